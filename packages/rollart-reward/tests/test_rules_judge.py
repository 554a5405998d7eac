"""Rule rewards (math-verify, format, env success), the LLM judge and its score parser."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rollart.env.protocols import GenerationRequest, GenerationResult
from rollart.env.trajectory import Trajectory, Turn
from rollart.reward.errors import RewardError
from rollart.reward.judge import LLMJudgeReward, parse_judge_score
from rollart.reward.protocol import RewardFn, RewardRegistry
from rollart.reward.rules import EnvSuccessReward, FormatReward, MathAnswerReward, WeightedSum, extract_answer


def traj(*responses, truth=None, success=False, question="What is 1/2 + 1/4?"):
    turns = [Turn(prompt_ids=[1], response_ids=[2], response_logprobs=[-1.0], response_text=r) for r in responses]
    info = {"ground_truth": truth} if truth is not None else {}
    return Trajectory(id="t1", turns=turns, info=info, success=success, initial_observation=question)


@pytest.mark.parametrize(
    ("answer", "truth", "score"),
    [
        ("<answer>0.75</answer>", "3/4", 1.0),
        ("so \\boxed{\\frac{3}{4}}", "0.75", 1.0),
        ("<answer>3/4</answer>", "\\frac{3}{4}", 1.0),
        ("<answer>0.7</answer>", "3/4", 0.0),
        ("no answer here", "3/4", 0.0),
    ],
)
async def test_math_answer_reward_uses_math_verify_equivalence(answer, truth, score):
    result = await MathAnswerReward().score(traj("thinking", answer, truth=truth))
    assert result.score == score


async def test_math_reward_without_ground_truth_says_why():
    result = await MathAnswerReward().score(traj("<answer>1</answer>"))
    assert result.score == 0.0 and "ground_truth" in result.details["error"]


async def test_format_env_success_and_weighted_sum():
    t = traj("<answer>1</answer>", "plain", success=True, truth="1")
    assert (await FormatReward().score(t)).score == 0.5
    assert (await EnvSuccessReward().score(t)).score == 1.0
    combo = WeightedSum([(0.9, EnvSuccessReward()), (0.1, FormatReward())], name="combo")
    result = await combo.score(t)
    assert result.score == pytest.approx(0.95) and set(result.details) == {"env_success", "format"}
    assert isinstance(combo, RewardFn)
    assert extract_answer("a <answer>1</answer> b <answer> 2 </answer>") == "2"


def test_registry_names_and_errors():
    reg = RewardRegistry()
    reg.register(FormatReward())
    with pytest.raises(RewardError, match="reward names are unique"):
        reg.register(FormatReward())
    with pytest.raises(RewardError, match=r"name must be one of \['format'\], got 'nope'"):
        reg.get("nope")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("<score>7</score>", 0.7),
        ("Score: 8/10", 0.8),
        ("I give it 9 out of 10", 0.9),
        ('{"score": 4}', 0.4),
        ("**6**", 0.6),
        ("In 2 steps it failed. Score: 3", 0.3),
        ("<score>2</score> on reflection <score>5</score>", 0.5),
        ("Score: 11", None),
        ("Score: 12/10", None),
        ("looks fine", None),
        ("", None),
    ],
)
def test_judge_score_parsing(text, expected):
    value = parse_judge_score(text)
    assert value == (pytest.approx(expected) if expected is not None else None)


@given(st.text(), st.floats(-100, 100), st.floats(-100, 100))
def test_judge_score_parsing_never_crashes_and_stays_in_unit_range(text, low, high):
    value = parse_judge_score(text, low, high)
    assert value is None or 0.0 <= value <= 1.0


class _JudgeStub:
    """A stub judge client (the real one is the proxy behind the scheduler's adapter)."""

    def __init__(self, reply):
        self.reply = reply
        self.requests = []

    async def generate(self, request: GenerationRequest) -> GenerationResult:
        self.requests.append(request)
        ids = list(self.reply.encode())
        return GenerationResult(ids, [0.0] * len(ids), [0] * len(ids), "stop")


async def test_llm_judge_reward_asks_and_parses():
    stub = _JudgeStub("The answer is right. <score>9</score>")
    judge = LLMJudgeReward(stub, encode=lambda s: list(s.encode()), decode=lambda ids: bytes(ids).decode())
    result = await judge.score(traj("<answer>0.75</answer>"))
    assert result.score == pytest.approx(0.9)
    prompt = bytes(stub.requests[0].prompt_ids).decode()
    assert "What is 1/2 + 1/4?" in prompt and "<answer>0.75</answer>" in prompt
    assert stub.requests[0].sampling.temperature == 0.0
    unparsable = LLMJudgeReward(_JudgeStub("hmm"), encode=lambda s: [1], decode=lambda ids: "hmm")
    bad = await unparsable.score(traj("x"))
    assert bad.score == 0.0 and bad.details["parse_error"] is True
    with pytest.raises(RewardError, match="the score scale is increasing"):
        LLMJudgeReward(stub, encode=list, decode=str, low=5, high=5)
