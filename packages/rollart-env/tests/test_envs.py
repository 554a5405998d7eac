"""Shipped environments: gym adapter, FrozenLake, math with a calculator, latency wrapper."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rollart.env.envs.frozen_lake import FrozenLakeEnv, parse_frozen_lake_action
from rollart.env.envs.latency import LatencyDistribution, LatencyWrapper
from rollart.env.envs.math_calc import CalculatorError, MathCalcEnv, generate_problem, load_problems, safe_eval
from rollart.env.errors import EnvCrashedError, EnvError, TransientEnvError
from rollart.env.gym_adapter import GymTextEnv
from rollart.env.protocols import Env
from rollart.resource.virtual_time import run_virtual as run_virtual_timed


def run_virtual(coro):
    """rollart-resource's virtual-time runtime (env D11), returning just the result."""
    return run_virtual_timed(coro).result


@given(st.text())
def test_frozen_lake_action_parsing_never_crashes_on_arbitrary_text(text):
    assert parse_frozen_lake_action(text) in (None, 0, 1, 2, 3)


@pytest.mark.parametrize(
    ("text", "action"),
    [
        ("I will go <answer>Right</answer>", 2),
        ("left... no, <answer> down </answer>", 1),
        ("UP", 3),
        ("go left then right", 2),
        ("<answer>jump</answer> left", None),
        ("uptown leftovers", None),
        ("", None),
    ],
)
def test_frozen_lake_action_parsing_examples(text, action):
    assert parse_frozen_lake_action(text) == action


def test_frozen_lake_not_slippery_reaches_goal_and_renders_player():
    env = FrozenLakeEnv(desc=["SF", "FG"], is_slippery=False)
    assert isinstance(env, Env)

    async def main():
        reset = await env.reset(seed=0)
        assert reset.observation == "PF\nFG"
        bad = await env.step("fly away")
        assert bad.info["invalid_action"] and bad.reward < 0 and "PF\nFG" in bad.observation
        s1 = await env.step("<answer>Right</answer>")
        assert s1.observation == "SP\nFG" and not s1.terminated
        s2 = await env.step("Down")
        return s2

    s2 = run_virtual(main())
    assert s2.terminated and s2.reward == 1.0 and s2.info["success"] is True


def test_frozen_lake_slippery_sometimes_slides_and_maps_follow_the_seed():
    async def first_move(env, seed):
        await env.reset(seed=seed)
        return (await env.step("Right")).observation.splitlines()[0]

    slippery = FrozenLakeEnv(desc=["SFFF", "FFFF", "FFFF", "FFFG"], is_slippery=True)
    outcomes = {run_virtual(first_move(slippery, seed)) for seed in range(20)}
    assert "SPFF" in outcomes and len(outcomes) > 1  # sometimes right, sometimes not
    solid = FrozenLakeEnv(desc=["SFFF", "FFFF", "FFFF", "FFFG"], is_slippery=False)
    assert {run_virtual(first_move(solid, seed)) for seed in range(5)} == {"SPFF"}
    random_maps = FrozenLakeEnv(size=5)
    a = run_virtual(random_maps.reset(seed=1)).observation
    b = run_virtual(random_maps.reset(seed=1)).observation
    c = {run_virtual(random_maps.reset(seed=s)).observation for s in range(10)}
    assert a == b and len(c) > 1 and len(a.splitlines()) == 5


def test_gym_adapter_wraps_another_gymnasium_env():
    import gymnasium as gym

    env = GymTextEnv(
        make_env=lambda seed: gym.make("CliffWalking-v1"),
        render=lambda obs, g: f"cell {int(obs)}",
        parse_action=lambda t: {"up": 0, "right": 1, "down": 2, "left": 3}.get(t.strip().lower()),
        name="cliff",
        system_prompt="walk",
    )

    async def main():
        r = await env.reset(seed=0)
        s = await env.step("up")
        await env.close()
        return r, s

    r, s = run_virtual(main())
    assert r.observation == "cell 36" and s.observation == "cell 24" and s.reward == -1.0


def test_math_env_calculator_then_answer():
    env = MathCalcEnv(source="generated")

    async def main():
        reset = await env.reset(seed=3)
        truth = reset.info["ground_truth"]
        assert reset.observation == generate_problem(3)["question"]
        calc = await env.step("let me compute <calc>(2 + 3) * 4 / 8</calc>")
        assert calc.observation == "Calculator: 2.5" and not calc.terminated
        err = await env.step("<calc>__import__('os')</calc>")
        assert err.observation.startswith("Calculator error") and not err.terminated
        hint = await env.step("I think it's big")
        assert hint.info["format_error"]
        wrong = await env.step(f"<answer>{int(truth) + 1}</answer>")
        assert wrong.terminated and wrong.reward == 0.0 and wrong.info["success"] is False
        await env.reset(seed=3)
        right = await env.step(f"<answer>{truth}</answer>")
        return right

    right = run_virtual(main())
    assert right.terminated and right.reward == 1.0 and right.info["success"] is True


