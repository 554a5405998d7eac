"""Issue 21 item 4 (env D29): an env's exception reaches the log at its first occurrence with the
task, the env and the traceback, later ones are rate-limited, every one is counted by kind, and the
trajectory it ended carries it in `info["env_error"]`."""

from __future__ import annotations

import logging

from hypothesis import given, settings
from hypothesis import strategies as st

from rollart.env.error_report import ErrorReport
from rollart.env.manager import EnvManager, EnvManagerConfig
from rollart.env.retry import RetryPolicy
from rollart.env.stubs import ListSink, StubLLMClient
from rollart.env.trajectory import TrajectoryStatus
from rollart.resource.virtual_time import run_virtual


class StepRaises:
    """An env whose every `step` raises (the issue's env: the run waited 426 s and showed nothing)."""

    name = "broken"
    system_prompt = "Answer."

    async def reset(self, seed=None):
        from rollart.env.protocols import ResetResult

        return ResetResult(observation="start", info={})

    async def step(self, action):
        return self.explode(action)

    def explode(self, action):
        raise ZeroDivisionError(f"the env's own bug on {action!r}")

    async def close(self):
        return None


def _managers(tokenizer, prompts, report, n=2):
    llm = StubLLMClient(lambda s: tokenizer.encode(s, add_special_tokens=False), ["Right"],
                        eos_token_id=tokenizer.eos_token_id)
    cfg = EnvManagerConfig(step_policy=RetryPolicy(timeout_s=5, max_attempts=2), reset_policy=RetryPolicy(timeout_s=5))
    return [EnvManager(StepRaises, llm, prompts, ListSink(), cfg, name=f"lake-0-{i}", tag="lake", errors=report)
            for i in range(n)]


def test_the_first_env_exception_is_logged_with_task_env_and_traceback_then_counted(tokenizer, prompts, caplog):
    report = ErrorReport(label="lake")
    managers = _managers(tokenizer, prompts, report)
    caplog.set_level(logging.INFO, logger="rollart.env.errors")

    async def main():
        return [await m.run_trajectory(seed=s) for s in range(3) for m in managers]

    trajs = run_virtual(main()).result
    assert all(t.status == TrajectoryStatus.FAILED for t in trajs)
    assert report.counts == {"step:ZeroDivisionError": len(trajs)}  # a bug is not retried: one per trajectory
    for t in trajs:
        assert t.info["env_error"]["kind"] == "step:ZeroDivisionError"
        assert "the env's own bug" in t.info["env_error"]["message"]
        assert t.info["env_error"]["env"] == t.env_name
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1, [r.getMessage() for r in caplog.records]
    text = errors[0].getMessage()
    assert "task lake: env lake-0-0: step raised ZeroDivisionError: the env's own bug" in text
    assert "Traceback" in text and "in explode" in text
    # within the rate-limit window nothing else is logged
    assert [r for r in caplog.records if r.levelno == logging.WARNING] == []


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["step", "reset", "factory"]), st.floats(0, 50)), min_size=1, max_size=60),
       st.floats(1, 100))
def test_lines_per_kind_are_bounded_by_the_interval_and_every_exception_is_counted(events, every_s):
    now = [0.0]
    report = ErrorReport(label="t", every_s=every_s, clock=lambda: now[0])
    lines: dict[str, int] = {}
    handler = logging.Handler()
    handler.emit = lambda r: lines.__setitem__(r.args[3], lines.get(r.args[3], 0) + 1)
    logger = logging.getLogger("rollart.env.errors")
    logger.addHandler(handler)
    old_level = logger.level
    logger.setLevel(logging.INFO)
    try:
        for call, dt in events:
            now[0] += dt
            fault = report.report(call, "e0", RuntimeError("x"))
            assert fault.kind == f"{call}:RuntimeError"
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old_level)
    assert sum(report.counts.values()) == len(events)
    elapsed = now[0]
    total_lines = sum(lines.values())
    kinds = len(report.counts)
    assert kinds <= total_lines <= kinds * (1 + elapsed / every_s)
