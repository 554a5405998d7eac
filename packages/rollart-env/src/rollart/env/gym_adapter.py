"""`GymTextEnv`: wraps any gymnasium environment as an async text `Env`.

Why an adapter: gymnasium envs take structured actions and return structured observations;
the policy speaks text. The adapter owns the two translations (render, parse) and turns an
unparsable action into an environment outcome (a penalty and a hint), never an exception.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rollart import checks as check
from rollart.env.errors import EnvError
from rollart.env.protocols import ResetResult, StepResult


def jsonable_info(info: dict[str, Any]) -> dict[str, Any]:
    """Keep only JSON-friendly info values (numpy scalars become Python numbers)."""
    out: dict[str, Any] = {}
    for key, value in info.items():
        if hasattr(value, "item") and callable(value.item):
            try:
                value = value.item()
            except (ValueError, TypeError):
                continue
        if isinstance(value, (str, int, float, bool)) or value is None:
            out[str(key)] = value
    return out


class GymTextEnv:
    """An async text `Env` over a gymnasium env created by `make_env(seed)`."""

    def __init__(
        self,
        make_env: Callable[[int | None], Any],
        render: Callable[[Any, Any], str],
        parse_action: Callable[[str], Any | None],
        name: str,
        system_prompt: str,
        invalid_action_penalty: float = 0.0,
        remake_on_reset: bool = False,
    ) -> None:
        """`render(obs, gym_env) -> str`, `parse_action(text) -> action or None`."""
        # VAL: VAL_NON_EMPTY(name, exc=EnvError)
        check.non_empty("name", name, exc=EnvError)  # generated #2b3c116a0c
        self.make_env = make_env
        self.render = render
        self.parse_action = parse_action
        self.name = name
        self.system_prompt = system_prompt
        self.invalid_action_penalty = invalid_action_penalty
        self.remake_on_reset = remake_on_reset
        self._gym: Any = None
        self._last_text = ""

    async def reset(self, seed: int | None = None) -> ResetResult:
        """Reset (re-creating the gym env first when `remake_on_reset`, e.g. a map drawn from the seed)."""
        if self._gym is None or self.remake_on_reset:
            if self._gym is not None:
                self._gym.close()
            self._gym = self.make_env(seed)
        obs, info = self._gym.reset(seed=seed)
        self._last_text = self.render(obs, self._gym)
        return ResetResult(observation=self._last_text, info=jsonable_info(info))

    async def step(self, action: str) -> StepResult:
        """Parse the text; an invalid action costs `invalid_action_penalty` and repeats the observation."""
        # AST: AST_PRECONDITION(self._gym is not None, got=self._gym, msg="reset before step", exc=EnvError)
        check.precondition(self._gym is not None, "reset before step", got=self._gym, exc=EnvError)  # generated #25fc9e32b4
        parsed = self.parse_action(action)
        if parsed is None:
            return StepResult(
                observation=f"Invalid action.\n{self._last_text}",
                reward=self.invalid_action_penalty,
                terminated=False,
                truncated=False,
                info={"invalid_action": True},
            )
        obs, reward, terminated, truncated, info = self._gym.step(parsed)
        self._last_text = self.render(obs, self._gym)
        out = jsonable_info(info)
        out["invalid_action"] = False
        return StepResult(self._last_text, float(reward), bool(terminated), bool(truncated), out)

    async def close(self) -> None:
        """Close the gym env."""
        if self._gym is not None:
            self._gym.close()
            self._gym = None
