"""Run every benchmark in scripts/bench/ (each prints its own table and ratio to its baseline).

    python scripts/bench/run_all.py [--quick] [NAME_SUBSTRING ...]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="pass --quick to every benchmark")
    parser.add_argument("only", nargs="*", help="run only benchmarks whose file name contains one of these")
    args = parser.parse_args(argv)
    scripts = sorted(p for p in HERE.glob("bench_*.py") if not args.only or any(s in p.name for s in args.only))
    if not scripts:
        print("no benchmarks matched", file=sys.stderr)
        return 1
    failed = []
    for script in scripts:
        print(f"\n=== {script.name} ===", flush=True)
        start = time.monotonic()
        rc = subprocess.call([sys.executable, str(script), *(["--quick"] if args.quick else [])])
        print(f"--- {script.name}: exit {rc} in {time.monotonic() - start:.1f} s", flush=True)
        if rc != 0:
            failed.append(script.name)
    if failed:
        print(f"\nfailed: {failed}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
