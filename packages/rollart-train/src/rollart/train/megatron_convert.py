"""Llama <-> megatron-core GPTModel: the config and the weight-name mapping.

rollart-sync publishes HF `state_dict` names so the proxy's engines load weights by name; a
megatron model therefore exports through this mapping (layer i):

| HF Llama                                   | megatron GPTModel (local spec)                  |
|--------------------------------------------|-------------------------------------------------|
| model.embed_tokens.weight                  | embedding.word_embeddings.weight                |
| model.layers.i.input_layernorm.weight      | decoder.layers.i.input_layernorm.weight         |
| model.layers.i.self_attn.{q,k,v}_proj.weight | decoder.layers.i.self_attention.linear_qkv.weight (fused, per query group: q heads, k, v) |
| model.layers.i.self_attn.o_proj.weight     | decoder.layers.i.self_attention.linear_proj.weight |
| model.layers.i.post_attention_layernorm.weight | decoder.layers.i.pre_mlp_layernorm.weight   |
| model.layers.i.mlp.{gate,up}_proj.weight   | decoder.layers.i.mlp.linear_fc1.weight (gate rows first, then up) |
| model.layers.i.mlp.down_proj.weight        | decoder.layers.i.mlp.linear_fc2.weight          |
| model.norm.weight                          | decoder.final_layernorm.weight                  |
| lm_head.weight                             | output_layer.weight                             |

Megatron's `_extra_state` entries (None without Transformer Engine) are not weights and are
dropped.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from transformers import LlamaConfig

from rollart import checks as check
from rollart.train.errors import TrainError

if TYPE_CHECKING:
    from megatron.core.transformer.transformer_config import TransformerConfig

SUPPORTED_MODEL_TYPES = ("llama",)


def _head_dim(hf_config: LlamaConfig) -> int:
    return int(getattr(hf_config, "head_dim", None) or hf_config.hidden_size // hf_config.num_attention_heads)


def rope_theta(hf_config: LlamaConfig) -> float:
    """RoPE base of a Llama config (transformers 5 keeps it in `rope_parameters`)."""
    params = getattr(hf_config, "rope_parameters", None) or {}
    return float(params.get("rope_theta", getattr(hf_config, "rope_theta", 10000.0)))


def megatron_config_from_hf(hf_config: LlamaConfig) -> TransformerConfig:
    """The megatron TransformerConfig of the same Llama architecture.

    RMSNorm, SwiGLU (gated linear unit with SiLU), grouped-query attention, no biases, dropout 0
    (RL log-probs must be deterministic) and no fused kernels (they need CUDA / Apex / TE).
    """
    # VAL: VAL_ONE_OF(hf_config.model_type, choices=SUPPORTED_MODEL_TYPES, exc=TrainError)
    check.one_of("hf_config.model_type", hf_config.model_type, SUPPORTED_MODEL_TYPES, exc=TrainError)  # generated #a7b6e9aa43
    from megatron.core.transformer.transformer_config import TransformerConfig

    return TransformerConfig(
        num_layers=hf_config.num_hidden_layers,
        hidden_size=hf_config.hidden_size,
        ffn_hidden_size=hf_config.intermediate_size,
        num_attention_heads=hf_config.num_attention_heads,
        num_query_groups=hf_config.num_key_value_heads,
        kv_channels=_head_dim(hf_config),
        normalization="RMSNorm",
        layernorm_epsilon=hf_config.rms_norm_eps,
        gated_linear_unit=True,
        activation_func=torch.nn.functional.silu,
        add_bias_linear=False,
        add_qkv_bias=False,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        bias_activation_fusion=False,
        bias_dropout_fusion=False,
        masked_softmax_fusion=False,
        persist_layer_norm=False,
        apply_rope_fusion=False,
        gradient_accumulation_fusion=False,
        use_cpu_initialization=not torch.cuda.is_available(),
        params_dtype=torch.float32,
    )


def _qkv_sizes(hf_config: LlamaConfig) -> tuple[int, int, int]:
    groups = hf_config.num_key_value_heads
    return groups, hf_config.num_attention_heads // groups, _head_dim(hf_config)


def megatron_to_hf_state_dict(state: dict[str, torch.Tensor], hf_config: LlamaConfig) -> dict[str, torch.Tensor]:
    """Rename and split megatron tensors into HF Llama names (see the module table)."""
    groups, heads_per_group, head_dim = _qkv_sizes(hf_config)
    hidden = hf_config.hidden_size
    out: dict[str, torch.Tensor] = {
        "model.embed_tokens.weight": state["embedding.word_embeddings.weight"],
        "model.norm.weight": state["decoder.final_layernorm.weight"],
    }
    if "output_layer.weight" in state:
        out["lm_head.weight"] = state["output_layer.weight"]
    for i in range(hf_config.num_hidden_layers):
        src, dst = f"decoder.layers.{i}.", f"model.layers.{i}."
        out[dst + "input_layernorm.weight"] = state[src + "input_layernorm.weight"]
        out[dst + "post_attention_layernorm.weight"] = state[src + "pre_mlp_layernorm.weight"]
        qkv = state[src + "self_attention.linear_qkv.weight"].view(groups, (heads_per_group + 2) * head_dim, hidden)
        q, k, v = torch.split(qkv, [heads_per_group * head_dim, head_dim, head_dim], dim=1)
        out[dst + "self_attn.q_proj.weight"] = q.reshape(-1, hidden)
        out[dst + "self_attn.k_proj.weight"] = k.reshape(-1, hidden)
        out[dst + "self_attn.v_proj.weight"] = v.reshape(-1, hidden)
        out[dst + "self_attn.o_proj.weight"] = state[src + "self_attention.linear_proj.weight"]
        gate, up = torch.chunk(state[src + "mlp.linear_fc1.weight"], 2, dim=0)
        out[dst + "mlp.gate_proj.weight"] = gate
        out[dst + "mlp.up_proj.weight"] = up
        out[dst + "mlp.down_proj.weight"] = state[src + "mlp.linear_fc2.weight"]
    return out


def hf_to_megatron_state_dict(state: dict[str, torch.Tensor], hf_config: LlamaConfig) -> dict[str, torch.Tensor]:
    """The inverse of megatron_to_hf_state_dict, to start megatron from HF weights."""
    groups, heads_per_group, head_dim = _qkv_sizes(hf_config)
    hidden = hf_config.hidden_size
    out: dict[str, torch.Tensor] = {
        "embedding.word_embeddings.weight": state["model.embed_tokens.weight"],
        "decoder.final_layernorm.weight": state["model.norm.weight"],
        "output_layer.weight": state.get("lm_head.weight", state["model.embed_tokens.weight"]),
    }
    for i in range(hf_config.num_hidden_layers):
        src, dst = f"model.layers.{i}.", f"decoder.layers.{i}."
        out[dst + "input_layernorm.weight"] = state[src + "input_layernorm.weight"]
        out[dst + "pre_mlp_layernorm.weight"] = state[src + "post_attention_layernorm.weight"]
        q = state[src + "self_attn.q_proj.weight"].view(groups, heads_per_group * head_dim, hidden)
        k = state[src + "self_attn.k_proj.weight"].view(groups, head_dim, hidden)
        v = state[src + "self_attn.v_proj.weight"].view(groups, head_dim, hidden)
        out[dst + "self_attention.linear_qkv.weight"] = torch.cat([q, k, v], dim=1).reshape(-1, hidden)
        out[dst + "self_attention.linear_proj.weight"] = state[src + "self_attn.o_proj.weight"]
        out[dst + "mlp.linear_fc1.weight"] = torch.cat(
            [state[src + "mlp.gate_proj.weight"], state[src + "mlp.up_proj.weight"]], dim=0
        )
        out[dst + "mlp.linear_fc2.weight"] = state[src + "mlp.down_proj.weight"]
    return out
