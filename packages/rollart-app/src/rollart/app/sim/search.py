"""Baselines found by search: the best feasible static layout under a device or cost budget (design D67).

Why: a policy that beats a lopsided static split proves little. A reader wants to know whether it
beats the best static split that the same budget buys. `search_static` takes one run of a scenario
as the base, keeps its mode (time-sharing becomes its static `async` counterpart: nothing lent) and
varies what a static layout can choose: the trainer's devices (the train/rollout split), the rollout
pools' devices, and the rollout hardware (the base's pools scaled, or one pool of one hardware type).
A layout the config refuses (memory, devices, routing) is infeasible: kept in the list with the
reason, never best.

Cheap: a coarse grid over the trainer's share (`coarse` points), then `refine` rounds at half the
spacing around the best so far; a layout already run is never run twice (the memo is keyed by its
overrides); `on_candidate` reports each as it finishes (progress).

Sync mode colocates training on the rollout devices, so a sync base has no split to search: only
the rollout hardware varies.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from rollart import checks as check
from rollart.app.config import format_validation_error
from rollart.app.sim.scenario import AS_BASE, RunSpec, Scenario, StaticSearch
from rollart.scheduler.errors import ConfigError, SchedulerError


@dataclass
class Candidate:
    """One static layout tried: its overrides, its numbers, or why it is infeasible."""

    name: str
    train_devices: int
    rollout: dict[str, int]  # pool name -> devices
    hardware: str  # `as_base` or the one pool's hardware
    devices: int
    cost: float
    overrides: dict[str, Any]
    result: Any = None  # RunResult when it ran
    infeasible: str = ""

    @property
    def feasible(self) -> bool:
        """It ran to the end (the config accepted it and the pipeline finished)."""
        return self.result is not None and not self.infeasible

    def row(self) -> dict[str, Any]:
        """JSON-ready: the layout and its run's row (or the reason it is infeasible)."""
        out = {"name": self.name, "train_devices": self.train_devices, "rollout": dict(self.rollout),
               "hardware": self.hardware, "devices": self.devices, "cost": round(self.cost, 4),
               "infeasible": self.infeasible}
        if self.result is not None:
            out["run"] = self.result.row()
        return out


@dataclass
class SearchResult:
    """Every candidate in the order run, and the best feasible one (None when none is)."""

    spec: StaticSearch
    base: str
    candidates: list[Candidate] = field(default_factory=list)
    best: Candidate | None = None

    def row(self) -> dict[str, Any]:
        """JSON-ready summary (what docs/simulator-results.json keeps)."""
        return {"base": self.base, "metric": self.spec.metric, "budget_devices": self.spec.budget_devices,
                "budget_cost": self.spec.budget_cost, "best": self.best.row() if self.best else None,
                "candidates": [c.row() for c in self.candidates]}


def score(metric: str, result: Any) -> float:
    """Larger is better: minus the mean step time, or trained tokens per second."""
    return -result.iteration_s if metric == "step_time" else result.trained_tokens_per_s


def _static_config(scenario: Scenario, base: RunSpec) -> dict[str, Any]:
    """The base run's config as a plain mapping, time-sharing turned into its static counterpart."""
    config = scenario.run_config(base)
    data = config.model_dump(mode="json")
    if data["pipeline"]["mode"] == "time_sharing":
        data["pipeline"]["mode"] = "async"
    return data


