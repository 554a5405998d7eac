"""`rollart plan` on every example config, the memory estimate against a hand computation, and
bad configs failing with one line naming the field before anything starts (D18)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st
from typer.testing import CliRunner

from rollart.app.cli import app
from rollart.app.overrides import apply_overrides, load_config_with
from rollart.app.plan import make_plan, param_count
from rollart.scheduler.errors import ConfigError

ROOT = Path(__file__).resolve().parents[3]
CONFIGS = ROOT / "examples" / "configs"
QWEN25_7B = {  # the shape of Qwen/Qwen2.5-7B's config.json (no weights are needed for a plan)
    "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_act": "silu", "hidden_size": 3584,
    "intermediate_size": 18944, "max_position_embeddings": 131072, "num_attention_heads": 28, "num_hidden_layers": 28,
    "num_key_value_heads": 4, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0, "tie_word_embeddings": False,
    "torch_dtype": "bfloat16", "vocab_size": 152064,
}


@pytest.fixture(scope="module")
def tiny_ckpt(tmp_path_factory) -> str:
    """A tiny Llama checkpoint (LlamaConfig + save_pretrained) with a `tokenizers` tokenizer and a chat template."""
    from rollart.proxy.testing import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny-ckpt"))


@pytest.fixture(scope="module")
def qwen_shaped(tmp_path_factory) -> str:
    """config.json of Qwen2.5-7B's shape plus a tokenizer (plan reads the shape and the chat template)."""
    from rollart.proxy.testing import build_tiny_tokenizer

    path = tmp_path_factory.mktemp("qwen25-7b-shape")
    (path / "config.json").write_text(json.dumps(QWEN25_7B))
    build_tiny_tokenizer().save_pretrained(path)
    return str(path)


def _plan_cli(*args: str) -> tuple[int, str]:
    res = CliRunner().invoke(app, ["plan", *args])
    return res.exit_code, res.output


@pytest.mark.parametrize("name", ["cpu_demo.yaml", "two_pools_affinity.yaml", "vllm_gloo.yaml", "user_env.yaml", "gpu_qwen_8gpu.yaml"])
def test_plan_every_example(name, tiny_ckpt, qwen_shaped):
    path = CONFIGS / name
    sets = [] if name in ("cpu_demo.yaml", "two_pools_affinity.yaml") else [f"model.path={qwen_shaped if 'gpu' in name else tiny_ckpt}"]
    code, out = _plan_cli(str(path), *[a for s in sets for a in ("--set", s)])
    assert code == 0, out
    cfg = load_config_with(path, sets)
    plan = make_plan(cfg, base_dir=path.parent)
    assert [p.name for p in plan.pools] == [p.name for p in cfg.rollout.pools]
    for pool in cfg.rollout.pools:
        assert pool.name in out and pool.engine in out
    assert f"channel {cfg.sync.channel}" in out and cfg.trainer.backend in out
    assert not plan.warnings, plan.warnings
    assert len(plan.tasks) == len(cfg.tasks)


def test_cpu_demo_example_is_the_shipped_demo():
    shipped = ROOT / "packages/rollart-app/src/rollart/app/configs/demo.yaml"
    assert yaml.safe_load((CONFIGS / "cpu_demo.yaml").read_text()) == yaml.safe_load(shipped.read_text())


def test_two_pools_routing_table():
    plan = make_plan(load_config_with(CONFIGS / "two_pools_affinity.yaml"), base_dir=CONFIGS)
    routes = {r.tag: (r.hardware, r.pools, r.tasks) for r in plan.routes}
    assert routes == {"lake": ("H800", ["h800"], ["tasks.0 (frozenlake)"]), "math": ("H20", ["h20"], ["tasks.1 (math)"])}
    assert plan.devices == {"H800": 2, "H20": 1}


def test_user_env_example_resolves_the_file_env_and_reward(tiny_ckpt):
    plan = make_plan(load_config_with(CONFIGS / "user_env.yaml", [f"model.path={tiny_ckpt}"]), base_dir=CONFIGS)
    (task,) = plan.tasks
    assert task.env_origin == "import path ../user_env.py:GuessNumberEnv"
    assert task.reward_origin == "import path ../user_env.py:guess_reward" and task.prompts == "chat_template"


