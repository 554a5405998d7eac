"""Steps 9-10 (D14, D15): the simulated trainer's cost model against hand-computed figures."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys

import pytest

from rollart.resource.hardware import BUILTIN_HARDWARE
from rollart.resource.virtual_time import run_virtual
from rollart.train.batch import TrainSample, build_train_batch
from rollart.train.errors import TrainError
from rollart.train.protocols import PolicyTrainer
from rollart.train.sim_trainer import AsyncStepTrainer, SimTrainer, train_step_cost

H800 = BUILTIN_HARDWARE["H800"]


def test_cost_matches_the_hand_computed_roofline():
    """Design D14: Qwen3-8B, 512 x 8,192 tokens, on 64 and on 8 H800 (mfu 0.4)."""
    c64 = train_step_cost(8.2e9, 512 * 8192, 64, H800)
    assert c64.compute_s == pytest.approx(8.146466, rel=1e-6)
    assert c64.allreduce_s == pytest.approx(0.64575, rel=1e-6)  # 2 x 63/64 x 16.4 GB / 50 GB/s (NIC)
    assert c64.step_s == pytest.approx(8.792216, rel=1e-6)
    c8 = train_step_cost(8.2e9, 512 * 8192, 8, H800)
    assert c8.compute_s == pytest.approx(65.171727, rel=1e-6)
    assert c8.allreduce_s == pytest.approx(0.07175, rel=1e-6)  # one node: NVLink 400 GB/s
    assert train_step_cost(8.2e9, 1000, 1, H800).allreduce_s == 0.0


def test_bad_figures_name_the_field():
    with pytest.raises(TrainError, match="n_params"):
        train_step_cost(0, 10, 1, H800)
    with pytest.raises(TrainError, match="devices"):
        train_step_cost(1e9, 10, 0, H800)
    with pytest.raises(TrainError, match="mfu"):
        SimTrainer(1e9, H800, 8, mfu=1.5)
    with pytest.raises(TrainError, match="version"):
        SimTrainer(1e9, H800, 8, version=-1)


def batch(n_seq: int, length: int):
    samples = [TrainSample(token_ids=list(range(1, length + 1)), policy_mask=[0] * (length // 2) + [1] * (length - length // 2),
                           behaviour_log_probs=[0.0] * length, reward=float(i % 2), group_id=i // 2) for i in range(n_seq)]
    return build_train_batch(samples, pad_token_id=0)


def test_sim_trainer_waits_its_modelled_time_in_virtual_time():
    trainer = SimTrainer(8.2e9, H800, 64)
    b = batch(4, 1000)

    async def go():
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        m = await trainer.train_step_async(b)
        return m, loop.time() - t0

    m, waited = run_virtual(go()).result
    expected = train_step_cost(8.2e9, 4000, 64, H800)
    assert waited == pytest.approx(expected.step_s) and m["step_s"] == pytest.approx(expected.step_s)
    assert m["tokens"] == 4000 and m["version"] == 1.0 and trainer.version == 1
    assert isinstance(trainer, AsyncStepTrainer)


def test_metrics_have_the_torch_trainers_keys_and_checkpoints_restore_the_version(tmp_path):
    trainer = SimTrainer(1e9, BUILTIN_HARDWARE["H20"], 16)
    assert isinstance(trainer, PolicyTrainer)
    m = trainer.train_step(batch(2, 10))
    torch_keys = {"loss", "pg_loss", "kl", "entropy", "clip_frac", "ratio_mean", "grad_norm", "policy_tokens",
                  "sequences", "micro_batches", "lr", "version"}
    assert torch_keys <= set(m) and m["policy_tokens"] == 10 and m["sequences"] == 2
    assert trainer.named_tensors()["sim.version"].tolist() == [1]
    assert trainer.weight_bytes == 2e9
    trainer.save_checkpoint(tmp_path / "sim-ckpt")
    fresh = SimTrainer(1e9, BUILTIN_HARDWARE["H20"], 16)
    fresh.load_checkpoint(tmp_path / "sim-ckpt")
    assert fresh.version == 1


def test_forward_pass_and_active_parameter_figures_name_the_field():
    """D25."""
    with pytest.raises(TrainError, match="forward_passes"):
        train_step_cost(8.2e9, 10, 1, H800, forward_passes=-1)
    with pytest.raises(TrainError, match="active_params"):
        train_step_cost(8.2e9, 10, 1, H800, active_params=9e9)


def test_forward_passes_and_active_parameters_price_the_rl_step():
    # Qwen3-235B-A22B, 512 x 8,192 tokens on 128 H800: (6 + 2 x 2) x 22e9 x T / (128 x 989.5e12 x 0.4)
    tokens = 512 * 8192
    cost = train_step_cost(235e9, tokens, 128, H800, active_params=22e9, forward_passes=2)
    assert cost.compute_s == pytest.approx(10 * 22e9 * tokens / (128 * 989.5e12 * 0.4))
    assert cost.allreduce_s == pytest.approx(2 * 127 / 128 * 2 * 235e9 / 50e9)  # gradients of all parameters
    trainer = SimTrainer(235e9, H800, 128, active_params=22e9, forward_passes=2)
    assert trainer.cost_on(tokens, 128) == cost
    assert train_step_cost(8.2e9, tokens, 8, H800, forward_passes=1).compute_s == pytest.approx(
        train_step_cost(8.2e9, tokens, 8, H800).compute_s * 8 / 6)


def test_the_simulators_train_modules_import_no_torch(tmp_path):
    """D31: the modules the simulator imports (sim trainer, batch, advantages, state_io) load without torch,
    and a sim step on plain token counts plus a checkpoint of its version never imports it."""
    code = (
        "import sys\n"
        "import rollart.train.advantages, rollart.train.batch, rollart.train.state_io\n"
        "from rollart.resource.hardware import BUILTIN_HARDWARE\n"
        "from rollart.train.sim_trainer import SimTrainer\n"
        "class Count(int):\n"
        "    def sum(self):\n"
        "        return self\n"
        "class Batch:\n"
        "    num_sequences, attention_mask, loss_mask = 2, Count(40), Count(10)\n"
        "t = SimTrainer(1e9, BUILTIN_HARDWARE['H20'], 16)\n"
        "m = t.train_step(Batch())\n"
        "t.save_checkpoint(sys.argv[1])\n"
        "print('TORCH', 'torch' in sys.modules, m['tokens'], m['policy_tokens'])\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path / "ckpt")], capture_output=True, text=True, env=env,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split() == ["TORCH", "False", "40.0", "10.0"]
