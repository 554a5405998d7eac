"""Multi-turn math with a calculator tool (GEM-math-like).

The policy may call `<calc>expression</calc>` any number of times (each returns the value as the
next observation) and ends with `<answer>value</answer>`. Problems come from the shipped tiny
data set or are generated from the reset seed, so every episode is reproducible. The ground truth
is put into the reset info so a reward function (or the reward service) can verify the answer.

Model text is hostile input: every `step` returns an observation or a scored end, whatever the text
(property-tested) in time linear in the text (`last_tagged`, D28), and a final answer is graded exactly: it must be one number written out
(`parse_final_number`), so hedges ("3 or 1"), expressions and overflowing literals score 0.
"""

from __future__ import annotations

import ast
import json
import math
import operator
import random
import re
from fractions import Fraction
from importlib import resources

from rollart import checks as check
from rollart.env.errors import EnvError
from rollart.env.protocols import ResetResult, StepResult

SYSTEM_PROMPT = (
    "Solve the problem. You may use the calculator by writing <calc>expression</calc>; "
    "give the final answer as <answer>number</answer>."
)
PROBLEM_SOURCES = ("generated", "data")
_BINOPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}
MAX_NUMERATOR = 10**30
MAX_DENOMINATOR = 10**12
MAX_ANSWER_CHARS = 64
# One number written out: optional sign, digits (optionally grouped by commas in threes), optional
# decimal part; or an integer fraction a/b. Nothing else: no words, no second number, no exponent.
_NUMBER_RE = re.compile(r"[+-]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?")
_FRACTION_RE = re.compile(r"([+-]?\d+)\s*/\s*(\d+)|([+-]?)\\d?frac\{\s*([+-]?\d+)\s*\}\{\s*(\d+)\s*\}")


class CalculatorError(ValueError):
    """The expression is not plain arithmetic (or divides by zero, or is too large)."""


def _bounded(value: Fraction) -> Fraction:
    if abs(value.numerator) > MAX_NUMERATOR or value.denominator > MAX_DENOMINATOR:
        raise CalculatorError("value too large")
    return value


def safe_eval(expression: str, max_len: int = 200) -> Fraction:
    """Evaluate + - * / and parentheses over integers/decimals exactly; anything else is refused.

    Total on any text: every failure (syntax, null bytes, nesting, inf/nan literals, overflow,
    division by zero) is a `CalculatorError`, which the env turns into an observation.
    """
    if len(expression) > max_len:
        raise CalculatorError(f"expression longer than {max_len} characters")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except (SyntaxError, ValueError, MemoryError, RecursionError) as exc:
        raise CalculatorError(f"not an arithmetic expression: {expression!r}") from exc

    def ev(node: ast.AST) -> Fraction:
        if isinstance(node, ast.Expression):
            return ev(node.body)
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
            if isinstance(node.value, float) and not math.isfinite(node.value):
                raise CalculatorError(f"not a finite number: {node.value!r}")
            if isinstance(node.value, int) and abs(node.value) > MAX_NUMERATOR:
                raise CalculatorError("value too large")
            return _bounded(Fraction(repr(node.value)))
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
            value = ev(node.operand)
            return -value if isinstance(node.op, ast.USub) else value
        if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
            left, right = ev(node.left), ev(node.right)
            if isinstance(node.op, ast.Div) and right == 0:
                raise CalculatorError("division by zero")
            return _bounded(_BINOPS[type(node.op)](left, right))
        raise CalculatorError(f"unsupported element {type(node).__name__}")

    try:
        return ev(tree)
    except RecursionError as exc:
        raise CalculatorError("expression nested too deeply") from exc


def format_number(value: Fraction) -> str:
    """An integer when whole, else a decimal with up to 6 places."""
    if value.denominator == 1:
        return str(value.numerator)
    return f"{float(value):.6f}".rstrip("0").rstrip(".")


def generate_problem(seed: int) -> dict[str, str]:
    """A reproducible word or arithmetic problem with its exact answer."""
    rng = random.Random(seed)
    a, b, c = rng.randint(2, 99), rng.randint(2, 99), rng.randint(2, 20)
    kind = rng.randrange(3)
    if kind == 0:
        question, answer = f"What is {a} * {b} + {c}?", a * b + c
    elif kind == 1:
        question = f"A shop has {c} boxes of {a} apples and sells {b} apples. How many apples are left?"
        answer = c * a - b
    else:
        question, answer = f"What is ({a} + {b}) * {c} - {a}?", (a + b) * c - a
    return {"question": question, "answer": str(answer)}


def load_problems() -> list[dict[str, str]]:
    """The shipped tiny data set (`data/math_problems.jsonl`)."""
    text = resources.files("rollart.env.envs").joinpath("data/math_problems.jsonl").read_text()
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def last_tagged(text: str, tag: str) -> str | None:
    """The content of the last `<tag>...</tag>` pair, in time linear in `len(text)`; None if there is none (D28).

    The pairs are those `re.findall(r"<tag>(.*?)</tag>", text, re.DOTALL)` finds (each opening tag is
    closed by the first closing tag after it, the next pair starts after that), but that regex is
    quadratic on an opening tag repeated without a close (`"<answer>" * 10000` took 40 s), and model
    text is hostile. Here every `str.find` starts where the last one ended, and a missing closing tag
    ends the scan, so the work is one pass over the text.
    """
    opening, closing = f"<{tag}>", f"</{tag}>"
    found, pos = None, 0
    while (start := text.find(opening, pos)) >= 0:
        end = text.find(closing, start + len(opening))
        if end < 0:
            break
        found, pos = text[start + len(opening) : end], end + len(closing)
    return found


