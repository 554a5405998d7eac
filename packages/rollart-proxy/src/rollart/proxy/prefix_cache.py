"""PrefixKVCache: the KV of contexts an engine finished, reused by the next request that extends them.

Why token-keyed with a longest-common-prefix lookup (design D28): the next turn of a multi-turn
trajectory is its previous context plus the environment's answer, and requests of one task share
their instructions; with causal attention the KV of the first m tokens depends only on those m
tokens, so any common prefix of an entry can be sliced out and reused exactly. Entries are kept in
LRU order and counted in tokens, and indexed by a token trie (a lookup walks the context once,
whatever the number of entries), because the engine's KV budget is in tokens; the engine passes its
free capacity to every call that may grow the cache, so cached and running KV share one budget.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from rollart import checks as check
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
    """Length of the longest common prefix of two token sequences."""
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


class _Node:
    """A token trie node: ids of the cached keys whose tokens pass through it, and the key ending here."""

    __slots__ = ("children", "keys", "end")

    def __init__(self) -> None:
        self.children: dict[int, _Node] = {}
        self.keys: set[int] = set()  # entry ids (hashing a long tuple per node would cost O(len) each)
        self.end: tuple[int, ...] | None = None


class PrefixKVCache:
    """Per-layer KV of finished contexts keyed by their token ids, LRU in token units (D28)."""

    def __init__(self) -> None:
        """An empty cache; the engine passes its free capacity to every call that may grow it."""
        self._entries: OrderedDict[tuple[int, ...], KV] = OrderedDict()
        self._root = _Node()  # a token trie over the keys: lookups cost O(context), not O(entries)
        self._ids: dict[tuple[int, ...], int] = {}
        self._keys: dict[int, tuple[int, ...]] = {}
        self._next_id = 0
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
        check.non_negative("max_len", max_len, exc=ProxyError)  # generated #f3be3b46cd
        node, depth = self._root, 0
        for token in context[:max_len]:
            child = node.children.get(token)
            if child is None:
                break
            node, depth = child, depth + 1
        if depth == 0:
            return None
        key = self._keys[next(iter(node.keys))]  # every key through this node has the same first `depth` tokens
        self._entries.move_to_end(key)
        return PrefixHit(depth, [(k[:, :, :depth], v[:, :, :depth]) for k, v in self._entries[key]])

    def insert(self, tokens: tuple[int, ...], kv: KV, capacity: int) -> bool:
        """Keep ``kv`` under ``tokens``, dropping entries it extends and LRU ones until all fit in ``capacity``."""
        # AST: AST_PRECONDITION(all(k.shape[2] == len(tokens) for k, _ in kv), got=len(tokens), msg="one cached column per token")
        check.precondition(all(k.shape[2] == len(tokens) for k, _ in kv), "one cached column per token", got_lazy=lambda: len(tokens))  # generated #985b739b8f
        if not tokens or len(tokens) > capacity:
            return False
        if tokens in self._entries:
            self._entries.move_to_end(tokens)
            return True
        node, extended = self._root, []
        for token in tokens:
            node = node.children.get(token)  # type: ignore[assignment]
            if node is None:
                break
            if node.end is not None:
                extended.append(node.end)
        else:  # every token is on the trie: a longer entry already holds this prefix
            self._entries.move_to_end(self._keys[next(iter(node.keys))])
            return True
        for key in extended:  # the new entry extends them (the previous turn of a trajectory)
            self._drop(key)
        self.evict_to(capacity - len(tokens))
        self._entries[tokens] = kv
        self._tokens += len(tokens)
        entry_id, self._next_id = self._next_id, self._next_id + 1
        self._ids[tokens], self._keys[entry_id] = entry_id, tokens
        node = self._root
        for token in tokens:
            node = node.children.setdefault(token, _Node())
            node.keys.add(entry_id)
        node.end = tokens
        return True

    def _drop(self, key: tuple[int, ...]) -> None:
        del self._entries[key]
        self._tokens -= len(key)
        entry_id = self._ids.pop(key)
        del self._keys[entry_id]
        node = self._root
        for token in key:
            child = node.children[token]
            child.keys.discard(entry_id)
            if not child.keys:
                del node.children[token]  # no key passes here any more: the subtree goes
                return
            node = child
        node.end = None

    def evict_to(self, capacity: int) -> int:
        """Drop least recently used entries until at most ``capacity`` tokens stay; return the tokens dropped."""
        dropped = 0
        while self._entries and self._tokens > max(capacity, 0):
            key = next(iter(self._entries))
            self._drop(key)
            dropped += len(key)
        self.evicted_tokens += dropped
        return dropped

    def clear(self) -> int:
        """Drop every entry (weight update, offload); return the tokens dropped."""
        dropped = self._tokens
        self._entries.clear()
        self._ids.clear()
        self._keys.clear()
        self._root = _Node()
        self._tokens = 0
        return dropped
