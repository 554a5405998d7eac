"""The GPU tier is collected everywhere and skips with one line where there is no CUDA device (app D73)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
TIER = ("test_torch_engine_generates_on_cuda", "test_torch_trainer_steps_on_cuda", "test_a_ray_actor_with_a_gpu_is_placed_on_cuda",
        "test_nccl_weight_sync_is_bit_exact_against_the_trainer", "test_a_vllm_gpu_pool_with_tensor_parallel_1",
        "test_a_vllm_gpu_pool_with_tensor_parallel_2")


def _pytest(*args: str) -> str:
    res = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args], cwd=ROOT,
                         capture_output=True, text=True, timeout=300)
    return res.stdout + res.stderr


def test_pytest_m_gpu_collect_only_lists_the_tier() -> None:
    out = _pytest("-m", "gpu", "--collect-only", "-q", "tests/gpu")
    assert all(f"tests/gpu/test_gpu_tier.py::{name}" in out for name in TIER), out


def test_without_cuda_each_gpu_test_skips_with_one_line_saying_why() -> None:
    import torch

    if torch.cuda.is_available():  # on a GPU node the tier runs instead
        return
    out = _pytest("-q", "-m", "gpu", "-rs", "tests/gpu")
    skips = [line for line in out.splitlines() if line.startswith("SKIPPED")]
    assert len(skips) == len(TIER), out
    assert all("no CUDA device here" in line or "needs 2 CUDA devices" in line for line in skips)


def test_the_gpu_page_is_in_the_docs_nav_and_make_has_test_gpu() -> None:
    nav = yaml.safe_load((ROOT / "mkdocs.yml").read_text().split("\nnav:\n", 1)[1].join(["nav:\n", ""]))["nav"]
    assert {"GPU clusters": "gpu-cluster.md"} in nav
    assert "\ntest-gpu:" in (ROOT / "Makefile").read_text()
