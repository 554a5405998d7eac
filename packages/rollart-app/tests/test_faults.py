"""Issue 21 items 1-3: a SIGKILLed rollout actor is replaced, a dead trainer group is rebuilt, SIGTERM stops cleanly.

Real parts: Ray on 127.0.0.1 with logical GPUs (H800, H20), torch engines on the tiny model, the
example two-pool affinity config; the kill is a real SIGKILL of the actor's process.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from rollart.app.builder import build_pipeline
from rollart.app.config import parse_config
from rollart.scheduler.errors import RunFailed
from rollart.scheduler.metrics import read_metrics
from rollart.scheduler.records import accounting_problems, read_events

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "configs" / "two_pools_affinity.yaml"


def example_config(**pipeline) -> dict:
    raw = yaml.safe_load(EXAMPLE.read_text())
    raw["run"].update({"tensorboard": False, "seed": 0})
    raw["pipeline"].update({"batch_size": 16, "get_batch_timeout_s": 180, **pipeline})
    return raw


async def actor_pid(worker) -> int:
    """The OS process of a rollout actor (what `kill -9` would target)."""
    ref = worker.handle.actor.__ray_call__.remote(lambda self: os.getpid())
    return await ref


@pytest.mark.ray
@pytest.mark.slow
async def test_a_sigkilled_rollout_actor_is_replaced_and_the_run_finishes(ray_cluster, tmp_path):
    cfg = parse_config(example_config())
    pipe = await build_pipeline(cfg, tmp_path)
    killed: list[int] = []

    def kill_after_first(rec):
        if rec["iteration"] == 1:
            h20 = next(s.handle for s in pipe.parts.proxy.slots if s.handle.hardware == "H20")
            killed.append(asyncio.ensure_future(actor_pid(h20)))

    try:
        await pipe.run(1, progress=False, on_iteration=kill_after_first)
        pid = await killed[0]
        os.kill(pid, signal.SIGKILL)  # mid-run: the rollout keeps generating in async mode
        recs = await pipe.run(4, progress=False)
        for _ in range(240):  # bounded (120 s; a restart takes ~10 s): a death found at the last update is still being recovered
            replaced = any(e["kind"] == "actor_replaced" for e in read_events(tmp_path))
            if replaced and all(s.state == "active" for s in pipe.parts.proxy.slots):
                break
            await asyncio.sleep(0.5)
        slots = [(s.handle.hardware, s.state, s.version) for s in pipe.parts.proxy.slots]
        recs += await pipe.run(6, progress=False)  # two more: the 5th record still holds the outage's tail
    finally:
        await pipe.close()
    assert [r["iteration"] for r in recs] == [2, 3, 4, 5, 6]
    assert all(state == "active" for _, state, _ in slots), slots
    assert sorted(hw for hw, _, _ in slots) == ["H20", "H800"]
    events = read_events(tmp_path)
    kinds = [e["kind"] for e in events]
    assert "actor_died" in kinds and "actor_replaced" in kinds, kinds
    died = next(e for e in events if e["kind"] == "actor_died")
    assert died["pool"] == "h20" and died["hardware"] == "H20"
    # math (affinity H20) went to H800 only while H20 had no worker; with the replacement up it is on H20 again
    last = read_metrics(tmp_path)[-1]
    math = last["routing"].get("math", {})
    assert last["iteration"] == 6 and math.get("H20", 0) > math.get("H800", 0), last["routing"]
    assert accounting_problems(tmp_path) == []


async def test_a_stop_request_checkpoints_the_last_iteration_and_returns(tmp_path):
    raw = example_config()
    raw["cluster"] = {"ray": "none"}
    raw["run"]["checkpoint_every"] = 100
    pipe = await build_pipeline(parse_config(raw), tmp_path)
    try:
        recs = await pipe.run(50, progress=False, on_iteration=lambda rec: pipe.request_stop("SIGTERM"))
    finally:
        await pipe.close()
    assert [r["iteration"] for r in recs] == [1] and pipe.stop_reason == "SIGTERM"
    assert pipe.parts.checkpointer.latest().iteration == 1  # saved at the stop, not at checkpoint_every


async def test_a_failure_ends_the_run_at_once_even_while_waiting_for_a_batch(tmp_path):
    raw = example_config()
    raw["cluster"] = {"ray": "none"}
    pipe = await build_pipeline(parse_config(raw), tmp_path)
    try:
        async def never(n, timeout_s):  # no batch ever fills: only the failure can end the wait
            await asyncio.Event().wait()

        pipe.parts.buffer.get_batch = never
        asyncio.get_running_loop().call_later(0.2, pipe.fail, RunFailed("rollout pool 'h20' (H20) lost every worker"))
        with pytest.raises(RunFailed, match="lost every worker"):
            await pipe.run(2, progress=False)
    finally:
        await pipe.close()
    assert pipe.iteration == 0


def run_command(tmp_path: Path, checkpoint_every: int) -> tuple[list[str], Path]:
    """`rollart run` of the example config without Ray (200 iterations: it runs until a signal), and its run directory."""
    raw = example_config()
    raw["cluster"] = {"ray": "none"}
    raw["run"].update({"checkpoint_every": checkpoint_every, "iterations": 200})
    config = tmp_path / "run.yaml"
    config.write_text(json.dumps(raw))
    run_dir = tmp_path / "out"
    return [sys.executable, "-m", "rollart.app.cli", "run", str(config), "--run-dir", str(run_dir)], run_dir


def signal_after(cmd: list[str], run_dir: Path, iterations: int, sig: int) -> tuple[int, str, str]:
    """Start `cmd`, send `sig` once `iterations` are in the metrics (or the run ended); (exit code, stdout, stderr)."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    metrics = run_dir / "metrics.jsonl"
    try:
        for _ in range(1200):  # bounded: 300 s
            if proc.poll() is not None or (metrics.exists() and metrics.read_text().count("\n") >= iterations):
                break
            time.sleep(0.25)
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    return proc.returncode, out, err


