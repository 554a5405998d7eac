"""Control-plane latency of rollart.resource: allocate, shrink, expand, Cluster creation, store writes.

    .venv/bin/python scripts/bench/bench_resource_control_plane.py           # full run (~1 min)
    .venv/bin/python scripts/bench/bench_resource_control_plane.py --quick   # a few seconds
    .venv/bin/python scripts/bench/bench_resource_control_plane.py --no-ray  # skip the Ray rows

Every row has a baseline measured in the same run:
  * store writes and ledger operations vs a bare SQLite insert (same file settings: WAL, synchronous=NORMAL,
    one committed transaction per insert) - the floor for any persisted control-plane step;
  * Cluster.create on Ray (allocate + placement group + actor start + store report) vs plain Ray placement-group
    creation and readiness, and vs plain placement group + actor start + first call (the fair baseline: an
    actor is a new process);
  * shrink/expand with a hook that calls a Ray actor in prepare and commit vs the same two actor calls alone.
The ratio is ours / baseline (how many baseline operations one of ours costs).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sqlite3
import statistics
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from rollart.resource.cluster import Cluster
from rollart.resource.manager import ResourceManager
from rollart.resource.store import SqliteMetadataStore
from rollart.resource.worker import Worker

POOL = {"H800": range(0, 4), "H20": range(4, 8)}


def stats(samples: list[float]) -> tuple[float, float]:
    ordered = sorted(samples)
    return statistics.median(ordered) * 1e3, ordered[int(0.9 * (len(ordered) - 1))] * 1e3


def time_sync(fn, n: int) -> list[float]:
    out = []
    for i in range(n):
        t0 = time.perf_counter()
        fn(i)
        out.append(time.perf_counter() - t0)
    return out


async def time_async(fn, n: int) -> list[float]:
    out = []
    for i in range(n):
        t0 = time.perf_counter()
        await fn(i)
        out.append(time.perf_counter() - t0)
    return out


def bare_sqlite_insert(path: Path, n: int) -> list[float]:
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=NORMAL")
    conn.execute("CREATE TABLE t (seq INTEGER PRIMARY KEY AUTOINCREMENT, kind TEXT, payload TEXT, at REAL)")

    def insert(i: int) -> None:
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("INSERT INTO t (kind, payload, at) VALUES (?, ?, ?)", ("bench", json.dumps({"i": i}), float(i)))
        conn.execute("COMMIT")

    samples = time_sync(insert, n)
    conn.close()
    return samples


class Ping(Worker):
    def noop(self) -> int:
        return self.rank


class ActorHook:
    """A TransitionHook doing the minimal real work a proxy hook does: one actor call per phase."""

    def __init__(self, actor):
        self.actor = actor

    async def prepare(self, transition) -> None:
        await self.actor.noop.remote()

    async def commit(self, transition) -> None:
        await self.actor.noop.remote()

    async def abort(self, transition) -> None:
        await self.actor.noop.remote()


async def run(args: argparse.Namespace) -> list[tuple]:
    n = 50 if args.quick else 400
    n_ray = 3 if args.quick else 15
    rows = []
    tmp = Path(tempfile.mkdtemp(prefix="rollart-bench-"))

    base = bare_sqlite_insert(tmp / "bare.db", n)
    store = SqliteMetadataStore(tmp / "store.db")
    ev = time_sync(lambda i: store.append_event("bench", {"i": i}, float(i)), n)
    rows.append(("store.append_event", "local", n, ev, "bare SQLite insert", base))

    rm = ResourceManager(POOL, store=tmp / "ledger.db")
    alloc_release = time_sync(lambda i: (rm.allocate("bench", "rollout", 2, hw="H20"), rm.release("bench")), n)
    rows.append(("allocate + release", "local", n, alloc_release, "bare SQLite insert", base))
    rm.allocate("gen", "rollout", 4, hw="H20")
    shrinks, expands = [], []
    for _ in range(n):
        t0 = time.perf_counter()
        await rm.shrink("rollout", "train", [4, 5])
        t1 = time.perf_counter()
        await rm.expand("train", "rollout", [4, 5])
        shrinks.append(t1 - t0)
        expands.append(time.perf_counter() - t1)
    rows.append(("shrink (2 devices)", "local", n, shrinks, "bare SQLite insert", base))
    rows.append(("expand (2 devices)", "local", n, expands, "bare SQLite insert", base))
    mem = ResourceManager(POOL)  # ":memory:" store: the simulated runtime's setting
    mem.allocate("gen", "rollout", 4, hw="H20")
    mem_shrink = await time_async(lambda i: mem.shrink("rollout", "train", [4 + i % 2]) if i % 2 == 0
                                  else mem.expand("train", "rollout", [4]), n)
    rows.append(("shrink/expand (:memory:)", "local", n, mem_shrink, "bare SQLite insert", base))

    if not args.no_ray:
        import ray
        from ray.util.placement_group import placement_group, remove_placement_group

        from rollart.resource.runtime import RayRuntime

        ray.init(num_cpus=4, num_gpus=8, resources={"H800": 4.0, "H20": 4.0}, _node_ip_address="127.0.0.1",
                 include_dashboard=False, log_to_driver=False)
        try:
            async def plain_pg(i: int) -> None:
                pg = placement_group([{"GPU": 1.0, "H20": 1.0}], strategy="STRICT_PACK")
                await pg.ready()
                remove_placement_group(pg)

            await plain_pg(0)  # warm up
            pg_base = await time_async(plain_pg, n_ray)
            runtime = RayRuntime()
            ray_rm = ResourceManager(POOL, store=tmp / "ray.db")

            async def create_cluster(i: int) -> None:
                cluster = await Cluster.create(ray_rm, Ping, role="rollout", hw="H20", num_workers=1,
                                               runtime=runtime, name=f"c{i}")
                await cluster.shutdown()

            remote_ping = ray.remote(Ping)

            async def plain_pg_and_actor(i: int) -> None:
                from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

                from rollart.resource.runtime import WorkerContext

                pg = placement_group([{"GPU": 1.0, "H20": 1.0}], strategy="STRICT_PACK")
                await pg.ready()
                actor = remote_ping.options(
                    num_cpus=0, num_gpus=1, resources={"H20": 1},
                    scheduling_strategy=PlacementGroupSchedulingStrategy(placement_group=pg),
                ).remote(WorkerContext("plain", 0, 1, "H20", (4,)))
                await actor.noop.remote()
                ray.kill(actor)
                remove_placement_group(pg)

            await create_cluster(-1)  # warm up (ships the class)
            await plain_pg_and_actor(-1)
            created, actor_base = [], []
            for i in range(n_ray):  # interleaved, so machine load hits both alike
                created += await time_async(lambda _, i=i: create_cluster(i), 1)
                actor_base += await time_async(plain_pg_and_actor, 1)
            rows.append(("Cluster.create (1 worker)", "ray", n_ray, created, "plain Ray placement group", pg_base))
            rows.append(("Cluster.create (1 worker)", "ray", n_ray, created, "plain PG + actor start", actor_base))

            cluster = await Cluster.create(ray_rm, Ping, role="rollout", hw="H20", num_workers=4, runtime=runtime,
                                           name="gen")
            actor = cluster._members[0].handle.actor
            ray_rm.add_transition_hook(ActorHook(actor))

            async def two_calls(i: int) -> None:
                await actor.noop.remote()
                await actor.noop.remote()

            await two_calls(0)
            call_base = await time_async(two_calls, n)
            r_shrink, r_expand = [], []
            for _ in range(n // 2):
                t0 = time.perf_counter()
                await ray_rm.shrink("rollout", "train", [6, 7])
                t1 = time.perf_counter()
                await ray_rm.expand("train", "rollout", [6, 7])
                r_shrink.append(t1 - t0)
                r_expand.append(time.perf_counter() - t1)
            rows.append(("shrink, actor hook", "ray", n // 2, r_shrink, "2 plain actor calls", call_base))
            rows.append(("expand, actor hook", "ray", n // 2, r_expand, "2 plain actor calls", call_base))
            await cluster.shutdown()
        finally:
            ray.shutdown()
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="a small run (seconds)")
    parser.add_argument("--no-ray", action="store_true", help="skip the Ray rows")
    args = parser.parse_args(argv)
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    rows = asyncio.run(run(args))
    table = Table(title=f"rollart-resource control plane ({'quick' if args.quick else 'full'} run, "
                        f"{os.cpu_count()} CPUs, python {sys.version.split()[0]})")
    for col in ("operation", "runtime", "n", "median ms", "p90 ms", "ops/s", "baseline", "baseline median ms",
                "ratio"):
        table.add_column(col, justify="left" if col in ("operation", "runtime", "baseline") else "right")
    for name, runtime, n, samples, base_name, base in rows:
        med, p90 = stats(samples)
        base_med, _ = stats(base)
        table.add_row(name, runtime, str(n), f"{med:.3f}", f"{p90:.3f}", f"{1e3 / med:,.0f}", base_name,
                      f"{base_med:.3f}", f"{med / base_med:.1f}x")
    Console(width=160).print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
