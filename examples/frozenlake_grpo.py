"""FrozenLake GRPO, composed by hand from the RollArt packages (in-process, CPU, ~1 minute).

    python examples/frozenlake_grpo.py [--iterations 40]

The same wiring `rollart run examples/frozenlake_grpo.yaml` builds; here every part is visible.
"""

import argparse
import asyncio
import tempfile

from rollart.app.config import parse_config
from rollart.app.task_factory import as_scorer
from rollart.app.tasks import FROZEN_LAKE_MAP, VOCAB, FrozenLakePrompts, build_demo_tokenizer, frozen_lake_reward
from rollart.app.trainers import LocalTrainer, LocalUpdater
from rollart.env.envs.frozen_lake import FrozenLakeEnv
from rollart.env.manager import EnvManager, EnvManagerConfig
from rollart.proxy.proxy import LLMProxy
from rollart.proxy.torch_engine import TorchEngine
from rollart.proxy.worker import InferenceWorker
from rollart.scheduler.adapters import ProxyLLMClient, ProxyWeightLoader
from rollart.scheduler.buffer import SampleBuffer
from rollart.scheduler.metrics import MetricsWriter
from rollart.scheduler.pipeline import Pipeline, PipelineParts
from rollart.scheduler.rollout import RolloutScheduler
from rollart.scheduler.scoring import ScoringSink
from rollart.sync.local import LocalChannel
from rollart.sync.model_update import ModelUpdateGroup
from rollart.train import TorchTrainer, TrainerConfig, build_causal_lm, tiny_llama_config
from rollart.train.losses import LossConfig


async def main(iterations: int) -> None:
    config = parse_config({"pipeline": {"mode": "async", "alpha": 1, "batch_size": 64, "group_size": 8},
                           "trainer": {"normalize_advantage_std": False}})  # Dr.GRPO advantages (design D15)
    model_cfg = tiny_llama_config(vocab_size=len(VOCAB), num_key_value_heads=4)  # random init, no download
    tokenizer = build_demo_tokenizer()

    # 1. rollout: two TorchEngine workers behind the LLMProxy
    workers = [InferenceWorker(f"rollout-{i}", lambda: TorchEngine(build_causal_lm(model_cfg, seed=0)), devices=(i,))
               for i in range(2)]
    for w in workers:
        await w.start()
    proxy = LLMProxy(workers)

    # 2. trainer and weight sync (same seed: version 0 needs no transfer)
    trainer = LocalTrainer(TorchTrainer(build_causal_lm(model_cfg, seed=0), TrainerConfig(lr=3e-3, micro_batch_size=64,
                                                                          loss=LossConfig(entropy_coef=0.01))))
    updater = LocalUpdater(ModelUpdateGroup(LocalChannel(), [ProxyWeightLoader(proxy)]))

    # 3. environments: 10 GRPO groups of 8 EnvManagers each (redundancy 1.25 over 8 groups per batch)
    buffer = SampleBuffer.from_config(config)  # the config's alpha and group size (Pipeline checks them)
    sink = ScoringSink(buffer, as_scorer(frozen_lake_reward))  # score, then buffer
    def env():
        return FrozenLakeEnv(desc=FROZEN_LAKE_MAP, is_slippery=False, max_episode_steps=8)
    slots = [[EnvManager(env, ProxyLLMClient(proxy), FrozenLakePrompts(tokenizer), sink,
                         EnvManagerConfig(max_turns=8, max_tokens_per_turn=1), name=f"fl-{g}-{m}")
              for m in range(8)] for g in range(10)]
    rollout = RolloutScheduler(slots, ["frozenlake"] * len(slots), buffer, proxy)

    # 4. the loop: get_batch -> train_step -> suspend -> model_update -> resume (design D12)
    run_dir = tempfile.mkdtemp(prefix="frozenlake-")
    parts = PipelineParts(buffer=buffer, rollout=rollout, trainer=trainer, updater=updater, rollout_devices=[0, 1],
                          train_devices=[2], metrics=MetricsWriter(run_dir, tensorboard=False), closers=[sink.aclose, proxy.close])
    pipeline = Pipeline(config, parts)
    try:
        for rec in await pipeline.run(iterations):
            print(f"iter {rec['iteration']:3d}  reward {rec['reward_mean']:+.3f}  success {rec['success_rate']:.2f}")
    finally:
        await pipeline.close()
    print(f"metrics: {run_dir}/metrics.jsonl")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--iterations", type=int, default=40)
    asyncio.run(main(parser.parse_args().iterations))