def layout(data: dict[str, Any], rollout_budget: float, hardware: str, by_cost: bool,
           costs: dict[str, float]) -> tuple[list[dict[str, Any]], dict[str, Any]] | None:
    """The rollout pools (and routing) that `rollout_budget` devices or cost buys; None if not even one device.

    `as_base` keeps the base's pools and splits the budget in their proportions (of devices, or of
    cost under a cost budget), each pool at least one device; a hardware name makes one pool of it
    and drops the affinity (there is one hardware type left to route to).
    """
    pools = data["rollout"]["pools"]

    def whole(n: float, pool: dict[str, Any]) -> int:  # devices come in tensor-parallel groups
        tp = int(pool.get("tensor_parallel_size") or 1)
        return math.floor(n / tp + 1e-9) * tp

    if hardware != AS_BASE:
        one = {**pools[0], "name": hardware.lower(), "hardware": hardware}
        n = whole(rollout_budget / costs[hardware] if by_cost else rollout_budget, one)
        if n < 1:
            return None
        return [{**one, "devices": n}], {"affinity": {}}
    weights = [p["devices"] * (costs[p["hardware"]] if by_cost else 1.0) for p in pools]
    out = []
    for p, w in zip(pools, weights):
        share = rollout_budget * w / sum(weights)
        n = whole(share / costs[p["hardware"]] if by_cost else share, p)
        if n < 1:
            return None
        out.append({**p, "devices": n})
    if not by_cost:  # whole devices: hand what flooring left to the pools, a tensor-parallel group at a time
        spare = int(rollout_budget) - sum(p["devices"] for p in out)
        for p in out:
            tp = int(p.get("tensor_parallel_size") or 1)
            while spare >= tp:
                p["devices"] += tp
                spare -= tp
    return out, dict(data.get("routing") or {})


def train_grid(lo: int, hi: int, points: int, granularity: int) -> list[int]:
    """`points` trainer sizes spread over [lo, hi], multiples of `granularity` (lo and hi included)."""
    # VAL: VAL_INT_RANGE(points, min=2, max=64, exc=ConfigError)
    check.int_range("points", points, min=2, max=64, exc=ConfigError)  # generated #bdcb3ce774
    if hi < lo:
        return []
    allowed = sorted({lo, hi, *range(math.ceil(lo / granularity) * granularity, hi + 1, granularity)})
    if len(allowed) <= points:
        return allowed
    return sorted({allowed[round(i * (len(allowed) - 1) / (points - 1))] for i in range(points)})


SEARCH_KINDS = ("static",)


def search_spec(scenario: Scenario, kind: str | None, **options: Any) -> StaticSearch:
    """The search to run: the scenario's `search:` section with the command line's options on top.

    Raises:
        ConfigError: `--search` is not `static`, or an option is out of range (naming it).
    """
    # VAL: VAL_ONE_OF(kind, choices=SEARCH_KINDS, name="--search", exc=ConfigError)
    check.one_of("--search", kind, SEARCH_KINDS, exc=ConfigError)  # generated #cee68e38ce
    given = {k: v for k, v in options.items() if v is not None}
    data = {**(scenario.search.model_dump(exclude_unset=True) if scenario.search else {}), **given}
    if "budget_devices" in given:
        data.pop("budget_cost", None)
    if "budget_cost" in given:
        data.pop("budget_devices", None)
    try:
        spec = StaticSearch.model_validate(data)
    except ValidationError as err:
        raise ConfigError(format_validation_error(err, StaticSearch).replace("invalid run config:", "invalid search:")) from None
    if spec.base is not None and spec.base not in [r.name for r in scenario.runs]:
        raise ConfigError(f"search.base: no run named {spec.base!r}; allowed: {[r.name for r in scenario.runs]}")
    return spec


def _least_trainer(scenario: Scenario, base: RunSpec) -> int | None:
    """The fewest trainer devices that hold the model (app D61's memory model), or None when it has no floor."""
    from rollart.app.plan import sim_trainer_memory

    config = scenario.run_config(base)
    static = config.model_copy(update={"pipeline": config.pipeline.model_copy(update={"mode": "async"})})
    memory = sim_trainer_memory(static)
    return getattr(memory, "min_devices", None)


