"""The CPU demo's tasks made learnable for a tiny random-init model (design D10).

A randomly initialised 2-layer model cannot read English grids or copy multi-digit numbers, so
the demo gives it a tiny word-level vocabulary and compact prompts, while the environments stay
the real `rollart.env` ones:

* FrozenLake (non-slippery 4x4, the classic map): each observation becomes one token naming the
  player's cell (`c0`..`c15`); the policy answers with one token (`left`/`down`/`right`/`up`), which
  decodes to the move word the env's own parser reads. Reward (shaped, stated here and in the
  docs, design D14): 1.0 at the goal; else phi of the closest cell the episode reached, with
  phi = 0.5 x (1 - d / 6) and d the shortest safe-path distance to the goal, minus 0.1 when the
  episode ended in a hole; plus the env's own invalid-action penalty (-0.05 per unparsable move).
  Shaping is needed because a random 4x4 walk reaches the goal ~1% of the time. It is bounded
  (every non-goal ending scores < 0.5 < 1.0), so the optimal policy is still "walk to the goal";
  the hole penalty removes the 0.17 trap of the plain progress bonus (walk to cell 8, fall into
  the hole 12: it paid as much as stopping at 8, and runs locked into that path).
* Math with the calculator tool (`MathCalcEnv`): the policy sees `math` and then one token per
  env reply (`result`, `hint`, ...). Its action tokens are tool macros: `calc` decodes to
  `<calc>EXPRESSION</calc>` with the question's expression, `answer` to `<answer>LAST_RESULT</answer>`.
  The policy must learn the multi-turn protocol: call the tool, then answer with its result.
  Reward: 1.0 for a correct answer, else 0.2 when the calculator was used (tool-use shaping).

Everything is built locally from these lists: no downloads, no warm start.
"""

from __future__ import annotations

import re
from typing import Any

from rollart.env.trajectory import Trajectory

SPECIALS = ["<pad>", "<s>", "</s>"]
FL_CELLS = [f"c{i}" for i in range(16)]
FL_ACTIONS = ["left", "down", "right", "up"]
MATH_TOKENS = ["math", "calc", "answer", "result", "hint", "error", "done"]
VOCAB = SPECIALS + FL_CELLS + FL_ACTIONS + MATH_TOKENS
FROZEN_LAKE_MAP = ["SFFF", "FHFH", "FFFH", "HFFG"]
_WORD_PROBLEM = re.compile(r"A shop has (\d+) boxes of (\d+) apples and sells (\d+) apples")
_WHAT_IS = re.compile(r"What is (.+)\?")
_CALC_RESULT = re.compile(r"Calculator: (\S+)")


def build_demo_tokenizer() -> Any:
    """A word-level `tokenizers` tokenizer over VOCAB (whitespace split), built in memory."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(VOCAB)}, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##")  # joins words with spaces
    return tok


def _ids(tok: Any, text: str) -> list[int]:
    return tok.encode(text).ids


def frozen_lake_cell(observation: str) -> int:
    """The player's cell index from the env's grid rendering (P marks the player)."""
    rows = [line for line in observation.splitlines() if len(line) == 4 and set(line) <= set("SFHGP")]
    for r, line in enumerate(rows[-4:]):
        if "P" in line:
            return r * 4 + line.index("P")
    return 0


class FrozenLakePrompts:
    """PromptBuilder: one cell token per observation; actions decode to the env's move words."""

    def __init__(self, tokenizer: Any) -> None:
        """Share the demo tokenizer."""
        self.tok = tokenizer

    def initial_ids(self, system_prompt: str, observation: str) -> list[int]:
        """`<s> c<cell>`: the system prompt is implied by the task (the model is too small to read it)."""
        return _ids(self.tok, f"<s> c{frozen_lake_cell(observation)}")

    def continuation_ids(self, previous_response_ids: list[int], observation: str) -> list[int]:
        """The new cell after the move."""
        return _ids(self.tok, f"c{frozen_lake_cell(observation)}")

    def decode(self, token_ids: list[int]) -> str:
        """Token words joined by spaces (e.g. `right`)."""
        return self.tok.decode(token_ids)


