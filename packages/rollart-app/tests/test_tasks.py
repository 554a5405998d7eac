"""The demo's task adapters: compact prompts, macro decoding and the shaped rewards (design D10)."""

from __future__ import annotations

from rollart.app.tasks import (
    GOAL_DISTANCE,
    HOLE_PENALTY,
    FrozenLakePrompts,
    MathToolPrompts,
    build_demo_tokenizer,
    frozen_lake_cell,
    frozen_lake_potential,
    frozen_lake_reward,
    math_reward,
)
from rollart.env.envs.math_calc import MathCalcEnv, generate_problem
from rollart.env.trajectory import Trajectory, TrajectoryStatus, Turn

GRID = "SFFF\nFHFH\nFFFH\nHFFG"


def grid_with_player(cell: int) -> str:
    chars = list(GRID.replace("\n", ""))
    chars[cell] = "P"
    return "\n".join("".join(chars[i:i + 4]) for i in range(0, 16, 4))


def fl_traj(cells: list[int], success: bool = False, invalid: int = 0) -> Trajectory:
    turns = [Turn(prompt_ids=[1], response_ids=[2], response_logprobs=[0.0], observation=grid_with_player(c)) for c in cells]
    turns += [Turn(prompt_ids=[1], response_ids=[2], response_logprobs=[0.0], env_reward=-0.05,
                   observation="Invalid action.\n" + grid_with_player(cells[-1] if cells else 0)) for _ in range(invalid)]
    return Trajectory(id="t", initial_observation=grid_with_player(0), turns=turns, success=success,
                      status=TrajectoryStatus.FINISHED)


def test_frozen_lake_prompts_and_reward():
    tok = build_demo_tokenizer()
    p = FrozenLakePrompts(tok)
    assert tok.decode(p.initial_ids("", grid_with_player(0))) == "<s> c0"
    assert tok.decode(p.continuation_ids([], "Invalid action.\n" + grid_with_player(9))) == "c9"
    assert p.decode(tok.encode("right").ids) == "right"
    assert frozen_lake_cell(grid_with_player(14)) == 14
    assert GOAL_DISTANCE[0] == 6 and GOAL_DISTANCE[14] == 1 and 7 not in GOAL_DISTANCE  # 7 is a hole
    assert frozen_lake_reward(fl_traj([1, 2, 6, 10, 14, 15], success=True)) == 1.0
    # progress counts the closest safe cell reached; a dead end (3) scores below the path via 6
    assert frozen_lake_reward(fl_traj([1, 2, 3])) < frozen_lake_reward(fl_traj([1, 2, 6]))
    assert frozen_lake_reward(fl_traj([1, 2, 6, 2])) == frozen_lake_reward(fl_traj([1, 2, 6]))
    assert frozen_lake_reward(fl_traj([1, 2, 6], invalid=2)) == frozen_lake_reward(fl_traj([1, 2, 6])) - 0.1
    assert frozen_lake_reward(fl_traj([])) == 0.0
    # the former 0.17 trap: progress to cell 8 and then into the hole 12 now scores below stopping at
    # 8 and below the safe step to 9, so a policy in the trap has a gradient out of it
    trap = frozen_lake_reward(fl_traj([4, 8, 12]))
    assert trap == frozen_lake_reward(fl_traj([4, 8])) - HOLE_PENALTY < frozen_lake_reward(fl_traj([4, 8, 9]))
    # bounded shaping: the goal (1.0) beats every other ending (< 0.5), so the optimal policy is unchanged
    assert max(frozen_lake_potential(c) for c in range(15)) == frozen_lake_potential(14) < 0.5


async def test_math_macros_drive_the_real_env():
    tok = build_demo_tokenizer()
    p = MathToolPrompts(tok)
    env = MathCalcEnv(max_tool_calls=2)
    reset = await env.reset(seed=7)
    assert tok.decode(p.initial_ids(env.system_prompt, reset.observation)) == "<s> math"
    step = await env.step(p.decode(tok.encode("calc").ids))
    assert step.observation.startswith("Calculator:")
    assert tok.decode(p.continuation_ids([], step.observation)) == "result"
    final = await env.step(p.decode(tok.encode("answer").ids))
    assert final.terminated and final.reward == 1.0 and generate_problem(7)["answer"] in p.decode(tok.encode("answer").ids)
    used = Trajectory(id="m", turns=[Turn(prompt_ids=[1], response_ids=[2], response_logprobs=[0.0],
                                          observation="Calculator: 5")], status=TrajectoryStatus.FINISHED)
    assert math_reward(used) == 0.2


async def test_calc_then_answer_solves_every_generated_problem_kind():
    tok = build_demo_tokenizer()
    for seed in range(30):
        p, env = MathToolPrompts(tok), MathCalcEnv(max_tool_calls=2)
        p.initial_ids("", (await env.reset(seed=seed)).observation)
        p.continuation_ids([], (await env.step(p.decode(tok.encode("calc").ids))).observation)
        assert (await env.step(p.decode(tok.encode("answer").ids))).reward == 1.0, seed
