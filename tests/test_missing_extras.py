"""Issue 14 item 1: using an optional part without its extra fails with an error naming the extra."""

from __future__ import annotations

import subprocess
import sys

import pytest

# (modules hidden as if not installed, code that uses the optional part, the extra the error must name)
CASES = [
    (["transformers", "tokenizers"], "from rollart.env.tiny_tokenizer import build_tiny_chat_tokenizer as b; b()",
     "pip install 'rollart-env[hf]'"),
    (["torch"], "import rollart.proxy.torch_engine", "pip install torch==2.13.0 'rollart-proxy[torch]'"),
    (["transformers"], "from rollart.proxy.testing import build_tiny_model as b; b('/nonexistent/never-written')",
     "'rollart-proxy[torch]'"),
    (["vllm"], "from rollart.proxy.vllm_engine import VLLMEngine as V; V('/nonexistent')", "'rollart-proxy[vllm]'"),
    (["mooncake", "mooncake.store"], "from rollart.sync.mooncake import mooncake_unavailable_reason as r; "
     "raise ImportError(r())", "'rollart-sync[mooncake]'"),
]


@pytest.mark.parametrize(("hidden", "code", "extra"), CASES, ids=[c[2] for c in CASES])
def test_missing_extra_error_names_the_extra(hidden, code, extra):
    hide = "; ".join(f"sys.modules[{m!r}] = None" for m in hidden)  # a None entry makes `import m` raise
    res = subprocess.run([sys.executable, "-c", f"import sys; {hide}; {code}"], capture_output=True, text=True)
    assert res.returncode != 0
    assert "ImportError" in res.stderr and extra in res.stderr, res.stderr[-2000:]
