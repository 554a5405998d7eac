"""Issue 23, graders: hostile answers cannot stall the grader or the service (D27, D29), and an
answer states exactly one value (D28).

Before the fix: `2^{999\\cdot 999\\cdot 999}` and friends passed the tower filter and sympy held the
GIL for 82 s (the service stopped answering /health and ignored SIGTERM); `"<answer>" * 10000` took
40 s in `extract_answer` (a quadratic regex); an `async def score` calling `time.sleep(40)` blocked
the event loop and came back `ok` after its 2 s deadline; `\\sqrt{2} \\approx 3` scored 1 against
`\\sqrt{2}` and `\\infty` scored 0 against `\\infty`.

Timing bounds: only the issue's (per-input budgets, 100 ms /health, 5 s SIGTERM), each with the
margin stated where it is asserted, because these tests share 2 loaded cores with others.
"""

from __future__ import annotations

import asyncio
import os
import signal
import statistics
import subprocess
import threading
import time

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rollart.env.trajectory import Trajectory, Turn
from rollart.reward.grading import GradingPool
from rollart.reward.rules import FormatReward, MathAnswerReward, extract_answer, grade, math_equivalent

TOKEN = "test-token-123456"  # the conftest's server token
AUTH = {"Authorization": f"Bearer {TOKEN}"}
# per hostile input: linear code takes milliseconds on 100 kB; 1 s is the issue's budget and leaves
# a wide margin for a loaded machine (the quadratic regex took 40 s on 80 kB)
PER_INPUT_BUDGET_S = 1.0
# inside the bounds but slow for sympy: 13 s and more than 100 s of GIL-holding work
SLOW_IN_BOUNDS = [r"\sum_{k=1}^{999} k^{999}", r"(x+y+z+1)^{99}"]
ATTACKS = [r"((9^{999})^{999})^{999}", r"2^{999\cdot 999\cdot 999}", r"\binom{99999999}{49999999}", r"\Gamma(99999999)"]


def traj(answer: str, truth: str = r"\sqrt{2}", key: str = "t") -> Trajectory:
    turn = Turn(prompt_ids=[1], response_ids=[2], response_logprobs=[-1.0], response_text=answer)
    return Trajectory(id=key, turns=[turn], info={"ground_truth": truth})


def timed(fn, *args):
    start = time.monotonic()
    result = fn(*args)
    return result, time.monotonic() - start


# --- D27: inputs bounded before parsing -------------------------------------------------------------


@pytest.mark.parametrize("answer", ATTACKS)
def test_the_issue_attacks_are_refused_with_a_reason_before_sympy_sees_them(answer):
    (ok, reason), took = timed(grade, answer, r"\sqrt{2}")
    assert ok is False and reason.startswith("refused:"), reason
    assert took < PER_INPUT_BUDGET_S


@pytest.mark.parametrize("answer", ["x^{999}", r"2^{1/2}", r"\binom{10}{3}", "999!", r"\Gamma(5)", r"(x+1)^2"])
def test_ordinary_powers_factorials_and_binomials_are_not_refused(answer):
    assert grade(answer, r"\sqrt{2}")[1] is None


def test_deep_nesting_and_long_answers_are_refused():
    assert "nested" in grade("(" * 20 + "1" + ")" * 20, r"\sqrt{2}")[1]
    assert "longer" in grade("1+" * 200 + "1", r"\sqrt{2}")[1]


# --- D27: answer and calc extraction linear in the text ---------------------------------------------

pieces = st.sampled_from(["<answer>", "</answer>", "<answer", "answer>", "<", ">", "\\boxed{", "{", "}", "x", " "])
# opening tags without a close are what made the old regexes quadratic: half the inputs are made of those only
unclosed = st.sampled_from(["<answer>", "<answer", "\\boxed{", "{", "x", " "])
hostile = st.builds(lambda parts, n: "".join(parts) * n,
                    st.one_of(st.lists(pieces, min_size=1, max_size=6), st.lists(unclosed, min_size=1, max_size=4)),
                    st.integers(1, 20_000))


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(hostile)
def test_extract_answer_and_format_take_linear_time_on_hostile_text(text):
    text = text[:100_000]
    _, took = timed(extract_answer, text)
    assert took < PER_INPUT_BUDGET_S
    _, took = timed(asyncio.run, FormatReward().score(traj(text)))
    assert took < PER_INPUT_BUDGET_S


def test_the_issue_input_is_fast_and_extraction_keeps_the_findall_semantics():
    _, took = timed(extract_answer, "<answer>" * 10_000)
    assert took < PER_INPUT_BUDGET_S
    assert extract_answer("<answer>a</answer></answer>") == "a"
    assert extract_answer("<answer>a</answer> <answer> b </answer>") == "b"
    assert extract_answer("<answer><answer>a</answer>") == "<answer>a"
    assert extract_answer("<answer>1 \\boxed{2}") == "2"


