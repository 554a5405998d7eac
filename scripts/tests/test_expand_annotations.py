"""Tests of the annotation expansion tool: round trip, and each failure reported for its reason."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
_spec = importlib.util.spec_from_file_location("expand_annotations", ROOT / "scripts" / "expand_annotations.py")
expand_annotations = importlib.util.module_from_spec(_spec)
sys.modules["expand_annotations"] = expand_annotations
_spec.loader.exec_module(expand_annotations)

from validation_patterns.library import PatternError, load_library, parse_annotation, render  # noqa: E402

process_text = expand_annotations.process_text

SAMPLE = '''\
def shrink(target_gpus, timeout):
    # VAL: VAL_INT_RANGE(target_gpus, min=0, max=7, each=True)
    # VAL: VAL_TIMEOUT(timeout)
    offload_ranks = list(target_gpus)
    # AST: AST_POSTCONDITION(len(offload_ranks) > 0, got=offload_ranks, msg="offload_ranks not empty")
    return offload_ranks
'''


def _kinds(text: str) -> list[str]:
    return [p.kind for p in process_text(text)[1]]


def _load(text: str):
    namespace: dict = {}
    exec(compile(text, "<generated>", "exec"), namespace)
    return namespace


def test_expanded_code_runs_and_raises_with_named_messages():
    expanded, problems = process_text(SAMPLE)
    assert [p.kind for p in problems] == ["not-expanded"] * 3
    shrink = _load(expanded)["shrink"]
    assert shrink([0, 7], 1.0) == [0, 7]
    with pytest.raises(ValueError, match=r"target_gpus must contain only integers in \[0, 7\], got 8 in \[1, 8\]"):
        shrink([1, 8], 1.0)
    with pytest.raises(ValueError, match=r"timeout must be a finite timeout > 0 seconds, got inf"):
        shrink([1], float("inf"))
    with pytest.raises(AssertionError, match=r"Post-condition: offload_ranks not empty, got \[\]"):
        shrink([], 1.0)


def test_check_is_clean_after_expand_and_expand_is_idempotent():
    once, _ = process_text(SAMPLE)
    twice, problems = process_text(once)
    assert problems == []
    assert twice == once


def test_check_reports_a_hand_edited_block():
    expanded, _ = process_text(SAMPLE)
    edited = expanded.replace("0 <= _val_item <= 7", "0 <= _val_item <= 9")
    assert _kinds(edited) == ["hand-edited"]


def test_check_reports_a_stale_block_after_the_annotation_changes():
    expanded, _ = process_text(SAMPLE)
    changed = expanded.replace("VAL_INT_RANGE(target_gpus, min=0, max=7, each=True)",
                               "VAL_INT_RANGE(target_gpus, min=0, max=3, each=True)")
    assert _kinds(changed) == ["stale"]
    fixed, _ = process_text(changed)
    assert "0 <= _val_item <= 3" in fixed and _kinds(fixed) == []


def test_check_reports_a_stale_block_when_the_library_template_changes(monkeypatch):
    expanded, _ = process_text(SAMPLE)
    lib = load_library()
    pattern = lib.patterns["VAL_TIMEOUT"]
    monkeypatch.setattr(pattern, "code", pattern.code.replace("> 0 seconds", "> 0 s"))
    assert _kinds(expanded) == ["stale"]


def test_check_reports_an_unknown_pattern_id():
    problems = process_text("x = 1\n# VAL: VAL_NOT_A_PATTERN(x)\n")[1]
    assert [p.kind for p in problems] == ["bad-annotation"]
    assert "unknown pattern id 'VAL_NOT_A_PATTERN'" in problems[0].detail


@pytest.mark.parametrize("tree", ["packages", "scripts", "examples"])
def test_check_without_paths_scans_every_python_tree(tree, tmp_path, monkeypatch, capsys):
    # `check` used to scan only packages/: an unknown pattern id in scripts/ or examples/ passed
    for root in ("packages", "scripts", "examples"):
        (tmp_path / root / "sub").mkdir(parents=True)
        (tmp_path / root / "sub" / "ok.py").write_text("x = 1\n")
    (tmp_path / tree / "sub" / "bad.py").write_text("def f(x):\n    # VAL: VAL_NOT_A_PATTERN(x)\n    return x\n")
    monkeypatch.setattr(expand_annotations, "REPO_ROOT", tmp_path)
    monkeypatch.chdir(tmp_path / "packages")  # roots resolve from the repository, not the cwd
    assert expand_annotations.main(["check"]) == 1
    assert "unknown pattern id 'VAL_NOT_A_PATTERN'" in capsys.readouterr().err


def test_annotations_inside_string_literals_are_data_not_code():
    text = 'DOC = """\n    # VAL: VAL_NOT_A_PATTERN(x)\n"""\n\n\ndef f(x):\n    # VAL: VAL_ALSO_NOT_ONE(x)\n    return x\n'
    problems = process_text(text)[1]
    assert [p.line for p in problems] == [7] and "VAL_ALSO_NOT_ONE" in problems[0].detail