def test_math_env_shipped_data_and_tool_budget():
    problems = load_problems()
    assert len(problems) >= 10
    env = MathCalcEnv(source="data", max_tool_calls=1)

    async def main():
        reset = await env.reset(seed=6)
        assert reset.observation == problems[6]["question"]
        await env.step("<calc>1+1</calc>")
        over = await env.step("<calc>1+1</calc>")
        ok = None
        await env.reset(seed=6)
        ok = await env.step("<answer>0.25</answer>")  # "1/4" is the shipped answer
        return over, ok

    over, ok = run_virtual(main())
    assert over.truncated and ok.reward == 1.0
    with pytest.raises(EnvError, match=r"source must be one of \['data', 'generated'\], got 'web'"):
        MathCalcEnv(source="web")


@given(st.text(max_size=60))
def test_calculator_refuses_everything_but_arithmetic_without_crashing(expr):
    try:
        value = safe_eval(expr)
    except CalculatorError:
        return
    assert value == value  # a Fraction came back


def test_latency_wrapper_delays_and_injects_each_failure_kind():
    inner = MathCalcEnv()

    async def timed_reset(env):
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        await env.reset(seed=0)
        return loop.time() - t0

    fixed = LatencyWrapper(inner, reset_latency=LatencyDistribution("fixed", 7.0))
    assert run_virtual(timed_reset(fixed)) == pytest.approx(7.0)
    gauss = LatencyWrapper(inner, reset_latency=LatencyDistribution("gaussian", 10.0, 3.0), seed=1)
    samples = [run_virtual(timed_reset(gauss)) for _ in range(50)]
    assert 8.0 < sum(samples) / len(samples) < 12.0 and min(samples) >= 0.0
    assert LatencyDistribution("lognormal", 0.0, 1.0).sample(__import__("random").Random(0)) > 0
    for kind, exc in (("transient", TransientEnvError), ("crash", EnvCrashedError)):
        with pytest.raises(exc):
            run_virtual(LatencyWrapper(inner, failure_prob=1.0, failure_kind=kind).reset(seed=0))
    with pytest.raises(asyncio.TimeoutError):
        run_virtual(asyncio.wait_for(LatencyWrapper(inner, failure_prob=1.0, failure_kind="hang").reset(0), 100))
    with pytest.raises(EnvError, match="kind must be one of"):
        LatencyDistribution("uniform", 1.0)


def test_latency_distributions_match_their_formulas_and_failure_rate():
    """D12: N(10, sigma) keeps its mean and spread; lognormal_with_mean keeps its mean with a 10x tail."""
    import random
    import statistics

    rng = random.Random(0)
    for sigma in (1.0, 5.0):
        xs = [LatencyDistribution("gaussian", 10.0, sigma).sample(rng) for _ in range(20_000)]
        assert statistics.fmean(xs) == pytest.approx(10.0, abs=0.1 * sigma)
        assert statistics.pstdev(xs) == pytest.approx(sigma, rel=0.05)
    tail = LatencyDistribution.lognormal_with_mean(10.0, 1.0)
    assert (tail.kind, round(tail.mean, 4), tail.std) == ("lognormal", 1.8026, 1.0)  # mu = ln 10 - 1/2
    ys = sorted(tail.sample(rng) for _ in range(40_000))
    assert statistics.fmean(ys) == pytest.approx(10.0, rel=0.05)
    median, p99 = ys[len(ys) // 2], ys[int(len(ys) * 0.99)]
    assert median == pytest.approx(6.07, rel=0.05) and p99 == pytest.approx(61.8, rel=0.12)
    with pytest.raises(EnvError, match="mean_s"):
        LatencyDistribution.lognormal_with_mean(0.0, 1.0)

    async def failures(p: float, n: int) -> int:
        env = LatencyWrapper(MathCalcEnv(), reset_latency=tail, failure_prob=p, seed=3)
        failed = 0
        for _ in range(n):
            try:
                await env.reset(seed=0)
            except TransientEnvError:
                failed += 1
        return failed

    assert run_virtual(failures(0.1, 3000)) == pytest.approx(300, abs=60)  # 3,000 resets, 10 % fail
