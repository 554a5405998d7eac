"""EnvManager: token-exact multi-turn, cancellation, resilience and trajectory conservation."""

from __future__ import annotations

import asyncio

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from rollart.env.envs.latency import LatencyDistribution, LatencyWrapper
from rollart.env.manager import EnvManager, EnvManagerConfig
from rollart.env.protocols import GenerationRequest, GenerationResult
from rollart.env.retry import RetryPolicy
from rollart.env.stubs import CountdownStubEnv, ListSink, StubLLMClient
from rollart.env.trajectory import TrajectoryStatus
from rollart.resource.virtual_time import VirtualTimeLoop as VirtualClockEventLoop
from rollart.resource.virtual_time import run_virtual as run_virtual_timed


def run_virtual(coro):
    """rollart-resource's virtual-time runtime (env D11), returning just the result."""
    return run_virtual_timed(coro).result

CountdownEnv = CountdownStubEnv


def _manager(prompts, tokenizer, env_factory, llm=None, **cfg):
    sink = ListSink()
    llm = llm or StubLLMClient(
        lambda s: tokenizer.encode(s, add_special_tokens=False), ["Right"], eos_token_id=tokenizer.eos_token_id
    )
    config = EnvManagerConfig(
        **{"step_policy": RetryPolicy(timeout_s=5, max_attempts=3), "reset_policy": RetryPolicy(timeout_s=5), **cfg}
    )
    return EnvManager(env_factory, llm, prompts, sink, config, name="m0"), sink, llm


def test_token_exact_multi_turn_keeps_generated_ids_and_never_retokenizes(tokenizer, prompts):
    # The stub emits *non-canonical* ids (one token per character): decoding and re-encoding the
    # history would merge them differently, so only carrying the ids forward keeps them.
    def char_ids(text):
        return [i for ch in text for i in tokenizer.encode(ch, add_special_tokens=False)]

    llm = StubLLMClient(char_ids, ["Right then Down", "answer Left"], eos_token_id=tokenizer.eos_token_id)
    manager, sink, _ = _manager(prompts, tokenizer, lambda: CountdownEnv(length=3), llm=llm)
    traj = run_virtual(manager.run_trajectory(seed=7))

    assert traj.status == TrajectoryStatus.FINISHED and traj.reason == "terminated"
    assert len(traj.turns) == 3 and len(llm.requests) == 3
    first = llm.requests[0].prompt_ids
    assert first == prompts.initial_ids("Count down.", "start 7")
    for k in range(1, 3):
        prev, turn = llm.requests[k - 1], traj.turns[k - 1]
        expected = prev.prompt_ids + turn.response_ids + traj.turns[k].prompt_ids
        assert llm.requests[k].prompt_ids == expected
        assert traj.turns[k].prompt_ids == prompts.continuation_ids(turn.response_ids, turn.observation)
    assert traj.token_ids() == llm.requests[-1].prompt_ids + traj.turns[-1].response_ids
    # re-tokenization really would drift on this history:
    history_text = tokenizer.decode(traj.token_ids())
    assert tokenizer.encode(history_text, add_special_tokens=False) != traj.token_ids()
    # the end-of-turn token the engine produced is not doubled by the next turn's delta
    assert traj.turns[0].response_ids[-1] == tokenizer.eos_token_id
    assert traj.turns[1].prompt_ids[0] != tokenizer.eos_token_id
    assert sum(traj.policy_mask()) == traj.num_response_tokens()
    assert sink.items == [traj]


def test_cancel_mid_generation_aborts_once_with_reason(tokenizer, prompts):
    llm = StubLLMClient(lambda s: [5, 6], ["x"], latency_s=10.0)
    manager, sink, _ = _manager(prompts, tokenizer, lambda: CountdownEnv(length=5), llm=llm)

    async def main():
        task = asyncio.create_task(manager.run_trajectory(seed=1))
        await asyncio.sleep(15)  # first turn done, second generation in flight
        assert manager.cancel("stale") is True
        assert manager.cancel("again") is False
        traj = await task
        assert manager.cancel("late") is False
        return traj

    traj = run_virtual(main())
    assert traj.status == TrajectoryStatus.ABORTED and traj.reason == "cancelled:stale"
    assert len(traj.turns) == 1 and sink.items == [traj]
    assert manager.counters.aborted == 1 and manager.counters.started == 1


