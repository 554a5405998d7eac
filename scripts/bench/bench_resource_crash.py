"""Crash campaign against the resource control plane: SIGKILL a real controller at random moments, then judge.

    .venv/bin/python scripts/bench/bench_resource_crash.py --kills 200              # this checkout
    .venv/bin/python scripts/bench/bench_resource_crash.py --kills 200 --src DIR    # another version's src/

Each campaign is a fresh store; each kill starts a controller (it recovers, then loops over allocate / release /
shrink / expand with three logging hooks, one of which vetoes 15% of prepares, each abort taking --slow-abort s)
and SIGKILLs it a uniformly random 0..--max-delay-ms after it started, a third of them within 15 ms, so many kills land in recovery. After the
campaign's last kill a clean controller recovers and the judge (rollart.resource.crash_harness.judge) checks the
ledger, the event-log replay and what every hook heard. Rows: kills delivered, kills that hit before the
controller finished recovering, transitions judged, violations by kind (0 everywhere means the control plane held).
"""

from __future__ import annotations

import argparse
import random
import tempfile
import time
from pathlib import Path

from rollart.resource.crash_harness import CrashReport, run_crash_campaign


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kills", type=int, default=200)
    parser.add_argument("--per-campaign", type=int, default=20)
    parser.add_argument("--max-delay-ms", type=float, default=150.0)
    parser.add_argument("--slow-abort", type=float, default=0.02)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--src", action="append", default=None, help="a src/ directory to put first on the path")
    args = parser.parse_args()
    rng = random.Random(args.seed)
    total = CrashReport()
    t0 = time.perf_counter()
    campaigns = -(-args.kills // args.per_campaign)
    for campaign in range(campaigns):
        n = min(args.per_campaign, args.kills - campaign * args.per_campaign)
        # a third of the kills early (0-15 ms after start: mostly while the controller recovers), the rest anywhere
        delays = [rng.uniform(0, 15.0) if rng.random() < 1 / 3 else rng.uniform(0, args.max_delay_ms) for _ in range(n)]
        with tempfile.TemporaryDirectory(prefix="rollart-crash-") as tmp:
            total.merge(run_crash_campaign(Path(tmp), delays, seed=args.seed * 100 + campaign,
                                           slow_abort=args.slow_abort, src=args.src))
    elapsed = time.perf_counter() - t0
    print(f"source: {args.src or 'this checkout'}; slow_abort={args.slow_abort}s; max_delay={args.max_delay_ms}ms; "
          f"seed={args.seed}; {campaigns} campaigns in {elapsed:.1f} s")
    print("| kills | kills in recovery | transitions judged | violations | by kind |")
    print("|---|---|---|---|---|")
    kinds = ", ".join(f"{k} {v}" for k, v in sorted(total.violations.items())) or "-"
    print(f"| {total.kills} | {total.kills_in_recovery} | {total.transitions} | {sum(total.violations.values())} "
          f"| {kinds} |")
    for line in total.examples[:5]:
        print("  e.g.", line[:300])


if __name__ == "__main__":
    main()