def test_qwen_memory_estimate_matches_a_hand_computation(qwen_shaped):
    cfg = load_config_with(CONFIGS / "gpu_qwen_8gpu.yaml", [f"model.path={qwen_shaped}"])
    plan = make_plan(cfg, base_dir=CONFIGS)
    # by hand: V=152064, H=3584, 28 layers, 28 query heads and 4 KV heads of 128, I=18944, untied, qkv bias
    v, h, layers, kv, inter = 152064, 3584, 28, 4 * 128, 18944
    per_layer = h * h + 2 * h * kv + h * h + (h + 2 * kv) + 3 * h * inter + 2 * h
    params = 2 * v * h + layers * per_layer + h  # 7.62e9: the published size of Qwen2.5-7B
    assert abs(param_count(plan.model) - params) <= 0.05 * params
    assert 7.55e9 < params < 7.7e9
    weights = 2 * params  # bfloat16
    kv_cache = (2 * layers * 4 * 128 * 2) * 64 * 8192  # K and V x layers x kv heads x head dim x bf16, x max_num_seqs x max_model_len
    (pool,) = plan.pools
    assert pool.max_context == 8192 and pool.devices == 4
    assert abs(pool.memory.total - (weights + kv_cache)) <= 0.05 * (weights + kv_cache)
    assert 44e9 < pool.memory.total < 47e9 and not pool.memory.over  # ~45.3 GB of an H800's 80
    trainer = weights + 4 * params + 12 * params / 4  # megatron: bf16 weights + fp32 grads, 12 B/param optimizer over DP=4
    assert abs(plan.trainer.memory.total - trainer) <= 0.05 * trainer
    # one device of training everything unsharded would not fit: the warning says so
    over = make_plan(load_config_with(CONFIGS / "gpu_qwen_8gpu.yaml", [f"model.path={qwen_shaped}", "trainer.backend=torch",
                                                                     "model.dtype=float32"]), base_dir=CONFIGS)
    assert over.trainer.memory.over and any(w.startswith("trainer: estimated") for w in over.warnings)


def _one_line_error(out: str) -> str:
    lines = [ln.strip() for ln in out.strip().splitlines() if ln.strip() and ln.strip() != "invalid run config:"]
    assert len(lines) == 1, out
    return lines[0]


def test_bad_configs_fail_with_one_line_naming_the_field(tmp_path, tiny_ckpt):
    two = str(CONFIGS / "two_pools_affinity.yaml")
    code, out = _plan_cli(two, "--set", "rollout.pools.0.engine=jax")
    assert code == 2 and _one_line_error(out).startswith("rollout.pools.0.engine: unknown engine 'jax'")
    code, out = _plan_cli(two, "--set", "routing.affinity.math=A100")
    assert code == 2 and _one_line_error(out).startswith("routing.affinity.math: hardware 'A100' has no rollout pool")
    code, out = _plan_cli(two, "--set", "cluster.devices.H800=1")
    assert code == 2 and _one_line_error(out).startswith("cluster.devices.H800: the pools and the trainer need 2 H800 devices, the cluster has 1")
    no_tok = tmp_path / "no-tokenizer"
    no_tok.mkdir()
    (no_tok / "config.json").write_text(json.dumps(QWEN25_7B))
    code, out = _plan_cli(str(CONFIGS / "gpu_qwen_8gpu.yaml"), "--set", f"model.path={no_tok}")
    assert code == 2 and _one_line_error(out).startswith("model.path ") and "has no tokenizer" in out
    user = str(CONFIGS / "user_env.yaml")
    code, out = _plan_cli(user, "--set", f"model.path={tiny_ckpt}", "--set", "tasks.0.env=../user_env.py:NoSuchEnv")
    assert code == 2 and _one_line_error(out).startswith("tasks.0.env: cannot load '../user_env.py:NoSuchEnv'")
    code, out = _plan_cli(user, "--set", f"model.path={tiny_ckpt}", "--set", "tasks.0.reward=no_such_pkg_q.rewards:score")
    assert code == 2 and _one_line_error(out).startswith("tasks.0.reward: cannot load 'no_such_pkg_q.rewards:score'")
    code, out = _plan_cli(user, "--set", f"model.path={tmp_path / 'absent'}")  # no checkpoint there: say how to make one
    assert code == 2 and _one_line_error(out).startswith("model.path ") and "is not a directory" in out
    assert f"rollart checkpoint init {tmp_path / 'absent'}" in " ".join(out.split())
    code, out = _plan_cli(two, "--set", "rollout.pools.5.devices=2")
    assert code == 2 and "rollout.pools.5 is not an index of a list of 2 items" in _one_line_error(out)


def test_overrides_parse_yaml_and_address_list_items():
    data = {"rollout": {"pools": [{"name": "a", "devices": 1}]}, "run": {"name": "x"}}
    out = apply_overrides(data, ["rollout.pools.0.devices=3", "run.iterations=5", "routing.affinity.lake=H800",
                                 "model.path=null", "tasks=[{env: math}]", "run.tensorboard=false"])
    assert out == {"rollout": {"pools": [{"name": "a", "devices": 3}]}, "run": {"name": "x", "iterations": 5, "tensorboard": False},
                   "routing": {"affinity": {"lake": "H800"}}, "model": {"path": None}, "tasks": [{"env": "math"}]}
    assert data["rollout"]["pools"][0]["devices"] == 1  # the input is not modified
    for bad in ("novalue", "=3", "a..b=1"):
        with pytest.raises(ConfigError, match="--set takes dotted.key=value"):
            apply_overrides(data, [bad])
    with pytest.raises(ConfigError, match=r"run.name is a str, not a mapping or list"):
        apply_overrides(data, ["run.name.first=1"])