def test_sigterm_stops_like_sigint_checkpoints_and_a_resume_runs_every_iteration_once(tmp_path):
    """Item 3: before, SIGTERM ended `rollart run` with a stack dump (exit 134) and no checkpoint."""
    cmd, run_dir = run_command(tmp_path, checkpoint_every=100)
    code, out, err = signal_after(cmd, run_dir, 2, signal.SIGTERM)
    assert code == 143, err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    done = [r["iteration"] for r in read_metrics(run_dir)]
    assert len(done) >= 2 and f"stopped by SIGTERM after iteration {done[-1]}; resume with: rollart run" in out
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir())[-1].endswith(str(done[-1]))
    again = subprocess.run([*cmd, "-n", str(done[-1] + 1)], capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr[-3000:]
    assert [r["iteration"] for r in read_metrics(run_dir)] == list(range(1, done[-1] + 2))
    assert accounting_problems(run_dir) == []


def test_a_sigkilled_driver_resumes_and_the_ledger_accounts_for_every_trajectory(tmp_path):
    """Item 2 + 6: before, the trajectories open at the checkpoint a SIGKILLed driver resumed from had no
    ledger line (launched in the metrics, never settled): "nothing lost" could not be checked (D65)."""
    from rollart.scheduler.records import read_ledger

    cmd, run_dir = run_command(tmp_path, checkpoint_every=1)
    signal_after(cmd, run_dir, 3, signal.SIGKILL)  # no handler, no checkpoint, no closing lines
    killed_at = len(read_metrics(run_dir))
    again = subprocess.run([*cmd, "-n", str(killed_at + 2)], capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr[-3000:]
    assert [r["iteration"] for r in read_metrics(run_dir)] == list(range(1, killed_at + 3))
    assert accounting_problems(run_dir) == []
    lost = [line for line in read_ledger(run_dir) if (line["reason"] or "").startswith("lost_on_resume")]
    assert lost and all(line["outcome"] == "aborted" for line in lost)


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.parametrize("channel", ["torch_dist", "mooncake"])
async def test_a_sigkilled_rollout_actor_in_a_channel_world_is_replaced_at_the_next_update(ray_cluster, tmp_path, channel):
    """D81: before, the next update failed on the dead member and the run ended with a bare error
    (torch_dist: WorkerFailedError "died during receive"; Mooncake: every later put failed, code -800)."""
    if channel == "mooncake":
        from rollart.sync.mooncake import mooncake_unavailable_reason

        if (reason := mooncake_unavailable_reason()) is not None:
            pytest.skip(reason)
    raw = example_config()
    raw["trainer"].update({"placement": "actors", "devices": 1})
    raw["sync"] = {"channel": channel}
    pipe = await build_pipeline(parse_config(raw), tmp_path)
    try:
        await pipe.run(1, progress=False)
        old = next(s.handle for s in pipe.parts.proxy.slots if s.handle.hardware == "H20")
        os.kill(await actor_pid(old), signal.SIGKILL)
        recs = await pipe.run(4, progress=False)
        p = pipe.parts
        slots = [(s.handle.hardware, s.state, s.version, s.handle.worker_id) for s in p.proxy.slots]
        replicas = await p.trainer.checksums()
        new = next(s.handle for s in p.proxy.slots if s.handle.hardware == "H20")
        held = await new.call("checksums")
        reformed = p.updater.reformed
    finally:
        await pipe.close()
    assert [r["iteration"] for r in recs] == [2, 3, 4]
    assert all(state == "active" and version == 4 for _, state, version, _ in slots), slots
    assert new is not old and new.worker_id.startswith("h20-0.r"), slots
    assert reformed == 1
    # the new member received the trainer's weights through the re-formed world and serves them
    assert held["loaded_version"] == 4 and held["loaded"] == replicas[0] and held["engine"] == replicas[0]
    kinds = [e["kind"] for e in read_events(tmp_path)]
    assert "actor_died" in kinds and "actor_replaced" in kinds, kinds
    assert accounting_problems(tmp_path) == []


@pytest.mark.ray
@pytest.mark.slow
async def test_a_channel_world_pool_that_cannot_replace_its_only_worker_fails_the_run_in_one_line(ray_cluster, tmp_path):
    """D81 with D51's rule: a pool with no worker and no replacement ends the run naming the pool and the cause."""
    raw = example_config()
    raw["trainer"].update({"placement": "actors", "devices": 1})
    raw["sync"] = {"channel": "torch_dist"}
    pipe = await build_pipeline(parse_config(raw), tmp_path)

    async def no_device(rank: int):
        raise RuntimeError("no free H20 device")

    try:
        await pipe.run(1, progress=False)
        pipe.parts.updater.spawn = no_device
        old = next(s.handle for s in pipe.parts.proxy.slots if s.handle.hardware == "H20")
        os.kill(await actor_pid(old), signal.SIGKILL)
        with pytest.raises(RunFailed) as failed:
            await pipe.run(6, progress=False)
    finally:
        await pipe.close()
    line = str(failed.value)
    assert "\n" not in line and "rollout pool 'h20' (H20) lost every worker and could not start one" in line, line
    assert "no free H20 device" in line and f"--run-dir {tmp_path}" in line, line
    assert "pool_lost" in [e["kind"] for e in read_events(tmp_path)]


async def kill_trainer(pipe) -> None:
    """SIGKILL the process of trainer actor 0 (what the OOM killer or a node loss does)."""
    actor = pipe.parts.trainer.handles[0].actor
    os.kill(await actor.__ray_call__.remote(lambda self: os.getpid()), signal.SIGKILL)


def assert_one_stop_line(failed, run_dir: Path, why: str, iterations: list[int]) -> None:
    """The run stopped with one line naming the dead actor, why it was not rebuilt, and the resume command."""
    line = str(failed.value)
    assert "\n" not in line and line.startswith("trainer actor trainer/0 died during train_step"), line
    assert why in line and f"rollart run CONFIG --run-dir {run_dir}" in line, line
    assert [r["iteration"] for r in read_metrics(run_dir)] == iterations


@pytest.mark.ray
@pytest.mark.slow
async def test_a_dead_trainer_actor_stops_the_run_in_one_line_naming_it_and_the_resume_command(ray_cluster, tmp_path):
    """Item 2 (the part past the budget): before, the run ended with a bare WorkerDiedError from the step."""
    raw = trainer_actors_config(restarts=0, channel="torch_dist")  # trainer actors publish through a channel
    pipe = await build_pipeline(parse_config(raw), tmp_path)
    try:
        await pipe.run(1, progress=False)
        await kill_trainer(pipe)
        with pytest.raises(RunFailed) as failed:
            await pipe.run(3, progress=False)
    finally:
        await pipe.close()
    assert_one_stop_line(failed, tmp_path, "rebuilt 0 times, the budget (trainer.restarts: 0) is spent", [1])
    assert pipe.iteration == 1


def trainer_actors_config(restarts: int, channel: str = "local") -> dict:
    raw = example_config()
    raw["trainer"].update({"placement": "actors", "devices": 1, "restarts": restarts})
    raw["sync"] = {"channel": channel}
    return raw


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.parametrize("channel", ["local", "torch_dist"])
async def test_a_dead_trainer_actor_is_rebuilt_from_the_last_checkpoint_and_the_run_finishes(ray_cluster, tmp_path, channel):
    """Item 2 (D75; torch_dist: D82): before, the run stopped at the first trainer death (and with sync.channel
    local the trainer actors never built their trainer; with torch_dist the world could not take a new member)."""
    pipe = await build_pipeline(parse_config(trainer_actors_config(restarts=2, channel=channel)), tmp_path)
    plan = pipe.parts.trainer.rebuild
    spawn, during = plan.spawn, []

    async def spawn_watched():  # trajectories finished while the new trainer actor starts
        before = pipe.seen_trajectories
        handles = await spawn()
        during.append(pipe.seen_trajectories - before)
        return handles

    plan.spawn = spawn_watched
    try:
        await pipe.run(1, progress=False)
        await kill_trainer(pipe)
        recs = await pipe.run(3, progress=False)
        replicas = await pipe.parts.trainer.checksums()
        held = [await s.handle.call("checksums") for s in pipe.parts.proxy.slots]
    finally:
        await pipe.close()
    assert [r["iteration"] for r in recs] == [2, 3]
    # every rollout worker serves the rebuilt trainer's weights (torch_dist: through the re-formed world)
    assert all(h["version"] == 3 and h["engine"] == replicas[0] for h in held)
    metrics = read_metrics(tmp_path)
    assert [r["iteration"] for r in metrics] == [1, 2, 3]  # every iteration once
    assert [r["version"] for r in metrics] == [1, 2, 3]  # monotonic: the rebuilt trainer continues at version 1
    rebuilt = [e for e in read_events(tmp_path) if e["kind"] == "trainer_rebuilt"]
    assert len(rebuilt) == 1, rebuilt
    event = rebuilt[0]
    assert event["actor"] == "trainer/0" and event["method"] == "train_step" and event["iteration"] == 2
    assert event["checkpoint_version"] == 1 and event["version"] == 1 and event["lost_updates"] == 0
    assert event["seconds"] > 0 and event["rebuilds"] == 1 and event["budget"] == 2 and event["cause"]
    assert during[0] > 0, during  # the rollout side kept generating while the trainer was rebuilt
    assert accounting_problems(tmp_path) == []


@pytest.mark.ray
@pytest.mark.slow
async def test_past_the_restart_budget_a_dead_trainer_stops_the_run_in_one_line(ray_cluster, tmp_path):
    """Item 2 (D75): one rebuild is allowed; the second death stops the run naming the actor, the budget
    and the resume command."""
    pipe = await build_pipeline(parse_config(trainer_actors_config(restarts=1)), tmp_path)
    try:
        await pipe.run(1, progress=False)
        await kill_trainer(pipe)
        await pipe.run(2, progress=False)  # rebuilt within the budget
        await kill_trainer(pipe)
        with pytest.raises(RunFailed) as failed:
            await pipe.run(3, progress=False)
    finally:
        await pipe.close()
    assert_one_stop_line(failed, tmp_path, "rebuilt 1 times, the budget (trainer.restarts: 1) is spent", [1, 2])
    assert [e["kind"] for e in read_events(tmp_path)].count("trainer_rebuilt") == 1


async def test_the_rollout_restart_budget_comes_from_the_config(tmp_path):
    """Issue 21 note: the budget was fixed at 1 restart per 600 s; `rollout.recovery` sets it (app D80)."""
    raw = example_config()
    raw["cluster"] = {"ray": "none"}
    raw["rollout"]["recovery"] = {"max_restarts": 3, "restart_window_s": 120, "restart_backoff_s": 0.5,
                                  "health_check_interval_s": None}
    pipe = await build_pipeline(parse_config(raw), tmp_path)
    try:
        proxy = pipe.parts.proxy
        got = (proxy._max_restarts, proxy._restart_window, proxy._backoff, proxy._health_interval)
    finally:
        await pipe.close()
    assert got == (3, 120.0, 0.5, None)
    raw["rollout"]["recovery"] = {"max_restart": 3}
    with pytest.raises(Exception, match=r"rollout\.recovery\.max_restart"):
        parse_config(raw)
