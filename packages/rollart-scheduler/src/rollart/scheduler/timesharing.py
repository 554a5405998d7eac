"""Time-sharing: lend rollout devices to training for one train step, then take them back.

Why a controller with pluggable policies (time-sharing blog, design D6/D7): when most of a batch
is done, rollout demand drops and some rollout devices idle; lending them to the trainer shortens
the train step, but every switch costs offload + migration + reload. The default policy measures
that cost and lends only when the expected speed-up exceeds it; the ROLL-like policy lends after
every get_batch regardless, kept as the baseline the benchmark compares against.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol, TypeVar, runtime_checkable

from rollart import checks as check
from rollart.scheduler.errors import SchedulerError, SchedulerTimeout

log = logging.getLogger(__name__)

T = TypeVar("T")


@dataclass(frozen=True)
class SwitchCost:
    """Measured seconds of one shrink or expand: offload + migration + reload."""

    offload_s: float = 0.0
    migration_s: float = 0.0
    reload_s: float = 0.0

    @property
    def total_s(self) -> float:
        """The whole switch, the number the policy weighs against the speed-up."""
        return self.offload_s + self.migration_s + self.reload_s


@dataclass(frozen=True)
class PoolState:
    """What a policy sees when the trainer is about to step."""

    rollout_devices: tuple[int, ...]
    load: dict[int, int]  # in-flight requests per rollout device
    train_devices: int
    slots_per_device: int
    train_step_s: float | None  # measured step time on the trainer's own devices (None: not yet)
    switch_cost_s: float | None  # measured shrink + expand seconds (None: not yet)
    groups: tuple[tuple[int, ...], ...] = ()  # devices that move together (one engine's TP group); () = each alone (D66)


@dataclass(frozen=True)
class ShrinkDecision:
    """Which devices to lend (possibly none) and why."""

    devices: tuple[int, ...]
    reason: str
    expected_gain_s: float = 0.0
    expected_cost_s: float = 0.0


@dataclass
class SwitchRecord:
    """One train step under the controller: what was lent, what it cost, what it bought."""

    devices: tuple[int, ...]
    reason: str
    shrink: SwitchCost = field(default_factory=SwitchCost)
    expand: SwitchCost = field(default_factory=SwitchCost)
    train_s: float = 0.0
    expected_gain_s: float = 0.0

    @property
    def switch_cost_s(self) -> float:
        """Shrink plus expand seconds (0 when nothing was lent)."""
        return self.shrink.total_s + self.expand.total_s


@runtime_checkable
class TimeSharingPolicy(Protocol):
    """Decides how many and which rollout devices to lend to one train step."""

    def decide(self, state: PoolState) -> ShrinkDecision:
        """Choose the rollout devices to lend to the coming train step; none is a valid answer.

        Called by `TimeSharingController.train_with_lending` once per train step, synchronously on
        the event loop, with the pool's devices and load and the step time and switch cost measured
        so far (None until measured). Returns a subset of `state.rollout_devices` and a reason for
        the log; lending the whole pool would stop the rollout, so keep at least one device.
        """
        ...


@runtime_checkable
class ElasticRolloutPool(Protocol):
    """The rollout side as the controller sees it (adapter over LLMProxy + ledger, or SimEngine).

    `TimeSharingController` calls it around one train step at a time: `shrink` of the devices the
    policy chose, the step, then `expand` of the same devices, always (even if the step failed).
    """

    def rollout_devices(self) -> list[int]:
        """The devices that take new rollout requests now (lent devices are not among them)."""
        ...

    def load(self) -> dict[int, int]:
        """In-flight requests per rollout device, for the policy; cheap, read once per train step."""
        ...

    async def shrink(self, devices: list[int]) -> SwitchCost:
        """Lend `devices` to training: stop routing to them, hand their requests to the other workers, free them.

        `devices` is a subset of `rollout_devices()`, never all of them. On return the devices
        are out of `rollout_devices()` and usable by the trainer, and no request was lost. Returns
        the measured offload and migration seconds. Bounded by the controller's deadline
        (`SchedulerTimeout` past it).
        """
        ...

    async def expand(self, devices: list[int]) -> SwitchCost:
        """Take lent `devices` back into rollout, serving the newest weights, and rebalance requests onto them.

        Called after every `shrink`, with the same devices. On return they are in
        `rollout_devices()` again (the controller checks it). Returns the measured reload seconds.
        """
        ...


def demand_devices(inflight: int, slots_per_device: int, min_keep: int) -> int:
    """Devices the remaining rollout demand needs: ceil(inflight / slots), at least min_keep."""
    # VAL: VAL_INT_RANGE(slots_per_device, min=1, max=1_000_000, exc=SchedulerError)
    check.int_range("slots_per_device", slots_per_device, min=1, max=1_000_000, exc=SchedulerError)  # generated #d1304be0d3
    return max(min_keep, math.ceil(max(inflight, 0) / slots_per_device))


def device_groups(state: PoolState) -> list[tuple[int, ...]]:
    """The rollout devices as the units a shrink moves: the pool's engine groups, each device alone by default."""
    members = set(state.rollout_devices)
    groups = [g for g in state.groups if g and set(g) <= members]
    grouped = {d for g in groups for d in g}
    return groups + [(d,) for d in state.rollout_devices if d not in grouped]


