"""Names in a config resolve to built-ins, installed plugins (entry points) and import paths (D16).

The plugin test installs a real distribution (a `.dist-info` with `entry_points.txt` on sys.path),
so `importlib.metadata` finds it exactly as it finds a pip-installed package.
"""

from __future__ import annotations

import asyncio
import textwrap
from pathlib import Path

import pytest

from rollart.app.config import parse_config
from rollart.app.registry import is_import_path, known_names, plugin_names, resolve
from rollart.app.task_factory import as_scorer, build_task
from rollart.env.trajectory import Trajectory, TrajectoryStatus
from rollart.scheduler.errors import ConfigError

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"

PLUGIN_CODE = '''
from rollart.env.protocols import ResetResult, StepResult


class EchoEnv:
    name = "echo"
    system_prompt = ""

    def __init__(self, word="hi"):
        self.word = word

    async def reset(self, seed=None):
        return ResetResult(f"say {self.word}")

    async def step(self, action):
        ok = self.word in action
        return StepResult("ok" if ok else "no", float(ok), True, False, {"success": ok})

    async def close(self):
        pass


def echo_reward(trajectory):
    return 0.75


class EchoEngine:
    pass
'''


@pytest.fixture
def plugin_dist(tmp_path, monkeypatch):
    """A distribution `rollart-echo-plugin` registering an env, a reward, an engine and a broken env."""
    pkg = tmp_path / "rollart_echo_plugin"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(PLUGIN_CODE)
    info = tmp_path / "rollart_echo_plugin-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: rollart-echo-plugin\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(textwrap.dedent("""\
        [rollart.envs]
        echo = rollart_echo_plugin:EchoEnv
        broken = rollart_echo_plugin:NoSuchEnv

        [rollart.rewards]
        echo = rollart_echo_plugin:echo_reward

        [rollart.engines]
        echo = rollart_echo_plugin:EchoEngine
        """))
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


def _traj(success: bool = True, **info) -> Trajectory:
    return Trajectory(id="t", status=TrajectoryStatus.FINISHED, success=success, info=info)


def test_entry_point_plugins_resolve_by_name(plugin_dist):
    assert "echo" in plugin_names("env") and "echo" in known_names("env") and "frozenlake" in known_names("env")
    env = resolve("env", "echo", field="tasks.0.env")
    assert env.obj.__name__ == "EchoEnv" and "entry point rollart.envs" in env.origin
    assert resolve("reward", "echo").obj(_traj()) == 0.75
    assert resolve("engine", "echo").obj.__name__ == "EchoEngine"
    # the config accepts the plugin engine (check_composition asks the registry) ...
    cfg = parse_config({"rollout": {"pools": [{"name": "p", "engine": "echo"}]}, "tasks": [{"env": "echo", "reward": "echo", "prompts": "chat_template"}]})
    assert cfg.rollout.pools[0].engine == "echo"
    # ... and the task factory builds the plugin env and scores with the plugin reward
    from rollart.proxy.testing import build_tiny_tokenizer

    parts = build_task(cfg.tasks[0], 0, cfg, build_tiny_tokenizer())
    assert parts.env_factory().word == "hi"
    assert asyncio.run(parts.scorer(_traj())) == 0.75
    # a broken plugin is reported with the field, not raised raw
    with pytest.raises(ConfigError, match=r"^tasks.1.env: plugin 'broken' \(rollart_echo_plugin:NoSuchEnv\) failed to load"):
        resolve("env", "broken", field="tasks.1.env")


def test_unknown_names_list_the_known_ones(plugin_dist):
    with pytest.raises(ConfigError) as exc:
        resolve("env", "chess", field="tasks.2.env")
    msg = str(exc.value)
    assert msg.startswith("tasks.2.env: unknown env 'chess'") and "'echo'" in msg and "'frozenlake'" in msg
    with pytest.raises(ConfigError, match=r"rollout.pools.0.engine: unknown engine 'jax'.*'torch'.*'vllm'"):
        parse_config({"rollout": {"pools": [{"name": "p", "engine": "jax"}]}})


def test_import_paths_to_modules_and_files():
    assert is_import_path("pkg.mod:Name") and is_import_path("a/b.py:f") and not is_import_path("C:\\x") and not is_import_path("frozenlake")
    env = resolve("env", "rollart.env.envs.frozen_lake:FrozenLakeEnv")
    assert env.obj.__name__ == "FrozenLakeEnv" and env.origin == "import path rollart.env.envs.frozen_lake:FrozenLakeEnv"
    # a file path is relative to the config file's folder first
    base = EXAMPLES / "configs"
    user = resolve("env", "../user_env.py:GuessNumberEnv", base_dir=base)
    assert user.obj.__name__ == "GuessNumberEnv"
    assert resolve("env", "../user_env.py:GuessNumberEnv", base_dir=base).obj is user.obj  # loaded once
    reward = resolve("reward", str(EXAMPLES / "user_env.py") + ":guess_reward")
    assert reward.obj(_traj(success=True)) == 1.0


@pytest.mark.parametrize(("spec", "pattern"), [
    ("no_such_pkg_xyz.mod:Env", r"^tasks.0.env: cannot load 'no_such_pkg_xyz.mod:Env': No module named 'no_such_pkg_xyz'"),
    ("rollart.env.envs.frozen_lake:NoEnv", r"^tasks.0.env: cannot load .*module 'rollart.env.envs.frozen_lake' has no attribute 'NoEnv'"),
    ("missing/file.py:Env", r"^tasks.0.env: cannot load 'missing/file.py:Env': file 'missing/file.py' not found"),
    ("../user_env.py:NoEnv", r"^tasks.0.env: cannot load .*user_env.py has no attribute 'NoEnv'"),
])
def test_bad_import_paths_name_the_field(spec, pattern):
    with pytest.raises(ConfigError, match=pattern):
        resolve("env", spec, base_dir=EXAMPLES / "configs", field="tasks.0.env")


def test_rewards_in_every_shape():
    from rollart.reward.protocol import RewardResult
    from rollart.reward.rules import EnvSuccessReward

    async def async_fn(t):
        await asyncio.sleep(0)
        return 0.25

    class MyReward:
        name = "mine"

        async def score(self, t):
            return RewardResult(score=0.5)

    shapes = {
        "plain": (lambda t: 1, 1.0),
        "async": (async_fn, 0.25),
        "returns RewardResult": (lambda t: RewardResult(score=0.125), 0.125),
        "RewardFn object": (MyReward(), 0.5),
        "RewardFn class": (MyReward, 0.5),
        "built-in RewardFn class": (EnvSuccessReward, 1.0),
    }
    for label, (obj, want) in shapes.items():
        assert asyncio.run(as_scorer(obj)(_traj(success=True))) == want, label
    with pytest.raises(ConfigError, match=r"^tasks.3.reward: 42 is not a reward"):
        as_scorer(42, "tasks.3.reward")

    class NeedsArgs:
        def __init__(self, x):
            pass

    with pytest.raises(ConfigError, match=r"^tasks.3.reward: reward class NeedsArgs cannot be built"):
        as_scorer(NeedsArgs, "tasks.3.reward")


def test_task_factory_errors_name_the_field():
    cfg = parse_config({"tasks": [{"env": "frozenlake"}, {"env": "rollart.app.config:RunConfig", "prompts": "demo"}]})
    with pytest.raises(ConfigError, match=r"^tasks.1.env: RunConfig is not a rollart.env Env: missing async \['reset', 'step', 'close'\]"):
        build_task(cfg.tasks[1], 1, cfg, None)
    cfg = parse_config({"tasks": [{"env": str(EXAMPLES / "user_env.py") + ":GuessNumberEnv", "prompts": "chat_template"}]})
    with pytest.raises(ConfigError, match=r"^tasks.0.reward: env .* has no built-in reward"):
        from rollart.proxy.testing import build_tiny_tokenizer

        build_task(cfg.tasks[0], 0, cfg, build_tiny_tokenizer())
    cfg = parse_config({"tasks": [{"env": "frozenlake", "prompts": "chat_template"}]})
    with pytest.raises(ConfigError, match=r"^tasks.0.prompts: 'chat_template' needs a tokenizer with a chat template"):
        build_task(cfg.tasks[0], 0, cfg, object())
    cfg = parse_config({"tasks": [{"env": "code", "reward": "math", "prompts": "demo"}]})
    with pytest.raises(ConfigError, match=r"^tasks.0.prompts: 'demo' prompts exist only for"):
        build_task(cfg.tasks[0], 0, cfg, None)


def test_checkpoint_tasks_render_prompts_with_the_chat_template(tmp_path):
    from transformers import AutoTokenizer

    from rollart.env.prompts import ChatTemplatePromptBuilder
    from rollart.proxy.testing import build_tiny_model

    path = build_tiny_model(tmp_path / "ckpt")
    tok = AutoTokenizer.from_pretrained(path)
    cfg = parse_config({"model": {"path": path}, "tasks": [
        {"env": "../user_env.py:GuessNumberEnv", "reward": "../user_env.py:guess_reward", "env_args": {"high": 8}}]})
    parts = build_task(cfg.tasks[0], 0, cfg, tok, base_dir=EXAMPLES / "configs")
    assert parts.prompts == "chat_template" and parts.env_origin.startswith("import path")
    builder = parts.prompts_factory()
    assert isinstance(builder, ChatTemplatePromptBuilder)
    env = parts.env_factory()
    reset = asyncio.run(env.reset(seed=3))
    want = tok.apply_chat_template([{"role": "system", "content": env.system_prompt}, {"role": "user", "content": reset.observation}],
                                   tokenize=False, add_generation_prompt=True)
    ids = builder.initial_ids(env.system_prompt, reset.observation)
    assert tok.decode(ids) == want and want.endswith("<|assistant|>")
    secret = reset.info["secret"]
    step = asyncio.run(env.step(f"I guess {secret}"))
    assert step.terminated and step.info["success"]
    assert asyncio.run(parts.scorer(_traj(success=False, best_gap=2, high=8))) == pytest.approx(0.5 * (1 - 2 / 8))
