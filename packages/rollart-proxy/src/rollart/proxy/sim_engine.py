"""SimEngine: a roofline cost model of an inference engine, for scale experiments in virtual time.

It is a *simulation*, named as such: token ids are pseudo-random, but the batching, the KV
capacity, the prefix cache and the time each step takes follow the formulas of the design doc
(Section 4, "SimEngine cost model"). It sleeps on the running event loop's clock, so under a
virtual-clock loop a 3,000-GPU run finishes in seconds of wall time.
"""

from __future__ import annotations

import asyncio
import random
import zlib
from collections import OrderedDict, deque
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from rollart import checks as check
from rollart.proxy.errors import ProxyError, WorkerFailedError
from rollart.proxy.types import (
    FINISH_ABORT,
    FINISH_LENGTH,
    FINISH_STOP,
    EngineLoad,
    EngineOutput,
    EngineRequest,
)
from rollart.proxy.weight_identity import same_payload, weights_digest


class HardwareLike(Protocol):
    """The fields of ``rollart.resource.hardware.HardwareSpec`` the cost model reads."""

    name: str
    """The hardware type's name (e.g. `H800`); identifies the spec, the cost model computes nothing from it."""
    tflops_bf16: float
    """Dense BF16 throughput in TFLOPS (> 0, checked by `SimEngine`): the compute roof of prefill."""
    hbm_gb: float
    """Device memory in GB: weights plus KV must fit, so it sets the engine's KV capacity in tokens."""
    hbm_tbps: float
    """Memory bandwidth in TB/s (> 0, checked by `SimEngine`): the memory roof of decode."""
    interconnect_gbps: float
    """Intra-node interconnect (NVLink) in GB/s: the ring all-reduces of a tensor-parallel engine (D45)."""


@dataclass(frozen=True)
class SimModelSpec:
    """The shape of the simulated model: enough to count FLOPs and bytes.

    A mixture-of-experts model (D44) sets ``n_active_params`` (parameters one token goes through),
    ``n_experts`` and ``experts_per_token``: memory holds all ``n_params``, FLOPs count the active ones,
    and a decode step reads the shared weights plus the experts its batch touches. ``n_heads`` x
    ``head_dim`` is the attention width (0 heads: ``hidden_size``, the earlier assumption).
    """

    name: str
    n_params: float
    n_layers: int
    hidden_size: int
    n_kv_heads: int
    head_dim: int
    bytes_per_param: float = 2.0
    vocab_size: int = 32000
    n_heads: int = 0
    n_active_params: float | None = None
    n_experts: int = 0
    experts_per_token: int = 0

    @property
    def weight_bytes(self) -> float:
        """Bytes of all weights (memory; what a weight update moves)."""
        return self.n_params * self.bytes_per_param

    @property
    def active_params(self) -> float:
        """Parameters one token goes through: ``n_params`` for a dense model, the active ones for MoE."""
        return self.n_params if self.n_active_params is None else self.n_active_params

    @property
    def expert_params(self) -> float:
        """Parameters of all routed experts (0 for a dense model): total - active = (E - k) x one expert's."""
        if self.n_experts <= self.experts_per_token or self.n_active_params is None:
            return 0.0
        return (self.n_params - self.n_active_params) * self.n_experts / (self.n_experts - self.experts_per_token)

    @property
    def attention_width(self) -> int:
        """Query heads x head dim: the width of the attention scores' FLOPs."""
        return self.n_heads * self.head_dim if self.n_heads else self.hidden_size

    def touched_weight_bytes(self, tokens: int) -> float:
        """Weight bytes one forward over ``tokens`` tokens reads: shared weights plus the experts the tokens
        route to, in expectation under uniform routing: each expert is missed by all with (1 - k/E)^tokens."""
        experts = self.expert_params
        if not experts:
            return self.weight_bytes
        missed = (1.0 - self.experts_per_token / self.n_experts) ** max(tokens, 1)
        return (self.n_params - experts * missed) * self.bytes_per_param

    @property
    def kv_bytes_per_token(self) -> float:
        """Bytes of K and V for one token across all layers."""
        return 2.0 * self.n_layers * self.n_kv_heads * self.head_dim * self.bytes_per_param


