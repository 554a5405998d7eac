"""`FailureWatch`: counts env and reward errors per iteration and stops a run whose task keeps failing.

Why (issue 21, item 4): an env whose `step` raised on every call made every trajectory of its task
fail; the batch could never fill, and the run waited out `get_batch_timeout_s` (426 s) to end with a
`SchedulerTimeout` that named neither the task nor the env's error. The watch observes every
trajectory put into the buffer (as the pipeline does for tokens/s): it counts the env errors
(`info["env_error"]`, rollart-env D29) and reward errors (`info["reward_error"]`, set by
`ScoringSink`) by kind, and when one task's last `limit` trajectories all failed on an env error with
none finished between them, it hands `TaskFailingError` to `on_trip` (the pipeline's `fail`) naming the task, the kind,
the env's message and its traceback's last line.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rollart import checks as check
from rollart.scheduler.errors import SchedulerError


class TaskFailingError(SchedulerError):
    """A task's trajectories keep failing on an env error: the run stops, naming the task and the error."""


def task_of(trajectory: Any) -> str:
    """The task key of a trajectory (its group id is `<task>-g<n>`, as the pipeline's per-task rewards read it)."""
    return str(getattr(trajectory, "group_id", "") or "").split("-g")[0] or str(getattr(trajectory, "env_name", "?"))


def _bump(counts: dict[str, int], kind: str) -> None:
    counts[kind] = counts.get(kind, 0) + 1


class FailureWatch:
    """Buffer observer: env/reward errors by kind (per iteration) and the fail-fast rule (D52)."""

    def __init__(self, limit: int = 16, on_trip: Callable[[TaskFailingError], None] | None = None) -> None:
        """`limit`: consecutive env-error failures of one task, with no finished trajectory between, that stop the run;
        `on_trip` gets the error once (the pipeline passes its `fail`, which already ends a wait for a batch)."""
        # VAL: VAL_INT_RANGE(limit, min=1, max=1_000_000, exc=SchedulerError)
        check.int_range("limit", limit, min=1, max=1_000_000, exc=SchedulerError)  # generated #25ffb3f8ae
        self.limit = limit
        self.env_errors: dict[str, int] = {}
        self.reward_errors: dict[str, int] = {}
        self._streak: dict[str, int] = {}
        self._failing: TaskFailingError | None = None
        self._on_trip = on_trip

    @property
    def failing(self) -> TaskFailingError | None:
        """The error that stops the run, once a task crossed the limit."""
        return self._failing

    def observe(self, trajectory: Any) -> None:
        """Count the trajectory's env or reward error; a finished trajectory resets its task's streak."""
        info = getattr(trajectory, "info", None) or {}
        status = getattr(getattr(trajectory, "status", None), "value", getattr(trajectory, "status", None))
        task = task_of(trajectory)
        env_error = info.get("env_error")
        if isinstance(env_error, dict) and status == "failed":
            _bump(self.env_errors, str(env_error.get("kind", "unknown")))
            self._streak[task] = self._streak.get(task, 0) + 1
            if self._streak[task] >= self.limit and self._failing is None:
                self._failing = TaskFailingError(_message(task, self._streak[task], env_error))
                if self._on_trip is not None:
                    self._on_trip(self._failing)
        elif status == "finished":
            self._streak[task] = 0
        reward_error = info.get("reward_error")
        if isinstance(reward_error, dict):
            _bump(self.reward_errors, str(reward_error.get("kind", "unknown")))

    def take(self) -> dict[str, dict[str, int]]:
        """The iteration's `env_errors` and `reward_errors` by kind; the next iteration counts from zero."""
        out = {"env_errors": self.env_errors, "reward_errors": self.reward_errors}
        self.env_errors, self.reward_errors = {}, {}
        return out



def _message(task: str, streak: int, env_error: dict[str, Any]) -> str:
    last_line = next((line.strip() for line in reversed(str(env_error.get("traceback", "")).splitlines())
                      if line.strip()), "")
    where = f" (env {env_error.get('env')})" if env_error.get("env") else ""
    return (f"task {task}: the last {streak} trajectories failed on an env error and none finished{where}: "
            f"{env_error.get('kind', 'unknown')}: {env_error.get('message', '')}"
            + (f" [{last_line}]" if last_line and str(env_error.get('message', '')) not in last_line else "")
            + "; the first occurrence is logged with its traceback")


def reward_metrics(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """Per-iteration `reward_retries` and `reward_outage_s` from two cumulative snapshots of the reward clients (D53).

    A counter that went down (a client was rebuilt) counts from zero, as the engine counters do.
    """
    out: dict[str, Any] = {}
    for key, field_ in (("reward_retries", "retries"), ("reward_outage_s", "outage_s")):
        now, then = after.get(field_, 0), before.get(field_, 0)
        out[key] = now - then if now >= then else now
    out["reward_retries"] = int(out["reward_retries"])
    out["reward_outage_s"] = float(out["reward_outage_s"])
    return out