def test_outside_cancellation_ends_trajectory_then_propagates(tokenizer, prompts):
    llm = StubLLMClient(lambda s: [5], ["x"], latency_s=10.0)
    manager, sink, _ = _manager(prompts, tokenizer, lambda: CountdownEnv(length=5), llm=llm)

    async def main():
        task = asyncio.create_task(manager.run(iter(range(100))))
        await asyncio.sleep(25)
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            return "propagated"

    assert run_virtual(main()) == "propagated"
    assert sink.items[-1].reason == "cancelled:shutdown"
    assert [t.status for t in sink.items[:-1]] == [TrajectoryStatus.FINISHED] * (len(sink.items) - 1)


def test_step_crash_fails_trajectory_and_env_is_restarted_for_the_next(tokenizer, prompts):
    envs = []

    def factory():
        envs.append(CountdownEnv(length=2, crash_on_step=1 if not envs else None))
        return envs[-1]

    manager, sink, _ = _manager(prompts, tokenizer, factory)
    first = run_virtual(manager.run_trajectory(seed=1))
    second = run_virtual(manager.run_trajectory(seed=2))
    assert first.status == TrajectoryStatus.FAILED and first.reason.startswith("env_crash:")
    assert "segfault-ish" in first.reason
    assert second.status == TrajectoryStatus.FINISHED
    assert len(envs) == 2 and envs[0].closed
    assert manager.counters.env_crashes == 1 and manager.counters.env_restarts == 1


def test_step_timeout_is_not_written_into_the_conversation(tokenizer, prompts):
    manager, sink, llm = _manager(
        prompts, tokenizer, lambda: CountdownEnv(length=5, hang_on_step=2), step_policy=RetryPolicy(timeout_s=3)
    )
    traj = run_virtual(manager.run_trajectory(seed=0))
    assert traj.status == TrajectoryStatus.FAILED and traj.reason.startswith("env_timeout:")
    assert manager.counters.env_timeouts == 1
    history = tokenizer.decode(traj.token_ids()).lower()
    assert "timed out" not in history and "timeout" not in history
    assert traj.turns[-1].observation == ""  # the step never answered; nothing was invented
    assert len(llm.requests) == 2


def test_transient_step_errors_are_retried_transparently(tokenizer, prompts):
    env = CountdownEnv(length=2, transient_on_steps=(1, 2))
    manager, _, _ = _manager(prompts, tokenizer, lambda: env)
    traj = run_virtual(manager.run_trajectory(seed=0))
    assert traj.status == TrajectoryStatus.FINISHED
    assert manager.counters.step_retries == 2
    assert env.actions == ["Right", "Right"]  # each action applied exactly once


def test_reset_crash_restarts_env_and_retries(tokenizer, prompts):
    envs = []

    def factory():
        envs.append(CountdownEnv(length=1, crash_on_reset=1 if not envs else 0))
        return envs[-1]

    manager, _, _ = _manager(prompts, tokenizer, factory)
    traj = run_virtual(manager.run_trajectory(seed=0))
    assert traj.status == TrajectoryStatus.FINISHED
    assert len(envs) == 2 and manager.counters.env_restarts == 1


def test_reset_that_always_crashes_fails_after_max_restarts(tokenizer, prompts):
    manager, _, _ = _manager(prompts, tokenizer, lambda: CountdownEnv(crash_on_reset=99), max_restarts=2)
    traj = run_virtual(manager.run_trajectory(seed=0))
    assert traj.status == TrajectoryStatus.FAILED and "reset exploded" in traj.reason
    assert manager.counters.env_restarts == 2