# Published configs (Hugging Face config.json of each Qwen3 release): layers, hidden, heads, KV heads, head
# dim, experts; parameter counts from the model cards (total / active).
QWEN3_8B = SimModelSpec("Qwen3-8B", 8.2e9, 36, 4096, 8, 128, vocab_size=151936, n_heads=32)
QWEN3_32B = SimModelSpec("Qwen3-32B", 32.8e9, 64, 5120, 8, 128, vocab_size=151936, n_heads=64)
QWEN3_30B_A3B = SimModelSpec("Qwen3-30B-A3B", 30.5e9, 48, 2048, 4, 128, vocab_size=151936, n_heads=32,
                             n_active_params=3.3e9, n_experts=128, experts_per_token=8)
QWEN3_235B_A22B = SimModelSpec("Qwen3-235B-A22B", 235e9, 94, 4096, 4, 128, vocab_size=151936, n_heads=64,
                               n_active_params=22e9, n_experts=128, experts_per_token=8)
TINY_SIM_MODEL = SimModelSpec("tiny", 1.0e6, 2, 64, 2, 16, bytes_per_param=4.0, vocab_size=384)
SIM_MODEL_SPECS: Mapping[str, SimModelSpec] = {
    m.name: m for m in (QWEN3_8B, QWEN3_32B, QWEN3_30B_A3B, QWEN3_235B_A22B)
}
"""The simulated models `model.sim_model` names (rollart-app's `SIM_MODELS` lists the same keys)."""


def lookup_hardware(name: str) -> HardwareLike:
    """The catalogue entry of rollart-resource for a hardware name (H800, H20, ...)."""
    from rollart.resource.hardware import BUILTIN_HARDWARE

    catalogue: Mapping[str, Any] = BUILTIN_HARDWARE
    # VAL: VAL_ONE_OF(name, choices=catalogue, exc=ProxyError)
    check.one_of("name", name, catalogue, exc=ProxyError)  # generated #988691afa5
    return catalogue[name]


@dataclass(frozen=True)
class RooflineModel:
    """Step times from FLOPs over compute and bytes over memory bandwidth (design doc formulas).

    Times are per engine of ``tp`` devices (D45): FLOPs, weight bytes and KV bytes split over the
    group (KV by heads, so at most ``n_kv_heads`` ways), plus two ring all-reduces per layer of the
    step's tokens x hidden activations over ``interconnect_gbps``, not overlapped with compute.
    """

    model: SimModelSpec
    tflops: float
    hbm_tbps: float
    mfu: float = 0.5
    mbu: float = 0.7
    step_overhead_s: float = 0.002
    tp: int = 1
    interconnect_gbps: float = 400.0
    collective_latency_s: float = 1e-5

    def __post_init__(self) -> None:
        """Fold the per-step constants once: `decode_seconds` runs once per modelled decode step (a hot path)."""
        m, k = self.model, self.tp
        const = object.__setattr__  # a frozen dataclass: derived figures, not fields (equality ignores them)
        const(self, "_byte_s", 1.0 / (k * self.hbm_tbps * 1e12 * self.mbu))
        const(self, "_flop_s", 1.0 / (k * self.tflops * 1e12 * self.mfu))
        const(self, "_kv", m.kv_bytes_per_token * k / min(k, m.n_kv_heads))  # KV bytes over the group, per token
        const(self, "_attn", 4.0 * m.n_layers * m.attention_width)
        const(self, "_dense", 2.0 * m.active_params)
        const(self, "_moe", bool(m.expert_params))
        ar_token = 2 * m.n_layers * 2.0 * (k - 1) / k * m.hidden_size * m.bytes_per_param / (self.interconnect_gbps * 1e9)
        const(self, "_ar_token", ar_token if k > 1 else 0.0)
        const(self, "_ar_fixed", 2 * m.n_layers * self.collective_latency_s if k > 1 else 0.0)

    def allreduce_seconds(self, tokens: int) -> float:
        """2 L ring all-reduces of tokens x hidden x bytes: 2 (k-1)/k x size / bandwidth + latency each; 0 at TP 1."""
        return self._ar_fixed + self._ar_token * tokens

    def prefill_seconds(self, new_tokens: int, cached_tokens: int) -> float:
        """t = overhead + AR + max((W_touched + kv c) / (k B mbu), (2 P_a n + 4 L a n (c + n/2)) / (k F mfu))."""
        return self.prefill_batch_seconds([(new_tokens, cached_tokens)])

    def prefill_batch_seconds(self, seqs: list[tuple[int, int]]) -> float:
        """One batched prefill of (new, cached) token counts: one overhead, and each sequence's attention
        over its own context only (sequences of a batch never attend to each other). The weights the
        batch touches are read once (D46: a short prefill is memory-bound, not free)."""
        new = sum(n for n, _ in seqs)
        flops = self._dense * new + self._attn * sum(n * (c + n / 2.0) for n, c in seqs)
        bytes_moved = self.model.touched_weight_bytes(new) + self._kv * sum(c for _, c in seqs)
        return self.step_overhead_s + self._ar_fixed + self._ar_token * new + max(bytes_moved * self._byte_s,
                                                                                  flops * self._flop_s)

    def decode_seconds(self, batch: int, context_tokens: int) -> float:
        """t = overhead + AR + max((W_touched + kv C) / (k B mbu), (2 P_a b + 4 L a C) / (k F mfu))."""
        weights = self.model.touched_weight_bytes(batch) if self._moe else self.model.weight_bytes
        return self.step_overhead_s + self._ar_fixed + self._ar_token * batch + max(
            (weights + self._kv * context_tokens) * self._byte_s,
            (self._dense * batch + self._attn * context_tokens) * self._flop_s)


