"""Trainer memory of a simulated RL step (design D24): does the trainer fit on its devices, and if not, by how much.

Why a closed form: the simulator must refuse a train/rollout split whose trainer cannot hold the model
(the blog's 128-GPU trainer for Qwen3-235B-A22B at 64K was forced by memory, not chosen), and
`rollart plan` must say so before anything starts. No torch here: `rollart plan` imports it.

Per device, for P parameters on n devices of HBM H (usable 0.9 H, the engines' `kv_fraction`):
    states       18 P / n: bf16 weights (2) + fp32 gradients (4) + fp32 master weights and Adam's two
                 moments (12), fully sharded over the n devices (Megatron's distributed optimizer with
                 model parallelism, or ZeRO-3 / FSDP): the least any layout holds
    activations  one sequence of S tokens at a time (micro-batch 1) with full recomputation: the input
                 of every layer (2 h L bytes a token), one layer's working set (34 h, Korthikanti et al.
                 2022 without the s^2 term: flash attention) and the fp32 logits (4 V), split over a
                 sequence-parallel group of min(n, gpus_per_node) devices (context parallel in a node)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

from rollart import checks as check
from rollart.train.errors import TrainError

STATE_BYTES_PER_PARAM = 18.0
"""bf16 weights 2 + fp32 gradients 4 + fp32 master weights 4 + Adam m and v 8."""
USABLE_FRACTION = 0.9
"""Share of HBM a trainer may fill (CUDA context, allocator fragmentation): the engines' kv_fraction."""


class TrainerHardware(Protocol):
    """The fields of rollart-resource's HardwareSpec the memory model reads."""

    name: str
    """The catalogue name (H800, H20, ...), for the shortfall message."""
    hbm_gb: float
    """Device memory in GB; 90% of it is usable for the trainer's states and activations."""
    gpus_per_node: int
    """Devices per node: activations of one sequence split over at most this many (one node's parallel group)."""


@dataclass(frozen=True)
class TrainerMemory:
    """Bytes per trainer device (weights, gradients, optimizer states, activations) against what one device holds."""

    model: str
    context_tokens: int
    devices: int
    hardware: str
    hbm_gb: float
    weights: float
    grads: float
    optimizer: float
    activations: float
    usable: float
    min_devices: int | None

    @property
    def per_device(self) -> float:
        """Everything one device holds."""
        return self.weights + self.grads + self.optimizer + self.activations

    @property
    def fits(self) -> bool:
        """Whether one device holds its share."""
        return self.per_device <= self.usable

    def shortfall(self) -> str:
        """One line: what the trainer needs, how much is missing, the least device count that fits."""
        need = self.per_device * self.devices
        short = (self.per_device - self.usable) * self.devices
        least = f"at least {self.min_devices} devices" if self.min_devices else \
            f"no device count holds one {self.context_tokens:,}-token sequence's activations"
        return (f"trainer: {self.model} at {self.context_tokens:,} tokens needs {need / 1e12:.2f} TB on {self.devices} x "
                f"{self.hardware} ({self.hbm_gb:g} GB, {self.usable / 1e9:.0f} GB usable): {short / 1e12:.2f} TB short; {least}")


def _activation_bytes(n_layers: int, hidden_size: int, vocab_size: int, context_tokens: int) -> float:
    return context_tokens * (2.0 * hidden_size * n_layers + 34.0 * hidden_size + 4.0 * vocab_size)


def trainer_memory(model: str, n_params: float, n_layers: int, hidden_size: int, vocab_size: int, context_tokens: int,
                   devices: int, hardware: TrainerHardware) -> TrainerMemory:
    """Per-device memory of a fully sharded trainer at `context_tokens` (module docstring), and the least devices that fit."""
    # deps: none
    # VAL: VAL_POSITIVE(n_params, exc=TrainError)
    check.positive("n_params", n_params, exc=TrainError)  # generated #3b1a3e238f
    # VAL: VAL_INT_RANGE(context_tokens, min=1, max=1 << 30, exc=TrainError)
    check.int_range("context_tokens", context_tokens, min=1, max=1 << 30, exc=TrainError)  # generated #4faf4aa4bd
    # VAL: VAL_INT_RANGE(devices, min=1, max=1 << 20, exc=TrainError)
    check.int_range("devices", devices, min=1, max=1 << 20, exc=TrainError)  # generated #e9bc0cbd5b
    usable = hardware.hbm_gb * 1e9 * USABLE_FRACTION
    act = _activation_bytes(n_layers, hidden_size, vocab_size, context_tokens)
    group = hardware.gpus_per_node

    def need(n: int) -> float:
        return STATE_BYTES_PER_PARAM * n_params / n + act / min(n, group)

    least = next((n for n in range(1, group) if need(n) <= usable), None)
    if least is None and usable > act / group:
        least = max(group, math.ceil(STATE_BYTES_PER_PARAM * n_params / (usable - act / group)))
    return TrainerMemory(model, context_tokens, devices, hardware.name, hardware.hbm_gb,
                         weights=2.0 * n_params / devices, grads=4.0 * n_params / devices,
                         optimizer=12.0 * n_params / devices, activations=act / min(devices, group), usable=usable,
                         min_devices=least)
