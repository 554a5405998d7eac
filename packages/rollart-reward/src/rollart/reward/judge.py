"""LLM-as-judge reward: ask any client with the proxy's `generate` shape, parse the score robustly.

Why robust parsing: judges answer "Score: 8/10", "**8.5**", "<score>0.7</score>", JSON, or ramble;
a parser that takes the first number it sees rewards "In 2 of the steps..." as 2. The parser
prefers explicit forms in order, normalises by the stated scale, and returns None (never raises)
when nothing credible is found, so an unparsable judgement is visible in the details.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable

from rollart import checks as check
from rollart.env.protocols import GenerationRequest, LLMClient, SamplingParams
from rollart.env.trajectory import Trajectory
from rollart.reward.errors import RewardError
from rollart.reward.protocol import RewardResult

DEFAULT_TEMPLATE = (
    "Rate the answer to the task on a scale from {low} to {high}.\n"
    "Task: {question}\nAnswer: {answer}\n"
    "Reply with <score>N</score>."
)
_NUM = r"([-+]?\d+(?:\.\d+)?)"
_PATTERNS = [
    re.compile(r"<score>\s*" + _NUM + r"\s*</score>", re.IGNORECASE),
    re.compile(r"\"score\"\s*:\s*" + _NUM, re.IGNORECASE),
    re.compile(r"score\s*(?:is|=|:)?\s*\**\s*" + _NUM + r"\s*(?:/|out of)\s*" + _NUM, re.IGNORECASE),
    re.compile(r"score\s*(?:is|=|:)\s*\**\s*" + _NUM, re.IGNORECASE),
    re.compile(r"^\s*\**\s*" + _NUM + r"\s*(?:/|out of)\s*" + _NUM + r"\s*\**\s*$", re.IGNORECASE | re.MULTILINE),
    re.compile(r"^\s*\**\s*" + _NUM + r"\s*\**\s*$", re.MULTILINE),
    re.compile(_NUM + r"\s*out of\s*" + _NUM, re.IGNORECASE),
]


def parse_judge_score(text: str, low: float = 0.0, high: float = 10.0) -> float | None:
    """The judge's score mapped to [0, 1], or None when no credible score is present.

    Accepts `<score>N</score>`, JSON `{"score": N}`, `Score: N/M`, `N out of M`, `Score: N`, and a
    line holding only a number; the last explicit occurrence wins (judges revise). Values outside
    [low, high] (or a stated scale M) are rejected rather than clipped.
    """
    if not isinstance(text, str) or not high > low:
        return None
    for pattern in _PATTERNS:
        matches = pattern.findall(text)
        if not matches:
            continue
        match = matches[-1]
        try:
            if isinstance(match, tuple):
                value, scale = float(match[0]), float(match[1])
                if not (math.isfinite(value) and math.isfinite(scale)) or scale <= 0 or not 0 <= value <= scale:
                    return None
                return value / scale
            value = float(match)
        except ValueError:
            return None
        if not math.isfinite(value) or not low <= value <= high:
            return None
        return (value - low) / (high - low)
    try:
        obj = json.loads(text)
    except (ValueError, RecursionError):
        return None
    if isinstance(obj, (int, float)) and not isinstance(obj, bool) and math.isfinite(obj) and low <= obj <= high:
        return (obj - low) / (high - low)
    return None


class LLMJudgeReward:
    """Scores a trajectory by asking a judge model; the score is normalised to [0, 1]."""

    runs_on_loop = True  # never blocks the event loop (service D29)

    def __init__(
        self,
        client: LLMClient,
        encode: Callable[[str], list[int]],
        decode: Callable[[list[int]], str],
        name: str = "judge",
        template: str = DEFAULT_TEMPLATE,
        low: float = 0.0,
        high: float = 10.0,
        max_tokens: int = 64,
    ) -> None:
        """`client` is anything with `generate(GenerationRequest)` (the proxy adapted, or a stub)."""
        # VAL: VAL_INT_RANGE(max_tokens, min=1, max=100_000, exc=RewardError)
        check.int_range("max_tokens", max_tokens, min=1, max=100_000, exc=RewardError)  # generated #3be8990ae2
        # AST: AST_PRECONDITION(high > low, got=(low, high), msg="the score scale is increasing", exc=RewardError)
        check.precondition(high > low, "the score scale is increasing", got=(low, high), exc=RewardError)  # generated #a149e1e6e2
        self.client = client
        self.encode = encode
        self.decode = decode
        self.name = name
        self.template = template
        self.low = low
        self.high = high
        self.max_tokens = max_tokens

    async def score(self, trajectory: Trajectory) -> RewardResult:
        """Render the prompt, generate greedily, parse; an unparsable reply scores 0 with `parse_error`."""
        # deps: parse_judge_score, LLMClient.generate
        prompt = self.template.format(
            low=self.low,
            high=self.high,
            question=trajectory.initial_observation,
            answer=trajectory.final_response(),
        )
        result = await self.client.generate(
            GenerationRequest(
                prompt_ids=self.encode(prompt),
                max_tokens=self.max_tokens,
                sampling=SamplingParams(temperature=0.0),
                trajectory_id=f"judge-{trajectory.id}",
                tag="judge",
            )
        )
        text = self.decode(result.token_ids)
        value = parse_judge_score(text, self.low, self.high)
        if value is None:
            return RewardResult(score=0.0, details={"judge_text": text, "parse_error": True})
        return RewardResult(score=value, details={"judge_text": text})
