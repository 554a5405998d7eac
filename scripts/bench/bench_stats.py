"""Shared by the benchmarks: interleaved repeats and a median with its spread.

Timing each variant once, one after the other, lets the machine's load drift between variants
(on a shared machine the ratio of two such runs moved from 0.97 to 1.64). Every benchmark
therefore runs its variants in rounds, one of each per round in a rotating order, and reports the
median over rounds with the min-max spread.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from statistics import median
from typing import TypeVar

T = TypeVar("T")


def rounds(variants: Sequence[T], repeats: int) -> list[tuple[int, T]]:
    """(round, variant) pairs: every variant once per round, the order rotated by one each round."""
    n = len(variants)
    return [(r, variants[(r + i) % n]) for r in range(repeats) for i in range(n)]


def summary(values: Sequence[float]) -> tuple[float, float, float]:
    """(median, min, max)."""
    return median(values), min(values), max(values)


def fmt(values: Sequence[float], spec: str = ".2f", scale: float = 1.0) -> str:
    """"median (min-max)" of values * scale."""
    med, lo, hi = summary([v * scale for v in values])
    return f"{med:{spec}} ({lo:{spec}}-{hi:{spec}})"


def ratio_fmt(num: Sequence[float], den: Sequence[float], spec: str = ".2f") -> str:
    """Median and spread of per-round ratios num[i] / den[i] (rounds paired, so load cancels)."""
    return fmt([a / b for a, b in zip(num, den)], spec) + "x"


def per_round(results: dict[tuple[int, str], T], name: str, key: Callable[[T], float]) -> list[float]:
    """The values of one variant over the rounds, in round order."""
    return [key(v) for (r, n), v in sorted(results.items()) if n == name]
