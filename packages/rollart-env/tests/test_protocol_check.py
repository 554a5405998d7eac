"""Issue 14 item 7: the EnvManager checks its parts against their protocols when it is built.

Before, a `def step` (not async) or a prompt builder without `decode` built fine and then turned
every trajectory into env_crash / internal_error at run time.
"""

from __future__ import annotations

import pytest

from rollart.env import EnvProtocolError
from rollart.env.manager import EnvManager
from rollart.env.protocols import ResetResult, StepResult
from rollart.env.stubs import CountdownStubEnv, ListSink, StubLLMClient
from rollart.resource.virtual_time import run_virtual


class SyncStepEnv(CountdownStubEnv):
    def step(self, action: str) -> StepResult:  # type: ignore[override] - the mistake under test
        return StepResult("done", 1.0, True, False)


class NoCloseEnv:
    name = "no-close"
    system_prompt = ""

    async def reset(self, seed: int | None = None) -> ResetResult:
        return ResetResult("hi")

    async def step(self, action: str) -> StepResult:
        return StepResult("done", 1.0, True, False)


class PromptsWithoutDecode:
    def __init__(self, inner) -> None:
        self.inner = inner

    def initial_ids(self, system_prompt: str, observation: str) -> list[int]:
        return self.inner.initial_ids(system_prompt, observation)

    def continuation_ids(self, previous_response_ids: list[int], observation: str) -> list[int]:
        return self.inner.continuation_ids(previous_response_ids, observation)


class AsyncDecodePrompts(PromptsWithoutDecode):
    async def decode(self, token_ids: list[int]) -> str:
        return self.inner.decode(token_ids)


def _llm(tokenizer):
    return StubLLMClient(lambda s: tokenizer.encode(s, add_special_tokens=False), ["Right"],
                         eos_token_id=tokenizer.eos_token_id)


@pytest.mark.parametrize("factory", [SyncStepEnv, lambda: SyncStepEnv()], ids=["class", "factory"])
def test_a_sync_step_fails_when_the_manager_is_built(factory, tokenizer, prompts):
    with pytest.raises(EnvProtocolError, match=r"SyncStepEnv\.step must be `async def`, it is a plain function"):
        EnvManager(factory, _llm(tokenizer), prompts, ListSink(), name="m0")


def test_a_missing_env_method_is_named(tokenizer, prompts):
    with pytest.raises(EnvProtocolError, match=r"NoCloseEnv\.close is missing \(the Env protocol needs it\)"):
        EnvManager(NoCloseEnv, _llm(tokenizer), prompts, ListSink(), name="m0")


@pytest.mark.parametrize(("builder", "problem"), [
    (PromptsWithoutDecode, r"PromptsWithoutDecode\.decode is missing \(the PromptBuilder protocol needs it\)"),
    (AsyncDecodePrompts, r"AsyncDecodePrompts\.decode must be a plain function, it is `async def`"),
])
def test_a_prompt_builder_missing_a_method_fails_when_the_manager_is_built(builder, problem, tokenizer, prompts):
    with pytest.raises(EnvProtocolError, match=problem):
        EnvManager(CountdownStubEnv, _llm(tokenizer), builder(prompts), ListSink(), name="m0")


def test_good_parts_build_and_the_first_env_serves_the_first_trajectory(tokenizer, prompts):
    made = []

    def factory():
        made.append(CountdownStubEnv(length=1))
        return made[-1]

    sink = ListSink()
    manager = EnvManager(factory, _llm(tokenizer), prompts, sink, name="m0")
    assert len(made) == 1  # called once to check what it makes

    async def one():
        await manager.run(iter([0]))

    run_virtual(one())
    assert len(made) == 1 and made[0].steps == 1
    assert [t.status.value for t in sink.items] == ["finished"]


def test_top_k_zero_disables_it_as_in_the_proxy_and_the_old_minus_one_is_refused():
    from rollart.env import EnvError
    from rollart.env.protocols import SamplingParams

    assert SamplingParams().top_k == 0
    with pytest.raises(EnvError, match=r"top_k must be an integer in \[0, 2147483648\], got -1"):
        SamplingParams(top_k=-1)