def question_expression(question: str) -> str:
    """The arithmetic expression behind one of MathCalcEnv's generated questions."""
    m = _WORD_PROBLEM.search(question)
    if m:
        boxes, apples, sold = m.groups()
        return f"{boxes} * {apples} - {sold}"
    m = _WHAT_IS.search(question)
    return m.group(1) if m else "0"


class MathToolPrompts:
    """PromptBuilder for MathCalcEnv with tool macros; stateful per EnvManager (one trajectory at a time)."""

    def __init__(self, tokenizer: Any) -> None:
        """Share the demo tokenizer."""
        self.tok = tokenizer
        self.expression = "0"
        self.last_result = "?"

    def initial_ids(self, system_prompt: str, observation: str) -> list[int]:
        """`<s> math`; remembers the question's expression for the `calc` macro."""
        self.expression = question_expression(observation)
        self.last_result = "?"
        return _ids(self.tok, "<s> math")

    def continuation_ids(self, previous_response_ids: list[int], observation: str) -> list[int]:
        """One token per env reply: `result` (and remember it), `hint` or `error`."""
        m = _CALC_RESULT.search(observation)
        if m:
            self.last_result = m.group(1)
            return _ids(self.tok, "result")
        return _ids(self.tok, "error" if "error" in observation.lower() else "hint")

    def decode(self, token_ids: list[int]) -> str:
        """Expand the macros `calc` and `answer`; other tokens stay words (the env answers with a hint)."""
        words = self.tok.decode(token_ids).split()
        if "calc" in words:
            return f"<calc>{self.expression}</calc>"
        if "answer" in words:
            return f"<answer>{self.last_result}</answer>"
        return " ".join(words)


def _goal_distances(desc: list[str]) -> dict[int, int]:
    """Shortest safe path length (avoiding holes) from every non-hole cell to the goal (BFS)."""
    n = len(desc)
    goal = next(r * n + c for r in range(n) for c in range(n) if desc[r][c] == "G")
    dist = {goal: 0}
    frontier = [goal]
    while frontier:
        nxt = []
        for cell in frontier:
            r, c = divmod(cell, n)
            for dr, dc in ((1, 0), (-1, 0), (0, 1), (0, -1)):
                rr, cc = r + dr, c + dc
                if 0 <= rr < n and 0 <= cc < n and desc[rr][cc] != "H" and rr * n + cc not in dist:
                    dist[rr * n + cc] = dist[cell] + 1
                    nxt.append(rr * n + cc)
        frontier = nxt
    return dist


GOAL_DISTANCE = _goal_distances(FROZEN_LAKE_MAP)


HOLE_PENALTY = 0.1


def frozen_lake_potential(cell: int) -> float:
    """phi(cell) = 0.5 x (1 - d / d_max) on safe cells (d: safe-path distance to the goal), 0 on holes."""
    d = GOAL_DISTANCE.get(cell)
    if d is None:
        return 0.0
    return 0.5 * (1.0 - d / max(GOAL_DISTANCE.values()))


def frozen_lake_reward(trajectory: Trajectory) -> float:
    """1.0 at the goal, else phi of the closest cell reached minus the hole penalty, plus invalid-move penalties."""
    penalty = sum(min(t.env_reward, 0.0) for t in trajectory.turns)  # the env's invalid-action penalty
    if trajectory.success or trajectory.env_return >= 1.0:
        return 1.0 + penalty
    cells = [frozen_lake_cell(trajectory.initial_observation)]
    cells += [frozen_lake_cell(t.observation) for t in trajectory.turns if t.observation]
    if cells[-1] not in GOAL_DISTANCE:  # the episode ended in a hole
        penalty -= HOLE_PENALTY
    return max(frozen_lake_potential(c) for c in cells) + penalty


def math_reward(trajectory: Trajectory) -> float:
    """1.0 for a correct answer, 0.2 when the calculator was used, else 0."""
    if trajectory.success or trajectory.env_return >= 1.0:
        return 1.0
    used_tool = any(t.observation.startswith("Calculator:") for t in trajectory.turns)
    return 0.2 if used_tool else 0.0


TASK_REWARDS = {"frozenlake": frozen_lake_reward, "math": math_reward}
