"""rollart.train: RL advantages and losses (GRPO, PPO-clip) and training workers: torch on CPU, megatron-core on GPUs.

Every name is imported lazily, on first attribute access (`rollart.train.TorchTrainer`, or `from
rollart.train import TorchTrainer`): importing one submodule (`rollart.train.sim_trainer`, which
`rollart sim` uses) must not import transformers through `models` (rollart-app D64). `MegatronTrainer`
resolves the same way and is left out of `__all__`, so neither `import rollart.train` nor a star
import needs megatron-core; install the `[megatron]` extra to use it.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_WHERE = {
    "grpo_advantages": "advantages",
    "TrainBatch": "batch", "TrainSample": "batch", "build_train_batch": "batch",
    "TrainError": "errors",
    "AGGREGATIONS": "losses", "LossConfig": "losses", "kl_k3": "losses", "masked_aggregate": "losses",
    "policy_loss": "losses", "ppo_clip_loss": "losses",
    "build_causal_lm": "models", "tiny_llama_config": "models",
    "PolicyTrainer": "protocols",
    "TorchTrainer": "torch_trainer", "TrainerConfig": "torch_trainer",
    "MegatronTrainer": "megatron_trainer",
}

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
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'rollart.train' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"rollart.train.{module}"), name)
    globals()[name] = value  # resolved once
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_WHERE])
