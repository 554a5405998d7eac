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
    assert [p.kind for p in problems] == ["not-expanded"] * 3 + ["import"]
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
    edited = expanded.replace("min=0, max=7)", "min=0, max=9)")
    assert _kinds(edited) == ["hand-edited"]


def test_check_reports_a_stale_block_after_the_annotation_changes():
    expanded, _ = process_text(SAMPLE)
    changed = expanded.replace("VAL_INT_RANGE(target_gpus, min=0, max=7, each=True)",
                               "VAL_INT_RANGE(target_gpus, min=0, max=3, each=True)")
    assert _kinds(changed) == ["stale"]
    fixed, _ = process_text(changed)
    assert "min=0, max=3)" in fixed and _kinds(fixed) == []


def test_check_reports_a_stale_block_when_the_library_template_changes(monkeypatch):
    expanded, _ = process_text(SAMPLE)
    lib = load_library()
    pattern = lib.patterns["VAL_TIMEOUT"]
    monkeypatch.setattr(pattern, "code", pattern.code.replace("check.timeout(", "check.deadline("))
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


def test_a_missing_end_marker_of_an_old_block_is_reported():
    broken = OLD_FORM.replace("# <<< generated", "", 1)
    assert "unterminated" in _kinds(broken)


def test_every_library_pattern_renders_to_valid_python():
    lib = load_library()
    for pid, pattern in lib.patterns.items():
        positional = ", ".join(f"p{i}" for i, prm in enumerate(pattern.params) if prm.default is None)
        lines = render(parse_annotation(pattern.family, f"{pid}({positional})"))
        compile("\n".join(lines), pid, "exec")


_EXPRS = st.sampled_from(["x", "self.ranks", "cfg['gpus']", "len(xs) - 1", "(a, b)"])
_ANNOTATIONS = st.one_of(
    st.builds(lambda e: f'# VAL: VAL_NON_EMPTY({e}, name="xs")', _EXPRS),
    st.builds(lambda e, lo, hi: f'# VAL: VAL_INT_RANGE({e}, min={lo}, max={hi}, name="x")', _EXPRS,
              st.integers(-5, 5), st.integers(5, 20)),
    st.builds(lambda e: f'# VAL: VAL_UNIQUE({e}, name="xs")', _EXPRS),
    st.builds(lambda e, f: f'# VAL: VAL_DISJOINT({e}, {f}, name="xs")', _EXPRS, _EXPRS),
    st.builds(lambda e: f"# AST: AST_INVARIANT({e} is not None, got={e})", _EXPRS),
    st.builds(lambda e: f'# VAL: VAL_VERSION_MONOTONIC({e}, current, strict=False, name="version")', _EXPRS),
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
    kept = [ln for ln in once.split("\n") if "# generated #" not in ln]
    assert all(line.rstrip() in kept for line in source.split("\n") if "# VAL:" in line or "# AST:" in line)


def test_parse_annotation_error_type():
    with pytest.raises(PatternError):
        parse_annotation("VAL", "VAL_TIMEOUT()")


def test_assertions_without_got_render_a_plain_string_that_keeps_braces():
    """Braces in a message survive (the message is a plain string, not an f-string)."""
    expanded, _ = process_text("def f(d):\n    # AST: AST_INVARIANT(d != {}, msg=\"d != {}\")\n    return d\n")
    assert 'check.invariant(d != {}, "d != {}")' in expanded
    with pytest.raises(AssertionError, match=r"^Invariant: d != \{\}$"):
        _load(expanded)["f"]({})


# ---- the one-line form: what a reader sees ---------------------------------------------------------

def test_each_annotation_expands_to_one_line_calling_the_runtime():
    expanded, _ = process_text(SAMPLE)
    body = expanded.split("\n")
    assert body[0] == "from rollart import checks as check"
    generated = [ln for ln in body if "# generated #" in ln]
    assert [ln.strip().split("  #")[0] for ln in generated] == [
        'check.int_range_each("target_gpus", target_gpus, min=0, max=7)',
        'check.timeout("timeout", timeout)',
        'check.postcondition(len(offload_ranks) > 0, "offload_ranks not empty", got=offload_ranks)',
    ]
    assert len(body) == len(SAMPLE.split("\n")) + 4  # one line per annotation, plus the import


def test_messages_name_the_value_as_the_caller_knows_it():
    text = ("class P:\n    def f(self, version):\n"
            "        # VAL: VAL_VERSION_MONOTONIC(version, self._version, strict=False)\n"
            "        # VAL: VAL_POSITIVE(self._rate)\n        return version\n")
    expanded, _ = process_text(text)
    assert 'check.version_monotonic("version", version, self._version, strict=False)' in expanded
    assert 'check.positive("rate", self._rate)' in expanded
    cls = _load(expanded)["P"]
    obj = cls()
    obj._version, obj._rate = 3, 1.0
    with pytest.raises(ValueError, match=r"^version must be >= the current version 3 \(versions never go back"):
        obj.f(2)


def test_a_computed_value_needs_a_name_and_then_uses_it():
    bad = "def f(ws):\n    # VAL: VAL_UNIQUE([w.id for w in ws])\n    return ws\n"
    problems = process_text(bad)[1]
    assert [p.kind for p in problems][:1] == ["bad-annotation"] and 'name="..."' in problems[0].detail
    good, problems = process_text(bad.replace("ws])", 'ws], name="ids of ws")'))
    assert "bad-annotation" not in [p.kind for p in problems]
    assert 'check.unique("ids of ws", [w.id for w in ws])' in good


def test_a_got_that_computes_is_evaluated_only_when_the_check_fails():
    text = ("calls = []\n\n\ndef cost(x):\n    calls.append(x)\n    return x\n\n\n"
            "def f(x):\n    # AST: AST_PRECONDITION(x > 0, got=cost(x))\n    return x\n")
    expanded, _ = process_text(text)
    assert "got_lazy=lambda: cost(x)" in expanded
    ns = _load(expanded)
    ns["f"](1)
    assert ns["calls"] == []
    with pytest.raises(AssertionError, match=r"^Pre-condition: x > 0, got -1$"):
        ns["f"](-1)


def test_the_rendered_code_never_double_negates():
    lib = load_library()
    for pid, pattern in lib.patterns.items():
        positional = ", ".join(f"p{i}" for i, prm in enumerate(pattern.params) if prm.default is None)
        (line,) = render(parse_annotation(pattern.family, f"{pid}({positional})"))
        assert "not (" not in line and " - " not in line, line


def test_every_tree_imports_the_one_runtime(tmp_path):
    """Packages (rollart-env included), scripts and examples import rollart.checks, never a copy."""
    paths = [tmp_path / "packages" / f"rollart-{pkg}" / "src" / "rollart" / pkg / "mod.py" for pkg in ("proxy", "env")]
    for path in [*paths, tmp_path / "scripts" / "tool.py", tmp_path / "examples" / "ex.py"]:
        expanded, _ = process_text(SAMPLE, path)
        assert expanded.split("\n")[0] == "from rollart import checks as check"


def test_the_runtime_is_one_module_that_imports_only_the_standard_library():
    """rollart-checks sits below every package: its module may import nothing but the standard library."""
    import ast as _ast
    import sys as _sys

    from validation_patterns.library import RUNTIME_PATH

    found = sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "packages").rglob("checks.py"))
    assert found == ["packages/rollart-checks/src/rollart/checks.py"] == [RUNTIME_PATH.relative_to(ROOT).as_posix()]
    tree = _ast.parse(RUNTIME_PATH.read_text())
    imported = {n.name.split(".")[0] for node in _ast.walk(tree) if isinstance(node, _ast.Import) for n in node.names}
    imported |= {node.module.split(".")[0] for node in _ast.walk(tree) if isinstance(node, _ast.ImportFrom) and node.module}
    assert imported <= set(_sys.stdlib_module_names) | {"__future__"}, imported


