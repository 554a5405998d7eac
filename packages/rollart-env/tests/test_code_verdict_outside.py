"""Every verdict is computed outside the sandbox (issue 23, item A): real sandbox runs, no mocks.

Before this change only `assert E == literal` was compared in the parent; any other shape of test
(a tolerance `abs(f() - 6.0) < 1e-9`, a membership `f() in (6, 6.0)`, a chained `and`, a range
`5.9 < f() < 6.1`) was evaluated inside the program's own process, so an object whose comparison
methods always answer yes scored 1.0. Now the program's side only evaluates the test's calls and
returns their results as plain data; the comparisons, `abs`, arithmetic and boolean operators
run here, on values no program object can stand in for.
"""

from __future__ import annotations

import pytest

from rollart.env.envs.code_sandbox import build_harness, grade_results, parse_test
from rollart.env.envs.sandbox import PythonSandbox, SandboxLimits
from rollart.env.errors import EnvError

LIMITS = SandboxLimits(cpu_s=2, wall_s=6.0, output_bytes=64 * 1024)
NONCE = "0123456789abcdef"

SHAPES = [
    "assert abs(f(2, 3) - 6.0) < 1e-9",
    "assert f(2, 3) in (6, 6.0)",
    "assert f(2, 3) > 5 and f(2, 3) < 7",
    "assert 5.9 < f(2, 3) < 6.1",
    "assert not (f(2, 3) != 6)",
    "assert f(2, 3) == 6",
    "assert round(f(2, 3), 6) == 6.0",
    "assert abs(f(2, 3) / 2 - 3) <= 1e-9 or f(2, 3) == 6",
]

# An object that says yes to every question the test could ask it in the program's process.
YES = """
class Yes:
    def _yes(self, *a):
        return True
    __eq__ = __ne__ = __lt__ = __le__ = __gt__ = __ge__ = __contains__ = __bool__ = _yes
    def _me(self, *a):
        return Yes()
    __abs__ = __sub__ = __rsub__ = __add__ = __radd__ = __truediv__ = __rtruediv__ = __neg__ = __round__ = _me
    __hash__ = object.__hash__
    def __repr__(self):
        return "6.0"

def f(a, b):
    return Yes()
"""

# A float that is 0.0 but compares equal and close to everything, and prints as 6.0.
FLOAT_TRICK = """
class F(float):
    def __eq__(self, other):
        return True
    __ne__ = lambda self, other: False
    __lt__ = __le__ = __gt__ = __ge__ = __eq__
    __hash__ = float.__hash__
    def __sub__(self, other):
        return F(0.0)
    __rsub__ = __truediv__ = __sub__
    def __abs__(self):
        return 0.0
    def __round__(self, n=None):
        return 6.0
    def __repr__(self):
        return "6.0"

def f(a, b):
    return F(0.0)
"""


async def _score(code: str, shapes: list[str]) -> list[bool]:
    tests = [parse_test(t) for t in shapes]
    result = await PythonSandbox(LIMITS).run(build_harness(code, tests, NONCE))
    return grade_results(result.stdout, NONCE, tests)


async def test_an_always_yes_object_fails_every_test_shape():
    assert await _score(YES, SHAPES) == [False] * len(SHAPES)


async def test_a_subclass_of_float_that_compares_true_fails_every_test_shape():
    assert await _score(FLOAT_TRICK, SHAPES) == [False] * len(SHAPES)


async def test_honest_right_answers_pass_every_shape_and_honest_wrong_ones_fail():
    assert await _score("def f(a, b):\n    return a * b\n", SHAPES) == [True] * len(SHAPES)
    tolerant = [SHAPES[0], SHAPES[2], SHAPES[3]]
    assert await _score("def f(a, b):\n    return 6.0 + 1e-12\n", tolerant) == [True] * 3
    assert await _score("def f(a, b):\n    return a + b\n", SHAPES) == [False] * len(SHAPES)
    assert await _score("def f(a, b):\n    return '6'\n", SHAPES) == [False] * len(SHAPES)


async def test_plain_containers_and_calls_of_calls_are_graded_outside():
    code = "def g(n):\n    return [n, (n, None), {'k': {n}}]\ndef h(x):\n    return len(x)\n"
    shapes = [
        "assert g(1) == [1, (1, None), {'k': {1}}]",
        "assert g(1)[1][0] == 1 and g(1)[1][1] is None",
        "assert h(g(1)) == 3",
        "assert len(g(2)) == 3 and sorted(g(2)[2]) == ['k']",
        "assert g(1) == g(1)",
        "assert not g(1)[1][1]",
    ]
    assert await _score(code, shapes) == [True] * len(shapes)


async def test_a_probe_that_raises_or_a_test_whose_values_are_forged_twice_fails():
    code = "def f(a, b):\n    raise ValueError('no')\n"
    assert await _score(code, ["assert f(1, 2) == 3", "assert not f(1, 2)"]) == [False, False]


def test_shapes_that_would_compare_inside_the_program_are_refused_naming_the_test():
    for bad in (
        "assert all(f(x) > 0 for x in range(3))",
        "assert f(lambda: 1) == 1",
        "assert f(1 if g() else 2) == 1",
        "assert f(g() == 1) == 1",
        "assert [x for x in f()] == [1]",
        "assert f(1) == 1; x = 2",
        "print(1)",
    ):
        with pytest.raises(EnvError, match="test "):
            parse_test(bad)
