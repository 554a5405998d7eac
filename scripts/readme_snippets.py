"""The code blocks of the package READMEs: the install commands and the Python snippets.

    python scripts/readme_snippets.py [--run] [rollart-env ...]

Used by `tests/test_readme_snippets.py` (every Python snippet runs as written, in the current
venv) and `scripts/check_install_alone.py` (every install command runs as written in an empty
venv, then the snippets run there). A Python snippet whose first line is `# not run: <reason>` is
reported and skipped (it needs a GPU extra or a service this machine does not run).
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("rollart-checks", "rollart-resource", "rollart-env", "rollart-reward", "rollart-proxy", "rollart-sync",
            "rollart-train", "rollart-scheduler", "rollart-app")
# Extras too heavy (or GPU-only) to install in the install-alone check; their lines are reported, not run.
HEAVY_EXTRAS = ("[vllm]", "[megatron]", "[mooncake]")
_FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.M | re.S)


@dataclass(frozen=True)
class Snippet:
    """One fenced code block of a README."""

    package: str
    lang: str
    code: str
    line: int

    @property
    def skip_reason(self) -> str | None:
        """The `# not run: <reason>` of a Python snippet, else None."""
        first = self.code.lstrip().splitlines()[0] if self.code.strip() else ""
        return first.removeprefix("# not run:").strip() if first.startswith("# not run:") else None


def snippets(package: str) -> list[Snippet]:
    """Every fenced block of `packages/<package>/README.md`, in order."""
    text = (ROOT / "packages" / package / "README.md").read_text()
    return [Snippet(package, m[1], m[2], text.count("\n", 0, m.start()) + 1) for m in _FENCE.finditer(text)]


def install_commands(package: str) -> list[str]:
    """The `pip install ...` lines of the README's shell blocks, comments stripped, in order."""
    out = []
    for snip in snippets(package):
        if snip.lang in ("bash", "sh", "shell"):
            for line in snip.code.replace("\\\n", " ").splitlines():  # join continuation lines
                cmd = " ".join(line.split(" #")[0].split())
                if cmd.startswith("pip install"):
                    out.append(cmd)
    return out


def runnable(package: str) -> list[Snippet]:
    """The Python snippets that must run as written."""
    return [s for s in snippets(package) if s.lang == "python" and s.skip_reason is None]


def run_snippet(snip: Snippet, python: str = sys.executable, timeout: float = 600.0) -> subprocess.CompletedProcess:
    """Run one snippet with `python` in a fresh temporary directory (files it writes land there)."""
    with tempfile.TemporaryDirectory(prefix="rollart-snippet-") as cwd:
        return subprocess.run([python, "-c", snip.code], cwd=cwd, capture_output=True, text=True, timeout=timeout)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("packages", nargs="*", default=list(PACKAGES))
    parser.add_argument("--run", action="store_true", help="run the Python snippets with this interpreter")
    args = parser.parse_args(argv)
    failed = 0
    for package in args.packages:
        for cmd in install_commands(package):
            print(f"{package}: install: {cmd}")
        for snip in snippets(package):
            if snip.lang != "python":
                continue
            if snip.skip_reason is not None:
                print(f"{package}: README.md:{snip.line}: not run ({snip.skip_reason})")
            elif args.run:
                res = run_snippet(snip)
                print(f"{package}: README.md:{snip.line}: {'ok' if res.returncode == 0 else 'FAILED'}", flush=True)
                if res.returncode != 0:
                    failed += 1
                    print(res.stderr[-3000:], file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