class _TokenStream:
    """A sequence's sampled tokens, drawn in fixed blocks from its own seeded generator (D30).

    Why blocks: drawing token by token cost ~6 us a token in Python (three ``random`` calls), the
    largest share of a 3,000-GPU simulation; one ``getrandbits`` per block and integer arithmetic over
    its words cost ~0.2 us. Position i of the stream is the same however it is read (one token per
    step or many per quantum), so decode quanta keep the tokens of one step per token.
    """

    MAX_BLOCK = 1024
    _SCALE = 1.0 / 4294967296.0

    def __init__(self, rng: random.Random, vocab_size: int, stops: tuple[int, ...], stop_prob: float, budget: int) -> None:
        """``budget``: the tokens the request may still generate; it sizes the blocks (fixed per stream)."""
        self._rng = rng
        self._block = max(1, min(budget, self.MAX_BLOCK))
        self._vocab = vocab_size
        self._stops = stops
        self._stop_below = int(stop_prob * 4294967296.0) if stops else 0  # a word below this samples a stop
        self._tokens: list[int] = []
        self._logprobs: list[float] = []
        self._stop_at: list[int] = []  # stream positions (ascending) that hold a stop token
        self._stop_cursor = 0
        self.cursor = 0  # tokens already taken

    def _extend(self) -> None:
        n = self._block
        words = memoryview(self._rng.getrandbits(96 * n).to_bytes(12 * n, "little")).cast("I")
        vocab = self._vocab
        tokens = [w % vocab for w in words[:n]]
        base = len(self._tokens)
        if self._stops:
            stops = set(self._stops)
            below = self._stop_below
            for i, w in enumerate(words[2 * n:]):
                if w < below:
                    tokens[i] = self._stops[0]
                    self._stop_at.append(base + i)
                else:
                    while tokens[i] in stops:  # a non-stop draw never samples a stop token
                        tokens[i] = (tokens[i] + 1) % vocab
        scale = -3.0 * self._SCALE
        self._tokens += tokens
        self._logprobs += [w * scale for w in words[n:2 * n]]

    def until_stop(self, limit: int) -> int:
        """Tokens to take from the cursor until and including the next stop, or ``limit`` if none comes first."""
        end = self.cursor + limit
        if self._stops and self._stop_below:
            while True:
                while self._stop_cursor < len(self._stop_at) and self._stop_at[self._stop_cursor] < self.cursor:
                    self._stop_cursor += 1
                if self._stop_cursor < len(self._stop_at):
                    return min(self._stop_at[self._stop_cursor] - self.cursor + 1, limit)
                if len(self._tokens) >= end:
                    return limit
                self._extend()
        return limit

    def take(self, n: int) -> tuple[list[int], list[float]]:
        """The next ``n`` tokens and their log-probabilities."""
        while len(self._tokens) < self.cursor + n:
            self._extend()
        start, self.cursor = self.cursor, self.cursor + n
        return self._tokens[start:self.cursor], self._logprobs[start:self.cursor]