def test_max_turns_and_max_tokens_limits(tokenizer, prompts):
    manager, _, _ = _manager(prompts, tokenizer, lambda: CountdownEnv(length=50), max_turns=4)
    traj = run_virtual(manager.run_trajectory(seed=0))
    assert (traj.status, traj.reason, len(traj.turns)) == (TrajectoryStatus.FINISHED, "max_turns", 4)

    llm = StubLLMClient(lambda s: list(range(10, 20)), ["x"])
    manager, _, _ = _manager(prompts, tokenizer, lambda: CountdownEnv(length=50), llm=llm, max_total_tokens=25)
    traj = run_virtual(manager.run_trajectory(seed=0))
    assert traj.reason == "max_tokens" and traj.num_response_tokens() == 25
    assert [r.max_tokens for r in llm.requests] == [25, 15, 5]


class _AbortingLLM:
    async def generate(self, request: GenerationRequest) -> GenerationResult:
        return GenerationResult([1], [-1.0], [0], "abort")


class _BrokenLLM:
    async def generate(self, request: GenerationRequest) -> GenerationResult:
        return GenerationResult([1, 2], [-1.0], [0, 0], "stop")  # one log-prob missing


def test_llm_abort_and_llm_contract_violation(tokenizer, prompts):
    manager, _, _ = _manager(prompts, tokenizer, lambda: CountdownEnv(), llm=_AbortingLLM())
    traj = run_virtual(manager.run_trajectory(seed=0))
    assert (traj.status, traj.reason) == (TrajectoryStatus.ABORTED, "llm_abort")
    manager, _, _ = _manager(prompts, tokenizer, lambda: CountdownEnv(), llm=_BrokenLLM())
    traj = run_virtual(manager.run_trajectory(seed=0))
    assert traj.status == TrajectoryStatus.FAILED and "one log-prob per generated token" in traj.reason
    assert manager.counters.llm_errors == 1


def test_llm_transient_errors_are_retried(tokenizer, prompts):
    llm = StubLLMClient(lambda s: [3], ["x"], fail_prob=0.5, seed=3)
    manager, _, _ = _manager(
        prompts, tokenizer, lambda: CountdownEnv(length=3), llm=llm, llm_policy=RetryPolicy(timeout_s=5, max_attempts=10)
    )
    traj = run_virtual(manager.run_trajectory(seed=0))
    assert traj.status == TrajectoryStatus.FINISHED
    assert manager.counters.llm_retries == llm.calls - 3 > 0


class _ExactlyOnceSink(ListSink):
    def put_nowait(self, trajectory):
        assert trajectory.ended, "only ended trajectories reach the sink"
        assert all(t.id != trajectory.id for t in self.items), f"{trajectory.id} delivered twice"
        super().put_nowait(trajectory)


