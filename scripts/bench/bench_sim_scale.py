"""Wall time of one simulated multi-turn iteration from 100 to 3,000 GPUs (`rollart sim`'s machinery).

Each row builds the whole pipeline with the one builder (SimEngine workers behind the real LLMProxy,
SimTrainer, SimChannel, synthetic envs in real EnvManagers, the real SampleBuffer and
RolloutScheduler) and runs ONE iteration on the VirtualTimeLoop: every env plays a 3-turn episode
(128-token prompt, 32-token observations and answers, env latency N(5, 2) s), the batch is 80% of the
environments (redundancy 1.25), 10% of the GPUs train. Measured: wall time of build + iteration +
close (`wall_s`), the iteration's virtual time, trajectories collected, requests served.
Half the rollout GPUs are H800, half H20 (two pools, routing by affinity).

    python scripts/bench/bench_sim_scale.py                  # 100, 300, 1000, 3000 GPUs, 1 repeat
    python scripts/bench/bench_sim_scale.py --gpus 3000 --repeats 3
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from rollart.app.sim.runner import run_one
from rollart.app.sim.scenario import parse_scenario


def scenario(gpus: int, envs: int) -> dict:
    train = max(1, gpus // 10)
    rollout = gpus - train
    group = 8
    slots = max(1, envs // group)
    batch = max(group, int(slots / 1.25) * group)
    return {
        "name": f"scale{gpus}", "seed": 0, "iterations": 1, "warmup": 0,
        "config": {
            "pipeline": {"mode": "async", "alpha": 1, "batch_size": batch, "group_size": group,
                         "redundancy": round(slots * group / batch, 6), "get_batch_timeout_s": 1e6, "update_timeout_s": 600},
            "model": {"sim_model": "Qwen3-8B"},
            "rollout": {"pools": [
                {"name": "h800", "hardware": "H800", "devices": rollout // 2, "engine": "sim", "max_num_seqs": 64,
                 "engine_args": {"decode_quantum_s": 1.0}},
                {"name": "h20", "hardware": "H20", "devices": rollout - rollout // 2, "engine": "sim", "max_num_seqs": 64,
                 "engine_args": {"decode_quantum_s": 1.0}}]},
            "routing": {"affinity": {"default": "H20", "prefill": "H800"}},
            "trainer": {"backend": "sim", "devices": train, "hardware": "H800"},
            "sync": {"channel": "sim"},
            "tasks": [{"env": "synthetic", "reward": "synthetic", "tag": "prefill", "max_turns": 3, "max_tokens": 64,
                       "env_timeout_s": 600},
                      {"env": "synthetic", "reward": "synthetic", "tag": "decode", "max_turns": 3, "max_tokens": 64,
                       "env_timeout_s": 600}],
        },
        "workload": {"turns": 3, "prompt_tokens": 128, "observation_tokens": 32, "response_tokens": 32,
                     "step_latency": {"kind": "gaussian", "mean": 5, "std": 2}},
        "runs": [{"name": f"{gpus} GPUs"}],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gpus", type=int, action="append", default=[])
    parser.add_argument("--envs-per-gpu", type=float, default=10_000 / 3_000)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--write", type=str, default="", help="also write the table to this markdown file")
    args = parser.parse_args()
    sizes = args.gpus or [100, 300, 1000, 3000]
    rows: dict[int, list] = {g: [] for g in sizes}
    lines = ["| GPUs | envs | wall s (median) | wall s (min-max) | CPU s of this process | virtual s | collected | aborted | "
             "failed | tok/s |", "|---|---|---|---|---|---|---|---|---|---|"]
    print("\n".join(lines), flush=True)
    for rep in range(args.repeats):  # interleaved: every size once per repeat
        for gpus in sizes:
            envs = int(round(gpus * args.envs_per_gpu))
            spec = parse_scenario(scenario(gpus, envs))
            cpu0 = time.process_time()  # CPU time: the machine may be shared; wall time is the headline
            result = run_one(spec, spec.runs[0])
            rows[gpus].append((envs, result, time.process_time() - cpu0))
            if rep == args.repeats - 1:
                walls = [r.wall_s for _, r, _ in rows[gpus]]
                cpus = [c for _, _, c in rows[gpus]]
                lines.append(f"| {gpus:,} | {envs:,} | {statistics.median(walls):.1f} | {min(walls):.1f}-{max(walls):.1f} | "
                             f"{statistics.median(cpus):.1f} | {result.virtual_s:.0f} | {result.collected:,} | "
                             f"{result.aborted:,} | {result.failed} | {result.tokens_per_s:,.0f} |")
                print(lines[-1], flush=True)
                if args.write:
                    Path(args.write).write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
