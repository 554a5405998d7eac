"""Forged code rewards (issue 12, item 1): the verdict comes from outside the sandbox.

Each program below is wrong and tries to be scored as right by what it prints or by how its values
compare; the last tests show that the score and the episode return stay in [0, 1] whatever is
printed. Real sandbox runs, no mocks.
"""

from __future__ import annotations

import asyncio
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rollart.env.envs.code_sandbox import CodeSandboxEnv, build_harness, grade_results, parse_test
from rollart.env.envs.sandbox import SandboxLimits

LIMITS = SandboxLimits(cpu_s=2, wall_s=6.0, output_bytes=64 * 1024)
WRONG_ADD = "def add(a, b):\n    return 7\n"


def block(code: str) -> str:
    return f"```python\n{code}\n```"


@pytest.fixture
async def env():
    env = CodeSandboxEnv(LIMITS, max_attempts=3)
    await env.reset(seed=0)  # add(a, b); expected 3, 0, 42
    return env


async def test_printing_the_old_pass_marker_thirty_times_scores_nothing(env):
    code = WRONG_ADD + "for _ in range(30):\n    print('__ROLLART_TEST__ 0 PASS', flush=True)\n"
    result = await env.step(block(code))
    assert (result.reward, result.info["success"], result.info["passed"]) == (0.0, False, 0)


async def test_forging_records_with_the_nonce_read_from_its_own_file_scores_nothing(env):
    """The program reads the harness (its own source), copies the nonce, forges records and exits first."""
    code = WRONG_ADD + (
        "import json, os, re, sys\n"
        "nonce = re.findall(r\"'([0-9a-f]{16})'\\)\", open(sys.argv[0]).read())[-1]\n"
        "for i in range(10):\n"
        "    for v in (['bool', True], ['none'], ['str', 'PASS'], ['int', '1'], ['int', '42']):\n"
        "        print(json.dumps([nonce, i, 0, 'value', v]), flush=True)\n"
        "os._exit(0)\n"
    )
    result = await env.step(block(code))
    assert result.reward == 0.0 and not result.info["success"]
    stdout, verdicts = await run_graded(env, code)
    assert stdout.count('"value"') >= 50, "the forged records carry the real nonce"
    assert verdicts == [False, False, False]


async def run_graded(env: CodeSandboxEnv, code: str) -> tuple[str, list[bool]]:
    """What `step` does, with the sandbox's stdout kept for the assertion."""
    tests = env._task_tests
    result = await env.sandbox.run(build_harness(code, tests, "0123456789abcdef"))
    return result.stdout, grade_results(result.stdout, "0123456789abcdef", tests)


async def test_forging_the_right_values_beside_the_harness_fails_the_duplicated_tests(env):
    """A wrong solution printing the *right* values still fails: the harness adds its own record."""
    code = WRONG_ADD + (
        "import json, re, sys\n"
        "nonce = re.findall(r\"'([0-9a-f]{16})'\\)\", open(sys.argv[0]).read())[-1]\n"
        "for i, v in enumerate(('3', '0', '42')):\n"
        "    print(json.dumps([nonce, i, 0, 'value', ['int', v]]), flush=True)\n"
    )
    result = await env.step(block(code))
    assert result.reward == 0.0 and not result.info["success"]
    stdout, verdicts = await run_graded(env, code)
    assert stdout.count('"value", ["int", "42"]') == 1 and verdicts == [False, False, False]


async def test_a_value_that_equals_everything_does_not_pass(env):
    """`__eq__` returning True made every `assert f(x) == y` pass in-process; values are compared outside."""
    code = "class Anything:\n    def __eq__(self, other):\n        return True\n    __hash__ = None\n\n"
    code += "def add(a, b):\n    return Anything()\n"
    result = await env.step(block(code))
    assert result.reward == 0.0 and not result.info["success"]


async def test_exiting_before_the_tests_run_scores_nothing(env):
    result = await env.step(block(WRONG_ADD + "import sys\nsys.exit(0)\n"))
    assert result.reward == 0.0 and result.info["sandbox_status"] == "ok"


async def test_a_right_solution_still_scores_one_and_the_return_stays_in_range(env):
    partial = await env.step(block("def add(a, b):\n    return 3 if a == 1 else 0\n"))  # passes 3 and 0
    assert partial.reward == pytest.approx(2 / 3) and not partial.terminated
    again = await env.step(block("def add(a, b):\n    return 3 if a == 1 else 0\n"))
    assert again.reward == 0.0, "repeating a partial answer must not add up past the best score"
    right = await env.step(block("def add(a, b):\n    return a + b\n"))
    assert right.terminated and right.info["success"]
    assert partial.reward + again.reward + right.reward == pytest.approx(1.0)


TESTS = [parse_test(t) for t in ("assert f(1) == 3", "assert f(2) == 'Fizz'", "assert g()", "assert h() == [1, (2, None)]")]
PAYLOADS = [
    ["int", "3"], ["str", "Fizz"], ["bool", True], ["list", [["int", "1"], ["tuple", [["int", "2"], ["none"]]]]],
    ["float", "inf"], ["int", "9" * 5000], ["list", []] * 3, ["dict", [[["list", []], ["none"]]]], ["x"], "3", 3,
]  # fmt: skip
records = st.tuples(
    st.sampled_from(["n0nce", "other"]),
    st.one_of(st.integers(-2, 6), st.text(max_size=3)),
    st.one_of(st.integers(-1, 1), st.text(max_size=2)),
    st.sampled_from(["value", "raised", "x"]),
    st.one_of(st.sampled_from(PAYLOADS), st.text(max_size=20)),
)
lines = st.one_of(records.map(lambda r: json.dumps(list(r))), st.text(max_size=80))


@given(st.lists(lines, max_size=30))
def test_grading_is_total_bounded_and_never_passes_without_exactly_one_right_value(out):
    stdout = "\n".join(out)
    verdicts = grade_results(stdout, "n0nce", TESTS)
    assert len(verdicts) == len(TESTS) and 0.0 <= sum(verdicts) / len(TESTS) <= 1.0
    for i, ok in enumerate(verdicts):
        mine = [json.loads(line) for line in out if _is_record(line, i)]
        if ok:
            assert len(mine) == 1 and mine[0][3] == "value"


def _is_record(line: str, i: int) -> bool:
    try:
        rec = json.loads(line)
    except ValueError:
        return False
    return isinstance(rec, list) and len(rec) == 5 and rec[0] == "n0nce" and rec[1:3] == [i, 0] and type(rec[1]) is int


def test_shipped_tests_parse_into_probes_and_an_outside_check():
    assert parse_test("assert add(1, 2) == 3").probes == ("add(1, 2)",)
    assert parse_test("assert is_prime(2)").probes == ("is_prime(2)",)
    assert parse_test("assert not is_prime(1)").probes == ("is_prime(1)",)
    assert parse_test("assert f(1) == g(2) and f(1) > 0").probes == ("f(1)", "g(2)")
    with pytest.raises(Exception, match="assert"):
        parse_test("print(1)")
    env = CodeSandboxEnv(LIMITS)
    assert all(len(t) > 0 for t in env._tests)


async def test_the_harness_never_contains_the_expected_values(env):
    harness = build_harness("pass", [parse_test("assert abs(add(10, 32) - 424242) < 0.5")], "abc")
    assert "424242" not in harness and "0.5" not in harness and "add(10, 32)" in harness
    await asyncio.sleep(0)
