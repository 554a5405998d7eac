"""`TransformersLLMClient`: a light `LLMClient` over a local `transformers` causal LM.

Why it is here and small: the real engines (vLLM, the CPU torch engine, the simulated engine)
belong to rollart-proxy; this adapter only lets rollart-env's own tests and demos drive an
EnvManager with a real model (a tiny random-init one built from a config) and check that token
ids and log-probs flow through untouched. Generation runs in a worker thread; a cancelled
caller stops waiting at once (the thread finishes its call and the result is dropped).
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from rollart import checks as check
from rollart.env.errors import EnvError
from rollart.env.protocols import GenerationRequest, GenerationResult


class TransformersLLMClient:
    """Generates with `model.generate` and reports per-token log-probs and the weight version."""

    def __init__(self, model: Any, eos_token_id: int | None, pad_token_id: int = 0, weight_version: int = 0) -> None:
        """Wrap a `transformers` causal LM (already on its device, in eval mode)."""
        # VAL: VAL_INT_RANGE(weight_version, min=0, max=2**62, exc=EnvError)
        check.int_range("weight_version", weight_version, min=0, max=2**62, exc=EnvError)  # generated #6283854864
        self.model = model
        self.eos_token_id = eos_token_id
        self.pad_token_id = pad_token_id
        self.weight_version = weight_version
        self._lock = threading.Lock()

    async def generate(self, request: GenerationRequest) -> GenerationResult:
        """Run one generation in a thread (the event loop keeps serving other managers)."""
        # deps: TransformersLLMClient.generate_sync
        return await asyncio.to_thread(self.generate_sync, request)

    def generate_sync(self, request: GenerationRequest) -> GenerationResult:
        """The blocking generation: sample, then read the log-prob of each chosen token."""
        # VAL: VAL_NON_EMPTY(request.prompt_ids, exc=EnvError)
        check.non_empty("request.prompt_ids", request.prompt_ids, exc=EnvError)  # generated #ffab11f8f7
        import torch

        sampling = request.sampling
        do_sample = sampling.temperature > 0
        kwargs: dict[str, Any] = {
            "max_new_tokens": request.max_tokens,
            "do_sample": do_sample,
            "return_dict_in_generate": True,
            "output_scores": True,
            "pad_token_id": self.pad_token_id,
            "eos_token_id": self.eos_token_id,
        }
        if do_sample:
            kwargs.update(temperature=sampling.temperature, top_p=sampling.top_p)
            kwargs["top_k"] = sampling.top_k if sampling.top_k > 0 else None
        input_ids = torch.tensor([request.prompt_ids], dtype=torch.long)
        with self._lock, torch.no_grad():
            if sampling.seed is not None:
                torch.manual_seed(sampling.seed)
            out = self.model.generate(input_ids, attention_mask=torch.ones_like(input_ids), **kwargs)
            scores = self.model.compute_transition_scores(out.sequences, out.scores, normalize_logits=True)
        new_ids = out.sequences[0, input_ids.shape[1] :].tolist()
        logprobs = scores[0, : len(new_ids)].tolist()
        finish = "stop" if new_ids and new_ids[-1] == self.eos_token_id else "length"
        return GenerationResult(
            token_ids=new_ids,
            logprobs=[float(x) for x in logprobs],
            weight_versions=[self.weight_version] * len(new_ids),
            finish_reason=finish,
        )
