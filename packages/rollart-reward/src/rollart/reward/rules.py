"""Rule rewards: math answer equivalence (math-verify), format checks, environment success.

Why math-verify: answer equivalence (fractions vs decimals, LaTeX, sets, units) is a solved and
maintained problem; a hand-rolled comparator is a perennial source of reward bugs. Its own
signal-based timeouts only work on the main thread, so they are disabled and the call runs in a
worker thread, bounded by the caller's deadline instead.
"""

from __future__ import annotations

import asyncio
import logging
import re

from rollart.env.trajectory import Trajectory
from rollart.resource import checks as check
from rollart.reward.errors import RewardError
from rollart.reward.protocol import RewardResult

_ANSWER_RE = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)


def extract_answer(text: str) -> str | None:
    """The last `<answer>...</answer>` content, else the text itself if it holds a `\\boxed{}`, else None."""
    answers = _ANSWER_RE.findall(text)
    if answers:
        return answers[-1].strip()
    return text if "\\boxed" in text else None


def math_equivalent(prediction: str, ground_truth: str) -> bool:
    """True when math-verify finds the two answers equal (never raises)."""
    from math_verify import parse, verify

    try:
        gold = parse(ground_truth, parsing_timeout=None)
        pred = parse(prediction, parsing_timeout=None)
        return bool(gold) and bool(pred) and bool(verify(gold, pred, timeout_seconds=None))
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
        return RewardResult(score=1.0 if ok else 0.0, details={"answer": answer, "ground_truth": str(truth)})


class FormatReward:
    """The fraction of policy turns whose text matches `pattern` (e.g. an `<answer>` tag)."""

    def __init__(self, pattern: str = r"<answer>.*?</answer>", name: str = "format") -> None:
        """Compile `pattern` (DOTALL)."""
        # VAL: VAL_NON_EMPTY(pattern, exc=RewardError)
        check.non_empty("pattern", pattern, exc=RewardError)  # generated #81150dcb6c
        self.name = name
        self.pattern = re.compile(pattern, re.DOTALL)

    async def score(self, trajectory: Trajectory) -> RewardResult:
        """0.0 for a trajectory without turns."""
        if not trajectory.turns:
            return RewardResult(score=0.0, details={"turns": 0})
        hits = sum(1 for t in trajectory.turns if self.pattern.search(t.response_text))
        return RewardResult(score=hits / len(trajectory.turns), details={"turns": len(trajectory.turns), "matched": hits})


class EnvSuccessReward:
    """1.0 when the environment reported success, else 0.0 (the env's own verdict)."""

    def __init__(self, name: str = "env_success") -> None:
        """No settings."""
        self.name = name

    async def score(self, trajectory: Trajectory) -> RewardResult:
        """Read `trajectory.success` and report the env return alongside."""
        return RewardResult(score=1.0 if trajectory.success else 0.0, details={"env_return": trajectory.env_return})


class WeightedSum:
    """A weighted sum of other reward functions (e.g. 0.9 math + 0.1 format)."""

    def __init__(self, parts: list[tuple[float, object]], name: str = "weighted") -> None:
        """`parts` is a list of (weight, reward function)."""
        # VAL: VAL_NON_EMPTY(parts, exc=RewardError)
        check.non_empty("parts", parts, exc=RewardError)  # generated #3612569066
        self.name = name
        self.parts = parts

    async def score(self, trajectory: Trajectory) -> RewardResult:
        """Score every part concurrently; details keep each part's result."""
        results = await asyncio.gather(*(fn.score(trajectory) for _, fn in self.parts))
        total = sum(w * r.score for (w, _), r in zip(self.parts, results))
        return RewardResult(score=total, details={fn.name: r.model_dump() for (_, fn), r in zip(self.parts, results)})
