"""A fluid bound of time-sharing's gain on the blog's workload, from the simulator's own cost model (app D69).

Why: a full simulation of the blog's workload (Qwen3-235B-A22B, 160 H800, 640 envs x ~30 turns) takes
minutes of CPU per layout; this reads the same formulas (rollart-proxy's RooflineModel and KV capacity,
rollart-train's step cost and memory floor) for the mean trajectory, with no queueing, no long tail and no
switch cost, so it bounds what any schedule can gain. Trained response tokens per second, per layout:

- an engine (8 H800, TP 8) holds `kv / context` sequences at the mean context; each turn costs one prefill
  of the observation (the context before it cached) and `answer` decode steps at that batch;
- static t train / r rollout (async, alpha 1): rollout runs all the time on r / 8 engines, unless the
  trainer is slower than the rollout (then the step bounds it);
- time-sharing (trainer `own` devices + `lend` lent for each step): the pool's engines serve except
  `lend / 8` of them for the train step on own + lend devices.

    python scripts/bench/timesharing_bound.py
"""

from __future__ import annotations

from rollart.proxy.sim_engine import QWEN3_235B_A22B, RooflineModel
from rollart.resource.hardware import BUILTIN_HARDWARE
from rollart.train.sim_memory import trainer_memory
from rollart.train.sim_trainer import train_step_cost

M, H800 = QWEN3_235B_A22B, BUILTIN_HARDWARE["H800"]
TP, BATCH, TURNS, PROMPT, OBS, ANSWER, CONTEXT = 8, 512, 30, 2048, 1500, 300, 65536


def engine_tokens_per_s() -> tuple[float, int, float]:
    """Response tokens per second of one TP-8 engine at the KV-bound batch of the mean context."""
    roof = RooflineModel(M, H800.tflops_bf16, H800.hbm_tbps, tp=TP, interconnect_gbps=H800.interconnect_gbps)
    kv = int((H800.hbm_gb * 1e9 * 0.9 - M.weight_bytes / TP) // (M.kv_bytes_per_token / min(TP, M.n_kv_heads))) * TP
    mean_context = PROMPT + TURNS / 2 * (OBS + ANSWER)
    batch = max(1, min(256, int(kv // mean_context)))
    turn_s = roof.prefill_batch_seconds([(OBS, int(mean_context))] * batch) + ANSWER * roof.decode_seconds(
        batch, int(batch * mean_context))
    return batch * ANSWER / turn_s, batch, mean_context


def main() -> None:
    per_engine, batch, ctx = engine_tokens_per_s()
    trained = BATCH * TURNS * ANSWER  # response tokens of one batch
    tokens = BATCH * (PROMPT + TURNS * (OBS + ANSWER))  # tokens a train step processes

    def step_s(devices: int) -> float:
        c = train_step_cost(M.n_params, tokens, devices, H800, active_params=M.active_params, forward_passes=2)
        return c.compute_s + c.allreduce_s

    floor = trainer_memory(M.name, M.n_params, M.n_layers, M.hidden_size, M.vocab_size, CONTEXT, 8, H800).min_devices
    print(f"engine (8 H800): {batch} sequences at a mean context of {ctx:,.0f} tokens, {per_engine:,.0f} response tok/s; "
          f"trainer floor {floor} H800; a batch = {trained / 1e6:.2f} M trained response tokens")
    rows = []
    for train in range(floor, 160, 8):
        engines = (160 - train) // TP
        rollout_s = trained / (engines * per_engine)
        rows.append((f"static {train} train / {160 - train} rollout", max(rollout_s, step_s(train)), step_s(train)))
    for own, lend in ((32, 40), (32, 96), (32, 120), (16, 56), (8, 64)):
        engines = (160 - own) // TP
        t = step_s(own + lend)
        # the batch's tokens come from all engines outside the step, and from engines - lend/8 during it
        cycle = (trained + lend / TP * per_engine * t) / (engines * per_engine)
        rows.append((f"time-sharing {own} own + {lend} lent / {160 - own} rollout", max(cycle, t), t))
    best = min(r[1] for r in rows if r[0].startswith("static"))
    print("| layout | step s (fluid) | train step s | trained tok/s | x best static |")
    print("|---|---|---|---|---|")
    for name, cycle, t in rows:
        print(f"| {name} | {cycle:.0f} | {t:.0f} | {trained / cycle:,.0f} | {best / cycle:.2f}x |")


if __name__ == "__main__":
    main()
