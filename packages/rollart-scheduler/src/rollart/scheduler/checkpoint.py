"""Per-iteration checkpoints (design D9): a crash mid-iteration resumes from the last completed one.

Why temp dir + rename: the rename is atomic on POSIX, so a crash while writing leaves the previous
checkpoint intact and never a half-written "latest".
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import torch

from rollart.resource import checks as check
from rollart.scheduler.errors import SchedulerError

_PREFIX = "ckpt-"


class Checkpointer:
    """Atomic per-iteration checkpoints (D9): write to a temp dir, then rename."""

    def __init__(self, root: Path, keep: int = 2) -> None:
        """Keep the newest `keep` checkpoints."""
        # VAL: VAL_INT_RANGE(keep, min=1, max=1000, exc=SchedulerError)
        check.int_range("keep", keep, min=1, max=1000, exc=SchedulerError)  # generated #e8b3547b74
        self.root = Path(root)
        self.keep = keep

    def _complete(self) -> list[Path]:
        if not self.root.exists():
            return []
        return sorted(p for p in self.root.iterdir() if p.name.startswith(_PREFIX) and (p / "state.pt").exists())

    def save(self, iteration: int, version: int, state: dict[str, Any]) -> Path:
        """Persist one completed iteration."""
        self.root.mkdir(parents=True, exist_ok=True)
        final = self.root / f"{_PREFIX}{iteration:08d}"
        tmp = self.root / f".tmp-{iteration:08d}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        torch.save({"iteration": iteration, "version": version, "state": state}, tmp / "state.pt")
        shutil.rmtree(final, ignore_errors=True)
        tmp.rename(final)
        for old in self._complete()[: -self.keep]:
            shutil.rmtree(old, ignore_errors=True)
        return final

    def latest(self) -> tuple[int, int, dict[str, Any]] | None:
        """(iteration, version, state) of the newest complete checkpoint, or None."""
        done = self._complete()
        if not done:
            return None
        blob = torch.load(done[-1] / "state.pt", weights_only=False)
        return int(blob["iteration"]), int(blob["version"]), blob["state"]
