"""Rule rewards: exact math answers, format checks, environment success.

The math rule (design D10): a final answer is graded *exactly* and must be *one* answer. A numeric
truth needs one number written out (`rollart.env.envs.math_calc.parse_final_number`, the rule the
math env uses too) equal to it as a fraction. A symbolic truth (LaTeX, sets, intervals) goes to
math-verify, but only when the parser consumed the whole answer (so "3 or 1" is not read as "1"),
with no decimal approximating a symbolic value, exact `simplify(gold - pred) == 0` for expressions,
and after refusing exponent towers and huge exponents (which would make sympy evaluate a
10-billion-digit number). math-verify's signal-based timeouts only work on the main thread, so they
are disabled and the call runs in a worker thread, bounded by the caller's deadline instead.
"""

from __future__ import annotations

import asyncio
import logging
import re

from rollart import checks as check
from rollart.env.envs.math_calc import parse_final_number
from rollart.env.trajectory import Trajectory
from rollart.reward.errors import RewardError
from rollart.reward.protocol import RewardResult

_ANSWER_RE = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
UNIT_RANGE = (0.0, 1.0)
MAX_SYMBOLIC_CHARS = 200
# exponent towers (a^{b^c}, a^b^c, a**b**c), exponents of 4+ digits, factorials of big or grouped values
_UNBOUNDED_RE = re.compile(
    r"\^\s*\{[^{}]*[\^{]|\^\s*[\w.]+\s*\^|\*\*[^*]*\*\*|(?:\^|\*\*)\s*[{(]?\s*[-+]?\d{4,}|(?:\d{4,}|[})\]])\s*!"
)


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
    """
    answers = _ANSWER_RE.findall(text)
    if answers:
        return answers[-1].strip()
    return _last_boxed(text)


def _unwrap(text: str) -> str:
    t = text.strip().rstrip(".").strip()
    if len(t) >= 2 and t[0] == "$" and t[-1] == "$":
        t = t.strip("$").strip()
    inner = _last_boxed(t) if t.startswith("\\boxed{") and t.endswith("}") else None
    return inner if inner is not None else t


def _squash(text: str) -> str:
    return re.sub(r"\s+", "", text)


def _symbolic_equivalent(prediction: str, ground_truth: str) -> bool:
    import sympy
    from math_verify import parse, verify

    text = _unwrap(prediction)
    if not text or len(text) > MAX_SYMBOLIC_CHARS or _UNBOUNDED_RE.search(text):
        return False
    gold = parse(f"${_unwrap(ground_truth)}$", parsing_timeout=None)
    pred = parse(f"${text}$", parsing_timeout=None)
    if len(gold) < 2 or len(pred) < 2 or _squash(str(pred[1])) != _squash(text):
        return False  # the parser read only part of the answer: a hedge ("a or b") or a fragment
    g, p = gold[0], pred[0]
    if isinstance(g, sympy.Expr) and isinstance(p, sympy.Expr):
        if p.atoms(sympy.Float) and not g.atoms(sympy.Float):
            return False  # a decimal approximates a symbolic truth; it does not equal it
        return bool(sympy.simplify(g - p) == 0)
    return bool(verify(gold, pred, timeout_seconds=None))


def math_equivalent(prediction: str, ground_truth: str) -> bool:
    """True when the prediction is one answer exactly equal to the ground truth (never raises).

    Numeric truth: `parse_final_number` on both, equal as fractions (hedges, expressions,
    exponents, words are refused). Symbolic truth: the bounded math-verify path (module docstring).
    """
    # deps: parse_final_number
    try:
        want = parse_final_number(ground_truth)
        if want is not None:
            return parse_final_number(prediction) == want
        return _symbolic_equivalent(prediction, ground_truth)
    except Exception:
        return False


class MathAnswerReward:
    """1.0 when the final answer equals `trajectory.info[truth_key]` (math-verify), else 0.0."""

    def __init__(self, name: str = "math", truth_key: str = "ground_truth") -> None:
        """`truth_key` names the ground-truth entry the environment put in the reset info."""
        # VAL: VAL_NON_EMPTY(name, exc=RewardError)
        check.non_empty("name", name, exc=RewardError)  # generated #87b045a1cf
        self.name = name
        self.truth_key = truth_key
        self.score_range = UNIT_RANGE
        # math-verify warns on every call that its signal timeouts are off (they are, on purpose: D4)
        logging.getLogger("math_verify").setLevel(logging.ERROR)

    async def score(self, trajectory: Trajectory) -> RewardResult:
        """Extract the answer of the last turn and verify it against the ground truth."""
        # deps: extract_answer, math_equivalent
        truth = trajectory.info.get(self.truth_key)
        if truth is None:
            return RewardResult(score=0.0, details={"error": f"no {self.truth_key!r} in trajectory.info"})
        answer = extract_answer(trajectory.final_response())
        if answer is None:
            return RewardResult(score=0.0, details={"answer": None})
        ok = await asyncio.to_thread(math_equivalent, answer, str(truth))
        score = 1.0 if ok else 0.0
        # AST: AST_POSTCONDITION(self.score_range[0] <= score <= self.score_range[1], got=score, msg="score in the declared range", exc=RewardError)
        check.postcondition(self.score_range[0] <= score <= self.score_range[1], "score in the declared range", got=score, exc=RewardError)  # generated #4bc15a0b2e
        return RewardResult(score=score, details={"answer": answer, "ground_truth": str(truth)})


class FormatReward:
    """The fraction of policy turns whose text matches `pattern` (e.g. an `<answer>` tag)."""

    def __init__(self, pattern: str = r"<answer>.*?</answer>", name: str = "format") -> None:
        """Compile `pattern` (DOTALL)."""
        # VAL: VAL_NON_EMPTY(pattern, exc=RewardError)
        check.non_empty("pattern", pattern, exc=RewardError)  # generated #81150dcb6c
        self.name = name
        self.pattern = re.compile(pattern, re.DOTALL)
        self.score_range = UNIT_RANGE

    async def score(self, trajectory: Trajectory) -> RewardResult:
        """0.0 for a trajectory without turns."""
        if not trajectory.turns:
            return RewardResult(score=0.0, details={"turns": 0})
        hits = sum(1 for t in trajectory.turns if self.pattern.search(t.response_text))
        score = hits / len(trajectory.turns)
        # AST: AST_POSTCONDITION(self.score_range[0] <= score <= self.score_range[1], got=score, msg="score in the declared range", exc=RewardError)
        check.postcondition(self.score_range[0] <= score <= self.score_range[1], "score in the declared range", got=score, exc=RewardError)  # generated #4bc15a0b2e
        return RewardResult(score=score, details={"turns": len(trajectory.turns), "matched": hits})


class EnvSuccessReward:
    """1.0 when the environment reported success, else 0.0 (the env's own verdict)."""

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

    async def score(self, trajectory: Trajectory) -> RewardResult:
        """Score every part concurrently; details keep each part's result."""
        results = await asyncio.gather(*(fn.score(trajectory) for _, fn in self.parts))
        total = sum(w * r.score for (w, _), r in zip(self.parts, results))
        # AST: AST_POSTCONDITION(self.score_range[0] - 1e-9 <= total <= self.score_range[1] + 1e-9, got=total, msg="score in the declared range", exc=RewardError)
        check.postcondition(self.score_range[0] - 1e-9 <= total <= self.score_range[1] + 1e-9, "score in the declared range", got=total, exc=RewardError)  # generated #ce66bc9c00
        return RewardResult(score=total, details={fn.name: r.model_dump() for (_, fn), r in zip(self.parts, results)})
