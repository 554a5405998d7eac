"""Fixtures of the rollart-proxy tests: the tiny model (built once per session) and hardware."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def tiny_model_path(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A tiny random Llama + tokenizer written to a temp dir (no downloads)."""
    from rollart.proxy.testing import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny-llama"))
