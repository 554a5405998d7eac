"""Issue 23: `MathCalcEnv.step` reads `<answer>`/`<calc>` in time linear in the text.

Before the fix `"<answer>" * 10000` took 40 s in `step` (a quadratic `.*?` regex on the event loop).
The 1 s per-input budget is the issue's; linear code takes milliseconds on 100 kB.
"""

from __future__ import annotations

import asyncio
import re
import time

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rollart.env.envs.math_calc import MathCalcEnv, last_tagged

PER_INPUT_BUDGET_S = 1.0
pieces = st.sampled_from(["<answer>", "</answer>", "<calc>", "</calc>", "<calc", "<", ">", "1+1", "x", " "])
# opening tags without a close are what made the old regexes quadratic: half the inputs are made of those only
unclosed = st.sampled_from(["<answer>", "<calc>", "<answer", "1+1", " ", "x"])
hostile = st.builds(lambda parts, n: "".join(parts) * n,
                    st.one_of(st.lists(pieces, min_size=1, max_size=6), st.lists(unclosed, min_size=1, max_size=4)),
                    st.integers(1, 20_000))


async def _step(text: str):
    env = MathCalcEnv()
    await env.reset(seed=1)
    return await env.step(text)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(hostile)
def test_step_takes_linear_time_on_hostile_text(text):
    text = text[:100_000]
    start = time.monotonic()
    asyncio.run(_step(text))
    assert time.monotonic() - start < PER_INPUT_BUDGET_S


def test_the_issue_input_ends_fast():
    start = time.monotonic()
    result = asyncio.run(_step("<answer>" * 10_000))
    assert time.monotonic() - start < PER_INPUT_BUDGET_S
    assert result.observation.startswith("Use <calc>")


@settings(max_examples=200)
@given(st.text(alphabet="<>/acnswerl1 ", max_size=60))
def test_last_tagged_finds_what_the_regex_found(text):
    for tag in ("answer", "calc"):
        found = re.findall(rf"<{tag}>(.*?)</{tag}>", text, re.DOTALL)
        assert last_tagged(text, tag) == (found[-1] if found else None)
