"""`MegatronTrainer`: the TorchTrainer step loop on a megatron-core `GPTModel`.

Imported lazily (`rollart.train.MegatronTrainer` resolves on first access) so `rollart.train`
works without megatron-core; install the `[megatron]` extra for it.

What runs where: model construction (tensor-parallel size 1), forward, the PPO loss, backward,
gradient clipping and a torch AdamW step run on CPU through `rollart.train.megatron_cpu_shims`
and are tested here. Megatron's DDP wrapper and distributed optimizer need CUDA (contiguous CUDA
grad buffers, CUDA streams); they, tensor/pipeline parallel sizes > 1 and bf16 are left to GPU
machines and are not wired yet (design doc D7).
"""

from __future__ import annotations

import torch
from transformers import LlamaConfig

from rollart import checks as check
from rollart.train.errors import TrainError
from rollart.train.megatron_convert import (
    hf_to_megatron_state_dict,
    megatron_config_from_hf,
    megatron_to_hf_state_dict,
    rope_theta,
)
from rollart.train.megatron_cpu_shims import megatron_cpu_context
from rollart.train.torch_trainer import TorchTrainer, TrainerConfig

try:
    from megatron.core import parallel_state
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "MegatronTrainer needs megatron-core: pip install 'rollart-train[megatron]'"
    ) from exc


def _is_weight(name: str, value: object) -> bool:
    return isinstance(value, torch.Tensor) and not name.endswith("_extra_state")


class MegatronTrainer(TorchTrainer):
    """The same step loop on a megatron-core GPTModel (TP=1 here; CPU via the shims).

    The caller owns the process group: `torch.distributed` and megatron's parallel state
    (`parallel_state.initialize_model_parallel`) must be initialized before construction, as in
    any megatron program; on one CPU process a gloo group of world size 1 on 127.0.0.1 does.
    """

    def __init__(
        self,
        hf_config: LlamaConfig,
        config: TrainerConfig | None = None,
        hf_state_dict: dict[str, torch.Tensor] | None = None,
        seed: int = 0,
        process_group: object = None,
        device: str | None = None,
    ) -> None:
        """Build GPTModel from the HF config; needs torch.distributed and megatron parallel state.

        Args:
            hf_config: the Llama config the proxy and the TorchTrainer use for the same model.
            config: optimizer, step and loss knobs.
            hf_state_dict: start from these HF-named weights (e.g. `build_causal_lm(...).state_dict()`)
                instead of megatron's random init, so every engine starts from one version 0.
            seed: torch seed of megatron's CPU initialization when no weights are given.
            process_group: data-parallel replicas that average gradients with this one (TorchTrainer D12);
                None for a single replica.
            device: where the built model moves (`cuda:0` from Ray's assignment, D27); None keeps it on CPU.
        """
        # deps: megatron_config_from_hf, hf_to_megatron_state_dict
        # AST: AST_PRECONDITION(parallel_state.model_parallel_is_initialized(), got=torch.distributed.is_initialized(), msg="megatron parallel state is initialized (initialize_model_parallel); got is torch.distributed.is_initialized()", exc=TrainError)
        check.precondition(parallel_state.model_parallel_is_initialized(), "megatron parallel state is initialized (initialize_model_parallel); got is torch.distributed.is_initialized()", got_lazy=lambda: torch.distributed.is_initialized(), exc=TrainError)  # generated #b68c6c029a
        self.hf_config = hf_config
        transformer_config = megatron_config_from_hf(hf_config)
        with megatron_cpu_context(), torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            model = GPTModel(
                config=transformer_config,
                transformer_layer_spec=get_gpt_layer_local_spec(normalization="RMSNorm"),
                vocab_size=hf_config.vocab_size,
                max_sequence_length=hf_config.max_position_embeddings,
                position_embedding_type="rope",
                rotary_base=rope_theta(hf_config),
                share_embeddings_and_output_weights=bool(hf_config.tie_word_embeddings),
            )
        if hf_state_dict is not None:
            result = model.load_state_dict(hf_to_megatron_state_dict(hf_state_dict, hf_config), strict=False)
            missing = [k for k in result.missing_keys if not k.endswith("_extra_state")]
            if missing or result.unexpected_keys:
                raise TrainError(
                    f"hf_state_dict must hold every Llama weight, missing {missing!r}, unexpected {result.unexpected_keys!r}"
                )
        super().__init__(model, config, process_group=process_group, device=device)

    def forward_logits(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """GPTModel forward with explicit position ids and causal mask, under the CPU shims.

        Batches are right-padded, so a causal mask alone keeps padding out of every real
        token's attention; padded positions produce logits the loss mask ignores.
        """
        # deps: megatron_cpu_context
        device = next(self.model.parameters()).device
        input_ids = input_ids.to(device)
        length = input_ids.shape[1]
        position_ids = torch.arange(length, device=device).unsqueeze(0).expand_as(input_ids)
        causal = torch.triu(torch.ones(length, length, dtype=torch.bool, device=device), diagonal=1)[None, None]
        with megatron_cpu_context():
            return self.model(input_ids, position_ids, attention_mask=causal)

    def named_tensors(self, copy: bool = True) -> dict[str, torch.Tensor]:
        """Weights under HF Llama names, loadable by TorchEngine / vLLM (views where the names map 1:1 with `copy=False`)."""
        # deps: megatron_to_hf_state_dict
        state = {k: v for k, v in self.model.state_dict().items() if _is_weight(k, v)}
        return {k: v.detach().clone() if copy else v.detach() for k, v in megatron_to_hf_state_dict(state, self.hf_config).items()}
