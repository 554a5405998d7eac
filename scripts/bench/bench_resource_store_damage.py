"""Damage sweep of the metadata store: flip one byte (or truncate, or empty the file), reopen, classify the result.

    .venv/bin/python scripts/bench/bench_resource_store_damage.py --flips 1000
    PYTHONPATH=<other src> /work/main/.venv/bin/python scripts/bench/bench_resource_store_damage.py   # another version

A store with every table in use (pool, allocations, a completed shrink, a worker, a service) is written and closed
(WAL checkpointed). Each case is a copy with one byte XOR-ed (offsets evenly spread over the file, masks 0x01, 0x20,
0x80, 0xFF in turn), or truncated, or emptied; reopening it with ResourceManager(None) is classified as:
  refused  - an error that names the file (the store refuses to guess);
  same     - opened and read back identical to the original (the flip hit unused space);
  WRONG    - opened and read back as a DIFFERENT state (silent damage: the failure this guards against);
  raw      - an error that does not name the file (e.g. a bare sqlite3.DatabaseError).
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
from collections import Counter
from pathlib import Path

from rollart.resource.manager import ResourceManager
from rollart.resource.store import WorkerRecord
from rollart.resource.testing import RecordingHook

POOL = {"H800": range(0, 2), "H20": range(2, 8)}


def build(path: Path):
    rm = ResourceManager(POOL, store=path)
    rm.allocate("trainer", "train", 2, hw="H800")
    rm.allocate("gen", "rollout", 5, hw="H20")
    rm.add_transition_hook(RecordingHook())
    asyncio.run(rm.shrink("rollout", "train", [2, 3]))
    rm.report_worker(WorkerRecord("gen/0", "gen", 0, "H20", (4,), "alive", 0))
    rm.register_service("judge", "http://127.0.0.1:9/reward", "rewarder")
    snap = rm.store.snapshot()
    rm.close()
    return snap


def classify(path: Path, original, pool=None) -> str:
    try:
        rm = ResourceManager(pool, store=path)
    except Exception as exc:  # noqa: BLE001 - classifying every outcome is the point
        return "refused" if str(path) in str(exc) else "raw"
    try:
        snap = rm.store.snapshot()
    except Exception as exc:  # noqa: BLE001
        return "refused" if str(path) in str(exc) else "raw"
    finally:
        rm.close()
    return "same" if snap == original else "WRONG"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--flips", type=int, default=1000)
    parser.add_argument("--truncations", type=int, default=50)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="rollart-damage-") as tmp:
        base = Path(tmp) / "meta.db"
        original = build(base)
        raw = base.read_bytes()
        rows: dict[str, Counter] = {"byte flip": Counter(), "truncation": Counter(), "0-byte file + pool": Counter()}
        examples: list[str] = []
        masks = (0x01, 0x20, 0x80, 0xFF)
        for i in range(args.flips):
            offset = i * len(raw) // args.flips
            case = Path(tmp) / f"flip{i}.db"
            case.write_bytes(raw[:offset] + bytes([raw[offset] ^ masks[i % 4]]) + raw[offset + 1:])
            outcome = classify(case, original)
            rows["byte flip"][outcome] += 1
            if outcome in ("WRONG", "raw") and len(examples) < 5:
                examples.append(f"flip at {offset} mask {masks[i % 4]:#x}: {outcome}")
            case.unlink()
        for i in range(args.truncations):
            size = 1 + i * (len(raw) - 1) // args.truncations
            case = Path(tmp) / f"trunc{i}.db"
            case.write_bytes(raw[:size])
            rows["truncation"][classify(case, original)] += 1
            case.unlink()
        empty = Path(tmp) / "empty.db"
        empty.write_bytes(b"")
        rows["0-byte file + pool"][classify(empty, original, pool=POOL)] += 1
    print(f"store file: {len(raw)} bytes")
    print("| damage | cases | refused | same | WRONG (silent) | raw error |")
    print("|---|---|---|---|---|---|")
    for name, c in rows.items():
        print(f"| {name} | {sum(c.values())} | {c['refused']} | {c['same']} | {c['WRONG']} | {c['raw']} |")
    for line in examples:
        print("  e.g.", line)


if __name__ == "__main__":
    main()
