"""The runtime every generated validation line calls: messages name the value, exceptions are the caller's."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rollart import checks

_ELEMENTS = st.one_of(st.integers(min_value=-5, max_value=40), st.booleans(), st.floats(allow_nan=False, width=16),
                      st.just("3"), st.none())


@given(values=st.one_of(st.lists(_ELEMENTS, max_size=12), st.lists(st.integers(0, 30), max_size=12).map(tuple)))
def test_int_range_each_fast_path_agrees_with_the_element_loop(values):
    """The C-level fast path for lists and tuples accepts exactly what the element loop accepts."""
    expected = all(not isinstance(v, bool) and isinstance(v, int) and 0 <= v <= 30 for v in values)
    try:
        checks.int_range_each("ids", values, min=0, max=30)
        accepted = True
    except ValueError as err:
        accepted = False
        assert "ids must contain only integers in [0, 30]" in str(err)
    assert accepted == expected


@given(st.one_of(st.integers(-3, 3), st.floats(allow_nan=True, allow_infinity=True), st.booleans(), st.none()))
def test_timeout_accepts_exactly_the_finite_positive_numbers(value):
    ok = not isinstance(value, bool) and isinstance(value, int | float) and math.isfinite(value) and value > 0
    if ok:
        checks.timeout("deadline_s", value)
    else:
        with pytest.raises(ValueError, match=r"^deadline_s must be"):
            checks.timeout("deadline_s", value)


def test_a_failed_check_raises_the_callers_exception_naming_the_value_and_the_choices():
    class ConfigError(Exception):
        pass

    with pytest.raises(ConfigError, match=r"^mode must be one of \['async', 'sync'\], got 'fast'$"):
        checks.one_of("mode", "fast", choices=("sync", "async"), exc=ConfigError)
    checks.one_of("mode", "sync", choices=("sync", "async"), exc=ConfigError)


def test_version_monotonic_refuses_going_back():
    checks.version_monotonic("version", 4, 3)
    with pytest.raises(ValueError, match=r"^version must be > the current version 3"):
        checks.version_monotonic("version", 3, 3)


def test_conditions_evaluate_got_lazily_only_on_failure():
    calls: list[int] = []
    checks.precondition(True, "x > 0", got_lazy=lambda: calls.append(1))
    assert calls == []
    with pytest.raises(AssertionError, match=r"^Pre-condition: x > 0, got -1$"):
        checks.precondition(False, "x > 0", got_lazy=lambda: -1)


def test_the_module_carries_its_distribution_version():
    import tomllib
    from pathlib import Path

    meta = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())["project"]
    assert checks.__version__ == meta["version"]
