"""The one progress line of a run: bar, iterations, elapsed time and what an operator watches.

`Pipeline.run` shows it, so a pipeline built by hand prints the same line as `rollart run`
(trajectories trained, tokens/s, reward, weight version, what each device does right now).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

ROLE_CHAR = {"rollout": "R", "train": "T", "idle": ".", "transfer": "~"}
REFRESH_S = 0.5


def status_text(consumed: int, last: dict[str, Any], version: int, roles: dict[int, str]) -> str:
    """`traj 64  tok/s 812  reward 0.41  v3  GPUs [RRT.]` (one character per device, in device order)."""
    gpus = "".join(ROLE_CHAR.get(roles[d], "?") for d in sorted(roles))
    return (f"traj {consumed}  tok/s {last.get('tokens_per_s', 0):.0f}  reward {last.get('reward_mean', 0):.2f}  "
            f"v{version}  GPUs [{gpus}]")


@contextlib.asynccontextmanager
async def progress_line(description: str, total: int, completed: int, status: Callable[[dict[str, Any]], str],
                        console: Console | None = None) -> AsyncIterator[Callable[[dict[str, Any]], None]]:
    """Show the line while the block runs; yields `advance(record)`, called after each iteration.

    The line refreshes every REFRESH_S seconds from `status(last_record)`; a console that is not a
    terminal (a log file, CI) gets the final line only, as rich renders it there.
    """
    last: dict[str, Any] = {}
    with Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  TextColumn("{task.fields[status]}"), console=console or Console(stderr=True),
                  transient=False) as progress:
        task = progress.add_task(description, total=total, completed=completed, status=status(last))

        async def refresh() -> None:
            while True:
                await asyncio.sleep(REFRESH_S)
                progress.update(task, status=status(last))

        def advance(record: dict[str, Any]) -> None:
            last.update(record)
            progress.update(task, completed=record["iteration"], status=status(last))

        ticker = asyncio.create_task(refresh())
        try:
            yield advance
        finally:
            ticker.cancel()
            progress.update(task, status=status(last))
