"""rollart.train: RL advantages and losses (GRPO, PPO-clip) and training workers: torch on CPU, megatron-core on GPUs.

`MegatronTrainer` is imported lazily on attribute access (`rollart.train.MegatronTrainer`) and is
left out of `__all__`, so neither `import rollart.train` nor a star import needs megatron-core;
install the `[megatron]` extra to use it.
"""

from __future__ import annotations

from typing import Any

from rollart.train.advantages import grpo_advantages
from rollart.train.batch import TrainBatch, TrainSample, build_train_batch
from rollart.train.errors import TrainError
from rollart.train.losses import AGGREGATIONS, LossConfig, kl_k3, masked_aggregate, policy_loss, ppo_clip_loss
from rollart.train.models import build_causal_lm, tiny_llama_config
from rollart.train.protocols import PolicyTrainer
from rollart.train.torch_trainer import TorchTrainer, TrainerConfig

__version__ = "0.1.0"

__all__ = [
    "AGGREGATIONS",
    "LossConfig",
    "PolicyTrainer",
    "TorchTrainer",
    "TrainBatch",
    "TrainError",
    "TrainSample",
    "TrainerConfig",
    "build_causal_lm",
    "build_train_batch",
    "grpo_advantages",
    "kl_k3",
    "masked_aggregate",
    "policy_loss",
    "ppo_clip_loss",
    "tiny_llama_config",
]


def __getattr__(name: str) -> Any:
    if name == "MegatronTrainer":
        from rollart.train.megatron_trainer import MegatronTrainer

        return MegatronTrainer
    raise AttributeError(f"module 'rollart.train' has no attribute {name!r}")