def search_static(scenario: Scenario, spec: StaticSearch,
                  run: Callable[[Scenario, RunSpec], Any] | None = None,
                  on_candidate: Callable[[Candidate], None] | None = None) -> SearchResult:
    """Run the coarse grid and its refinements; return every candidate and the best feasible one.

    Raises:
        ConfigError: the base run does not exist, or the budget cannot hold one trainer device and
            one rollout device.
    """
    # deps: layout, train_grid, score, run_one
    from rollart.app.sim.runner import run_one
    from rollart.resource.hardware import BUILTIN_HARDWARE

    names = [r.name for r in scenario.runs]
    base_name = spec.base or names[0]
    # VAL: VAL_ONE_OF(base_name, choices=names, exc=ConfigError)
    check.one_of("base_name", base_name, names, exc=ConfigError)  # generated #13801ceef4
    run = run or run_one
    base = next(r for r in scenario.runs if r.name == base_name)
    data = _static_config(scenario, base)
    if spec.iterations is not None:
        scenario = scenario.model_copy(update={"iterations": spec.iterations})
    costs = {name: hw.cost for name, hw in BUILTIN_HARDWARE.items()}
    t_hw = data["trainer"]["hardware"]
    sync = data["pipeline"]["mode"] == "sync"
    by_cost = spec.budget_cost is not None
    base_devices = sum(p["devices"] for p in data["rollout"]["pools"]) + (0 if sync else data["trainer"]["devices"])
    budget = spec.budget_cost if by_cost else float(spec.budget_devices or base_devices)
    unit = costs[t_hw] if by_cost else 1.0
    hardware_tried = {p["hardware"] for p in data["rollout"]["pools"]} | (set(spec.rollout_hardware) - {AS_BASE})
    cheapest = min(costs[h] for h in hardware_tried)  # the largest trainer leaves one rollout device of this
    hi = 0 if sync else math.floor((budget - cheapest if by_cost else budget - 1) / unit + 1e-9)
    if not sync and hi < 1:
        raise ConfigError(f"search.budget: {budget} cannot hold one trainer device and one rollout device")
    out = SearchResult(spec, base_name)
    memo: dict[str, Candidate] = {}

    def try_one(train: int, hardware: str) -> Candidate | None:
        rollout_budget = budget - (0 if sync else train * unit)
        laid = layout(data, rollout_budget, hardware, by_cost, costs)
        if laid is None:
            return None
        pools, routing = laid
        n_roll = sum(p["devices"] for p in pools)
        train_n = n_roll if sync else train
        overrides = {**base.set, "pipeline.mode": data["pipeline"]["mode"], "trainer.devices": train_n,
                     "rollout.pools": pools, "routing": routing}
        key = repr(sorted((k, repr(v)) for k, v in overrides.items()))
        if key in memo:
            return memo[key]
        label = "+".join(f"{p['devices']}{p['hardware']}" for p in pools)
        cand = Candidate(name=f"static {'colocated' if sync else f'{train_n}{t_hw} train'} / {label} rollout",
                         train_devices=train_n, rollout={p["name"]: p["devices"] for p in pools}, hardware=hardware,
                         devices=n_roll + (0 if sync else train_n),
                         cost=sum(p["devices"] * costs[p["hardware"]] for p in pools) + (0 if sync else train_n * costs[t_hw]),
                         overrides=overrides)
        memo[key] = cand
        try:
            cand.result = run(scenario, RunSpec(name=cand.name, set=overrides))
        except (ConfigError, SchedulerError, ValueError) as err:
            cand.infeasible = str(err).splitlines()[0][:300]
        out.candidates.append(cand)
        if on_candidate is not None:
            on_candidate(cand)
        return cand

    def best() -> Candidate | None:
        ok = [c for c in out.candidates if c.feasible]
        return max(ok, key=lambda c: score(spec.metric, c.result)) if ok else None

    lo = min(spec.granularity, hi) if not sync else 0
    least = _least_trainer(scenario, base)  # the memory model's floor: smaller trainers are refused without a run
    if least and not sync:
        lo = max(lo, min(hi, math.ceil(least / spec.granularity) * spec.granularity))
    grid = [0] if sync else train_grid(lo, hi, spec.coarse, spec.granularity)
    for hardware in spec.rollout_hardware:
        for t in grid:
            try_one(t, hardware)
    step = (grid[-1] - grid[0]) / max(len(grid) - 1, 1)
    for _ in range(0 if sync else spec.refine):
        step /= 2
        top = best()
        if top is None or step < spec.granularity:  # finer than a node is not a layout anyone would pick
            break
        for t in (top.train_devices - step, top.train_devices + step):
            snapped = round(t / spec.granularity) * spec.granularity
            if lo <= snapped <= hi:
                try_one(snapped, top.hardware)
    out.best = best()
    return out
