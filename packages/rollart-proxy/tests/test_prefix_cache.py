"""Step 15: PrefixKVCache invariants under random inserts, lookups and evictions (a state machine)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from rollart.proxy.errors import ProxyError
from rollart.proxy.prefix_cache import PrefixKVCache, common_prefix_len

TOKENS = st.lists(st.integers(0, 3), min_size=1, max_size=12).map(tuple)


def kv_of(tokens: tuple[int, ...]) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Two layers whose K/V columns carry the token ids, so a slice can be checked against its tokens."""
    col = torch.tensor(tokens, dtype=torch.float32).view(1, 1, -1, 1)
    return [(col.clone(), -col.clone()) for _ in range(2)]


class PrefixCacheMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.cache = PrefixKVCache()

    @rule(tokens=TOKENS, capacity=st.integers(0, 40))
    def insert(self, tokens, capacity):
        keys_before = self.cache.keys()
        kept = self.cache.insert(tokens, kv_of(tokens), capacity)
        if len(tokens) > capacity:
            assert not kept and self.cache.keys() == keys_before
            return
        assert kept
        assert any(key[: len(tokens)] == tokens for key in self.cache.keys()), "the tokens are held"
        if tokens in self.cache.keys():
            assert self.cache.tokens <= capacity or tokens in keys_before

    @rule(context=TOKENS, max_len=st.integers(0, 12))
    def lookup(self, context, max_len):
        keys = self.cache.keys()
        expected = max((common_prefix_len(context[:max_len], k) for k in keys), default=0)
        hit = self.cache.lookup(context, max_len)
        if expected == 0:
            assert hit is None
            return
        assert hit is not None and hit.length == expected
        for k, v in hit.kv:
            assert k.shape[2] == expected and k[0, 0, :, 0].tolist() == list(context[:expected])
            assert torch.equal(v, -k)
        used = self.cache.keys()[-1]
        assert used[:expected] == tuple(context[:expected]), "the entry used becomes most recent"

    @rule(capacity=st.integers(0, 40))
    def evict(self, capacity):
        before = self.cache.tokens
        evicted_before = self.cache.evicted_tokens
        dropped = self.cache.evict_to(capacity)
        assert self.cache.tokens <= capacity and dropped == before - self.cache.tokens
        assert self.cache.evicted_tokens == evicted_before + dropped

    @precondition(lambda self: len(self.cache) > 0)
    @rule()
    def clear(self):
        tokens = self.cache.tokens
        assert self.cache.clear() == tokens and self.cache.tokens == 0 and len(self.cache) == 0

    @invariant()
    def tokens_are_counted_and_no_entry_extends_another(self):
        keys = self.cache.keys()
        assert self.cache.tokens == sum(map(len, keys))
        for a in keys:
            for b in keys:
                assert a == b or b[: len(a)] != a, f"{a} is a prefix of {b}"


TestPrefixCacheMachine = PrefixCacheMachine.TestCase
TestPrefixCacheMachine.settings = settings(max_examples=150, stateful_step_count=30, deadline=None)


def test_lookup_validates_and_partial_match_slices():
    cache = PrefixKVCache()
    with pytest.raises(ProxyError, match="max_len must be >= 0"):
        cache.lookup((1, 2), -1)
    cache.insert((5, 6, 7, 8), kv_of((5, 6, 7, 8)), capacity=10)
    hit = cache.lookup((5, 6, 9), 3)
    assert hit is not None and hit.length == 2 and hit.kv[0][0][0, 0, :, 0].tolist() == [5, 6]
    with pytest.raises(AssertionError, match="one cached column per token"):
        cache.insert((1, 2), kv_of((1, 2, 3)), capacity=10)
