"""Benchmark: TorchTrainer.train_step vs a plain hand-written torch loop on the same batch.

    .venv/bin/python scripts/bench/bench_train_step.py [--quick] [--no-megatron]

Both sides train the same tiny Llama (rollart.train.tiny_llama_config) from the same initial
weights on the same GRPO batch with the same micro-batch size, AdamW and gradient clipping. The
baseline is the loop one would write by hand: forward, gather log-probs, PPO-clip on policy
tokens (token mean), backward, clip, step. The ratio shows what the trainer's extras cost
(masking by `where`, global-denominator aggregation, entropy/clip/ratio metrics, validation).
If megatron-core imports, MegatronTrainer (CPU shims, gloo group of one rank) is measured too.
Runs alternate between the backends so a noisy shared CPU hurts each side alike; the minimum
step time is the steadier statistic when other processes compete for the cores.
"""

from __future__ import annotations

import argparse
import copy
import socket
import statistics
import time
import warnings

import torch
from rich.console import Console
from rich.table import Table

from rollart.train import (
    LossConfig,
    TorchTrainer,
    TrainerConfig,
    TrainSample,
    build_causal_lm,
    build_train_batch,
    tiny_llama_config,
)


def make_batch(num_sequences: int, prompt_len: int, response_len: int, vocab: int, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    samples = []
    for i in range(num_sequences):
        n = prompt_len + response_len - (i % 4) * (response_len // 8)  # ragged lengths
        ids = torch.randint(4, vocab, (n,), generator=gen).tolist()
        mask = [0] * prompt_len + [1] * (n - prompt_len)
        lps = (-torch.rand(n, generator=gen) * 3).tolist()
        samples.append(TrainSample(ids, mask, lps, float(i % 2), i // 8))
    return build_train_batch(samples)


class PlainLoop:
    """The hand-written baseline: same math (PPO-clip, token mean), no abstraction."""

    def __init__(self, model: torch.nn.Module, config: TrainerConfig) -> None:
        self.model, self.config = model, config
        self.opt = torch.optim.AdamW(model.parameters(), lr=config.lr, betas=config.betas, eps=config.adam_eps)

    def train_step(self, batch) -> dict[str, float]:
        self.opt.zero_grad(set_to_none=True)
        n_tok = batch.loss_mask.sum()
        eps = self.config.loss.clip_eps_low
        for s in range(0, batch.input_ids.shape[0], self.config.micro_batch_size):
            ids = batch.input_ids[s : s + self.config.micro_batch_size]
            am = batch.attention_mask[s : s + self.config.micro_batch_size]
            mask = batch.loss_mask[s : s + self.config.micro_batch_size, 1:].float()
            old = batch.behaviour_log_probs[s : s + self.config.micro_batch_size, 1:]
            adv = batch.advantages[s : s + self.config.micro_batch_size, None]
            logits = self.model(input_ids=ids, attention_mask=am.long()).logits[:, :-1]
            lp = torch.log_softmax(logits.float(), -1).gather(-1, ids[:, 1:, None]).squeeze(-1)
            ratio = torch.exp(lp - old)
            loss = -torch.min(ratio * adv, ratio.clamp(1 - eps, 1 + eps) * adv)
            ((loss * mask).sum() / n_tok).backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.config.max_grad_norm)
        self.opt.step()
        return {}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _megatron_trainer(hf_config, model, config):
    try:
        warnings.filterwarnings("ignore")
        import torch.distributed as dist
        from megatron.core import parallel_state

        from rollart.train import MegatronTrainer
    except ImportError:
        return None
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{_free_port()}", rank=0, world_size=1)
    parallel_state.initialize_model_parallel(1, 1)
    return MegatronTrainer(hf_config, config, hf_state_dict=model.state_dict())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small batch, few steps")
    parser.add_argument("--no-megatron", action="store_true", help="skip the MegatronTrainer row")
    args = parser.parse_args()
    torch.set_num_threads(max(1, torch.get_num_threads()))
    sequences, prompt, response, steps = (8, 16, 48, 3) if args.quick else (32, 32, 96, 8)
    hf_config = tiny_llama_config()
    model = build_causal_lm(hf_config, seed=0)
    config = TrainerConfig(lr=1e-4, micro_batch_size=8, loss=LossConfig())
    batch = make_batch(sequences, prompt, response, hf_config.vocab_size)
    tokens = int(batch.attention_mask.sum())
    backends = {
        "plain torch loop (baseline)": PlainLoop(copy.deepcopy(model), config),
        "TorchTrainer.train_step": TorchTrainer(copy.deepcopy(model), config),
    }
    if not args.no_megatron:
        megatron = _megatron_trainer(hf_config, model, config)
        if megatron is not None:
            backends["MegatronTrainer.train_step (CPU shims)"] = megatron
    times: dict[str, list[float]] = {name: [] for name in backends}
    for backend in backends.values():  # warm-up
        backend.train_step(batch)
    for _ in range(steps):
        for name, backend in backends.items():
            start = time.perf_counter()
            backend.train_step(batch)
            times[name].append(time.perf_counter() - start)

    baseline = statistics.median(times["plain torch loop (baseline)"])
    baseline_min = min(times["plain torch loop (baseline)"])
    table = Table(title=f"train step, tiny Llama, {sequences} seqs, {tokens} tokens, micro-batch 8, {steps} steps")
    for col in (
        "backend",
        "median step (ms)",
        "min step (ms)",
        "tokens/s (median)",
        "median vs baseline",
        "min vs baseline",
    ):
        table.add_column(col, justify="left" if col == "backend" else "right")
    for name, ts in times.items():
        med = statistics.median(ts)
        table.add_row(
            name,
            f"{med * 1e3:.1f}",
            f"{min(ts) * 1e3:.1f}",
            f"{tokens / med:,.0f}",
            f"{med / baseline:.2f}x",
            f"{min(ts) / baseline_min:.2f}x",
        )
    Console(width=130).print(table)


if __name__ == "__main__":
    main()
