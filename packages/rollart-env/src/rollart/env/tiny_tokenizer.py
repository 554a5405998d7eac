"""A tiny byte-level BPE chat tokenizer built locally (no downloads) for tests, demos and benchmarks.

Why byte-level BPE: every string encodes (no unknown tokens) and merges make re-tokenization
drift real — exactly the bug token-exact multi-turn must avoid, so tests can show it.
"""

from __future__ import annotations

from typing import Any

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
SPECIAL_TOKENS = ["<|pad|>", "<|im_start|>", "<|im_end|>", "<|endoftext|>"]

_CORPUS = [
    "You are an agent. Think, then answer with an action.",
    "The frozen lake: move Up, Down, Left or Right to reach the goal G without falling into a hole H.",
    "Compute the value. Use <calc>12 * 7</calc> for the calculator and <answer>84</answer> to answer.",
    "def solve(x):\n    return x + 1\n",
    "```python\nprint('hello world')\n```",
    "0 1 2 3 4 5 6 7 8 9 10 100 1000 + - * / = ( ) < > [ ] { }",
    "Invalid action. Observation: the result is 42. Correct! Wrong answer.",
]


def build_tiny_chat_tokenizer(vocab_size: int = 400) -> Any:
    """Train a byte-level BPE on a built-in corpus and wrap it as a `PreTrainedTokenizerFast` with ChatML."""
    try:
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
        from transformers import PreTrainedTokenizerFast
    except ImportError as err:  # the optional extra is missing: say which one
        raise ImportError(f"{err.name or 'transformers'} is missing: the tiny tokenizer needs the [hf] extra, "
                          "pip install 'rollart-env[hf]'") from err

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_CORPUS * 4, trainer=trainer)
    hf = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token="<|pad|>",
        eos_token="<|im_end|>",
        bos_token="<|endoftext|>",
    )
    hf.chat_template = CHATML_TEMPLATE
    return hf