def _least_loaded(state: PoolState, k: int, at_least: bool = False) -> tuple[int, ...]:
    """The least loaded whole groups (D66): at most `k` devices, or, with `at_least`, the fewest groups reaching `k`.

    A tensor-parallel engine holds all its devices: lending some of them offloads the whole engine
    while the trainer gets only those, so the rest would idle in neither role.
    """
    groups = sorted(device_groups(state), key=lambda g: (max(state.load.get(d, 0) for d in g), -max(g)))
    chosen: list[int] = []
    for group in groups[:-1]:  # the most loaded group always stays in rollout
        if len(chosen) >= k:
            break
        if not at_least and len(chosen) + len(group) > k:
            continue
        chosen.extend(group)
    return tuple(sorted(chosen))


def with_required(decision: ShrinkDecision, state: PoolState, min_lend: int) -> ShrinkDecision:
    """At least `min_lend` devices lent: the trainer's own devices cannot hold the model, so the step needs them (D59).

    Raises:
        SchedulerError: the pool cannot lend `min_lend` devices and keep one for rollout.
    """
    # AST: AST_PRECONDITION(min_lend == 0 or min_lend < len(state.rollout_devices), got=(min_lend, len(state.rollout_devices)), msg="the pool can lend the devices the train step needs and keep one", exc=SchedulerError)
    check.precondition(min_lend == 0 or min_lend < len(state.rollout_devices), "the pool can lend the devices the train step needs and keep one", got_lazy=lambda: (min_lend, len(state.rollout_devices)), exc=SchedulerError)  # generated #c05776bed2
    if len(decision.devices) >= min_lend:
        return decision
    lent = _least_loaded(state, min_lend, at_least=True)
    # AST: AST_POSTCONDITION(len(lent) >= min_lend, got=(min_lend, len(lent), len(device_groups(state))), msg="whole engine groups reach the devices the train step needs and one group stays in rollout", exc=SchedulerError)
    check.postcondition(len(lent) >= min_lend, "whole engine groups reach the devices the train step needs and one group stays in rollout", got_lazy=lambda: (min_lend, len(lent), len(device_groups(state))), exc=SchedulerError)  # generated #68a36fc339
    return ShrinkDecision(lent, f"lend {len(lent)}: the train step needs {min_lend} to hold the model "
                          f"({decision.reason})", decision.expected_gain_s, decision.expected_cost_s)


