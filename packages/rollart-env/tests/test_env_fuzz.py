"""Any text a model can emit yields an observation or a scored end (issue 12, item 6), and final
math answers are graded exactly (item 5, env side). Hypothesis drives each env's `step` with
arbitrary text and with its own grammar filled by hostile content."""

from __future__ import annotations

import asyncio
from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rollart.env.envs.code_sandbox import CodeSandboxEnv, extract_code
from rollart.env.envs.frozen_lake import FrozenLakeEnv
from rollart.env.envs.math_calc import CalculatorError, MathCalcEnv, answers_match, parse_final_number, safe_eval
from rollart.env.envs.sandbox import SandboxLimits
from rollart.env.protocols import StepResult

HOSTILE = [
    "1e999", "-1e999", "1e-400", "nan", "inf", "9" * 400, "1/0", "0/0", "((" * 150 + "1" + "))" * 150,
    "-" * 199 + "1", "\x00", "1\x00", "1_000", "0x10", "1j", "2**9999", "10^{10^{10}}-1", "3 or 1",
    "__import__('os')", "\ud800", "", " ", "1" * 31, "1.5e308*10",
    "-\\frac{-3}{4}", "\\frac{1}{0}", "\\boxed{\\frac{1}{2}}", "$-\\dfrac{7}{-2}$", "1,234,567.5",
]
payload = st.one_of(st.sampled_from(HOSTILE), st.text(max_size=80), st.floats().map(repr), st.integers().map(str))


def math_action():
    tags = st.sampled_from(["<calc>{}</calc>", "<answer>{}</answer>", "{}", "<calc>{}", "<answer>{}</calc>"])
    one = st.tuples(tags, payload).map(lambda tp: tp[0].format(tp[1]))
    return st.lists(one, min_size=1, max_size=3).map(" ".join)


def _step(env, action: str) -> StepResult:
    async def go():
        await env.reset(seed=3)
        return await env.step(action)

    return asyncio.run(go())


@given(math_action())
def test_math_env_step_is_total_on_model_text(action):
    result = _step(MathCalcEnv(), action)
    assert isinstance(result.observation, str) and result.reward in (0.0, 1.0)
    assert result.terminated == ("<answer>" in action and "</answer>" in action.split("<answer>", 1)[1])


@pytest.mark.parametrize("action", ["<calc>1e999</calc>", "<answer>1e999</answer>", "<calc>-1e999</calc>", "<calc>1\x00</calc>"])
async def test_overflowing_literals_are_an_observation_or_a_wrong_answer(action):
    env = MathCalcEnv()
    await env.reset(seed=0)
    result = await env.step(action)
    assert result.reward == 0.0
    assert result.terminated == action.startswith("<answer>")
    assert "Calculator error" in result.observation or result.observation == "Wrong answer."


@given(payload)
def test_safe_eval_raises_only_calculator_errors(text):
    try:
        value = safe_eval(text)
    except CalculatorError:
        return
    assert isinstance(value, Fraction)


@given(st.integers(-10**6, 10**6), st.integers(-10**6, 10**6), st.sampled_from([" or ", ", ", " and ", " / ", "; ", " "]))
def test_hedged_answers_never_match(a, b, sep):
    if sep == " / " and b > 0:
        return  # "a / b" is one number (a fraction), not a hedge
    hedge = f"{a}{sep}{b}"
    assert not answers_match(hedge, str(a)) and not answers_match(hedge, str(b))


@given(st.integers(-10**9, 10**9))
def test_exact_numbers_match_and_expressions_do_not(n):
    assert answers_match(str(n), str(n)) and answers_match(f"{n}.0", str(n)) and answers_match(f"\\boxed{{{n}}}", str(n))
    assert answers_match(f"{2 * n}/2", str(n))
    for expression in (f"{n}+0", f"10^{{10^{{10}}}} - 1 + {n}", f"{n}e0", f"x = {n}", f"{n + 1} - 1"):
        assert not answers_match(expression, str(n))
    assert not answers_match(f"{n}.000001", str(n))


@given(st.text(max_size=80))
def test_parse_final_number_is_total(text):
    value = parse_final_number(text)
    assert value is None or isinstance(value, Fraction)


@pytest.fixture(scope="module")
def lake():
    return FrozenLakeEnv(size=4)


@given(st.one_of(st.text(max_size=200), st.tuples(st.sampled_from(["<answer>{}</answer>", "{}"]), payload).map(lambda t: t[0].format(t[1]))))
def test_frozen_lake_step_is_total_on_model_text(action):
    result = _step(FrozenLakeEnv(size=4), action)
    assert isinstance(result.observation, str) and result.reward in (-0.05, 0.0, 1.0)


@given(st.text(max_size=300))
def test_code_env_parsing_is_total_and_text_without_code_is_an_observation(text):
    code = extract_code(text)
    assert code is None or isinstance(code, str)
    if code is None:
        result = _step(CodeSandboxEnv(SandboxLimits(cpu_s=1, wall_s=2.0)), text)
        assert result.reward == 0.0 and "No ```python" in result.observation


async def test_code_env_step_on_hostile_blocks_is_a_scored_end_or_an_observation():
    env = CodeSandboxEnv(SandboxLimits(cpu_s=1, wall_s=3.0), max_attempts=100)
    await env.reset(seed=0)
    for body in ("", "\x00", "'''", "def add(", "raise SystemExit(3)", "import os\nos._exit(0)", "print('x' * 10**6)"):
        result = await env.step(f"```python\n{body}\n```")
        assert 0.0 <= result.reward <= 1.0 and isinstance(result.observation, str)