@dataclass
class _SimSeq:
    request: EngineRequest
    token_ids: list[int]
    logprobs: list[float]
    versions: list[int]
    stream: _TokenStream
    cached: int = 0  # tokens of context whose KV is resident (0 = must prefill)
    reserved: int = 0  # KV tokens held for it while running: context + remaining budget at admission

    @property
    def context_len(self) -> int:
        return len(self.request.prompt_ids) + len(self.token_ids)

    def to_finish(self) -> int:
        """Decode steps until this sequence finishes (a stop token or its token budget)."""
        return self.stream.until_stop(max(self.request.params.max_tokens - len(self.token_ids), 1))

    def output(self, reason: str | None) -> EngineOutput:
        return EngineOutput(
            self.request.request_id, tuple(self.token_ids), tuple(self.logprobs), tuple(self.versions), reason
        )


class SimEngine:
    """A simulated engine on one device of a given hardware type (see the module docstring)."""

    def __init__(
        self,
        model: SimModelSpec,
        hardware: HardwareLike,
        *,
        mfu: float = 0.5,
        mbu: float = 0.7,
        step_overhead_s: float = 0.002,
        kv_fraction: float = 0.9,
        max_num_seqs: int = 256,
        prefix_cache_tokens: int | None = None,
        decode_quantum_s: float = 0.0,
        stop_prob: float = 0.0,
        time_scale: float = 1.0,
        host_link_gbs: float = 25.0,
        seed: int = 0,
        version: int = 0,
        tensor_parallel_size: int = 1,
    ) -> None:
        """``time_scale`` multiplies every sleep (0 = only yield; virtual-clock runs keep 1.0).

        ``prefix_cache_tokens`` caps the prefix cache (D17); None lets it use every KV token the
        running sequences do not reserve. ``decode_quantum_s`` > 0 lets one ``step`` decode several
        tokens while nothing finishes, up to that much modelled time (D19); 0 = one token per step.
        ``tensor_parallel_size`` k: the engine spans k devices of ``hardware`` (D45): weights and KV
        split over them, two all-reduces per layer over the interconnect.
        """
        # VAL: VAL_POSITIVE(hardware.tflops_bf16, exc=ProxyError)
        check.positive("hardware.tflops_bf16", hardware.tflops_bf16, exc=ProxyError)  # generated #7b34f29d4e
        # VAL: VAL_POSITIVE(hardware.hbm_tbps, exc=ProxyError)
        check.positive("hardware.hbm_tbps", hardware.hbm_tbps, exc=ProxyError)  # generated #aefdd4f340
        # VAL: VAL_NON_NEGATIVE(time_scale, exc=ProxyError)
        check.non_negative("time_scale", time_scale, exc=ProxyError)  # generated #0936c5fd8c
        # VAL: VAL_POSITIVE(host_link_gbs, exc=ProxyError)
        check.positive("host_link_gbs", host_link_gbs, exc=ProxyError)  # generated #0245fa17d2
        # VAL: VAL_INT_RANGE(max_num_seqs, min=1, max=1 << 20, exc=ProxyError)
        check.int_range("max_num_seqs", max_num_seqs, min=1, max=1 << 20, exc=ProxyError)  # generated #48ff99fd2d
        # VAL: VAL_INT_RANGE(tensor_parallel_size, min=1, max=1024, exc=ProxyError)
        check.int_range("tensor_parallel_size", tensor_parallel_size, min=1, max=1024, exc=ProxyError)  # generated #021bb0f163
        # AST: AST_PRECONDITION(model.weight_bytes / tensor_parallel_size < hardware.hbm_gb * 1e9 * kv_fraction, got=(model.name, hardware.name, tensor_parallel_size), msg="the weights' share of one device fits its usable HBM (raise tensor_parallel_size)", exc=ProxyError)
        check.precondition(model.weight_bytes / tensor_parallel_size < hardware.hbm_gb * 1e9 * kv_fraction, "the weights' share of one device fits its usable HBM (raise tensor_parallel_size)", got=(model.name, hardware.name, tensor_parallel_size), exc=ProxyError)  # generated #0f1a12de38
        self.model = model
        self.hardware = hardware
        self.tensor_parallel_size = tensor_parallel_size
        self.roofline = RooflineModel(model, hardware.tflops_bf16, hardware.hbm_tbps, mfu, mbu, step_overhead_s,
                                      tp=tensor_parallel_size, interconnect_gbps=hardware.interconnect_gbps)
        kv_per_device = model.kv_bytes_per_token / min(tensor_parallel_size, model.n_kv_heads)
        free_per_device = hardware.hbm_gb * 1e9 * kv_fraction - model.weight_bytes / tensor_parallel_size
        self.kv_capacity_tokens = int(free_per_device // kv_per_device)
        # VAL: VAL_POSITIVE(self.kv_capacity_tokens, exc=ProxyError)
        check.positive("kv_capacity_tokens", self.kv_capacity_tokens, exc=ProxyError)  # generated #e570f973e5
        # AST: AST_PRECONDITION(prefix_cache_tokens is None or (isinstance(prefix_cache_tokens, int) and prefix_cache_tokens >= 0), got=prefix_cache_tokens, msg="prefix_cache_tokens is None or an integer >= 0", exc=ProxyError)
        check.precondition(prefix_cache_tokens is None or (isinstance(prefix_cache_tokens, int) and prefix_cache_tokens >= 0), "prefix_cache_tokens is None or an integer >= 0", got=prefix_cache_tokens, exc=ProxyError)  # generated #cb55cf94f9
        self._max_num_seqs = max_num_seqs
        self._prefix_cache: OrderedDict[str, tuple[int, ...]] = OrderedDict()  # LRU: oldest first
        self._prefix_cap = self.kv_capacity_tokens if prefix_cache_tokens is None else prefix_cache_tokens
        # VAL: VAL_NON_NEGATIVE(decode_quantum_s, exc=ProxyError)
        check.non_negative("decode_quantum_s", decode_quantum_s, exc=ProxyError)  # generated #144b439704
        self._decode_quantum_s = decode_quantum_s
        self._cached_tokens = 0
        self._reserved = 0
        self._stop_prob = stop_prob
        self._time_scale = time_scale
        self._host_link_gbs = host_link_gbs
        self._seed = seed
        self._version = version
        self._weights_digest: str | None = None  # of the payload loaded under self._version
        self._waiting: deque[_SimSeq] = deque()
        self._running: dict[str, _SimSeq] = {}
        self._offloaded = False
        self._fault_in_steps: int | None = None
        self.stats = {"prefill_s": 0.0, "decode_s": 0.0, "steps": 0, "tokens": 0, "prefix_hit_tokens": 0}

    @property
    def version(self) -> int:
        """The weight version now served."""
        return self._version

    @property
    def offloaded(self) -> bool:
        """Whether weights are off the device."""
        return self._offloaded

    def inject_fault(self, after_steps: int | None = 0) -> None:
        """Make the step after ``after_steps`` more steps raise (tests of worker failure); None disarms."""
        self._fault_in_steps = after_steps

    def add_request(self, request: EngineRequest) -> None:
        """Queue a request; resumed requests keep their tokens and pay a recompute prefill."""
        # VAL: VAL_NON_EMPTY(request.prompt_ids, exc=ProxyError)
        check.non_empty("request.prompt_ids", request.prompt_ids, exc=ProxyError)  # generated #1d2562ad28
        # VAL: VAL_POSITIVE(request.remaining_tokens, exc=ProxyError)
        check.positive("request.remaining_tokens", request.remaining_tokens, exc=ProxyError)  # generated #002811cb2c
        if self._offloaded:
            raise ProxyError(f"SimEngine.add_request({request.request_id!r}): engine is offloaded")
        rng = random.Random(zlib.crc32(f"{self._seed}:{request.request_id}:{len(request.generated_ids)}".encode()))
        stream = _TokenStream(rng, self.model.vocab_size, tuple(request.params.stop_token_ids or ()), self._stop_prob,
                              request.remaining_tokens)
        self._waiting.append(
            _SimSeq(request, list(request.generated_ids), list(request.generated_logprobs), list(request.generated_versions), stream)
        )

    def cached_prefix_tokens(self) -> int:
        """Tokens held by the prefix cache now (never more than the KV the running sequences leave free)."""
        return self._cached_tokens

    def _ids(self) -> set[str]:
        return set(self._running) | {s.request.request_id for s in self._waiting}

    def abort_request(self, request_id: str) -> EngineOutput:
        """Remove a request, returning its tokens so far; its context stays in the prefix cache."""
        # VAL: VAL_ONE_OF(request_id, choices=self._ids(), exc=ProxyError)
        check.one_of("request_id", request_id, self._ids(), exc=ProxyError)  # generated #b6094f5c03
        seq = self._running.pop(request_id, None)
        if seq is None:
            seq = next(s for s in self._waiting if s.request.request_id == request_id)
            self._waiting.remove(seq)
        else:
            self._reserved -= seq.reserved
        self._remember_prefix(seq)
        return seq.output(FINISH_ABORT)

    def has_work(self) -> bool:
        """Whether a step would make progress."""
        return bool(self._waiting or self._running)

    def load(self) -> EngineLoad:
        """Occupancy; KV is counted for context tokens actually resident."""
        used = sum(s.context_len for s in self._running.values())
        in_flight = sum(s.context_len + s.request.remaining_tokens for s in (*self._running.values(), *self._waiting))
        return EngineLoad(len(self._running), len(self._waiting), in_flight, max(self.kv_capacity_tokens - used, 0))

    def _cache_budget(self) -> int:
        return max(0, min(self._prefix_cap, self.kv_capacity_tokens - self._reserved))

    def _evict_prefixes(self) -> None:
        """Drop least-recently-used prefixes until the cache fits the KV the running sequences leave."""
        budget = self._cache_budget()
        while self._cached_tokens > budget and self._prefix_cache:
            _, context = self._prefix_cache.popitem(last=False)
            self._cached_tokens -= len(context)

    def _remember_prefix(self, seq: _SimSeq) -> None:
        key = seq.request.trajectory_id or seq.request.request_id
        old = self._prefix_cache.pop(key, None)
        if old is not None:
            self._cached_tokens -= len(old)
        context = seq.request.prompt_ids + tuple(seq.token_ids)
        self._prefix_cache[key] = context
        self._cached_tokens += len(context)
        self._evict_prefixes()

    def _take_prefix(self, seq: _SimSeq) -> int:
        """Tokens of ``seq``'s context already cached; the entry leaves the cache (the sequence owns that KV now)."""
        cached = self._prefix_cache.pop(seq.request.trajectory_id or seq.request.request_id, None)
        if cached is None:
            return 0
        self._cached_tokens -= len(cached)
        context = seq.request.prompt_ids + tuple(seq.token_ids)
        if context[: len(cached)] == cached:
            n = len(cached)
        else:
            n = 0
            for a, b in zip(cached, context):
                if a != b:
                    break
                n += 1
        return min(n, len(context) - 1)  # at least one token is computed to get logits

    async def _sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds * self._time_scale)

    async def step(self) -> list[EngineOutput]:
        """Prefill admissible waiting requests together, else decode all running; sleep its roofline time."""
        if self._offloaded:
            raise ProxyError("SimEngine.step: weights are offloaded; reload() first")
        if self._fault_in_steps is not None:
            if self._fault_in_steps <= 0:
                self._fault_in_steps = None
                raise WorkerFailedError("SimEngine: injected fault")
            self._fault_in_steps -= 1
        self.stats["steps"] += 1
        admitted = self._admit()
        if admitted:
            sizes = []
            for seq in admitted:
                hit = seq.cached
                self.stats["prefix_hit_tokens"] += hit
                sizes.append((seq.context_len - hit, hit))
                self._running[seq.request.request_id] = seq
            seconds = self.roofline.prefill_batch_seconds(sizes)
            self.stats["prefill_s"] += seconds
            await self._sleep(seconds)
            return [out for seq in admitted if (out := self._emit(seq, 1)) is not None]
        if not self._running:
            return []
        seqs = list(self._running.values())
        if self._decode_quantum_s > 0:
            return await self._decode_many(seqs)
        seconds = self.roofline.decode_seconds(len(seqs), sum(s.context_len for s in seqs))
        self.stats["decode_s"] += seconds
        await self._sleep(seconds)
        return [out for seq in seqs if (out := self._emit(seq, 1)) is not None]

    async def _decode_many(self, seqs: list[_SimSeq]) -> list[EngineOutput]:
        """Decode steps back to back until a sequence finishes or the quantum is used (D19): the same
        tokens and finish times as one step per token, one sleep instead of many. Requests that
        arrive meanwhile are admitted when it ends (at most ``decode_quantum_s`` late).

        O(sequences + steps), not their product (D30): the steps to the first finish come from each
        sequence's token stream, the time from the roofline per step, then every sequence takes that
        many tokens at once."""
        first_finish = min(seq.to_finish() for seq in seqs)
        batch = len(seqs)
        context = sum(s.context_len for s in seqs)
        seconds = 0.0
        steps = 0
        while True:
            seconds += self.roofline.decode_seconds(batch, context)
            steps += 1
            if steps >= first_finish or seconds >= self._decode_quantum_s:
                break
            context += batch
        outputs = [out for seq in seqs if (out := self._emit(seq, steps)) is not None]
        self.stats["decode_s"] += seconds
        await self._sleep(seconds)
        return outputs

    def _admit(self) -> list[_SimSeq]:
        """Admit waiting sequences in order while their KV reservation fits beside the running ones (D17)."""
        admitted = []
        while self._waiting and len(self._running) + len(admitted) < self._max_num_seqs:
            head = self._waiting[0]
            need = head.context_len + head.request.remaining_tokens
            if need > self.kv_capacity_tokens - self._reserved and (self._running or admitted):
                break  # a lone request always runs, so nothing waits forever
            seq = self._waiting.popleft()
            seq.cached = self._take_prefix(seq)
            seq.reserved = need
            self._reserved += need
            self._evict_prefixes()
            admitted.append(seq)
        # AST: AST_INVARIANT(self._cached_tokens <= self._cache_budget(), got=(self._cached_tokens, self._reserved), msg="cached prefixes fit beside the running reservations")
        check.invariant(self._cached_tokens <= self._cache_budget(), "cached prefixes fit beside the running reservations", got=(self._cached_tokens, self._reserved))  # generated #c5291099e8
        return admitted

    def _emit(self, seq: _SimSeq, steps: int) -> EngineOutput | None:
        """Append ``steps`` decoded tokens (never past the sequence's finish); the output if it finished."""
        tokens, logprobs = seq.stream.take(steps)
        seq.token_ids += tokens
        seq.logprobs += logprobs
        seq.versions += [self._version] * steps
        self.stats["tokens"] += steps
        stops = seq.request.params.stop_token_ids
        reason = FINISH_STOP if stops and tokens[-1] in stops else FINISH_LENGTH if len(seq.token_ids) >= seq.request.params.max_tokens else None
        if reason is None:
            return None
        del self._running[seq.request.request_id]
        self._reserved -= seq.reserved
        self._remember_prefix(seq)
        return seq.output(reason)

    async def offload(self) -> None:
        """Simulate copying weights to host memory over the host link (the engine must be empty)."""
        # AST: AST_PRECONDITION(not self.has_work(), got=sorted(self._ids()), msg="engine empty before offload")
        check.precondition(not self.has_work(), "engine empty before offload", got_lazy=lambda: sorted(self._ids()))  # generated #38704b3a1f
        if not self._offloaded:
            self._offloaded = True
            self._prefix_cache.clear()
            self._cached_tokens = 0
            await self._sleep(self.model.weight_bytes / (self.tensor_parallel_size * self._host_link_gbs * 1e9))

    async def reload(self) -> None:
        """Simulate copying weights back to the device."""
        if self._offloaded:
            await self._sleep(self.model.weight_bytes / (self.tensor_parallel_size * self._host_link_gbs * 1e9))
            self._offloaded = False

    async def load_weights(self, weights: Mapping[str, Any], version: int) -> None:
        """Take a new version (tensor contents only identify it); running requests recompute their KV.

        The version served now is accepted again only with the payload loaded under it (its digest)
        or an empty one; the construction version has no payload, so only an empty one.
        """
        # VAL: VAL_VERSION_MONOTONIC(version, self._version, strict=False, exc=ProxyError)
        check.version_monotonic("version", version, self._version, strict=False, exc=ProxyError)  # generated #446e2b7c63
        # AST: AST_PRECONDITION(version != self._version or same_payload(self._weights_digest, weights), got=version, msg="the version served now is re-sent only with the payload loaded under it (publish changed weights under a new version)", exc=ProxyError)
        check.precondition(version != self._version or same_payload(self._weights_digest, weights), "the version served now is re-sent only with the payload loaded under it (publish changed weights under a new version)", got=version, exc=ProxyError)  # generated #edc8c1ab9e
        if version == self._version:
            return  # an identical re-send
        await self._sleep(self.model.weight_bytes / (self.tensor_parallel_size * self._host_link_gbs * 1e9))
        self._version = version
        self._weights_digest = weights_digest(weights)
        self._prefix_cache.clear()
        self._cached_tokens = 0
        for seq in reversed(list(self._running.values())):
            seq.cached = 0
            self._waiting.appendleft(seq)
        self._running.clear()
        self._reserved = 0
