"""A user's own environment and reward, loaded by `rollart run` from this file by import path.

    tasks:
      - env: ../user_env.py:GuessNumberEnv      # relative to the config file's folder
        env_args: {high: 16}
        reward: ../user_env.py:guess_reward

Nothing here imports RollArt's scheduler: an env only has to follow `rollart.env`'s async Env
protocol (`name`, `system_prompt`, `reset`, `step`, `close`), and a reward is any function of a
finished trajectory returning a float (sync or async). The same function can be served over HTTP:

    rollart-reward serve examples/user_env.py:guess_reward --port 8000   # or: rollart reward serve ...
"""

from __future__ import annotations

import random
import re

from rollart.env.protocols import ResetResult, StepResult

_NUMBER = re.compile(r"-?\d+")


class GuessNumberEnv:
    """Guess a secret integer in [1, high]; the env answers `higher`, `lower` or `correct`.

    Actions are free text; the first integer in it is the guess. Text without a number is an
    invalid move (small penalty, the episode goes on), so a policy learns the action format too.
    """

    name = "guess_number"
    system_prompt = "Guess the secret number. Answer with one integer."

    def __init__(self, high: int = 16, max_guesses: int = 6) -> None:
        """`high`: the largest secret; `max_guesses`: the episode is truncated after that many."""
        if high < 1 or max_guesses < 1:
            raise ValueError(f"high and max_guesses must be >= 1, got high={high}, max_guesses={max_guesses}")
        self.high = high
        self.max_guesses = max_guesses
        self.secret = 1
        self.guesses = 0
        self.best_gap = high

    async def reset(self, seed: int | None = None) -> ResetResult:
        """Draw the secret from `seed` (same seed, same secret)."""
        self.secret = random.Random(seed).randint(1, self.high)
        self.guesses = 0
        self.best_gap = self.high
        return ResetResult(f"I picked a number between 1 and {self.high}. Your guess?",
                           {"secret": self.secret, "high": self.high})

    async def step(self, action: str) -> StepResult:
        """Parse the guess and answer; `info` carries what the reward needs."""
        self.guesses += 1
        truncated = self.guesses >= self.max_guesses
        match = _NUMBER.search(action)
        if match is None:
            return StepResult("Please answer with a number.", -0.05, False, truncated,
                              {"success": False, "best_gap": self.best_gap, "high": self.high})
        guess = int(match.group())
        self.best_gap = min(self.best_gap, abs(guess - self.secret))
        info = {"success": guess == self.secret, "best_gap": self.best_gap, "high": self.high, "guesses": self.guesses}
        if guess == self.secret:
            return StepResult("correct", 1.0, True, False, info)
        return StepResult("higher" if guess < self.secret else "lower", 0.0, False, truncated, info)

    async def close(self) -> None:
        """Nothing to release."""


def guess_reward(trajectory) -> float:
    """1.0 for finding the number; else up to 0.5 for how close the best guess came."""
    if trajectory.success:
        return 1.0
    info = trajectory.info
    high = max(int(info.get("high", 1)), 1)
    gap = int(info.get("best_gap", high))
    return 0.5 * max(0.0, 1.0 - gap / high)
