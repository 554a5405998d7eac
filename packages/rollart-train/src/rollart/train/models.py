"""The tiny causal LM every CPU run shares, built from a config (random init, no downloads)."""

from __future__ import annotations

import torch
from transformers import AutoModelForCausalLM, LlamaConfig, PretrainedConfig

from rollart import checks as check
from rollart.train.errors import TrainError


def tiny_llama_config(
    vocab_size: int = 512,
    hidden_size: int = 64,
    intermediate_size: int = 128,
    num_hidden_layers: int = 2,
    num_attention_heads: int = 4,
    num_key_value_heads: int = 2,
    max_position_embeddings: int = 256,
) -> LlamaConfig:
    """The tiny Llama the CPU demo, tests and benchmarks share.

    Untied embeddings and head so the weight names map one-to-one onto megatron's
    `output_layer` (see `rollart.train.megatron_convert`); GQA (4 query heads, 2 KV heads)
    so the QKV split is exercised.
    """
    # VAL: VAL_INT_RANGE(vocab_size, min=2, max=1_000_000, exc=TrainError)
    check.int_range("vocab_size", vocab_size, min=2, max=1_000_000, exc=TrainError)  # generated #5e44da83b3
    return LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_hidden_layers,
        num_attention_heads=num_attention_heads,
        num_key_value_heads=num_key_value_heads,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=False,
        attention_dropout=0.0,
    )


def build_causal_lm(config: PretrainedConfig, seed: int = 0) -> torch.nn.Module:
    """A randomly initialized HF causal LM, deterministic in `seed`.

    The scheduler, the proxy's TorchEngine and the trainer each call this with the same config
    and seed and get the same weights, so version 0 needs no transfer. The global torch RNG is
    forked, not consumed, so building a model does not change the caller's random stream.
    """
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config)
    return model