def parse_final_number(text: str) -> Fraction | None:
    """The exact value of a final answer written as one number, else None (never raises).

    Accepted: `42`, `-3`, `1,234`, `2.5`, `7/2`, `\\frac{7}{2}`, optionally wrapped in `$...$` or `\\boxed{...}` and
    followed by a period. Refused (None): two numbers ("3 or 1", "1, 3"), expressions ("2^10 - 1"),
    exponents ("1e999"), words, anything over 64 characters. Why so strict: a grader that searches
    the text for *a* number lets a policy hedge, and one that evaluates expressions can be made to
    round a huge value to the truth; a final answer is a number.
    """
    if not isinstance(text, str) or len(text) > MAX_ANSWER_CHARS:
        return None
    t = text.strip().rstrip(".").strip()
    if len(t) >= 2 and t[0] == "$" and t[-1] == "$":
        t = t.strip("$").strip()
    if t.startswith("\\boxed{") and t.endswith("}"):
        t = t[len("\\boxed{") : -1].strip()
    if _NUMBER_RE.fullmatch(t):
        value = Fraction(t.replace(",", ""))
    elif m := _FRACTION_RE.fullmatch(t):
        if m.group(1) is not None:
            num, den = int(m.group(1)), int(m.group(2))
        else:
            num, den = int(m.group(4)) * (-1 if m.group(3) == "-" else 1), int(m.group(5))
        if den == 0:
            return None
        value = Fraction(num, den)
    else:
        return None
    if abs(value.numerator) > MAX_NUMERATOR or value.denominator > MAX_DENOMINATOR:
        return None
    return value


def answers_match(given: str, truth: str) -> bool:
    """Exact: both parse as one number and are equal; a non-numeric truth needs the same stripped text.

    Never raises, whatever `given` is (it is model text).
    """
    # deps: parse_final_number
    want = parse_final_number(truth)
    if want is None:
        return isinstance(given, str) and given.strip() == truth.strip()
    return parse_final_number(given) == want


class MathCalcEnv:
    """Multi-turn math with a calculator tool; reward 1 for a correct final answer, else 0."""

    def __init__(self, source: str = "generated", max_tool_calls: int = 4) -> None:
        """`source` is 'generated' (problem from the seed) or 'data' (shipped problem chosen by the seed)."""
        # VAL: VAL_ONE_OF(source, choices=PROBLEM_SOURCES, exc=EnvError)
        check.one_of("source", source, PROBLEM_SOURCES, exc=EnvError)  # generated #b737c639a4
        # VAL: VAL_INT_RANGE(max_tool_calls, min=0, max=1000, exc=EnvError)
        check.int_range("max_tool_calls", max_tool_calls, min=0, max=1000, exc=EnvError)  # generated #a352443fd7
        self.name = "math_calc"
        self.system_prompt = SYSTEM_PROMPT
        self.source = source
        self.max_tool_calls = max_tool_calls
        self._problems = load_problems() if source == "data" else []
        self._problem: dict[str, str] | None = None
        self._tool_calls = 0

    async def reset(self, seed: int | None = None) -> ResetResult:
        """Draw the problem for `seed` (None means seed 0)."""
        seed = 0 if seed is None else seed
        self._problem = self._problems[seed % len(self._problems)] if self._problems else generate_problem(seed)
        self._tool_calls = 0
        return ResetResult(
            observation=self._problem["question"],
            info={"ground_truth": self._problem["answer"], "question": self._problem["question"]},
        )

    async def step(self, action: str) -> StepResult:
        """An `<answer>` ends the episode; a `<calc>` returns its value; anything else gets a hint."""
        # AST: AST_PRECONDITION(self._problem is not None, got=self._problem, msg="reset before step", exc=EnvError)
        check.precondition(self._problem is not None, "reset before step", got=self._problem, exc=EnvError)  # generated #c243cfb39b
        truth = self._problem["answer"]
        answer = last_tagged(action, "answer")
        if answer is not None:
            ok = answers_match(answer, truth)
            return StepResult(
                "Correct." if ok else "Wrong answer.", 1.0 if ok else 0.0, True, False, {"success": ok}
            )
        call = last_tagged(action, "calc")
        if call is not None:
            self._tool_calls += 1
            if self._tool_calls > self.max_tool_calls:
                return StepResult("Tool budget exhausted.", 0.0, False, True, {"success": False})
            try:
                observation = f"Calculator: {format_number(safe_eval(call))}"
            except CalculatorError as exc:
                observation = f"Calculator error: {exc}"
            return StepResult(observation, 0.0, False, False, {"tool_call": True})
        return StepResult("Use <calc>...</calc> or give <answer>...</answer>.", 0.0, False, False, {"format_error": True})

    async def close(self) -> None:
        """Nothing to release."""
