"""Token sampling shared by the torch engine: greedy, temperature, top-k, top-p, with seeds.

Log-probs are those of the *raw* model distribution (log-softmax of the logits before
temperature and filtering), the same convention as vLLM's default ``raw_logprobs``: the trainer
compares them with its own forward pass, which knows nothing of the sampling knobs.
"""

from __future__ import annotations

import torch

from rollart.proxy.types import SamplingParams


def sample_next(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None) -> tuple[int, float]:
    """Pick the next token from one row of logits; return it with its raw log-prob."""
    logits = logits.float()
    logprobs = torch.log_softmax(logits, dim=-1)
    if params.temperature == 0:
        token = int(torch.argmax(logits).item())
        return token, float(logprobs[token].item())
    scaled = logits / params.temperature
    if params.top_k > 0 and params.top_k < scaled.numel():
        kth = torch.topk(scaled, params.top_k).values[-1]
        scaled = scaled.masked_fill(scaled < kth, float("-inf"))
    if params.top_p < 1.0:
        sorted_logits, order = torch.sort(scaled, descending=True)
        probs = torch.softmax(sorted_logits, dim=-1)
        cumulative = torch.cumsum(probs, dim=-1)
        drop = cumulative - probs > params.top_p  # keep the smallest prefix whose mass reaches top_p
        sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
        scaled = torch.full_like(scaled, float("-inf")).scatter(0, order, sorted_logits)
    probs = torch.softmax(scaled, dim=-1)
    token = int(torch.multinomial(probs, 1, generator=generator).item())
    return token, float(logprobs[token].item())
