"""Rule rewards: exact math answers, format checks, environment success.

The math rule (design D10): a final answer is graded *exactly* and must be *one* answer. A numeric
truth needs one number written out (`rollart.env.envs.math_calc.parse_final_number`, the rule the
math env uses too) equal to it as a fraction. A symbolic truth (LaTeX, sets, intervals) goes to
math-verify, but only when the parser consumed the whole answer (so "3 or 1" is not read as "1"),
with no decimal approximating a symbolic value, exact `simplify(gold - pred) == 0` for expressions.

Bounded before parsing (D27): length, bracket nesting, powers of powers (`(9^{999})^{999}`),
exponents that multiply or have 4+ digits (`2^{999\\cdot 999}`), and factorials, binomials and
Gamma of 4+ digit arguments are refused with a reason, because sympy evaluates an integer power
eagerly while parsing. Whatever passes these filters and is still slow is stopped by the grading
pool (`rollart.reward.grading`): symbolic grading runs in a worker process killed at its deadline.
math-verify's signal-based timeouts only work on the main thread, so they stay disabled.

One value (D28): a response that states two values (`a \\approx b`, `a = b = c` with different
values) is not one answer; each value of an `=` chain must equal the truth.
"""

from __future__ import annotations

import asyncio
import logging
import re

from rollart import checks as check
from rollart.env.envs.math_calc import last_tagged, parse_final_number
from rollart.env.trajectory import Trajectory
from rollart.reward.errors import RewardError
from rollart.reward.protocol import RewardResult

UNIT_RANGE = (0.0, 1.0)
MAX_SYMBOLIC_CHARS = 200
MAX_NESTING = 12
MAX_EXPONENT_DIGITS = 3  # 9^{999} has 954 digits: cheap; 9^{9999} is where sympy starts to crawl
MAX_SPECIAL_ARG_DIGITS = 3  # 999! has 2565 digits; binomials and Gamma grow the same way
GRADING_TIMEOUT_S = 2.0
# exponent towers (a^{b^c}, a^b^c, a**b**c), exponents of 4+ digits, factorials of big or grouped values
_UNBOUNDED_RE = re.compile(
    r"\^\s*\{[^{}]*[\^{]|\^\s*[\w.]+\s*\^|\*\*[^*]*\*\*|(?:\^|\*\*)\s*[{(]?\s*[-+]?\d{4,}|(?:\d{4,}|[})\]])\s*!"
)
_EXPONENT_OPS_RE = re.compile(r"\\cdot|\\times|\*|!|\\binom|\\choose|\\Gamma")
_SPECIAL_RE = re.compile(r"\\[dt]?binom|\\choose|\\Gamma|\\operatorname\s*\{\s*Gamma|!")
_INTEGER_RE = re.compile(r"\d+")
# stating an approximation is stating a second value
_APPROX_RE = re.compile(r"\\(?:approx|thickapprox|simeq|sim|eqsim|cong|doteq|fallingdotseq|risingdotseq)(?![a-zA-Z])|\u2248|\u2243|\u2245")
_LABEL_RE = re.compile(r"\s*(?:[A-Za-z]|\\[A-Za-z]+)(?:_\{?\w+\}?)?\s*:?\s*")
_CLOSE_TO_OPEN = {")": "(", "]": "[", "}": "{"}


def _last_boxed(text: str) -> str | None:
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    depth, i = 0, start + len("\\boxed")
    for j in range(i, len(text)):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            return text[i + 1 : j].strip()
    return None


def extract_answer(text: str) -> str | None:
    """The last `<answer>...</answer>` content, else the content of the last `\\boxed{...}`, else None.

    The last answer is the one graded (as the math env does): writing several gains nothing.
    Linear in `len(text)` (D27): the regex it replaces was quadratic on `"<answer>" * 10000` (40 s).
    """
    # deps: last_tagged
    answer = last_tagged(text, "answer")
    if answer is not None:
        return answer.strip()
    return _last_boxed(text)


def _unwrap(text: str) -> str:
    t = text.strip().rstrip(".").strip()
    if len(t) >= 2 and t[0] == "$" and t[-1] == "$":
        t = t.strip("$").strip()
    inner = _last_boxed(t) if t.startswith("\\boxed{") and t.endswith("}") else None
    return inner if inner is not None else t


def _squash(text: str) -> str:
    return re.sub(r"\s+", "", text)


def _group_start(text: str, close: int) -> int:
    """The index of the bracket that the one at `close` closes (-1 if unbalanced)."""
    depth = 0
    for i in range(close, -1, -1):
        if text[i] in _CLOSE_TO_OPEN:
            depth += 1
        elif text[i] in "([{":
            depth -= 1
            if depth == 0:
                return i
    return -1