@given(keys=st.lists(st.from_regex(r"[a-z][a-z_]{0,6}", fullmatch=True), min_size=1, max_size=4),
       value=st.one_of(st.integers(), st.booleans(), st.text(st.characters(min_codepoint=97, max_codepoint=122), min_size=1, max_size=8),
                       st.lists(st.integers(), max_size=3)))
def test_an_override_reads_back_as_its_yaml_value(keys, value):
    out = apply_overrides({}, [".".join(keys) + "=" + yaml.safe_dump(value, default_flow_style=True).strip().removesuffix("...").strip()])
    node = out
    for k in keys:
        node = node[k]
    assert node == value


def test_version_and_run_overrides_fail_before_anything_starts():
    from importlib.metadata import version

    res = CliRunner().invoke(app, ["--version"])
    assert res.exit_code == 0 and res.output.strip() == f"rollart {version('rollart-app')}"
    res = CliRunner().invoke(app, ["run", str(CONFIGS / "two_pools_affinity.yaml"), "--set", "pipeline.mode=turbo"])
    assert res.exit_code == 2 and _one_line_error(res.output).startswith("pipeline.mode: Input should be")
    res = CliRunner().invoke(app, ["run", str(CONFIGS / "two_pools_affinity.yaml"), "--set", "oops"])
    assert res.exit_code == 2 and "--set takes dotted.key=value" in _one_line_error(res.output)


def test_plan_accepts_a_simulated_run():
    """A simulator config (engine, trainer and sync all `sim`, synthetic tasks) plans: the routing table and the
    placement as for a real run, and no trainer memory (a cost model holds no weights)."""
    from rollart.app.config import parse_config

    cfg = parse_config({
        "model": {"sim_model": "Qwen3-8B"},
        "cluster": {"ray": "none"},
        "rollout": {"pools": [{"name": "h800", "hardware": "H800", "devices": 4, "engine": "sim"},
                              {"name": "h20", "hardware": "H20", "devices": 4, "engine": "sim"}]},
        "routing": {"affinity": {"prefill": "H800", "decode": "H20"}},
        "trainer": {"backend": "sim", "devices": 8, "hardware": "H800"},
        "sync": {"channel": "sim"},
        "tasks": [{"env": "synthetic", "reward": "synthetic", "tag": "prefill"},
                  {"env": "synthetic", "reward": "synthetic", "tag": "decode"}],
    })
    plan = make_plan(cfg)
    # D61: the simulated trainer's sharded states and one 8,192-token sequence's activations over 8 devices
    act = 8192 * (2 * 4096 * 36 + 34 * 4096 + 4 * 151_936) / 8
    assert plan.trainer.backend == "sim" and plan.trainer.memory.total == pytest.approx(18 * 8.2e9 / 8 + act, abs=8)
    assert {r.tag: r.pools for r in plan.routes} == {"prefill": ["h800"], "decode": ["h20"]}


def test_examples_that_load_a_checkpoint_plan_as_shipped_after_one_documented_command(tmp_path, monkeypatch):
    """Issue 25: user_env.yaml and vllm_gloo.yaml name `checkpoints/tiny`; `rollart checkpoint init` makes it."""
    monkeypatch.chdir(tmp_path)
    for name in ("user_env.yaml", "vllm_gloo.yaml"):
        code, out = _plan_cli(str(CONFIGS / name))
        assert code == 2 and "rollart checkpoint init checkpoints/tiny" in " ".join(out.split()), out
    res = CliRunner().invoke(app, ["checkpoint", "init", "checkpoints/tiny"])
    assert res.exit_code == 0 and (tmp_path / "checkpoints" / "tiny" / "config.json").is_file(), res.output
    for name in ("user_env.yaml", "vllm_gloo.yaml"):
        code, out = _plan_cli(str(CONFIGS / name))
        assert code == 0, out


def test_plan_of_a_config_without_a_checkpoint_imports_neither_torch_nor_transformers():
    """Issue 25: `rollart plan` starts nothing, so it must not pay seconds of torch/transformers imports."""
    code = ("import sys\nfrom rollart.app.cli import app\n"
            f"sys.argv = ['rollart', 'plan', {str(CONFIGS / 'cpu_demo.yaml')!r}]\n"
            "try:\n    app()\nexcept SystemExit as e:\n    assert not e.code, e.code\n"
            "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules), file=sys.stderr)\n")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stderr.strip().splitlines()[-1] == "[]", res.stderr[-2000:]
