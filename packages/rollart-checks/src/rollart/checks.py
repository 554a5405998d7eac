"""The runtime of the validation-pattern library: one small function per pattern.

An annotation such as ``# VAL: VAL_INT_RANGE(count, min=1, max=8)`` expands to one line that
calls a function of this module, ``check.int_range("count", count, min=1, max=8)``, so the code under
an annotation reads like code a person writes and the messages are written once, here.
Every function takes the name of the value as the caller knows it (a parameter name, a config
field), raises ``exc`` (a package's own exception class, which must accept one message) and
returns None. Messages name the value, show what it was and say what is allowed.

This module is the whole of the rollart-checks distribution, at the bottom of the layering
(it imports only the standard library), so every rollart package, rollart-env included, and
every generated line import the one copy: ``from rollart import checks as check``. The
annotations themselves, their parameters and the lines they expand to, live in the repository's
``validation_patterns/`` (patterns.yaml); ``scripts/expand_annotations.py`` writes the lines.
A signature change must keep the old call working while packages pinned to an older
rollart-checks exist.
"""

from __future__ import annotations

import builtins
import math
from collections.abc import Callable, Collection, Iterable, Mapping, Sized
from typing import Any

__version__ = "0.1.0"

_UNSET: Any = object()


def int_range(name: str, value: Any, min: int, max: int, *, exc: type[Exception] = ValueError) -> None:
    """An integer (not a bool) within [min, max]."""
    if isinstance(value, bool) or not isinstance(value, int) or not min <= value <= max:
        raise exc(f"{name} must be an integer in [{min}, {max}], got {value!r}")


def int_range_each(name: str, values: Iterable[Any], min: int, max: int, *, exc: type[Exception] = ValueError) -> None:
    """Every element an integer (not a bool) within [min, max].

    Token-id lists are checked on every request of a hot path: a list or tuple of plain ints within
    the range passes on three C-level passes (element types, min, max); anything else takes the
    element loop, which is the authority and names the first offending element."""
    if isinstance(values, (list, tuple)):
        if not values:
            return
        if set(map(type, values)) == {int} and builtins.min(values) >= min and builtins.max(values) <= max:
            return
    for item in values:
        if isinstance(item, bool) or not isinstance(item, int) or not min <= item <= max:
            raise exc(f"{name} must contain only integers in [{min}, {max}], got {item!r} in {values!r}")


def non_empty(name: str, value: Sized, *, exc: type[Exception] = ValueError) -> None:
    """A collection or string with at least one element."""
    if len(value) == 0:
        raise exc(f"{name} must not be empty, got {value!r}")


def unique(name: str, values: Iterable[Any], *, exc: type[Exception] = ValueError) -> None:
    """No element occurs twice (elements must be hashable)."""
    seen: set = set()
    dups = []
    for item in values:
        if item in seen:
            dups.append(item)
        seen.add(item)
    if dups:
        raise exc(f"{name} must have unique elements, duplicates {dups!r} in {values!r}")


def of_type(name: str, value: Any, types: type | tuple[type, ...], *, exc: type[Exception] = TypeError) -> None:
    """isinstance(value, types)."""
    if not isinstance(value, types):
        expected = " or ".join(t.__name__ for t in types) if isinstance(types, tuple) else types.__name__
        raise exc(f"{name} must be of type {expected}, got {type(value).__name__} {value!r}")


def one_of(name: str, value: Any, choices: Collection[Any], *, exc: type[Exception] = ValueError) -> None:
    """value is one of the allowed choices."""
    if value not in choices:
        raise exc(f"{name} must be one of {sorted(choices, key=repr)!r}, got {value!r}")


def subset(name: str, values: Iterable[Any], of: Collection[Any], *, exc: type[Exception] = ValueError) -> None:
    """Every element of values is in the allowed collection."""
    extra = [item for item in values if item not in of]
    if extra:
        raise exc(f"{name} must be a subset of {sorted(of, key=repr)!r}; not allowed: {extra!r}")


