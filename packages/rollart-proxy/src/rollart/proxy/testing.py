"""A tiny causal LM and tokenizer built locally (no downloads), for tests, demos and benchmarks.

Other packages may reuse the factory through the scheduler, or copy ``TINY_LLAMA_CONFIG`` (the
train package may not import ``rollart.proxy``): the model is a 2-layer Llama with hidden size 64
(2 heads of dim 32: vLLM's CPU attention has no kernel for head_dim 16) and a byte-level BPE vocabulary of ``TINY_VOCAB_SIZE`` tokens, randomly initialised from a fixed
seed, in float32. ``initializer_range`` is large on purpose: a near-uniform random model has
near-ties between logits, and greedy equivalence tests need clear winners.

Example:
    ```python
    path = build_tiny_model("/tmp/tiny")          # writes config, weights, tokenizer
    engine = TorchEngine.from_pretrained(path)
    ```
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rollart.resource.virtual_time import VirtualTimeLoop
from rollart.resource.virtual_time import run_virtual as _run_virtual

TINY_VOCAB_SIZE = 384
TINY_LLAMA_CONFIG: dict[str, Any] = {
    "vocab_size": TINY_VOCAB_SIZE,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "max_position_embeddings": 512,
    "initializer_range": 0.5,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": False,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "pad_token_id": 0,
}
SPECIAL_TOKENS = ("<pad>", "<s>", "</s>", "<|user|>", "<|assistant|>")
CHAT_TEMPLATE = (
    "{% for m in messages %}{% if m['role'] == 'user' %}<|user|>{% else %}<|assistant|>{% endif %}"
    "{{ m['content'] }}</s>{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
TRAINING_TEXT = (
    "You are walking on a frozen lake. Move left, right, up or down to reach the goal.",
    "Solve: what is 12 plus 30? The answer is 42.",
    "def add(a, b):\n    return a + b\n",
    "The quick brown fox jumps over the lazy dog. 0123456789",
    "Observation: you see a hole to the left and the goal below. Action: down",
)


def build_tiny_tokenizer() -> Any:
    """A byte-level BPE tokenizer trained on a few shipped strings, with a chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=TINY_VOCAB_SIZE,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(list(TRAINING_TEXT) * 4, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", bos_token="<s>", eos_token="</s>", model_max_length=512
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def build_tiny_model(path: str | Path, *, seed: int = 0) -> str:
    """Write a random-init tiny Llama (weights, config, tokenizer) to ``path``; return the path.

    Deterministic for a given seed, so two processes (a test and a Ray actor, vLLM's engine
    process) see the same weights.
    """
    try:
        import torch
        from transformers import LlamaConfig, LlamaForCausalLM
    except ImportError as err:  # the optional extra is missing: say which one
        raise ImportError("build_tiny_model needs torch and transformers: pip install torch==2.13.0 "
                          "'rollart-proxy[torch]'") from err

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    config = LlamaConfig(**TINY_LLAMA_CONFIG)
    model = LlamaForCausalLM(config).to(torch.float32)
    model.config.dtype = "float32"
    model.save_pretrained(path)
    build_tiny_tokenizer().save_pretrained(path)
    return str(path)


def prompts_of_mixed_lengths(n: int, *, seed: int = 0, min_len: int = 3, max_len: int = 24) -> list[list[int]]:
    """Random prompt token ids (never special tokens) of varied lengths, for tests and benches."""
    import random

    rng = random.Random(seed)
    low = len(SPECIAL_TOKENS)
    return [
        [rng.randrange(low, TINY_VOCAB_SIZE) for _ in range(rng.randint(min_len, max_len))] for _ in range(n)
    ]


VirtualLoop = VirtualTimeLoop
"""The one virtual-time loop of rollart-resource (design D18), under the name the proxy's tests use."""


def run_virtual(coro: Any) -> Any:
    """Run a coroutine on a fresh rollart.resource VirtualTimeLoop (aliased here as ``VirtualLoop``); return its result."""
    # deps: rollart.resource.virtual_time.run_virtual
    return _run_virtual(coro).result
