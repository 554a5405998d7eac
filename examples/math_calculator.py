"""Multi-turn math with the calculator tool, with time-sharing, composed by hand (in-process, CPU).

    python examples/math_calculator.py [--iterations 30]

The policy must learn the tool protocol: call `<calc>` first, then `<answer>` with its result
(see `rollart.app.tasks` for the tiny model's macro tokens).
"""

import argparse
import asyncio
import tempfile

from rollart.app.config import parse_config
from rollart.app.task_factory import as_scorer
from rollart.app.tasks import VOCAB, MathToolPrompts, build_demo_tokenizer, math_reward
from rollart.app.trainers import LocalTrainer, LocalUpdater
from rollart.env.envs.math_calc import MathCalcEnv
from rollart.env.manager import EnvManager, EnvManagerConfig
from rollart.proxy.proxy import LLMProxy
from rollart.proxy.torch_engine import TorchEngine
from rollart.proxy.worker import InferenceWorker
from rollart.scheduler.adapters import ProxyElasticPool, ProxyLLMClient, ProxyWeightLoader
from rollart.scheduler.buffer import SampleBuffer
from rollart.scheduler.metrics import MetricsWriter
from rollart.scheduler.pipeline import Pipeline, PipelineParts
from rollart.scheduler.rollout import RolloutScheduler
from rollart.scheduler.scoring import ScoringSink
from rollart.scheduler.timesharing import CostAwarePolicy, TimeSharingController
from rollart.sync.local import LocalChannel
from rollart.sync.model_update import ModelUpdateGroup
from rollart.train import TorchTrainer, TrainerConfig, build_causal_lm, tiny_llama_config


async def main(iterations: int) -> None:
    config = parse_config({"pipeline": {"mode": "time_sharing", "alpha": 1, "batch_size": 32, "group_size": 8}})
    model_cfg = tiny_llama_config(vocab_size=len(VOCAB), num_key_value_heads=4)
    tokenizer = build_demo_tokenizer()
    workers = [InferenceWorker(f"rollout-{i}", lambda: TorchEngine(build_causal_lm(model_cfg, seed=0)), devices=(i,))
               for i in range(3)]
    for w in workers:
        await w.start()
    proxy = LLMProxy(workers)
    trainer = LocalTrainer(TorchTrainer(build_causal_lm(model_cfg, seed=0), TrainerConfig(lr=3e-3, micro_batch_size=32)))
    updater = LocalUpdater(ModelUpdateGroup(LocalChannel(), [ProxyWeightLoader(proxy)]))

    buffer = SampleBuffer.from_config(config)  # the config's alpha and group size (Pipeline checks them)
    sink = ScoringSink(buffer, as_scorer(math_reward))  # score, then buffer
    slots = [[EnvManager(lambda: MathCalcEnv(max_tool_calls=2), ProxyLLMClient(proxy), MathToolPrompts(tokenizer),
                         sink, EnvManagerConfig(max_turns=4, max_tokens_per_turn=1), name=f"math-{g}-{m}")
              for m in range(8)] for g in range(5)]
    rollout = RolloutScheduler(slots, ["math"] * len(slots), buffer, proxy)

    # time-sharing: lend idle rollout devices to the train step when the gain beats the switch cost
    controller = TimeSharingController(ProxyElasticPool(proxy), CostAwarePolicy(min_keep=1), train_devices=1,
                                       slots_per_device=16)
    run_dir = tempfile.mkdtemp(prefix="math-")
    parts = PipelineParts(buffer=buffer, rollout=rollout, trainer=trainer, updater=updater, rollout_devices=[0, 1, 2],
                          train_devices=[3], controller=controller, metrics=MetricsWriter(run_dir, tensorboard=False),
                          closers=[sink.aclose, proxy.close])
    pipeline = Pipeline(config, parts)
    try:
        for rec in await pipeline.run(iterations):
            print(f"iter {rec['iteration']:3d}  reward {rec['reward_mean']:.3f}  lent {rec['lent_devices']}  "
                  f"switch {rec['switch_cost_s']:.3f}s")
    finally:
        await pipeline.close()
    print(f"metrics: {run_dir}/metrics.jsonl")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--iterations", type=int, default=30)
    asyncio.run(main(parser.parse_args().iterations))
