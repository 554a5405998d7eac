"""FrozenLake as a text environment (gymnasium `FrozenLake-v1`), slippery or not.

Why a random map per seed: a fixed map is memorised; drawing the map from the reset seed gives
a reproducible but varied task distribution.
"""

from __future__ import annotations

import re
from typing import Any

from rollart import checks as check
from rollart.env.errors import EnvError
from rollart.env.gym_adapter import GymTextEnv

ACTIONS = {"left": 0, "down": 1, "right": 2, "up": 3}
SYSTEM_PROMPT = (
    "You are walking on a frozen lake. S is the start, F frozen ice, H a hole, G the goal and P you. "
    "Answer with one move: Up, Down, Left or Right, e.g. <answer>Right</answer>."
)
_ANSWER_RE = re.compile(r"<answer>(.*?)</answer>", re.IGNORECASE | re.DOTALL)
_MOVE_RE = re.compile(r"\b(left|down|right|up)\b", re.IGNORECASE)


def parse_frozen_lake_action(text: str) -> int | None:
    """The move in the last `<answer>` tag, else the last move word; None if there is none.

    Total on any input (property-tested): never raises, returns an action index or None.
    """
    if not isinstance(text, str):
        return None
    answers = _ANSWER_RE.findall(text)
    scope = answers[-1] if answers else text
    moves = _MOVE_RE.findall(scope)
    return ACTIONS[moves[-1].lower()] if moves else None


def render_frozen_lake(obs: Any, gym_env: Any) -> str:
    """The map as a character grid with P at the player's cell."""
    desc = gym_env.unwrapped.desc
    ncol = desc.shape[1]
    row, col = divmod(int(obs), ncol)
    lines = []
    for r, line in enumerate(desc):
        chars = [c.decode() if isinstance(c, bytes) else str(c) for c in line]
        if r == row:
            chars[col] = "P"
        lines.append("".join(chars))
    return "\n".join(lines)


class FrozenLakeEnv(GymTextEnv):
    """FrozenLake with a map drawn from the reset seed (or a fixed `desc`)."""

    def __init__(
        self,
        size: int = 4,
        is_slippery: bool = False,
        desc: list[str] | None = None,
        frozen_prob: float = 0.8,
        max_episode_steps: int = 20,
        invalid_action_penalty: float = -0.05,
    ) -> None:
        """Configure the map; `desc` fixes the map, otherwise one is generated per seed."""
        # VAL: VAL_INT_RANGE(size, min=2, max=32, exc=EnvError)
        check.int_range("size", size, min=2, max=32, exc=EnvError)  # generated #241f334136
        # VAL: VAL_INT_RANGE(max_episode_steps, min=1, max=10_000, exc=EnvError)
        check.int_range("max_episode_steps", max_episode_steps, min=1, max=10_000, exc=EnvError)  # generated #fe106f10a6
        self.size = size
        self.is_slippery = is_slippery
        self.desc = desc
        self.frozen_prob = frozen_prob
        self.max_episode_steps = max_episode_steps
        super().__init__(
            make_env=self._make,
            render=render_frozen_lake,
            parse_action=parse_frozen_lake_action,
            name="frozen_lake",
            system_prompt=SYSTEM_PROMPT,
            invalid_action_penalty=invalid_action_penalty,
            remake_on_reset=desc is None,
        )

    def _make(self, seed: int | None) -> Any:
        import gymnasium as gym
        from gymnasium.envs.toy_text.frozen_lake import generate_random_map

        desc = self.desc or generate_random_map(size=self.size, p=self.frozen_prob, seed=seed)
        return gym.make(
            "FrozenLake-v1", desc=desc, is_slippery=self.is_slippery, max_episode_steps=self.max_episode_steps
        )

    async def step(self, action: str):
        """Step, and mark `success` when the goal is reached."""
        result = await super().step(action)
        result.info["success"] = bool(result.terminated and result.reward > 0)
        return result
