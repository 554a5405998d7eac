"""TorchEngine: a real continuous-batching engine over a Hugging Face causal LM, on CPU.

Each request keeps its own KV cache (one key/value tensor pair per layer). A step either prefills
newly admitted requests (each on its own, without padding, so greedy output is what
``transformers.generate`` computes) or decodes one token for every running request in one batched
forward over a left-padded batched cache with an attention mask and per-row position ids. The
batched cache persists between steps: a finished request's row is dropped, a newly prefilled
request's cache is padded and appended, so no step re-pads the whole batch.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field

import torch

from rollart.proxy.errors import ProxyError
from rollart.proxy.sampling import sample_next
from rollart.proxy.types import (
    FINISH_ABORT,
    FINISH_LENGTH,
    FINISH_STOP,
    EngineLoad,
    EngineOutput,
    EngineRequest,
)
from rollart.proxy.weight_identity import holds_weights
from rollart.resource import checks as check


@dataclass
class _Sequence:
    """A request inside the engine: its generated tokens and its KV cache (None = to prefill)."""

    request: EngineRequest
    token_ids: list[int]
    logprobs: list[float]
    versions: list[int]
    generator: torch.Generator | None
    cache: list[tuple[torch.Tensor, torch.Tensor]] | None = None
    finish_reason: str | None = None
    stop_set: frozenset[int] = field(default_factory=frozenset)

    @property
    def context_len(self) -> int:
        return len(self.request.prompt_ids) + len(self.token_ids)

    def output(self, reason: str | None) -> EngineOutput:
        return EngineOutput(
            request_id=self.request.request_id,
            token_ids=tuple(self.token_ids),
            logprobs=tuple(self.logprobs),
            token_versions=tuple(self.versions),
            finish_reason=reason,
        )


class TorchEngine:
    """Continuous batching over a ``transformers`` causal LM (CPU, float32), per-request KV cache."""

    def __init__(
        self,
        model: torch.nn.Module,
        *,
        max_num_seqs: int = 16,
        max_kv_tokens: int = 8192,
        max_prefills_per_step: int = 4,
        version: int = 0,
        offload_to_thread: bool = True,
    ) -> None:
        """Wrap a loaded model; ``offload_to_thread`` runs forwards off the event loop thread."""
        # VAL: VAL_INT_RANGE(max_num_seqs, min=1, max=4096, exc=ProxyError)
        check.int_range("max_num_seqs", max_num_seqs, min=1, max=4096, exc=ProxyError)  # generated #9935161f6a
        # VAL: VAL_INT_RANGE(max_kv_tokens, min=1, max=1 << 30, exc=ProxyError)
        check.int_range("max_kv_tokens", max_kv_tokens, min=1, max=1 << 30, exc=ProxyError)  # generated #b77dd22dcb
        # VAL: VAL_INT_RANGE(max_prefills_per_step, min=1, max=4096, exc=ProxyError)
        check.int_range("max_prefills_per_step", max_prefills_per_step, min=1, max=4096, exc=ProxyError)  # generated #05662c408b
        self._model = model.eval()
        self._max_num_seqs = max_num_seqs
        self._max_kv_tokens = max_kv_tokens
        self._max_prefills = max_prefills_per_step
        self._version = version
        self._to_thread = offload_to_thread
        self._waiting: deque[_Sequence] = deque()
        self._running: dict[str, _Sequence] = {}
        self._host_params: dict[str, torch.Tensor] | None = None
        # the running batch's KV, left-padded: row i is sequence self._batch[i] with self._batch_lens[i] tokens
        self._batch: list[_Sequence] = []
        self._batch_lens: list[int] = []
        self._batch_keys: list[torch.Tensor] = []
        self._batch_values: list[torch.Tensor] = []
        self._param_names = {name for name, _ in model.named_parameters()}

    @classmethod
    def from_pretrained(cls, path: str, **kwargs: object) -> TorchEngine:
        """Load a local model directory (no downloads) in float32 with eager attention."""
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="eager")
        return cls(model, **kwargs)  # type: ignore[arg-type]

    @property
    def version(self) -> int:
        """The weight version now served."""
        return self._version

    @property
    def model(self) -> torch.nn.Module:
        """The wrapped model (the same object the weight loader writes into)."""
        return self._model

    def add_request(self, request: EngineRequest) -> None:
        """Queue a request; resumed requests keep their generated tokens and recompute their KV."""
        # VAL: VAL_NON_EMPTY(request.prompt_ids, exc=ProxyError)
        check.non_empty("request.prompt_ids", request.prompt_ids, exc=ProxyError)  # generated #1d2562ad28
        # VAL: VAL_POSITIVE(request.remaining_tokens, exc=ProxyError)
        check.positive("request.remaining_tokens", request.remaining_tokens, exc=ProxyError)  # generated #002811cb2c
        # AST: AST_PRECONDITION(request.request_id not in self._ids(), got=request.request_id, msg="request id not already in the engine")
        check.precondition(request.request_id not in self._ids(), "request id not already in the engine", got=request.request_id)  # generated #a7681b5720
        needed = len(request.context_ids) + request.remaining_tokens
        # VAL: VAL_INT_RANGE(needed, min=1, max=self._max_kv_tokens, exc=ProxyError)
        check.int_range("needed", needed, min=1, max=self._max_kv_tokens, exc=ProxyError)  # generated #3cf1f6a281
        generator = None
        if request.params.seed is not None:
            generator = torch.Generator().manual_seed(request.params.seed + len(request.generated_ids))
        self._waiting.append(
            _Sequence(
                request=request,
                token_ids=list(request.generated_ids),
                logprobs=list(request.generated_logprobs),
                versions=list(request.generated_versions),
                generator=generator,
                stop_set=frozenset(request.params.stop_token_ids),
            )
        )

    def _ids(self) -> set[str]:
        return set(self._running) | {s.request.request_id for s in self._waiting}

    def abort_request(self, request_id: str) -> EngineOutput:
        """Remove a request, returning its tokens so far (so a migration keeps them)."""
        # VAL: VAL_ONE_OF(request_id, choices=self._ids(), exc=ProxyError)
        check.one_of("request_id", request_id, self._ids(), exc=ProxyError)  # generated #b6094f5c03
        seq = self._running.pop(request_id, None)
        if seq is None:
            seq = next(s for s in self._waiting if s.request.request_id == request_id)
            self._waiting.remove(seq)
        return seq.output(FINISH_ABORT)

    def has_work(self) -> bool:
        """Whether a step would make progress."""
        return bool(self._waiting or self._running)

    def load(self) -> EngineLoad:
        """Occupancy for routing: KV is reserved for prompt + max tokens of every admitted request."""
        reserved = sum(s.context_len + s.request.remaining_tokens for s in self._running.values())
        in_flight = reserved + sum(s.context_len + s.request.remaining_tokens for s in self._waiting)
        return EngineLoad(
            running=len(self._running),
            waiting=len(self._waiting),
            tokens_in_flight=in_flight,
            free_kv_tokens=max(self._max_kv_tokens - reserved, 0),
        )

    async def step(self) -> list[EngineOutput]:
        """One prefill step if requests can be admitted, else one batched decode step."""
        if self._host_params is not None:
            raise ProxyError("TorchEngine.step: weights are offloaded; reload() first")
        admitted = self._admit()
        if admitted:
            work = lambda: self._prefill(admitted)  # noqa: E731
        elif self._running:
            work = self._decode
        else:
            return []
        if self._to_thread:
            return await asyncio.to_thread(work)
        return work()

    def _admit(self) -> list[_Sequence]:
        admitted: list[_Sequence] = []
        reserved = self._max_kv_tokens - self.load().free_kv_tokens
        while self._waiting and len(admitted) < self._max_prefills:
            if len(self._running) + len(admitted) >= self._max_num_seqs:
                break
            seq = self._waiting[0]
            need = seq.context_len + seq.request.remaining_tokens
            if reserved + need > self._max_kv_tokens:
                break
            reserved += need
            admitted.append(self._waiting.popleft())
        return admitted

    @torch.no_grad()
    def _prefill(self, seqs: list[_Sequence]) -> list[EngineOutput]:
        finished: list[EngineOutput] = []
        for seq in seqs:
            ids = torch.tensor([list(seq.request.prompt_ids) + seq.token_ids], dtype=torch.long)
            out = self._model(input_ids=ids, use_cache=True)
            seq.cache = [(layer.keys, layer.values) for layer in out.past_key_values.layers]
            self._running[seq.request.request_id] = seq
            done = self._append(seq, out.logits[0, -1])
            if done is not None:
                finished.append(done)
        return finished

    def _sync_batch(self) -> None:
        """Make the batched cache hold exactly the running requests: drop finished or aborted rows,
        trim columns that are padding in every row, and merge newly prefilled requests."""
        keep = [i for i, seq in enumerate(self._batch) if self._running.get(seq.request.request_id) is seq]
        if not keep:
            self._batch, self._batch_lens, self._batch_keys, self._batch_values = [], [], [], []
        elif len(keep) != len(self._batch):
            index = torch.tensor(keep, dtype=torch.long)
            self._batch_keys = [k.index_select(0, index) for k in self._batch_keys]
            self._batch_values = [v.index_select(0, index) for v in self._batch_values]
            self._batch = [self._batch[i] for i in keep]
            self._batch_lens = [self._batch_lens[i] for i in keep]
        if self._batch:
            width, longest = self._batch_keys[0].shape[2], max(self._batch_lens)
            if longest < width:
                self._batch_keys = [k[:, :, width - longest :] for k in self._batch_keys]
                self._batch_values = [v[:, :, width - longest :] for v in self._batch_values]
        in_batch = {id(seq) for seq in self._batch}
        joining = [seq for seq in self._running.values() if id(seq) not in in_batch]
        if not joining:
            return
        lens = [seq.cache[0][0].shape[2] for seq in joining]  # type: ignore[index]
        longest = max(lens + self._batch_lens)
        n_layers = len(joining[0].cache or [])
        keys, values = [], []
        for layer in range(n_layers):
            k_parts, v_parts = [], []
            if self._batch:
                pad = longest - self._batch_keys[layer].shape[2]
                k_parts.append(torch.nn.functional.pad(self._batch_keys[layer], (0, 0, pad, 0)))
                v_parts.append(torch.nn.functional.pad(self._batch_values[layer], (0, 0, pad, 0)))
            for seq, length in zip(joining, lens):
                k, v = seq.cache[layer]  # type: ignore[index]
                k_parts.append(torch.nn.functional.pad(k, (0, 0, longest - length, 0)))
                v_parts.append(torch.nn.functional.pad(v, (0, 0, longest - length, 0)))
            keys.append(torch.cat(k_parts))
            values.append(torch.cat(v_parts))
        self._batch_keys, self._batch_values = keys, values
        for seq in joining:
            seq.cache = None  # its KV now lives in the batched cache
        self._batch += joining
        self._batch_lens += lens

    @torch.no_grad()
    def _decode(self) -> list[EngineOutput]:
        """One token for every running request, on a left-padded batched KV cache that persists
        between steps (rows leave when a request ends, join after its prefill)."""
        from transformers import DynamicCache

        self._sync_batch()
        seqs = list(self._batch)
        longest = self._batch_keys[0].shape[2]
        lens = torch.tensor(self._batch_lens, dtype=torch.long)
        mask = (torch.arange(longest + 1)[None, :] >= (longest - lens)[:, None]).long()
        input_ids = torch.tensor([[seq.token_ids[-1]] for seq in seqs], dtype=torch.long)
        out = self._model(
            input_ids=input_ids,
            attention_mask=mask,
            position_ids=lens[:, None],
            past_key_values=DynamicCache(list(zip(self._batch_keys, self._batch_values))),
            use_cache=True,
        )
        layers = out.past_key_values.layers
        self._batch_keys = [layer.keys for layer in layers]
        self._batch_values = [layer.values for layer in layers]
        self._batch_lens = [length + 1 for length in self._batch_lens]
        finished: list[EngineOutput] = []
        for row, seq in enumerate(seqs):
            done = self._append(seq, out.logits[row, -1])
            if done is not None:
                finished.append(done)
        return finished

    def _append(self, seq: _Sequence, logits: torch.Tensor) -> EngineOutput | None:
        token, logprob = sample_next(logits, seq.request.params, seq.generator)
        seq.token_ids.append(token)
        seq.logprobs.append(logprob)
        seq.versions.append(self._version)
        reason = None
        if token in seq.stop_set:
            reason = FINISH_STOP
        elif len(seq.token_ids) >= seq.request.params.max_tokens:
            reason = FINISH_LENGTH
        if reason is None:
            return None
        del self._running[seq.request.request_id]
        return seq.output(reason)

    async def offload(self) -> None:
        """Move the parameters out of the model into a host-side dict.

        On a GPU this is the copy to pinned host memory that frees HBM; on CPU the tensors stay in
        the same memory, so offload only detaches them (the engine refuses to step until reload).
        """
        # AST: AST_PRECONDITION(not self.has_work(), got=sorted(self._ids()), msg="engine empty before offload")
        check.precondition(not self.has_work(), "engine empty before offload", got_lazy=lambda: sorted(self._ids()))  # generated #38704b3a1f
        if self._host_params is not None:
            return
        host: dict[str, torch.Tensor] = {}
        for name, param in self._model.named_parameters():
            host[name] = param.data
            param.data = torch.empty(0, dtype=param.dtype)
        self._host_params = host

    async def reload(self) -> None:
        """Put the offloaded parameters back."""
        if self._host_params is None:
            return
        for name, param in self._model.named_parameters():
            param.data = self._host_params[name]
        self._host_params = None

    async def load_weights(self, weights: Mapping[str, torch.Tensor], version: int) -> None:
        """Copy named tensors into the model; running requests recompute their KV under them.

        The version served now is accepted again only with bit-equal tensors (a no-op): a version
        names one set of weights, and every token is tagged with it.
        """
        # VAL: VAL_VERSION_MONOTONIC(version, self._version, strict=False, exc=ProxyError)
        check.version_monotonic("version", version, self._version, strict=False, exc=ProxyError)  # generated #446e2b7c63
        # VAL: VAL_SUBSET(weights.keys(), of=self._param_names, name="weight names", exc=ProxyError)
        check.subset("weight names", weights.keys(), of=self._param_names, exc=ProxyError)  # generated #b08ab1394d
        # AST: AST_PRECONDITION(version != self._version or holds_weights(self._host_params or dict(self._model.named_parameters()), weights), got=version, msg="the version served now is re-sent only with the weights it serves (publish changed weights under a new version)", exc=ProxyError)
        check.precondition(version != self._version or holds_weights(self._host_params or dict(self._model.named_parameters()), weights), "the version served now is re-sent only with the weights it serves (publish changed weights under a new version)", got=version, exc=ProxyError)  # generated #e71fb39243
        if version == self._version:
            return  # an identical re-send: nothing to load, no KV to recompute
        if self._host_params is not None:
            await self.reload()
            reoffload = True
        else:
            reoffload = False
        params = dict(self._model.named_parameters())
        with torch.no_grad():
            for name, tensor in weights.items():
                params[name].data.copy_(tensor.to(params[name].dtype))
        self._version = version
        # KV computed with the old weights is stale: running requests go back to prefill, keeping tokens.
        for seq in reversed(list(self._running.values())):
            seq.cache = None
            self._waiting.appendleft(seq)
        self._running.clear()
        self._batch, self._batch_lens, self._batch_keys, self._batch_values = [], [], [], []
        if reoffload:
            await self.offload()
