"""TorchEngine: a real continuous-batching engine over a Hugging Face causal LM, on CPU.

A step either prefills newly admitted requests or decodes one token for every running request in
one batched forward over a left-padded batched cache with an attention mask and per-row position
ids. The batched cache persists between steps: a finished request's row is dropped, a newly
prefilled request's cache is padded and appended, so no step re-pads the whole batch.

Prefill (design D27, D28): the admitted requests of a step run in one forward (padding plus an
attention mask and explicit position ids), and a request whose context starts with tokens whose KV
the engine kept from a finished request (the previous turn of its trajectory, a shared
instruction) reuses that KV and computes only the new tokens. Both are constructor flags; with both
off each request is prefilled on its own from scratch (the step-11 engine, the benchmark's baseline).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field

try:
    import torch
except ImportError as err:  # the optional extra is missing: say which one
    raise ImportError("TorchEngine needs torch and transformers: pip install torch==2.13.0 'rollart-proxy[torch]' "
                      "(the pin keeps the CPU build)") from err

from rollart import checks as check
from rollart.proxy.errors import ProxyError
from rollart.proxy.prefix_cache import KV, PrefixHit, PrefixKVCache
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

logger = logging.getLogger(__name__)


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
    prefix: PrefixHit | None = None  # cached KV found at admission, consumed by the prefill

    @property
    def context_ids(self) -> list[int]:
        return list(self.request.prompt_ids) + self.token_ids

    @property
    def context_len(self) -> int:
        return len(self.request.prompt_ids) + len(self.token_ids)

    @property
    def kv_reserved(self) -> int:
        """KV this request holds from admission to its end: prompt + max_tokens (D25). Generated
        tokens are inside that budget, so it neither grows while decoding nor when resumed."""
        return len(self.request.prompt_ids) + self.request.params.max_tokens

    def output(self, reason: str | None) -> EngineOutput:
        return EngineOutput(
            request_id=self.request.request_id,
            token_ids=tuple(self.token_ids),
            logprobs=tuple(self.logprobs),
            token_versions=tuple(self.versions),
            finish_reason=reason,
        )


@dataclass(frozen=True)
class TorchEngineStats:
    """Cumulative engine counters; ``prefix_hit_rate`` and ``prefill_share`` are derived."""

    prefill_forwards: int
    decode_forwards: int
    prefill_s: float
    decode_s: float
    prompt_tokens_computed: int
    prompt_tokens_reused: int
    prefix_lookups: int
    prefix_hits: int
    cached_tokens: int
    evicted_tokens: int

    @property
    def prefix_hit_rate(self) -> float:
        """Share of admitted requests that reused at least one cached token (0 before any lookup)."""
        return self.prefix_hits / self.prefix_lookups if self.prefix_lookups else 0.0

    @property
    def prefill_share(self) -> float:
        """Prefill seconds over prefill + decode seconds (0 before any forward)."""
        total = self.prefill_s + self.decode_s
        return self.prefill_s / total if total > 0 else 0.0


class TorchEngine:
    """Continuous batching over a ``transformers`` causal LM (CPU, float32), per-request KV cache."""

    def __init__(
        self,
        model: torch.nn.Module,
        *,
        max_num_seqs: int = 16,
        max_kv_tokens: int = 8192,
        max_prefills_per_step: int = 16,
        version: int = 0,
        offload_to_thread: bool = True,
        batched_prefill: bool = True,
        prefix_cache: bool = True,
        device: str = "cpu",
        tensor_parallel_size: int = 1,
    ) -> None:
        """Wrap a loaded model; ``offload_to_thread`` runs forwards off the event loop thread;
        ``batched_prefill`` and ``prefix_cache`` switch D27 and D28 (off = the step-11 engine).

        ``device`` is where the model, its KV and every input live (``cuda:0`` from what Ray
        assigned the actor, D48). One TorchEngine is one device: ``tensor_parallel_size`` > 1 is
        refused (D49), a pool that shards a model over devices uses vLLM.
        """
        # AST: AST_PRECONDITION(tensor_parallel_size == 1, got=tensor_parallel_size, msg="TorchEngine runs one device per engine: tensor_parallel_size must be 1 (use engine: vllm to shard a model over devices)", exc=ProxyError)
        check.precondition(tensor_parallel_size == 1, "TorchEngine runs one device per engine: tensor_parallel_size must be 1 (use engine: vllm to shard a model over devices)", got=tensor_parallel_size, exc=ProxyError)  # generated #738bd10ceb
        # VAL: VAL_INT_RANGE(max_num_seqs, min=1, max=4096, exc=ProxyError)
        check.int_range("max_num_seqs", max_num_seqs, min=1, max=4096, exc=ProxyError)  # generated #9935161f6a
        # VAL: VAL_INT_RANGE(max_kv_tokens, min=1, max=1 << 30, exc=ProxyError)
        check.int_range("max_kv_tokens", max_kv_tokens, min=1, max=1 << 30, exc=ProxyError)  # generated #b77dd22dcb
        # VAL: VAL_INT_RANGE(max_prefills_per_step, min=1, max=4096, exc=ProxyError)
        check.int_range("max_prefills_per_step", max_prefills_per_step, min=1, max=4096, exc=ProxyError)  # generated #05662c408b
        self._device = torch.device(device)
        self._model = model.to(self._device).eval()
        logger.info("TorchEngine model on %s", self._device)
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
        self._batched_prefill = batched_prefill
        self._cache = PrefixKVCache() if prefix_cache else None
        self._counts = dict.fromkeys(
            ("prefill_forwards", "decode_forwards", "prompt_tokens_computed", "prompt_tokens_reused",
             "prefix_lookups", "prefix_hits"), 0)
        self._seconds = {"prefill_s": 0.0, "decode_s": 0.0}

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
        """Occupancy for routing: prompt + max tokens of every admitted request (D25) plus the
        prefix cache's tokens (D28: evictable, but resident until evicted)."""
        reserved = self._reserved()
        in_flight = reserved + sum(s.kv_reserved for s in self._waiting)
        cached = self._cache.tokens if self._cache is not None else 0
        return EngineLoad(
            running=len(self._running),
            waiting=len(self._waiting),
            tokens_in_flight=in_flight,
            free_kv_tokens=max(self._max_kv_tokens - reserved - cached, 0),
        )

    def stats(self) -> TorchEngineStats:
        """Cumulative counters (D29): prefill/decode time, computed vs reused prompt tokens, cache hits."""
        cache = self._cache
        return TorchEngineStats(**self._counts, **self._seconds, cached_tokens=cache.tokens if cache is not None else 0,
                                evicted_tokens=cache.evicted_tokens if cache is not None else 0)

    def _reserved(self) -> int:
        return sum(s.kv_reserved for s in self._running.values())

    async def step(self) -> list[EngineOutput]:
        """One prefill step if requests can be admitted, else one batched decode step."""
        if self._host_params is not None:
            raise ProxyError("TorchEngine.step: weights are offloaded; reload() first")
        admitted = self._admit()
        if admitted:
            work = lambda: self._timed("prefill_s", lambda: self._prefill(admitted))  # noqa: E731
        elif self._running:
            work = lambda: self._timed("decode_s", self._decode)  # noqa: E731
        else:
            return []
        if self._to_thread:
            return await asyncio.to_thread(work)
        return work()

    def _timed(self, key: str, work) -> list[EngineOutput]:  # noqa: ANN001
        start = time.perf_counter()  # a measurement of CPU work for stats, never control (D29)
        try:
            return work()
        finally:
            self._seconds[key] += time.perf_counter() - start

    def _admit(self) -> list[_Sequence]:
        admitted: list[_Sequence] = []
        reserved = self._reserved()
        while self._waiting and len(admitted) < self._max_prefills:
            if len(self._running) + len(admitted) >= self._max_num_seqs:
                break
            seq = self._waiting[0]
            if reserved + seq.kv_reserved > self._max_kv_tokens:
                break
            reserved += seq.kv_reserved
            admitted.append(self._waiting.popleft())
            if self._cache is not None:
                context = seq.context_ids
                seq.prefix = self._cache.lookup(context, len(context) - 1)  # one token left for the logits
                self._counts["prefix_lookups"] += 1
                self._counts["prefix_hits"] += seq.prefix is not None
                self._cache.evict_to(self._max_kv_tokens - reserved)
        return admitted

    @torch.no_grad()
    def _prefill(self, seqs: list[_Sequence]) -> list[EngineOutput]:
        groups = [seqs] if self._batched_prefill else [[seq] for seq in seqs]
        finished: list[EngineOutput] = []
        for group in groups:
            logits = self._prefill_forward(group)
            for row, seq in enumerate(group):
                self._running[seq.request.request_id] = seq
                done = self._append(seq, logits[row])
                if done is not None:
                    self._remember(seq, seq.cache)
                    finished.append(done)
        return finished

    def _prefill_forward(self, seqs: list[_Sequence]) -> torch.Tensor:
        """One forward over the new tokens of ``seqs`` (D27); sets each ``seq.cache`` to its contiguous
        KV and returns the last position's logits per row."""
        from transformers import DynamicCache

        contexts = [seq.context_ids for seq in seqs]
        cached = [seq.prefix.length if seq.prefix is not None else 0 for seq in seqs]
        news = [ctx[c:] for ctx, c in zip(contexts, cached)]
        self._counts["prefill_forwards"] += 1
        self._counts["prompt_tokens_computed"] += sum(map(len, news))
        self._counts["prompt_tokens_reused"] += sum(cached)
        if len(seqs) == 1 and cached[0] == 0:  # nothing to pad or reuse: the plain forward
            out = self._model(input_ids=torch.tensor([news[0]], dtype=torch.long, device=self._device), use_cache=True)
            seqs[0].cache = [(layer.keys, layer.values) for layer in out.past_key_values.layers]
            return out.logits[:, -1]
        width_c, width_n = max(cached), max(map(len, news))
        rows = len(seqs)
        input_ids = torch.zeros(rows, width_n, dtype=torch.long)
        position_ids = torch.zeros(rows, width_n, dtype=torch.long)
        mask = torch.zeros(rows, width_c + width_n, dtype=torch.long)
        for i, (new, c) in enumerate(zip(news, cached)):
            n = len(new)
            input_ids[i, width_n - n :] = torch.tensor(new, dtype=torch.long)
            position_ids[i, width_n - n :] = torch.arange(c, c + n)
            mask[i, width_c - c : width_c] = 1
            mask[i, width_c + width_n - n :] = 1
        past = None
        if width_c > 0:
            past = DynamicCache(self._padded_prefixes(seqs, width_c))
        dev = self._device  # built on the host row by row, moved once (D48)
        out = self._model(input_ids=input_ids.to(dev), attention_mask=mask.to(dev), position_ids=position_ids.to(dev),
                          past_key_values=past, use_cache=True, logits_to_keep=1)
        layers = out.past_key_values.layers
        for i, (new, c) in enumerate(zip(news, cached)):
            index = torch.cat([torch.arange(width_c - c, width_c),
                               torch.arange(width_c + width_n - len(new), width_c + width_n)]).to(dev)
            seqs[i].cache = [(layer.keys[i : i + 1].index_select(2, index), layer.values[i : i + 1].index_select(2, index))
                             for layer in layers]
            seqs[i].prefix = None
        return out.logits[:, -1]

    @staticmethod
    def _padded_prefixes(seqs: list[_Sequence], width: int) -> KV:
        """The cached prefixes of ``seqs`` left-padded to ``width`` columns, one (keys, values) per layer."""
        template = next(seq.prefix.kv for seq in seqs if seq.prefix is not None)  # type: ignore[union-attr]
        layers: KV = []
        for layer, (k0, v0) in enumerate(template):
            k_rows, v_rows = [], []
            for seq in seqs:
                if seq.prefix is None:
                    k_rows.append(k0.new_zeros(1, k0.shape[1], width, k0.shape[3]))
                    v_rows.append(v0.new_zeros(1, v0.shape[1], width, v0.shape[3]))
                    continue
                k, v = seq.prefix.kv[layer]
                pad = width - k.shape[2]
                k_rows.append(torch.nn.functional.pad(k, (0, 0, pad, 0)))
                v_rows.append(torch.nn.functional.pad(v, (0, 0, pad, 0)))
            layers.append((torch.cat(k_rows), torch.cat(v_rows)))
        return layers

    def _remember(self, seq: _Sequence, kv: KV | None) -> None:
        """Keep a finished request's KV (its context but the last, never fed, token) for later turns (D28)."""
        if self._cache is None or kv is None:
            return
        length = kv[0][0].shape[2]
        tokens = tuple(seq.context_ids[:length])
        self._cache.insert(tokens, kv, self._max_kv_tokens - self._reserved())

    def _sync_batch(self) -> None:
        """Make the batched cache hold exactly the running requests: drop finished or aborted rows,
        trim columns that are padding in every row, and merge newly prefilled requests."""
        keep = [i for i, seq in enumerate(self._batch) if self._running.get(seq.request.request_id) is seq]
        if not keep:
            self._batch, self._batch_lens, self._batch_keys, self._batch_values = [], [], [], []
        elif len(keep) != len(self._batch):
            index = torch.tensor(keep, dtype=torch.long, device=self._device)
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
        lens = torch.tensor(self._batch_lens, dtype=torch.long, device=self._device)
        mask = (torch.arange(longest + 1, device=self._device)[None, :] >= (longest - lens)[:, None]).long()
        input_ids = torch.tensor([[seq.token_ids[-1]] for seq in seqs], dtype=torch.long, device=self._device)
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
        self._counts["decode_forwards"] += 1
        finished: list[EngineOutput] = []
        width = self._batch_keys[0].shape[2]
        for row, seq in enumerate(seqs):
            done = self._append(seq, out.logits[row, -1])
            if done is not None:
                if self._cache is not None:
                    start = width - self._batch_lens[row]
                    self._remember(seq, [(k[row : row + 1, :, start:].clone(), v[row : row + 1, :, start:].clone())
                                         for k, v in zip(self._batch_keys, self._batch_values)])
                finished.append(done)
        return finished

    def _append(self, seq: _Sequence, logits: torch.Tensor) -> EngineOutput | None:
        if logits.device.type != "cpu":
            logits = logits.cpu()  # sampling draws from the request's host generator (bit-reproducible)
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
        if self._cache is not None:
            self._cache.clear()  # offload frees the KV too (on a GPU that is the point)
        if self._host_params is not None:
            return
        host: dict[str, torch.Tensor] = {}
        for name, param in self._model.named_parameters():
            host[name] = param.data if self._device.type == "cpu" else param.data.cpu()
            param.data = torch.empty(0, dtype=param.dtype, device=self._device)
        self._host_params = host

    async def reload(self) -> None:
        """Put the offloaded parameters back."""
        if self._host_params is None:
            return
        for name, param in self._model.named_parameters():
            param.data = self._host_params[name].to(self._device)
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
        if self._cache is not None:
            self._cache.clear()  # KV of the old weights must not feed the new version's tokens (D28)
        if reoffload:
            await self.offload()
