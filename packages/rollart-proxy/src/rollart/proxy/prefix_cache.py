"""PrefixKVCache: the KV of contexts an engine finished, reused by the next request that extends them.

Why token-keyed with a longest-common-prefix lookup (design D19): the next turn of a multi-turn
trajectory is its previous context plus the environment's answer, and requests of one task share
their instructions; with causal attention the KV of the first m tokens depends only on those m
tokens, so any common prefix of an entry can be sliced out and reused exactly. Entries are kept in
LRU order and counted in tokens, because the engine's KV budget is in tokens; the engine passes its
free capacity to every call that may grow the cache, so cached and running KV share one budget.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from rollart.proxy.errors import ProxyError

if TYPE_CHECKING:
    import torch

KV = list[tuple["torch.Tensor", "torch.Tensor"]]


@dataclass(frozen=True)
class PrefixHit:
    """The KV of the first ``length`` tokens of a context, sliced out of a cache entry."""

    length: int
    kv: KV


def common_prefix_len(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix (binary search over slice equality, which runs in C)."""
    lo, hi = 0, min(len(a), len(b))
    if hi == 0 or a[0] != b[0]:
        return 0
    a, b = tuple(a), tuple(b)
    if a[:hi] == b[:hi]:
        return hi
    lo = 1  # invariant: a[:lo] == b[:lo] and a[:hi] != b[:hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid
    return lo


class PrefixKVCache:
    """Per-layer KV of finished contexts keyed by their token ids, LRU in token units (D19)."""

    def __init__(self) -> None:
        """An empty cache; the engine passes its free capacity to every call that may grow it."""
        self._entries: OrderedDict[tuple[int, ...], KV] = OrderedDict()
        self._tokens = 0
        self.evicted_tokens = 0  # cumulative tokens dropped by LRU eviction (not by clear or extension)

    @property
    def tokens(self) -> int:
        """Cached tokens in total (what ``load()`` subtracts from free KV)."""
        return self._tokens

    def __len__(self) -> int:
        return len(self._entries)

    def keys(self) -> list[tuple[int, ...]]:
        """The cached token sequences, least recently used first (for tests and debugging)."""
        return list(self._entries)

    def lookup(self, context: Sequence[int], max_len: int) -> PrefixHit | None:
        """The longest common prefix of ``context`` with any entry, at most ``max_len`` tokens; marks it used."""
        # VAL: VAL_NON_NEGATIVE(max_len, exc=ProxyError)
        # >>> generated VAL_NON_NEGATIVE #406494e48a (edit the annotation, not this block)
        if not max_len >= 0:
            raise ProxyError(f"max_len must be >= 0, got {max_len!r}")
        # <<< generated
        if max_len == 0 or not context:
            return None
        query = tuple(context[:max_len])
        best_key, best = None, 0
        for key in self._entries:
            n = common_prefix_len(query, key)
            if n > best:
                best_key, best = key, n
                if n == len(query):
                    break
        if best_key is None:
            return None
        self._entries.move_to_end(best_key)
        kv = self._entries[best_key]
        return PrefixHit(best, [(k[:, :, :best], v[:, :, :best]) for k, v in kv])

    def insert(self, tokens: tuple[int, ...], kv: KV, capacity: int) -> bool:
        """Keep ``kv`` under ``tokens``, dropping entries it extends and LRU ones until all fit in ``capacity``."""
        # AST: AST_PRECONDITION(all(k.shape[2] == len(tokens) for k, _ in kv), got=len(tokens), msg="one cached column per token")
        # >>> generated AST_PRECONDITION #7007f8aca3 (edit the annotation, not this block)
        if not (all((k.shape[2] == len(tokens) for k, _ in kv))):
            raise AssertionError(f"Pre-condition: one cached column per token, got {len(tokens)!r}")
        # <<< generated
        if not tokens or len(tokens) > capacity:
            return False
        if tokens in self._entries:
            self._entries.move_to_end(tokens)
            return True
        for key in self._entries:
            if len(key) > len(tokens) and key[: len(tokens)] == tokens:
                self._entries.move_to_end(key)
                return True  # a longer entry already holds this prefix: nothing new to keep
        for key in [k for k in self._entries if tokens[: len(k)] == k]:
            del self._entries[key]  # the new entry extends it (the previous turn of a trajectory)
            self._tokens -= len(key)
        self.evict_to(capacity - len(tokens))
        self._entries[tokens] = kv
        self._tokens += len(tokens)
        return True

    def evict_to(self, capacity: int) -> int:
        """Drop least recently used entries until at most ``capacity`` tokens stay; return the tokens dropped."""
        dropped = 0
        while self._entries and self._tokens > max(capacity, 0):
            key, _ = self._entries.popitem(last=False)
            self._tokens -= len(key)
            dropped += len(key)
        self.evicted_tokens += dropped
        return dropped

    def clear(self) -> int:
        """Drop every entry (weight update, offload); return the tokens dropped."""
        dropped = self._tokens
        self._entries.clear()
        self._tokens = 0
        return dropped
