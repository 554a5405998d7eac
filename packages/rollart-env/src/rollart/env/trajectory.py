"""The `Trajectory`: the unit of rollout that crosses package lines (to reward, buffer, trainer).

Why pydantic: a trajectory travels as JSON to the Reward-as-a-Service and between Ray actors, so
it needs validated (de)serialisation; the token-level fields are the ground truth the trainer
consumes, so they are recorded exactly as generated and never re-derived from text.
"""

from __future__ import annotations

from enum import Enum
from typing import Any

from pydantic import BaseModel, Field


class TrajectoryStatus(str, Enum):
    """Life cycle of a trajectory: RUNNING, then exactly one terminal status."""

    RUNNING = "running"
    FINISHED = "finished"  # the episode ended (terminated / truncated / max turns / max tokens)
    ABORTED = "aborted"  # cancelled from outside (staleness, redundancy, shutdown) or by the LLM side
    FAILED = "failed"  # infrastructure failure after retries (env crash, env timeout, LLM error)


TERMINAL_STATUSES = frozenset({TrajectoryStatus.FINISHED, TrajectoryStatus.ABORTED, TrajectoryStatus.FAILED})
ALLOWED_TRANSITIONS = {TrajectoryStatus.RUNNING: TERMINAL_STATUSES}


class Turn(BaseModel):
    """One policy turn: the tokens added to the context before it, and the tokens the policy produced.

    `prompt_ids` holds only the *new* context tokens of this turn (the first turn: the whole
    templated prompt; later turns: end of the previous assistant message plus the observation
    and the generation prompt), so concatenating prompt_ids + response_ids over all turns gives
    the exact token sequence the model saw.
    """

    prompt_ids: list[int]
    response_ids: list[int]
    response_logprobs: list[float]
    response_weight_versions: list[int] = Field(default_factory=list)
    weight_version: int = -1  # the version that produced the first response token of this turn
    finish_reason: str = "stop"
    response_text: str = ""
    observation: str = ""  # what the environment answered after this turn's action ("" if none)
    env_reward: float = 0.0
    t_generate_start: float = 0.0
    t_generate_end: float = 0.0
    t_step_end: float = 0.0


class Trajectory(BaseModel):
    """A multi-turn episode with token-exact records, status and reward fields filled later."""

    id: str
    group_id: str = ""
    env_name: str = ""
    tag: str = "default"
    seed: int | None = None
    turns: list[Turn] = Field(default_factory=list)
    initial_observation: str = ""
    info: dict[str, Any] = Field(default_factory=dict)  # from reset (e.g. ground truth) and last step
    status: TrajectoryStatus = TrajectoryStatus.RUNNING
    reason: str = ""
    env_return: float = 0.0
    success: bool = False
    t_start: float = 0.0
    t_end: float = 0.0
    reward: float | None = None
    reward_details: dict[str, Any] = Field(default_factory=dict)

    @property
    def ended(self) -> bool:
        """True once a terminal status is set."""
        return self.status != TrajectoryStatus.RUNNING

    def token_ids(self) -> list[int]:
        """The exact sequence the model saw and produced, turn by turn."""
        out: list[int] = []
        for turn in self.turns:
            out.extend(turn.prompt_ids)
            out.extend(turn.response_ids)
        return out

    def policy_mask(self) -> list[int]:
        """1 for each token the policy produced (trained on), 0 for prompt/observation tokens."""
        out: list[int] = []
        for turn in self.turns:
            out.extend([0] * len(turn.prompt_ids))
            out.extend([1] * len(turn.response_ids))
        return out

    def logprobs(self) -> list[float]:
        """Per-token log-probs aligned with `token_ids()` (0.0 where the policy did not produce the token)."""
        out: list[float] = []
        for turn in self.turns:
            out.extend([0.0] * len(turn.prompt_ids))
            out.extend(turn.response_logprobs)
        return out

    def weight_versions(self) -> list[int]:
        """The weight version of each turn (a trajectory may span versions after a resume)."""
        return [turn.weight_version for turn in self.turns]

    def num_response_tokens(self) -> int:
        """How many tokens the policy produced in total (the max-tokens budget counts these)."""
        return sum(len(t.response_ids) for t in self.turns)

    def final_response(self) -> str:
        """The text of the last policy turn ('' when there is none): what answer rewards look at."""
        return self.turns[-1].response_text if self.turns else ""