def _exponent(text: str, caret: int) -> str:
    """The exponent after the `^` at `caret`: a braced group, or the next token."""
    i = caret + 1
    while i < len(text) and text[i].isspace():
        i += 1
    if i < len(text) and text[i] == "{":
        depth = 0
        for j in range(i, len(text)):
            depth += {"{": 1, "}": -1}.get(text[j], 0)
            if depth == 0:
                return text[i + 1 : j]
        return text[i + 1 :]
    m = re.match(r"[-+]?(?:\d+|\\[A-Za-z]+|\w)", text[i:])
    return m.group(0) if m else text[i : i + 1]


def unbounded_reason(text: str) -> str | None:
    """Why sympy could not grade `text` in bounded time and memory, or None when it is within the bounds.

    Checked on the text before any parsing, because sympy evaluates integer powers, factorials and
    binomials eagerly while parsing: `2^{999\\cdot 999\\cdot 999}` is a 300-million-digit number
    before any comparison runs. The bounds (D27) are far above what a math answer needs.
    """
    # deps: none
    if len(text) > MAX_SYMBOLIC_CHARS:
        return f"answer longer than {MAX_SYMBOLIC_CHARS} characters"
    depth = deepest = 0
    for ch in text:
        depth += 1 if ch in "([{" else -1 if ch in ")]}" else 0
        deepest = max(deepest, depth)
    if deepest > MAX_NESTING:
        return f"brackets nested deeper than {MAX_NESTING}"
    if _UNBOUNDED_RE.search(text):
        return "exponent tower or huge exponent"
    for caret in (i for i, ch in enumerate(text) if ch == "^"):
        before = caret - 1
        while before >= 0 and text[before].isspace():
            before -= 1
        if before >= 0 and text[before] in _CLOSE_TO_OPEN:
            start = _group_start(text, before)
            if start < 0 or "^" in text[start:before]:
                return "a power of a power"
        exponent = _exponent(text, caret)
        if "^" in exponent or _EXPONENT_OPS_RE.search(exponent):
            return "an exponent that is itself a product, power, factorial or root"
        if any(len(n) > MAX_EXPONENT_DIGITS for n in _INTEGER_RE.findall(exponent)):
            return f"an exponent with more than {MAX_EXPONENT_DIGITS} digits"
    if _SPECIAL_RE.search(text) and any(len(n) > MAX_SPECIAL_ARG_DIGITS for n in _INTEGER_RE.findall(text)):
        return f"a factorial, binomial or Gamma with a number of more than {MAX_SPECIAL_ARG_DIGITS} digits"
    return None


def _top_level_split(text: str, sep: str) -> list[str]:
    parts, depth, last = [], 0, 0
    for i, ch in enumerate(text):
        depth += 1 if ch in "([{" else -1 if ch in ")]}" else 0
        if ch == sep and depth == 0:
            parts.append(text[last:i])
            last = i + 1
    parts.append(text[last:])
    return parts


def stated_values(text: str) -> list[str] | None:
    """The values an answer states: `[text]`, or each member of an `=` chain; None when it states an approximation.

    `x = 3 = \\sqrt{2}` states 3 and \\sqrt{2} (a leading variable name is a label, not a value);
    `\\sqrt{2} \\approx 3` states two values by definition, so it is not one answer (D28).
    An empty member (`= 3`, `3 ==`) makes the chain malformed: None.
    """
    # deps: none
    if _APPROX_RE.search(text):
        return None
    parts = _top_level_split(text, "=")
    if len(parts) == 1:
        return parts
    if _LABEL_RE.fullmatch(parts[0]):
        parts = parts[1:]
    parts = [p.strip() for p in parts]
    return parts if all(parts) else None


def _parsed_equal(text: str, ground_truth: str) -> bool:
    import sympy
    from math_verify import parse, verify

    gold = parse(f"${_unwrap(ground_truth)}$", parsing_timeout=None)
    pred = parse(f"${text}$", parsing_timeout=None)
    if len(gold) < 2 or len(pred) < 2 or _squash(str(pred[1])) != _squash(text):
        return False  # the parser read only part of the answer: a hedge ("a or b") or a fragment
    g, p = gold[0], pred[0]
    if isinstance(g, sympy.Expr) and isinstance(p, sympy.Expr):
        if p.atoms(sympy.Float) and not g.atoms(sympy.Float):
            return False  # a decimal approximates a symbolic truth; it does not equal it
        if g == p:
            return True  # structurally identical: also oo == oo, where simplify(oo - oo) is nan
        return bool(sympy.simplify(g - p) == 0)
    return bool(verify(gold, pred, timeout_seconds=None))