# ---- migration of the earlier four-line form (what merged branches bring) --------------------------

OLD_FORM = '''\
def shrink(target_gpus, timeout):
    # VAL: VAL_INT_RANGE(target_gpus, min=0, max=7, each=True)
    # >>> generated VAL_INT_RANGE #0123456789 (edit the annotation, not this block)
    for _val_item in target_gpus:
        if isinstance(_val_item, bool) or not isinstance(_val_item, int) or not (0 <= _val_item <= 7):
            raise ValueError(f"target_gpus must contain only integers in [{ 0 }, { 7 }], got {_val_item!r} in {target_gpus!r}")
    # <<< generated
    # VAL: VAL_TIMEOUT(timeout)
    # >>> generated VAL_TIMEOUT #abcdef0123 (edit the annotation, not this block)
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not (timeout - timeout == 0) or not timeout > 0:
        raise ValueError(f"timeout must be a finite timeout > 0 seconds, got {timeout!r}")
    # <<< generated
    offload_ranks = list(target_gpus)
    # AST: AST_POSTCONDITION(len(offload_ranks) > 0, got=offload_ranks, msg="offload_ranks not empty")
    # >>> generated AST_POSTCONDITION #fedcba9876 (edit the annotation, not this block)
    if not (len(offload_ranks) > 0):
        raise AssertionError(f"Post-condition: offload_ranks not empty, got {offload_ranks!r}")
    # <<< generated
    return offload_ranks
'''


def test_expand_migrates_old_four_line_blocks_to_the_one_line_form():
    assert _kinds(OLD_FORM) == ["old-format"] * 3 + ["import"]
    migrated, _ = process_text(OLD_FORM)
    assert migrated == process_text(SAMPLE)[0]
    assert ">>> generated" not in migrated and "<<< generated" not in migrated
    assert _kinds(migrated) == []


def test_a_merge_that_kept_both_forms_or_lost_an_annotation_is_cleaned_by_expand():
    new_form, _ = process_text(SAMPLE)
    # a conflict resolved by keeping both sides: the new line plus an old block, one annotation gone
    lines = new_form.split("\n")
    at = next(k for k, ln in enumerate(lines) if "check.timeout(" in ln)
    old_timeout_block = OLD_FORM.split("\n")[8:12]
    merged = "\n".join(lines[: at + 1] + old_timeout_block + lines[at + 1 :])
    assert "orphan" in _kinds(merged)
    cleaned, _ = process_text(merged)
    assert cleaned == new_form
    no_annotation = new_form.replace("    # VAL: VAL_TIMEOUT(timeout)\n", "")
    assert "orphan" in _kinds(no_annotation)
    assert "check.timeout(" not in process_text(no_annotation)[0]


def test_a_module_without_annotations_loses_the_runtime_import():
    new_form, _ = process_text(SAMPLE)
    bare = "\n".join(ln for ln in new_form.split("\n") if "# VAL:" not in ln and "# AST:" not in ln)
    cleaned, problems = process_text(bare)
    assert "import checks as check" not in cleaned and "check." not in cleaned