class TrajectoryConservation(RuleBasedStateMachine):
    """Managers under random latencies, failures, hangs and cancels: every start ends exactly once."""

    @initialize(
        n=st.integers(1, 4),
        latency_mean=st.floats(0.0, 20.0),
        latency_std=st.floats(0.0, 10.0),
        failure_prob=st.floats(0.0, 0.4),
        failure_kind=st.sampled_from(["transient", "crash", "hang"]),
        seed=st.integers(0, 1000),
    )
    def setup(self, n, latency_mean, latency_std, failure_prob, failure_kind, seed):
        from rollart.env.prompts import ChatTemplatePromptBuilder
        from rollart.env.tiny_tokenizer import build_tiny_chat_tokenizer

        if not hasattr(TrajectoryConservation, "_prompts"):
            TrajectoryConservation._prompts = ChatTemplatePromptBuilder(build_tiny_chat_tokenizer())
        self.loop = VirtualClockEventLoop()
        self.sink = _ExactlyOnceSink()
        self.managers = []
        self.tasks = []
        for i in range(n):

            def factory(i=i, k=[0]):  # noqa: B006 - a per-factory restart counter
                k[0] += 1
                return LatencyWrapper(
                    CountdownEnv(length=3),
                    step_latency=LatencyDistribution("gaussian", latency_mean, latency_std),
                    reset_latency=LatencyDistribution("lognormal", 0.0, 1.0),
                    failure_prob=failure_prob,
                    failure_kind=failure_kind,
                    seed=seed * 100 + i * 10 + k[0],
                )

            llm = StubLLMClient(lambda s: [7, 8], ["x"], latency_s=lambda r: r.uniform(0, 5), fail_prob=0.05, seed=seed + i)
            cfg = EnvManagerConfig(
                max_turns=5,
                step_policy=RetryPolicy(timeout_s=30, max_attempts=2),
                reset_policy=RetryPolicy(timeout_s=30, max_attempts=2),
                llm_policy=RetryPolicy(timeout_s=30, max_attempts=2),
                seed=seed + i,
            )
            self.managers.append(EnvManager(factory, llm, self._prompts, self.sink, cfg, name=f"m{i}"))
        self.tasks = [self.loop.create_task(m.run(iter(range(1000)))) for m in self.managers]

    @rule(dt=st.floats(0.1, 60.0))
    def advance(self, dt):
        self.loop.run_until_complete(asyncio.sleep(dt))

    @rule(i=st.integers(0, 3), reason=st.sampled_from(["stale", "redundant"]))
    def cancel(self, i, reason):
        manager = self.managers[i % len(self.managers)]
        in_flight = manager.current
        if manager.cancel(reason):
            self._settle()
            assert in_flight.status == TrajectoryStatus.ABORTED and in_flight.reason == f"cancelled:{reason}"

    @precondition(lambda self: any(not t.done() for t in self.tasks))
    @rule(i=st.integers(0, 3))
    def shutdown_one(self, i):
        task = self.tasks[i % len(self.tasks)]
        task.cancel()
        self._settle()

    def _settle(self):
        # let a cancellation travel through the nested awaits (wait_for, retries) without time passing
        for _ in range(20):
            self.loop.run_until_complete(asyncio.sleep(0))

    @invariant()
    def conservation(self):
        if not hasattr(self, "managers"):
            return
        started = sum(m.counters.started for m in self.managers)
        in_flight = sum(1 for m in self.managers if m.current is not None)
        assert len(self.sink.items) + in_flight == started
        for m in self.managers:
            c = m.counters
            assert c.finished + c.aborted + c.failed + (m.current is not None) == c.started
        assert all(t.reason for t in self.sink.items)

    def teardown(self):
        if not hasattr(self, "loop"):
            return
        self.loop.run_until_complete(asyncio.sleep(300))  # let every manager run a while, then shut down
        for task in self.tasks:
            task.cancel()
        self.loop.run_until_complete(asyncio.gather(*self.tasks, return_exceptions=True))
        assert all(m.current is None for m in self.managers)
        assert len(self.sink.items) == sum(m.counters.started for m in self.managers)
        assert len({t.id for t in self.sink.items}) == len(self.sink.items)
        self.loop.close()


TestTrajectoryConservation = TrajectoryConservation.TestCase
TestTrajectoryConservation.settings = settings(max_examples=40, stateful_step_count=15, deadline=None)


def test_a_crash_loop_backs_off_instead_of_spinning(tokenizer, prompts):
    def broken_factory():
        raise RuntimeError("image pull failed")

    manager, sink, _ = _manager(
        prompts, tokenizer, broken_factory, reset_policy=RetryPolicy(timeout_s=5, base_delay_s=1.0, max_delay_s=8.0)
    )

    async def main():
        loop = asyncio.get_running_loop()
        task = asyncio.create_task(manager.run(iter(range(10**9))))
        await asyncio.sleep(100)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        return loop.time()

    run_virtual(main())
    # with >= 1 s between failed trajectories, 100 virtual seconds hold at most ~100 of them
    assert 10 <= len(sink.items) <= 101
    assert all(t.status == TrajectoryStatus.FAILED and "image pull failed" in t.reason for t in sink.items[:-1])
    assert manager.failure_backoff(0) == 0.0 and 1.0 <= manager.failure_backoff(5) <= 8.0