@pytest.mark.parametrize(
    ("annotation", "reason"),
    [
        ("# VAL: VAL_INT_RANGE(gpu, min=0)", "missing required parameter 'max'"),
        ("# VAL: VAL_INT_RANGE(gpu, min=0, max=7, maximum=8)", "unknown parameter 'maximum'"),
        ("# VAL: VAL_INT_RANGE(gpu, min=0, max=7, each=1)", "'each' must be a bool literal"),
        ("# VAL: VAL_NON_EMPTY(a, b)", "at most 1 positional"),
        ("# AST: VAL_NON_EMPTY(a)", "belongs under '# VAL:'"),
        ("# VAL: VAL_NON_EMPTY(", "not a call expression"),
    ],
)
def test_check_reports_bad_parameters(annotation, reason):
    problems = process_text(f"def f(gpu, a, b):\n    {annotation}\n    return gpu\n")[1]
    assert [p.kind for p in problems] == ["bad-annotation"]
    assert reason in problems[0].detail


def test_a_missing_end_marker_is_reported():
    expanded, _ = process_text(SAMPLE)
    broken = expanded.replace("# <<< generated", "", 1)
    assert "unterminated" in _kinds(broken)


def test_every_library_pattern_renders_to_valid_python():
    lib = load_library()
    for pid, pattern in lib.patterns.items():
        positional = ", ".join(f"p{i}" for i, prm in enumerate(pattern.params) if prm.default is None)
        lines = render(parse_annotation(pattern.family, f"{pid}({positional})"))
        compile("\n".join(lines), pid, "exec")


_EXPRS = st.sampled_from(["x", "self.ranks", "cfg['gpus']", "len(xs) - 1", "(a, b)"])
_ANNOTATIONS = st.one_of(
    st.builds(lambda e: f"# VAL: VAL_NON_EMPTY({e})", _EXPRS),
    st.builds(lambda e, lo, hi: f"# VAL: VAL_INT_RANGE({e}, min={lo}, max={hi})", _EXPRS,
              st.integers(-5, 5), st.integers(5, 20)),
    st.builds(lambda e: f"# VAL: VAL_UNIQUE({e})", _EXPRS),
    st.builds(lambda e, f: f"# VAL: VAL_DISJOINT({e}, {f})", _EXPRS, _EXPRS),
    st.builds(lambda e: f"# AST: AST_INVARIANT({e} is not None, got={e})", _EXPRS),
    st.builds(lambda e: f"# VAL: VAL_VERSION_MONOTONIC({e}, current, strict=False)", _EXPRS),
)


@given(
    items=st.lists(st.tuples(st.integers(0, 3), st.one_of(_ANNOTATIONS, st.just("y = 1"))), max_size=8),
)
def test_expanding_twice_changes_nothing(items):
    source = "def f():\n" + "".join(f"{'    ' * (1 + depth % 2)}{line}\n" for depth, line in items) + "    pass\n"
    once, _ = process_text(source)
    twice, problems = process_text(once)
    assert twice == once
    assert problems == []
    # the annotations themselves are untouched: only generated blocks were added
    kept = [ln for ln in once.split("\n") if not ln.strip().startswith("# >>>") and "generated" not in ln]
    assert all(line.rstrip() in kept for line in source.split("\n") if "# VAL:" in line or "# AST:" in line)


def test_parse_annotation_error_type():
    with pytest.raises(PatternError):
        parse_annotation("VAL", "VAL_TIMEOUT()")


def test_assertions_without_got_render_a_plain_string_that_keeps_braces():
    """No f-prefix without placeholders (ruff F541 would rewrite the block), and braces survive."""
    expanded, _ = process_text("def f(d):\n    # AST: AST_INVARIANT(d != {}, msg=\"d != {}\")\n    return d\n")
    assert 'raise AssertionError("Invariant: d != {}")' in expanded
    with pytest.raises(AssertionError, match=r"^Invariant: d != \{\}$"):
        _load(expanded)["f"]({})
