"""TimeSharingController against a real LLMProxy over SimEngine workers (simulated engines, named so).

Invariants (design/000-overview.md §5): lent devices return to rollout after every train step; a shrink never
empties the pool while requests are in flight; every request ends exactly once, none lost.
"""

from __future__ import annotations

import asyncio

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from rollart.proxy.proxy import LLMProxy
from rollart.proxy.sim_engine import QWEN3_8B, SimEngine, lookup_hardware
from rollart.proxy.types import GenerateRequest, SamplingParams
from rollart.proxy.worker import InferenceWorker
from rollart.scheduler.adapters import ProxyElasticPool
from rollart.scheduler.timesharing import AlwaysShrinkPolicy, CostAwarePolicy, TimeSharingController


class SimPoolMachine(RuleBasedStateMachine):
    """Requests stream into a SimEngine pool while train steps shrink and expand it."""

    @initialize(devices=st.integers(1, 4), cost_aware=st.booleans(), prior=st.sampled_from([0.0, 100.0]))
    def setup(self, devices, cost_aware, prior):
        self.loop = asyncio.new_event_loop()
        self.devices = set(range(devices))
        self.n = 0
        self.pending: dict[str, asyncio.Task] = {}
        self.answers: dict[str, str] = {}

        async def build():
            workers = []
            for i in range(devices):
                w = InferenceWorker(f"sim-{i}", lambda i=i: SimEngine(QWEN3_8B, lookup_hardware("H800"), time_scale=0.0, seed=i),
                                    hardware="H800", devices=(i,))
                await w.start()
                workers.append(w)
            return LLMProxy(workers, max_inflight_per_worker=4)

        self.proxy = self.loop.run_until_complete(build())
        policy = CostAwarePolicy(min_keep=1, prior_switch_cost_s=prior) if cost_aware else AlwaysShrinkPolicy(lend=3)
        self.pool = ProxyElasticPool(self.proxy)
        self.ctl = TimeSharingController(self.pool, policy, train_devices=1, slots_per_device=2)

    def teardown(self):
        if hasattr(self, "loop"):
            async def close():
                for t in self.pending.values():
                    t.cancel()
                await asyncio.gather(*self.pending.values(), return_exceptions=True)
                await self.proxy.close()
            self.loop.run_until_complete(close())
            self.loop.close()

    def _collect(self):
        for rid, t in list(self.pending.items()):
            if t.done():
                assert rid not in self.answers, "a request answered twice"
                self.answers[rid] = t.result().finish_reason
                del self.pending[rid]

    @rule(k=st.integers(1, 5), max_tokens=st.integers(1, 40))
    def submit(self, k, max_tokens):
        async def go():
            for _ in range(k):
                self.n += 1
                rid = f"r{self.n}"
                req = GenerateRequest((1, 2, 3, self.n % 50 + 4), SamplingParams(max_tokens=max_tokens), request_id=rid,
                                      trajectory_id=f"t{self.n}")
                self.pending[rid] = asyncio.ensure_future(self.proxy.generate(req, timeout_s=60))
            await asyncio.sleep(0)
        self.loop.run_until_complete(go())

    @rule(spins=st.integers(1, 20))
    def run_a_while(self, spins):
        async def go():
            for _ in range(spins):
                await asyncio.sleep(0)
        self.loop.run_until_complete(go())
        self._collect()

    @rule(train_spins=st.integers(0, 10))
    def train_step(self, train_spins):
        async def train():
            for _ in range(train_spins):
                await asyncio.sleep(0)
                assert self.pool.rollout_devices(), "rollout pool emptied during the train step"
            return train_spins

        result, rec = self.loop.run_until_complete(self.ctl.train_with_lending(train, timeout_s=60))
        assert result == train_spins
        assert len(rec.devices) < len(self.devices)
        self._collect()

    @invariant()
    def devices_back_and_requests_accounted(self):
        if not hasattr(self, "pool"):
            return
        assert set(self.pool.rollout_devices()) == self.devices
        assert set(self.pending).isdisjoint(self.answers)
        assert len(self.pending) + len(self.answers) == self.n
        assert all(reason in ("stop", "length") for reason in self.answers.values())

    def check_drained(self):
        async def drain():
            await asyncio.wait_for(asyncio.gather(*self.pending.values()), 60)
        self.loop.run_until_complete(drain())
        self._collect()
        assert len(self.answers) == self.n


class DrainingMachine(SimPoolMachine):
    @rule()
    def drain(self):
        self.check_drained()


TestSimControllerMachine = DrainingMachine.TestCase
TestSimControllerMachine.settings = settings(max_examples=25, stateful_step_count=15, deadline=None)