class CostAwarePolicy:
    """Default: lend only when the expected speed-up exceeds the measured switch cost (D6)."""

    def __init__(self, min_keep: int = 1, margin: float = 1.0, prior_switch_cost_s: float = 0.0, min_lend: int = 0) -> None:
        """`prior_switch_cost_s` is used until a switch has been measured; `min_lend` devices are lent whatever
        the gain, because the trainer alone cannot hold the model (D59)."""
        # VAL: VAL_INT_RANGE(min_keep, min=1, max=1_000_000, exc=SchedulerError)
        check.int_range("min_keep", min_keep, min=1, max=1_000_000, exc=SchedulerError)  # generated #c6b9227e1e
        # VAL: VAL_NON_NEGATIVE(margin, exc=SchedulerError)
        check.non_negative("margin", margin, exc=SchedulerError)  # generated #e083c66960
        # VAL: VAL_NON_NEGATIVE(prior_switch_cost_s, exc=SchedulerError)
        check.non_negative("prior_switch_cost_s", prior_switch_cost_s, exc=SchedulerError)  # generated #7f314dc737
        # VAL: VAL_INT_RANGE(min_lend, min=0, max=1_000_000, exc=SchedulerError)
        check.int_range("min_lend", min_lend, min=0, max=1_000_000, exc=SchedulerError)  # generated #4bee7cc1c0
        self.min_lend = min_lend
        self.min_keep = min_keep
        self.margin = margin
        self.prior_switch_cost_s = prior_switch_cost_s

    def decide(self, state: PoolState) -> ShrinkDecision:
        """Size the lent set from remaining demand; lend iff gain > margin * switch cost; never fewer than `min_lend`."""
        # deps: demand_devices, with_required
        decision = with_required(self._decide(state), state, self.min_lend)
        # AST: AST_POSTCONDITION(len(decision.devices) < len(state.rollout_devices) or not state.rollout_devices, got=decision.devices, msg="never lend the whole pool", exc=SchedulerError)
        check.postcondition(len(decision.devices) < len(state.rollout_devices) or not state.rollout_devices, "never lend the whole pool", got=decision.devices, exc=SchedulerError)  # generated #f374154e53
        return decision

    def _decide(self, state: PoolState) -> ShrinkDecision:
        pool = len(state.rollout_devices)
        if pool == 0:
            return ShrinkDecision((), "no rollout devices")
        inflight = sum(state.load.get(d, 0) for d in state.rollout_devices)
        keep = min(pool, demand_devices(inflight, state.slots_per_device, self.min_keep))
        k = pool - keep
        if k <= 0:
            return ShrinkDecision((), f"remaining demand ({inflight} requests) needs all {pool} devices")
        if state.train_step_s is None:
            return ShrinkDecision((), "train step time not measured yet")
        d = state.train_devices
        gain = state.train_step_s - state.train_step_s * d / (d + k)
        cost = state.switch_cost_s if state.switch_cost_s is not None else self.prior_switch_cost_s
        if gain <= self.margin * cost:
            return ShrinkDecision((), f"expected gain {gain:.3f}s <= {self.margin} x switch cost {cost:.3f}s", gain, cost)
        lent = _least_loaded(state, k)
        if not lent:
            return ShrinkDecision((), f"remaining demand leaves {k} devices, less than one engine's group", gain, cost)
        return ShrinkDecision(lent, f"lend {len(lent)}: gain {gain:.3f}s > cost {cost:.3f}s", gain, cost)


class AlwaysShrinkPolicy:
    """ROLL-like baseline: lend a fixed number of devices after every get_batch, cost ignored."""

    def __init__(self, lend: int = 1, min_lend: int = 0) -> None:
        """Lend `lend` devices (capped so at least one stays in rollout), and never fewer than `min_lend` (D59)."""
        # VAL: VAL_INT_RANGE(lend, min=1, max=1_000_000, exc=SchedulerError)
        check.int_range("lend", lend, min=1, max=1_000_000, exc=SchedulerError)  # generated #0bfd8f6add
        # VAL: VAL_INT_RANGE(min_lend, min=0, max=1_000_000, exc=SchedulerError)
        check.int_range("min_lend", min_lend, min=0, max=1_000_000, exc=SchedulerError)  # generated #4bee7cc1c0
        self.lend = lend
        self.min_lend = min_lend

    def decide(self, state: PoolState) -> ShrinkDecision:
        """Lend the `lend` least loaded devices, keeping one for rollout."""
        # deps: with_required
        k = min(self.lend, len(state.rollout_devices) - 1)
        if k <= 0:
            return with_required(ShrinkDecision((), "pool too small to lend"), state, self.min_lend)
        lent = _least_loaded(state, k)
        return with_required(ShrinkDecision(lent, f"always shrink {len(lent)}"), state, self.min_lend)