# --- D28: exactly one value -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("prediction", "truth", "ok"),
    [
        (r"\sqrt{2} \approx 3", r"\sqrt{2}", False),
        (r"\sqrt{2} \approx 1.414", r"\sqrt{2}", False),
        (r"\sqrt{3} = \sqrt{2}", r"\sqrt{2}", False),
        (r"\sqrt{2} = \sqrt{3}", r"\sqrt{2}", False),
        (r"x = 3 = \sqrt{2}", r"\sqrt{2}", False),
        (r"x = \sqrt{2} = 3", r"\sqrt{2}", False),
        (r"= \sqrt{2}", r"\sqrt{2}", False),
        (r"\sqrt{8}/2 = \sqrt{2}", r"\sqrt{2}", True),  # a chain of equal values is one value
        (r"x = \sqrt{2}", r"\sqrt{2}", True),  # a variable name is a label
        (r"\infty", r"\infty", True),
        (r"-\infty", r"-\infty", True),
        (r"-\infty", r"\infty", False),
        (r"\infty", r"-\infty", False),
        ("3", r"\infty", False),
    ],
)
def test_an_answer_states_exactly_one_value_and_equal_infinities_are_equal(prediction, truth, ok):
    assert math_equivalent(prediction, truth) is ok


# --- D27: the grading pool kills a grader at its deadline -------------------------------------------


