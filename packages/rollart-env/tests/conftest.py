"""Fixtures of rollart-env's tests: a tiny local chat tokenizer and its prompt builder."""

from __future__ import annotations

import pytest

from rollart.env.prompts import ChatTemplatePromptBuilder
from rollart.env.tiny_tokenizer import build_tiny_chat_tokenizer


@pytest.fixture(scope="session")
def tokenizer():
    return build_tiny_chat_tokenizer()


@pytest.fixture(scope="session")
def prompts(tokenizer):
    return ChatTemplatePromptBuilder(tokenizer)