class TimeSharingController:
    """Runs shrink -> train -> expand around one train step and records the switch cost."""

    def __init__(
        self,
        pool: ElasticRolloutPool,
        policy: TimeSharingPolicy,
        train_devices: int,
        slots_per_device: int,
        on_role: Callable[[Sequence[int], str], None] | None = None,
    ) -> None:
        """`train_devices` is the trainer's own device count (d in D6); `on_role` feeds the timeline."""
        # VAL: VAL_INT_RANGE(train_devices, min=1, max=1_000_000, exc=SchedulerError)
        check.int_range("train_devices", train_devices, min=1, max=1_000_000, exc=SchedulerError)  # generated #5ca7f2317b
        # VAL: VAL_INT_RANGE(slots_per_device, min=1, max=1_000_000, exc=SchedulerError)
        check.int_range("slots_per_device", slots_per_device, min=1, max=1_000_000, exc=SchedulerError)  # generated #d1304be0d3
        self.pool = pool
        self.policy = policy
        self.train_devices = train_devices
        self.slots_per_device = slots_per_device
        self._on_role = on_role or (lambda devices, role: None)
        self.train_step_s: float | None = None
        self.switch_cost_s: float | None = None
        self.history: list[SwitchRecord] = []

    def state(self) -> PoolState:
        """The snapshot the policy decides on."""
        devices = tuple(sorted(self.pool.rollout_devices()))
        groups = getattr(self.pool, "groups", None)  # optional: pools of tensor-parallel engines (D66)
        return PoolState(devices, dict(self.pool.load()), self.train_devices, self.slots_per_device,
                         self.train_step_s, self.switch_cost_s, tuple(groups()) if groups is not None else ())

    async def train_with_lending(self, train: Callable[[], Awaitable[T]], timeout_s: float) -> tuple[T, SwitchRecord]:
        """Shrink per the policy, run `train`, always expand (even if train raised).

        Raises:
            SchedulerTimeout: shrink, train or expand ran past `timeout_s`.
        """
        # deps: TimeSharingPolicy.decide, ElasticRolloutPool.shrink, ElasticRolloutPool.expand
        # VAL: VAL_TIMEOUT(timeout_s, exc=SchedulerError)
        check.timeout("timeout_s", timeout_s, exc=SchedulerError)  # generated #4c6d4a16bf
        loop = asyncio.get_running_loop()
        before = list(self.pool.rollout_devices())
        decision = self.policy.decide(self.state())
        lent = list(decision.devices)
        log.info("train step: lend %s to training (%s)", lent, decision.reason)
        record = SwitchRecord(tuple(lent), decision.reason, expected_gain_s=decision.expected_gain_s)
        try:
            if lent:
                self._on_role(lent, "transfer")
                record.shrink = await self._bounded(self.pool.shrink(lent), timeout_s, f"shrink {lent}")
                self._on_role(lent, "train")
            t0 = loop.time()
            result = await self._bounded(train(), timeout_s, "train step")
            record.train_s = loop.time() - t0
        finally:
            if lent:
                self._on_role(lent, "transfer")
                record.expand = await self._bounded(self.pool.expand(lent), timeout_s, f"expand {lent}")
                self._on_role(lent, "rollout")
        d = self.train_devices
        own = record.train_s * (d + len(lent)) / d  # normalise to the trainer's own devices
        self.train_step_s = own if self.train_step_s is None else 0.5 * self.train_step_s + 0.5 * own
        if lent:
            cost = record.switch_cost_s
            self.switch_cost_s = cost if self.switch_cost_s is None else 0.5 * self.switch_cost_s + 0.5 * cost
        self.history.append(record)
        # AST: AST_POSTCONDITION(set(self.pool.rollout_devices()) >= set(before), got=self.pool.rollout_devices(), msg="every lent device is back in rollout", exc=SchedulerError)
        check.postcondition(set(self.pool.rollout_devices()) >= set(before), "every lent device is back in rollout", got_lazy=lambda: self.pool.rollout_devices(), exc=SchedulerError)  # generated #dff08f48a5
        return result, record

    @staticmethod
    async def _bounded(aw: Awaitable[T], timeout_s: float, what: str) -> T:
        try:
            return await asyncio.wait_for(aw, timeout=timeout_s)
        except TimeoutError:
            raise SchedulerTimeout(f"time-sharing {what} did not finish within {timeout_s}s") from None