def _symbolic_grade(prediction: str, ground_truth: str) -> tuple[bool, str | None]:
    text = _unwrap(prediction)
    if not text:
        return False, "empty answer"
    gold_text = _unwrap(ground_truth)
    for checked in (text, gold_text):
        if reason := unbounded_reason(checked):
            return False, f"refused: {reason}"
    if "=" in gold_text or _APPROX_RE.search(gold_text):
        return _parsed_equal(text, ground_truth), None  # the truth is itself an equation: compare whole
    values = stated_values(text)
    if values is None:
        return False, "states an approximation or a malformed chain, not one value"
    if len(values) > 1 and not all(_parsed_equal(v, ground_truth) for v in values):
        return False, "states different values"
    return _parsed_equal(values[0], ground_truth), None


def grade(prediction: str, ground_truth: str) -> tuple[bool, str | None]:
    """`(equal, reason)`: whether the prediction is one answer exactly equal to the truth, and why not.

    Never raises. What the grading worker runs (`rollart.reward.grading`), and what
    `math_equivalent` returns the first half of. `reason` names a refusal (an input bound, two
    stated values) or an error; None when the answer was simply compared.
    """
    # deps: parse_final_number, unbounded_reason, stated_values
    try:
        want = parse_final_number(ground_truth)
        if want is not None:
            return parse_final_number(prediction) == want, None
        return _symbolic_grade(prediction, ground_truth)
    except Exception as exc:
        return False, f"grader error: {type(exc).__name__}"[:200]


def math_equivalent(prediction: str, ground_truth: str) -> bool:
    """True when the prediction is one answer exactly equal to the ground truth (never raises).

    Numeric truth: `parse_final_number` on both, equal as fractions (hedges, expressions,
    exponents, words are refused). Symbolic truth: the bounded math-verify path (module docstring).
    Runs in the calling thread; `MathAnswerReward` runs the symbolic path in the grading pool.
    """
    # deps: grade
    return grade(prediction, ground_truth)[0]


class MathAnswerReward:
    """1.0 when the final answer equals `trajectory.info[truth_key]` (math-verify), else 0.0."""

    runs_on_loop = True  # never blocks the event loop (service D29)

    def __init__(self, name: str = "math", truth_key: str = "ground_truth",
                 grading_timeout_s: float = GRADING_TIMEOUT_S) -> None:
        """`truth_key` names the ground-truth entry the environment put in the reset info;
        `grading_timeout_s` bounds one symbolic comparison (its worker is killed past it, D27)."""
        # VAL: VAL_NON_EMPTY(name, exc=RewardError)
        check.non_empty("name", name, exc=RewardError)  # generated #87b045a1cf
        # VAL: VAL_TIMEOUT(grading_timeout_s, exc=RewardError)
        check.timeout("grading_timeout_s", grading_timeout_s, exc=RewardError)  # generated #12470d5fb2
        self.name = name
        self.truth_key = truth_key
        self.grading_timeout_s = grading_timeout_s
        self.score_range = UNIT_RANGE
        # math-verify warns on every call that its signal timeouts are off (they are, on purpose: D4)
        logging.getLogger("math_verify").setLevel(logging.ERROR)

    async def score(self, trajectory: Trajectory) -> RewardResult:
        """Extract the answer of the last turn and verify it against the ground truth.

        A numeric truth is compared in process (`parse_final_number` reads at most 64 characters);
        a symbolic one in the grading pool, so no answer can hold the event loop: past
        `grading_timeout_s` the item scores 0 with reason "grading timeout".
        """
        # deps: extract_answer, grade, GradingPool.grade
        from rollart.reward.grading import GradingFailed, GradingTimeout, shared_pool

        truth = trajectory.info.get(self.truth_key)
        if truth is None:
            return RewardResult(score=0.0, details={"error": f"no {self.truth_key!r} in trajectory.info"})
        answer = extract_answer(trajectory.final_response())
        if answer is None:
            return RewardResult(score=0.0, details={"answer": None})
        details: dict = {"answer": answer[:MAX_SYMBOLIC_CHARS + 1], "ground_truth": str(truth)}
        if parse_final_number(str(truth)) is not None:
            ok, reason = grade(answer, str(truth))
        else:
            try:
                ok, reason = await shared_pool().grade(answer, str(truth), self.grading_timeout_s)
            except GradingTimeout:
                ok, reason = False, "grading timeout"
            except GradingFailed as exc:
                ok, reason = False, f"grading failed: {exc}"
        if reason is not None:
            details["reason"] = reason
        score = 1.0 if ok else 0.0
        # AST: AST_POSTCONDITION(self.score_range[0] <= score <= self.score_range[1], got=score, msg="score in the declared range", exc=RewardError)
        check.postcondition(self.score_range[0] <= score <= self.score_range[1], "score in the declared range", got=score, exc=RewardError)  # generated #4bc15a0b2e
        return RewardResult(score=score, details=details)


