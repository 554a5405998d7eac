"""rollart.train: RL advantages and losses (GRPO, PPO-clip) and training workers: torch on CPU, megatron-core on GPUs."""

__version__ = "0.1.0"
