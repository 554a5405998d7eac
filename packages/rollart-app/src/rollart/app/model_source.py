"""The policy model every part loads: the tiny demo model or a Hugging Face checkpoint directory.

Why a small picklable spec: the trainer actors and every rollout actor build the model themselves
from the same spec (same checkpoint, or same config and seed), so version 0 needs no transfer and
no state dict ever passes through the driver.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rollart import checks as check
from rollart.app.config import RunConfig
from rollart.scheduler.errors import SchedulerError

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


@dataclass(frozen=True)
class ModelSpec:
    """Enough to rebuild the policy anywhere: a checkpoint path or the tiny config, the dtype and the seed."""

    path: str | None
    dtype: str = "float32"
    tiny: dict[str, int] = field(default_factory=dict)
    seed: int = 0
    sim_model: str | None = None  # a SimEngine preset (Qwen3-8B, ...): a simulated run's shape, no weights

    def __post_init__(self) -> None:
        """Refuse a dtype no part can load."""
        # VAL: VAL_ONE_OF(self.dtype, choices=DTYPE_BYTES, exc=SchedulerError)
        check.one_of("dtype", self.dtype, DTYPE_BYTES, exc=SchedulerError)  # generated #1f27464bcc

    @classmethod
    def from_config(cls, config: RunConfig) -> ModelSpec:
        """The run's model section as a spec."""
        from rollart.app.tasks import VOCAB

        m = config.model
        tiny = {"vocab_size": len(VOCAB), "hidden_size": m.hidden_size, "intermediate_size": m.intermediate_size,
                "num_hidden_layers": m.num_layers, "num_attention_heads": m.num_heads,
                "num_key_value_heads": m.num_heads, "max_position_embeddings": m.max_positions}
        return cls(path=m.path, dtype=m.dtype, tiny=tiny, seed=config.run.seed, sim_model=m.sim_model)

    @property
    def is_checkpoint(self) -> bool:
        """True for a Hugging Face checkpoint directory."""
        return self.path is not None

    def hf_config(self) -> Any:
        """The transformers config (read from the checkpoint, or the tiny Llama's)."""
        if self.path is not None:
            from transformers import AutoConfig

            return AutoConfig.from_pretrained(self.path)
        from rollart.train.models import tiny_llama_config

        return tiny_llama_config(**self.tiny)

    def build_module(self) -> Any:
        """The causal LM with its weights: loaded from the checkpoint, or random-init from the seed."""
        import torch

        dtype = getattr(torch, self.dtype)
        if self.path is not None:
            from transformers import AutoModelForCausalLM

            return AutoModelForCausalLM.from_pretrained(self.path, dtype=dtype)
        from rollart.train.models import build_causal_lm

        return build_causal_lm(self.hf_config(), seed=self.seed).to(dtype)

    def tokenizer(self) -> Any:
        """The checkpoint's tokenizer (with its chat template), or the demo's word-level one."""
        if self.path is not None:
            from transformers import AutoTokenizer

            return AutoTokenizer.from_pretrained(self.path)
        from rollart.app.tasks import build_demo_tokenizer

        return build_demo_tokenizer()

    def pad_token_id(self, tokenizer: Any) -> int:
        """Padding id for train batches: the tokenizer's pad, else its eos, else 0."""
        for name in ("pad_token_id", "eos_token_id"):
            value = getattr(tokenizer, name, None)
            if isinstance(value, int):
                return value
        return 0

    def sim_spec(self) -> Any:
        """The shape SimEngine's roofline model needs, read from the config (no weights are built)."""
        from rollart.proxy.sim_engine import SIM_MODEL_SPECS, SimModelSpec

        if self.sim_model is not None:
            return SIM_MODEL_SPECS[self.sim_model]
        c = self.hf_config()
        heads = c.num_attention_heads
        kv_heads = getattr(c, "num_key_value_heads", None) or heads
        head_dim = getattr(c, "head_dim", None) or c.hidden_size // heads
        return SimModelSpec(name=self.path or "tiny", n_params=float(count_parameters(c)), n_layers=c.num_hidden_layers,
                            hidden_size=c.hidden_size, n_kv_heads=kv_heads, head_dim=head_dim,
                            bytes_per_param=float(DTYPE_BYTES[self.dtype]), vocab_size=c.vocab_size)


def count_parameters(c: Any) -> int:
    """Parameters of a Llama/Qwen-style decoder from its config: embeddings, attention (GQA), MLP, norms, head."""
    hidden, layers, vocab = c.hidden_size, c.num_hidden_layers, c.vocab_size
    heads = c.num_attention_heads
    kv_heads = getattr(c, "num_key_value_heads", None) or heads
    head_dim = getattr(c, "head_dim", None) or hidden // heads
    inter = c.intermediate_size
    attn = hidden * heads * head_dim + 2 * hidden * kv_heads * head_dim + heads * head_dim * hidden
    if getattr(c, "attention_bias", False) or getattr(c, "model_type", "") == "qwen2":
        attn += heads * head_dim + 2 * kv_heads * head_dim
    mlp = 3 * hidden * inter
    per_layer = attn + mlp + 2 * hidden
    head = 0 if getattr(c, "tie_word_embeddings", False) else vocab * hidden
    return vocab * hidden + layers * per_layer + hidden + head


def init_tiny_checkpoint(path: str, seed: int = 0) -> str:
    """Write a tiny random-init Hugging Face checkpoint (Llama weights, config, tokenizer) to `path`.

    Why: the example configs that load a checkpoint (`model.path`) must plan and run on a machine
    with no model downloads; this makes one locally, deterministic per seed, in a second.
    """
    # deps: rollart.proxy.testing.build_tiny_model
    # VAL: VAL_NON_EMPTY(path, exc=SchedulerError)
    check.non_empty("path", path, exc=SchedulerError)  # generated #8c38ff8b66
    # VAL: VAL_INT_RANGE(seed, min=0, max=2**32 - 1, exc=SchedulerError)
    check.int_range("seed", seed, min=0, max=2**32 - 1, exc=SchedulerError)  # generated #7f7691d862
    from rollart.proxy.testing import build_tiny_model

    return build_tiny_model(path, seed=seed)
