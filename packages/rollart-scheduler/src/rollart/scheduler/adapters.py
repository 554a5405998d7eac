"""Small adapters at the package seams (the scheduler is the one package that imports all others).

Why here: `rollart.env` defines `LLMClient`/`TrajectorySink`, `rollart.proxy` serves `generate`,
`rollart.sync` calls `load_weights(weights, version)`, `rollart.train` takes `TrainSample`s; none
of them may import the others (design/000-overview.md §2), so the wiring lives in the scheduler.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from rollart.env.protocols import GenerationRequest, GenerationResult
from rollart.env.trajectory import Trajectory
from rollart.proxy.proxy import LLMProxy
from rollart.proxy.types import GenerateRequest
from rollart.proxy.types import SamplingParams as ProxySampling
from rollart.scheduler.timesharing import SwitchCost
from rollart.train.batch import TrainSample


class ProxyLLMClient:
    """env's `LLMClient` over `LLMProxy.generate` (token ids in, token ids + versions out)."""

    def __init__(self, proxy: LLMProxy, timeout_s: float = 600.0,
                 on_response: Callable[[str, tuple[str, ...]], None] | None = None,
                 on_served: Callable[[str, str, tuple[str, ...], int, int | None], None] | None = None) -> None:
        """`timeout_s` bounds each generate call; `on_response(tag, worker_ids)` sees where each was served;
        `on_served(trajectory_id, tag, worker_ids, tokens, first_version)` feeds the run's records (D50)."""
        self.proxy = proxy
        self.timeout_s = timeout_s
        self.on_response = on_response
        self.on_served = on_served

    async def generate(self, request: GenerationRequest) -> GenerationResult:
        """Translate the request, call the proxy, translate the answer."""
        s = request.sampling
        params = ProxySampling(max_tokens=request.max_tokens, temperature=s.temperature, top_p=s.top_p,
                               top_k=s.top_k, seed=s.seed, stop_token_ids=tuple(s.stop_token_ids))
        resp = await self.proxy.generate(
            GenerateRequest(tuple(request.prompt_ids), params, trajectory_id=request.trajectory_id, tag=request.tag),
            timeout_s=self.timeout_s,
        )
        if self.on_response is not None:
            self.on_response(request.tag, tuple(resp.worker_ids))
        if self.on_served is not None:
            versions = resp.token_versions
            self.on_served(request.trajectory_id, request.tag, tuple(resp.worker_ids), len(resp.token_ids),
                           versions[0] if versions else None)
        reason = resp.finish_reason if resp.finish_reason in ("stop", "length", "abort") else "abort"
        return GenerationResult(list(resp.token_ids), list(resp.logprobs), list(resp.token_versions), reason)


class RoutingLog:
    """Requests served per tag and hardware type: the evidence that affinity routing held."""

    def __init__(self, hardware_of: dict[str, str]) -> None:
        """`hardware_of` maps a worker id to its hardware type."""
        self.hardware_of = dict(hardware_of)
        self.counts: dict[str, dict[str, int]] = {}

    def record(self, tag: str, worker_ids: tuple[str, ...]) -> None:
        """Count one response of `tag` on each hardware type that served part of it."""
        per_tag = self.counts.setdefault(tag, {})
        for hw in {self.hardware_of.get(w, "?") for w in worker_ids}:
            per_tag[hw] = per_tag.get(hw, 0) + 1


class ProxyWeightLoader:
    """sync's `WeightLoader` over `LLMProxy.update_weights` (active workers now, offloaded ones on expand)."""

    def __init__(self, proxy: LLMProxy) -> None:
        """Wrap the proxy."""
        self.proxy = proxy

    async def load_weights(self, weights: Mapping[str, Any], version: int) -> None:
        """Push `version` through the proxy."""
        await self.proxy.update_weights(weights, version)


class ProxyElasticPool:
    """The controller's `ElasticRolloutPool` over `LLMProxy.shrink/expand`, one device per worker rank.

    An optional `ledger` (rollart.resource `ResourceManager`) records each move of devices between
    the `rollout` and `train` roles, so the role ledger and the proxy agree.
    """

    def __init__(self, proxy: LLMProxy, ledger: Any | None = None, timeout_s: float = 120.0) -> None:
        """`ledger` needs async `shrink(from_role, to_role, devices)` / `expand(...)` if given."""
        self.proxy = proxy
        self.ledger = ledger
        self.timeout_s = timeout_s

    def _ranks(self, devices: list[int]) -> list[int]:
        """The ranks now on `devices` (read at each move: a replaced worker may sit on another device)."""
        wanted = set(devices)
        return sorted({s.rank for s in self.proxy.slots if wanted & set(s.devices)})

    def rollout_devices(self) -> list[int]:
        """Devices of the workers that take new requests."""
        active = set(self.proxy.active_ranks())
        return sorted(d for s in self.proxy.slots if s.rank in active for d in s.devices)

    def groups(self) -> list[tuple[int, ...]]:
        """Each active worker's devices: a tensor-parallel engine moves as one (scheduler D66)."""
        active = set(self.proxy.active_ranks())
        return [tuple(s.devices) for s in self.proxy.slots if s.rank in active]

    def load(self) -> dict[int, int]:
        """In-flight requests per rollout device."""
        active = set(self.proxy.active_ranks())
        return {d: len(s.inflight) for s in self.proxy.slots if s.rank in active for d in s.devices}

    async def shrink(self, devices: list[int]) -> SwitchCost:
        """Hand the requests of these devices' workers back (migration) and offload their weights."""
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        await self.proxy.shrink(self._ranks(devices))
        t1 = loop.time()
        if self.ledger is not None:
            await self.ledger.shrink("rollout", "train", devices, timeout=self.timeout_s)
        return SwitchCost(offload_s=t1 - t0, migration_s=loop.time() - t1)

    async def expand(self, devices: list[int]) -> SwitchCost:
        """Reload the workers with the latest weights and rebalance requests onto them."""
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        if self.ledger is not None:
            await self.ledger.expand("train", "rollout", devices, timeout=self.timeout_s)
        await self.proxy.expand(self._ranks(devices))
        return SwitchCost(reload_s=loop.time() - t0)


def trajectories_to_samples(batch: Sequence[Trajectory]) -> list[TrainSample]:
    """Trajectories as train's plain-list samples; string group ids become small ints."""
    groups: dict[str, int] = {}
    out = []
    for t in batch:
        gid = groups.setdefault(t.group_id, len(groups))
        out.append(TrainSample(token_ids=t.token_ids(), policy_mask=t.policy_mask(),
                               behaviour_log_probs=t.logprobs(), reward=float(t.reward or 0.0), group_id=gid))
    return out