def _running(pid: int) -> bool:
    """The process exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except FileNotFoundError:
        return False


def test_a_slow_grader_is_killed_at_its_deadline_and_its_worker_replaced():
    async def main():
        pool = GradingPool(size=1)
        try:
            assert await pool.grade(r"\sqrt{2}", r"\sqrt{2}", 30.0) == (True, None)  # warm: the clock starts when ready
            (first,) = pool.worker_pids()
            start = time.monotonic()
            with pytest.raises(Exception, match="did not finish within 1 s"):
                await pool.grade(SLOW_IN_BOUNDS[1], r"\sqrt{2}", 1.0)
            took = time.monotonic() - start
            await asyncio.sleep(0.5)
            alive = await asyncio.to_thread(_running, first)
            assert await pool.grade(r"\sqrt{8}/2", r"\sqrt{2}", 30.0) == (True, None)
            return took, alive, first, pool.worker_pids()
        finally:
            pool.close()

    took, alive, first, now = asyncio.run(main())
    assert took < 1.0 + 2.0  # the deadline plus a loaded machine's 2 s to notice and kill
    assert not alive  # the stuck worker is gone ...
    assert first not in now and len(now) == 1  # ... and a new one graded the next item


async def test_math_reward_scores_zero_with_reason_grading_timeout():
    reward = MathAnswerReward(grading_timeout_s=1.0)
    result = await reward.score(traj(f"<answer>{SLOW_IN_BOUNDS[0]}</answer>"))
    assert result.score == 0.0 and result.details["reason"] == "grading timeout"
    refused = await reward.score(traj(f"<answer>{ATTACKS[1]}</answer>"))
    assert refused.score == 0.0 and refused.details["reason"].startswith("refused:")
    assert (await reward.score(traj("<answer>\\sqrt{2}</answer>"))).score == 1.0


# --- the service under hostile items (real server on 127.0.0.1) ------------------------------------


def _poll_health(url: str, stop: threading.Event, latencies: list[float]) -> None:
    with httpx.Client(timeout=10.0) as client:
        while not stop.is_set():
            start = time.monotonic()
            client.get(f"{url}/health").raise_for_status()
            latencies.append(time.monotonic() - start)
            time.sleep(0.02)


def _item(key: str, answer: str, **info) -> dict:
    t = traj(answer, key=key)
    t.info.update(info)
    return {"key": key, "trajectory": t.model_dump(mode="json")}


@pytest.mark.slow
def test_health_answers_within_100ms_under_a_flood_of_hostile_items_and_sigterm_stops_it(server_factory):
    """1 worker (so every hostile item lands where /health is asked). Hostile math items (slow-in-bounds
    sympy, the issue's towers, 100 kB of repeated tags) under a 5 s deadline and `time.sleep(40)`
    rewards under a 2 s one are posted from 4 threads while /health is polled. The issue's bound is 100 ms; the median and
    the 95th percentile are held to it, single polls get 1 s of slack for a loaded 2-core machine."""
    srv = server_factory(workers=1, item_timeout_s=5.0).start()
    stop = threading.Event()
    latencies: list[float] = []
    statuses: list[tuple] = []
    math_items = [_item(f"m{i}", f"<answer>{a}</answer>") for i, a in enumerate(SLOW_IN_BOUNDS + ATTACKS)]
    math_items.append(_item("tags", "<answer>" * 12_000))

    def flood(n: int) -> None:
        with httpx.Client(timeout=30.0) as client:
            for round_ in range(3):
                for reward, items, deadline in (("math", math_items, 5.0), ("block", [_item(f"b{n}-{round_}", "", sleep_s=40.0)], 2.0)):
                    items = [{**it, "key": f"{it['key']}-{n}-{round_}"} for it in items]
                    start = time.monotonic()
                    r = client.post(f"{srv.url}/v1/score", headers=AUTH, json={"reward": reward, "items": items, "timeout_s": deadline})
                    took = time.monotonic() - start
                    for res in r.json()["results"]:
                        statuses.append((reward, res["status"], res.get("score"), (res.get("details") or {}).get("reason")))
                    assert took < deadline + 1.0 + 2.0  # answer_bound_s plus 2 s of loaded-machine slack

    poller = threading.Thread(target=_poll_health, args=(srv.url, stop, latencies))
    poller.start()
    floods = [threading.Thread(target=flood, args=(n,)) for n in range(4)]
    for f in floods:
        f.start()
    for f in floods:
        f.join(timeout=120)
    stop.set()
    poller.join(timeout=20)
    assert len(latencies) > 20
    p95 = statistics.quantiles(latencies, n=20)[-1]
    print(f"/health under flood: n={len(latencies)} median={statistics.median(latencies)*1000:.1f} ms "
          f"p95={p95*1000:.1f} ms max={max(latencies)*1000:.1f} ms")
    assert statistics.median(latencies) < 0.1 and p95 < 0.1
    assert max(latencies) < 1.0
    # a hostile math item scores 0 (refused, or its grader killed at 2 s), or, queued behind other
    # killed graders (2 workers), is answered `timeout` at the 5 s request deadline; never 1, never late
    math_results = [s for s in statuses if s[0] == "math"]
    assert len(math_results) == 4 * 3 * len(math_items)
    assert all((status == "ok" and score == 0.0) or status == "timeout" for _, status, score, _ in math_results)
    reasons = {reason or "" for *_, reason in math_results}
    assert "grading timeout" in reasons and any(r.startswith("refused:") for r in reasons)
    assert all(status == "timeout" for reward, status, *_ in statuses if reward == "block")

    # SIGTERM to the master alone, while graders and blocked threads still run: gone within 5 s
    with httpx.Client(timeout=30.0) as client:
        threading.Thread(target=lambda: _swallow(client.post, f"{srv.url}/v1/score", headers=AUTH,
                         json={"reward": "math", "items": [_item("last", f"<answer>{SLOW_IN_BOUNDS[1]}</answer>")]}),
                         daemon=True).start()
        time.sleep(0.5)
        start = time.monotonic()
        os.kill(srv.proc.pid, signal.SIGTERM)
        try:
            srv.proc.wait(timeout=5.0 + 2.0)  # the issue's 5 s plus 2 s for a loaded machine
        except subprocess.TimeoutExpired:
            pytest.fail("the service did not stop on SIGTERM")
        print(f"SIGTERM to exit: {time.monotonic() - start:.2f} s")
        assert time.monotonic() - start < 5.0 + 2.0


def _swallow(fn, *args, **kwargs):
    try:
        fn(*args, **kwargs)
    except Exception:
        pass


@pytest.mark.slow
def test_a_blocking_reward_is_answered_timeout_at_its_deadline_and_health_stays_up(server_factory):
    srv = server_factory(workers=1, item_timeout_s=30.0).start()
    result: dict = {}

    def post():
        start = time.monotonic()
        r = httpx.post(f"{srv.url}/v1/score", headers=AUTH, timeout=30.0,
                       json={"reward": "block", "timeout_s": 2.0, "items": [_item("b", "", sleep_s=40.0)]})
        result["took"], result["body"] = time.monotonic() - start, r.json()

    t = threading.Thread(target=post)
    t.start()
    time.sleep(0.5)
    start = time.monotonic()
    assert httpx.get(f"{srv.url}/health", timeout=10.0).status_code == 200
    health_took = time.monotonic() - start
    t.join(timeout=30)
    assert result["body"]["results"][0]["status"] == "timeout"
    assert result["took"] < 2.0 + 1.0 + 2.0  # answer_bound_s plus 2 s of loaded-machine slack (was 40 s)
    assert health_took < 1.0  # was: timed out (the loop slept 40 s)
