"""`ChatTemplatePromptBuilder`: new context tokens per turn from a tokenizer's chat template.

Why deltas: the history is never re-rendered and re-tokenized. For a new observation we render
a two-message conversation with a sentinel assistant reply and keep only the text *after* the
sentinel (end of the assistant turn + the user turn + the generation prompt); if the engine
already produced the end-of-turn token, its text is dropped from the delta so it is not doubled.
"""

from __future__ import annotations

from typing import Any

from rollart import checks as check
from rollart.env.errors import EnvError

_SENTINEL = "\u2063ROLLART_SENTINEL\u2063"


class ChatTemplatePromptBuilder:
    """A `PromptBuilder` over a Hugging Face tokenizer with a chat template."""

    def __init__(self, tokenizer: Any, user_role: str = "user") -> None:
        """Wrap `tokenizer` (anything with `apply_chat_template`, `encode`, `decode`, `eos_token_id`)."""
        # VAL: VAL_NON_EMPTY(user_role, exc=EnvError)
        check.non_empty("user_role", user_role, exc=EnvError)  # generated #5276b11311
        self.tokenizer = tokenizer
        self.user_role = user_role
        self._eos_text = tokenizer.decode([tokenizer.eos_token_id]) if tokenizer.eos_token_id is not None else ""

    def initial_ids(self, system_prompt: str, observation: str) -> list[int]:
        """The templated first prompt (system + first observation + generation prompt) as ids."""
        messages = [{"role": "system", "content": system_prompt}] if system_prompt else []
        messages.append({"role": self.user_role, "content": observation})
        text = self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def continuation_ids(self, previous_response_ids: list[int], observation: str) -> list[int]:
        """Ids that close the previous assistant turn and add the observation and generation prompt."""
        # deps: ChatTemplatePromptBuilder.delta_text
        return list(self.tokenizer.encode(self.delta_text(previous_response_ids, observation), add_special_tokens=False))

    def delta_text(self, previous_response_ids: list[int], observation: str) -> str:
        """The template text between the end of the generated reply and the next generation prompt."""
        messages = [
            {"role": self.user_role, "content": "x"},
            {"role": "assistant", "content": _SENTINEL},
            {"role": self.user_role, "content": observation},
        ]
        full = self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        # AST: AST_INVARIANT(_SENTINEL in full, got=full, msg="the chat template renders assistant content verbatim", exc=EnvError)
        check.invariant(_SENTINEL in full, "the chat template renders assistant content verbatim", got=full, exc=EnvError)  # generated #db74847733
        delta = full[full.index(_SENTINEL) + len(_SENTINEL) :]
        ended_with_eos = bool(previous_response_ids) and previous_response_ids[-1] == self.tokenizer.eos_token_id
        if ended_with_eos and self._eos_text and delta.startswith(self._eos_text):
            delta = delta[len(self._eos_text) :]
        return delta

    def decode(self, token_ids: list[int]) -> str:
        """Text of generated ids without special tokens (what the environment parses)."""
        return self.tokenizer.decode(token_ids, skip_special_tokens=True)
