"""Install each rollart distribution alone into an empty venv and import it.

    python scripts/check_install_alone.py [rollart-env ...]

Wheels of all seven packages are built first (no dependencies), so a package that needs another
rollart package finds it as a wheel, the way it would from an index; third-party dependencies come
from the normal package index, with torch held to the local CPU build (constraints-dev.txt).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("rollart-resource", "rollart-env", "rollart-reward", "rollart-proxy", "rollart-sync",
            "rollart-train", "rollart-scheduler")


def run(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, check=False, capture_output=True, text=True, **kw)


def build_wheels(dest: Path) -> None:
    res = run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(dest),
               *[str(ROOT / "packages" / p) for p in PACKAGES]])
    if res.returncode != 0:
        raise SystemExit(f"building wheels failed:\n{res.stderr}")


def install_alone(package: str, wheels: Path, workdir: Path) -> tuple[bool, str, float]:
    start = time.monotonic()
    venv = workdir / package
    res = run([sys.executable, "-m", "venv", str(venv)])
    if res.returncode != 0:
        return False, res.stderr, time.monotonic() - start
    py = venv / "bin" / "python"
    res = run([str(py), "-m", "pip", "install", "-q", "--find-links", str(wheels),
               "-c", str(ROOT / "constraints-dev.txt"), package])
    if res.returncode != 0:
        return False, f"pip install {package} failed:\n{res.stderr[-3000:]}", time.monotonic() - start
    module = "rollart." + package.removeprefix("rollart-")
    res = run([str(py), "-c", f"import {module}, sys; print({module}.__version__)"], cwd=workdir)
    ok = res.returncode == 0
    return ok, (res.stdout.strip() if ok else res.stderr[-3000:]), time.monotonic() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("packages", nargs="*", default=list(PACKAGES))
    args = parser.parse_args(argv)
    failed = []
    with tempfile.TemporaryDirectory(prefix="rollart-alone-") as tmp:
        wheels = Path(tmp) / "wheels"
        build_wheels(wheels)
        for package in args.packages:
            ok, detail, secs = install_alone(package, wheels, Path(tmp))
            print(f"{package:20s} {'ok' if ok else 'FAILED':6s} {secs:6.1f} s  {detail if ok else ''}", flush=True)
            if not ok:
                failed.append(package)
                print(detail, file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