class FormatReward:
    """The fraction of policy turns whose text matches `pattern` (default: an `<answer>...</answer>` pair)."""

    runs_on_loop = True  # never blocks the event loop (service D29)

    def __init__(self, pattern: str | None = None, name: str = "format") -> None:
        """Compile `pattern` (DOTALL); None (the default) checks for an `<answer>` pair in linear time.

        Why not the regex `<answer>.*?</answer>` as before: it is quadratic on an opening tag
        repeated without a close (D27). A custom pattern is the caller's to keep linear.
        """
        if pattern is not None:
            # VAL: VAL_NON_EMPTY(pattern, exc=RewardError)
            check.non_empty("pattern", pattern, exc=RewardError)  # generated #81150dcb6c
        self.name = name
        self.pattern = re.compile(pattern, re.DOTALL) if pattern is not None else None
        self.score_range = UNIT_RANGE

    def _matches(self, text: str) -> bool:
        if self.pattern is None:
            return last_tagged(text, "answer") is not None
        return self.pattern.search(text) is not None

    async def score(self, trajectory: Trajectory) -> RewardResult:
        """0.0 for a trajectory without turns."""
        if not trajectory.turns:
            return RewardResult(score=0.0, details={"turns": 0})
        hits = sum(1 for t in trajectory.turns if self._matches(t.response_text))
        score = hits / len(trajectory.turns)
        # AST: AST_POSTCONDITION(self.score_range[0] <= score <= self.score_range[1], got=score, msg="score in the declared range", exc=RewardError)
        check.postcondition(self.score_range[0] <= score <= self.score_range[1], "score in the declared range", got=score, exc=RewardError)  # generated #4bc15a0b2e
        return RewardResult(score=score, details={"turns": len(trajectory.turns), "matched": hits})


class EnvSuccessReward:
    """1.0 when the environment reported success, else 0.0 (the env's own verdict)."""

    runs_on_loop = True  # never blocks the event loop (service D29)

    def __init__(self, name: str = "env_success") -> None:
        """No settings."""
        self.name = name
        self.score_range = UNIT_RANGE

    async def score(self, trajectory: Trajectory) -> RewardResult:
        """Read `trajectory.success` and report the env return alongside."""
        return RewardResult(score=1.0 if trajectory.success else 0.0, details={"env_return": trajectory.env_return})


class WeightedSum:
    """A weighted sum of other reward functions (e.g. 0.9 math + 0.1 format)."""

    def __init__(self, parts: list[tuple[float, object]], name: str = "weighted") -> None:
        """`parts` is a list of (weight, reward function); each part must declare its `score_range`."""
        # VAL: VAL_NON_EMPTY(parts, exc=RewardError)
        check.non_empty("parts", parts, exc=RewardError)  # generated #3612569066
        self.name = name
        self.parts = parts
        for _, fn in parts:
            # AST: AST_PRECONDITION(hasattr(fn, "score_range"), got=fn, msg="every part declares its score_range", exc=RewardError)
            check.precondition(hasattr(fn, "score_range"), "every part declares its score_range", got=fn, exc=RewardError)  # generated #5ae58928c4
        lows = [min(w * fn.score_range[0], w * fn.score_range[1]) for w, fn in parts]
        highs = [max(w * fn.score_range[0], w * fn.score_range[1]) for w, fn in parts]
        self.score_range = (sum(lows), sum(highs))
        # on the service's loop only if no part may block (service D29)
        self.runs_on_loop = all(getattr(fn, "runs_on_loop", False) for _, fn in parts)

    async def score(self, trajectory: Trajectory) -> RewardResult:
        """Score every part concurrently; details keep each part's result."""
        results = await asyncio.gather(*(fn.score(trajectory) for _, fn in self.parts))
        total = sum(w * r.score for (w, _), r in zip(self.parts, results))
        # AST: AST_POSTCONDITION(self.score_range[0] - 1e-9 <= total <= self.score_range[1] + 1e-9, got=total, msg="score in the declared range", exc=RewardError)
        check.postcondition(self.score_range[0] - 1e-9 <= total <= self.score_range[1] + 1e-9, "score in the declared range", got=total, exc=RewardError)  # generated #ce66bc9c00
        return RewardResult(score=total, details={fn.name: r.model_dump() for (_, fn), r in zip(self.parts, results)})