def disjoint(name: str, value: Iterable[Any], other_name: str, other: Iterable[Any], *,
             exc: type[Exception] = ValueError) -> None:
    """Two collections share no element."""
    common = set(value) & set(other)
    if common:
        raise exc(f"{name} and {other_name} must be disjoint, both contain {sorted(common, key=repr)!r}")


def positive(name: str, value: Any, *, exc: type[Exception] = ValueError) -> None:
    """value > 0 (NaN fails)."""
    if not value > 0:
        raise exc(f"{name} must be > 0, got {value!r}")


def non_negative(name: str, value: Any, *, exc: type[Exception] = ValueError) -> None:
    """value >= 0 (NaN fails)."""
    if not value >= 0:
        raise exc(f"{name} must be >= 0, got {value!r}")


def _is_finite_number(value: Any) -> bool:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    return isinstance(value, int) or math.isfinite(value)


def finite(name: str, value: Any, *, exc: type[Exception] = ValueError) -> None:
    """A real number, neither infinite nor NaN."""
    if not _is_finite_number(value):
        raise exc(f"{name} must be a finite number, got {value!r}")


def timeout(name: str, value: Any, *, exc: type[Exception] = ValueError) -> None:
    """A deadline in seconds: a finite number > 0 (every wait in RollArt has one)."""
    if not _is_finite_number(value) or not value > 0:
        raise exc(f"{name} must be a finite timeout > 0 seconds, got {value!r}")


def transition(name: str, current: Any, target: Any, allowed: Mapping[Any, Collection[Any]], *,
               exc: type[Exception] = ValueError) -> None:
    """A state-machine move current -> target allowed by a {state: next states} table."""
    nexts = allowed.get(current, ())
    if target not in nexts:
        raise exc(f"illegal transition of {name}: {current!r} -> {target!r}; "
                  f"allowed from {current!r}: {sorted(nexts, key=repr)!r}")


def version_monotonic(name: str, new: Any, current: Any, *, strict: bool = True,
                      exc: type[Exception] = ValueError) -> None:
    """A new version is > (strict) or >= the version held now (None: none held)."""
    if current is None or (new > current if strict else new >= current):
        return
    relation = ">" if strict else ">="
    raise exc(f"{name} must be {relation} the current version {current!r} (versions never go backwards), got {new!r}")


def checksum(name: str, value: Any, expected: Any, *, exc: type[Exception] = ValueError) -> None:
    """A stored checksum equals the one recomputed now from the data it covers (data read back from disk)."""
    if value != expected:
        raise exc(f"{name} is {value!r} but the data it covers checksums to {expected!r}: "
                  "the data or its checksum changed")


def _condition(kind: str, cond: Any, what: str, got: Any, got_lazy: Callable[[], Any] | None,
               exc: type[Exception]) -> None:
    if cond:
        return
    if got_lazy is not None:
        got = got_lazy()
    raise exc(f"{kind}: {what}" if got is _UNSET else f"{kind}: {what}, got {got!r}")


def precondition(cond: Any, what: str, got: Any = _UNSET, *, got_lazy: Callable[[], Any] | None = None,
                 exc: type[Exception] = AssertionError) -> None:
    """A condition that must hold on entry; raises even under ``python -O``.

    ``got`` is the value the message shows; ``got_lazy`` computes it only when the check fails
    (the expander passes an expression that calls or builds something that way).
    """
    _condition("Pre-condition", cond, what, got, got_lazy, exc)


def postcondition(cond: Any, what: str, got: Any = _UNSET, *, got_lazy: Callable[[], Any] | None = None,
                  exc: type[Exception] = AssertionError) -> None:
    """A condition that must hold on exit; raises even under ``python -O``."""
    _condition("Post-condition", cond, what, got, got_lazy, exc)


def invariant(cond: Any, what: str, got: Any = _UNSET, *, got_lazy: Callable[[], Any] | None = None,
              exc: type[Exception] = AssertionError) -> None:
    """A condition that must hold whenever control passes this point."""
    _condition("Invariant", cond, what, got, got_lazy, exc)
