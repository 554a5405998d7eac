"""The two shims that let megatron-core 0.16's `GPTModel` run forward and backward on CPU.

Measured with megatron-core 0.16.1 and the local (non-Transformer-Engine) layer spec, on a torch
build without CUDA:

1. `torch.cuda.current_device()` is called while a forward runs, by megatron's global memory
   buffer (`GlobalMemoryBuffer.get_tensor` allocates "on the current CUDA device") and by RoPE
   (`RotaryEmbedding.get_emb` moves `inv_freq` there on first use). Those are the only two call
   sites hit by the tiny Llama-shaped model. On a CPU-only torch that call can only raise, so
   answering it with the CPU device changes nothing but the failures; the patch is scoped to
   the `with` block and reference-counted under a lock so nested or concurrent users are safe.
2. The training RNG tracker forks CUDA RNG states around dropout; megatron's inference-mode
   tracker makes `fork()` a no-op. RollArt trains with dropout 0, so nothing random is lost.
   The tracker is process-wide in megatron; installing it is idempotent and is not undone.

Also needed, but not a shim: pass the causal attention mask explicitly (megatron's default
mask is built with `device="cuda"`); `MegatronTrainer.forward_logits` does that.

Not shimmed (GPU-only, by design): megatron's DDP wrapper and distributed optimizer allocate
contiguous CUDA grad buffers and use CUDA streams; on CPU `MegatronTrainer` steps a torch AdamW.
On a machine with CUDA every function here is a no-op.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

import torch

_PATCH_LOCK = threading.Lock()
_patch_state: dict[str, object] = {"depth": 0, "original": None}


def _cpu_device() -> torch.device:
    return torch.device("cpu")


@contextlib.contextmanager
def cuda_current_device_on_cpu() -> Iterator[None]:
    """Context: `torch.cuda.current_device()` answers the CPU device while megatron runs.

    A no-op when CUDA is available, so GPU runs use the real device.
    """
    if torch.cuda.is_available():
        yield
        return
    with _PATCH_LOCK:
        if _patch_state["depth"] == 0:
            _patch_state["original"] = torch.cuda.current_device
            torch.cuda.current_device = _cpu_device
        _patch_state["depth"] = int(_patch_state["depth"]) + 1
    try:
        yield
    finally:
        with _PATCH_LOCK:
            _patch_state["depth"] = int(_patch_state["depth"]) - 1
            if _patch_state["depth"] == 0:
                torch.cuda.current_device = _patch_state["original"]
                _patch_state["original"] = None


def install_inference_rng_tracker() -> None:
    """Install megatron's inference-mode RNG tracker, whose forks are no-ops (no CUDA RNG)."""
    from megatron.core.tensor_parallel import random as megatron_random

    tracker = megatron_random.get_cuda_rng_tracker()
    if getattr(tracker, "is_inference_rng_tracker", False):
        return
    megatron_random.initialize_rng_tracker(inference_rng_tracker=True, force_reset=True)


@contextlib.contextmanager
def megatron_cpu_context() -> Iterator[None]:
    """Both shims when CUDA is unavailable; a no-op on GPU machines."""
    # deps: cuda_current_device_on_cpu, install_inference_rng_tracker
    if torch.cuda.is_available():
        yield
        return
    install_inference_rng_tracker()
    with cuda_current_device_on_cpu():
        yield
