"""Tests of the design-doc check: a clean package passes; each kind of drift fails for its reason."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))
_spec = importlib.util.spec_from_file_location("design_check", ROOT / "scripts" / "design_check.py")
design_check = importlib.util.module_from_spec(_spec)
sys.modules["design_check"] = design_check
_spec.loader.exec_module(design_check)
from expand_annotations import process_text  # noqa: E402

DOC = '''\
# rollart-demo

## 1. Goals and non-goals
Goals.
## 2. Requirements
R1.
## 3. Decisions
D1.
## 4. Data model and state machines
None.
## 5. API and implementation spec

Module: `rollart.demo.pool`

```python
class Pool:
    def shrink(self, ranks: list[int], timeout: float = 5.0) -> list[int]:
        """Release ranks."""
        # deps: none
        # VAL: VAL_NON_EMPTY(ranks)
        # VAL: VAL_TIMEOUT(timeout)
        ...

    async def expand(self, ranks: list[int]) -> None:
        """Take ranks back."""
        # AST: AST_PRECONDITION(len(ranks) > 0, got=ranks)

def later(x: int) -> int:
    """Built in step 2."""
    ...
```

## 6. Implementation plan

### Step 1: the pool
Status: DONE
Methods: `Pool`, `Pool.shrink`, `Pool.expand`
Validation: VAL_NON_EMPTY on ranks
Tests: `packages/rollart-demo/tests/test_pool.py::test_shrink`, `packages/rollart-demo/tests/test_pool.py::TestPool::test_it`

### Step 2: later
Status: NOT_STARTED
Methods: `later`
Tests: `packages/rollart-demo/tests/test_later.py::test_later`

## 7. Log
- v1.
'''

CODE = '''\
class Pool:
    def shrink(self, ranks: list[int], timeout: float = 5.0) -> list[int]:
        """Release ranks."""
        # VAL: VAL_NON_EMPTY(ranks)
        # VAL: VAL_TIMEOUT(timeout)
        # VAL: VAL_UNIQUE(ranks)
        return ranks

    async def expand(self, ranks: list[int]) -> None:
        # AST: AST_PRECONDITION(len(ranks) > 0, got=ranks)
        return None
'''

TESTS = "def test_shrink():\n    assert True\n\nclass TestPool:\n    def test_it(self):\n        assert True\n"


@pytest.fixture
def repo(tmp_path, monkeypatch):
    (tmp_path / "design").mkdir()
    (tmp_path / "design" / "rollart-demo.md").write_text(DOC)
    src = tmp_path / "packages" / "rollart-demo" / "src" / "rollart" / "demo"
    src.mkdir(parents=True)
    (src / "pool.py").write_text(process_text(CODE)[0])
    tests = tmp_path / "packages" / "rollart-demo" / "tests"
    tests.mkdir()
    (tests / "test_pool.py").write_text(TESTS)
    monkeypatch.setattr(design_check, "ROOT", tmp_path)
    return tmp_path


def _errors(repo_path: Path) -> list[str]:
    return design_check.check_package("rollart-demo").errors


def _edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new))


def test_a_consistent_package_passes_and_counts(repo):
    report = design_check.check_package("rollart-demo")
    assert report.errors == []
    assert (report.specified, report.present, report.drifted, report.deferred) == (4, 3, 0, 1)
    assert report.annotations_ok == report.annotations == 3
    assert [s.status for s in report.steps] == ["DONE", "NOT_STARTED"]


def test_a_drifted_signature_fails(repo):
    _edit(repo / "packages/rollart-demo/src/rollart/demo/pool.py", "timeout: float = 5.0", "timeout: float = 9.0")
    errors = _errors(repo)
    assert len(errors) == 1 and "Pool.shrink drifted" in errors[0] and "timeout: float=9.0" in errors[0]


def test_async_ness_is_part_of_the_signature(repo):
    _edit(repo / "packages/rollart-demo/src/rollart/demo/pool.py", "async def expand", "def expand")
    assert any("Pool.expand drifted" in e for e in _errors(repo))


def test_a_missing_method_fails_unless_its_step_is_not_started(repo):
    _edit(repo / "design/rollart-demo.md", "Status: NOT_STARTED", "Status: IN_PROGRESS")
    assert any("later (design line" in e and "missing" in e for e in _errors(repo))


def test_a_design_annotation_absent_from_the_code_fails(repo):
    _edit(repo / "packages/rollart-demo/src/rollart/demo/pool.py", "# VAL: VAL_TIMEOUT(timeout)", "# VAL: VAL_POSITIVE(timeout)")
    assert any("design annotations" in e for e in _errors(repo))


def test_an_unexpanded_annotation_fails(repo):
    (repo / "packages/rollart-demo/src/rollart/demo/pool.py").write_text(CODE)
    assert any("not expanded or stale" in e for e in _errors(repo))


def test_a_done_step_with_a_missing_test_fails(repo):
    _edit(repo / "packages/rollart-demo/tests/test_pool.py", "def test_shrink", "def test_other")
    assert any("test 'test_shrink' not found" in e for e in _errors(repo))


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("def test_shrink", "@pytest.mark.skip(reason='later')\ndef test_shrink"),
        ("def test_shrink", "@pytest.mark.skip\ndef test_shrink"),
        ("def test_shrink", "@pytest.mark.skipif(True, reason='x')\ndef test_shrink"),
        ("def test_shrink():\n", "def test_shrink():\n    pytest.skip('not yet')\n"),
        ("def test_shrink", "pytestmark = [pytest.mark.slow, pytest.mark.skip]\n\ndef test_shrink"),
        ("class TestPool", "@unittest.skip('x')\nclass TestPool"),
    ],
)
def test_a_done_step_with_a_skipped_test_fails(repo, old, new):
    _edit(repo / "packages/rollart-demo/tests/test_pool.py", old, new)
    assert any("is marked skip" in e and "it never runs" in e for e in _errors(repo)), _errors(repo)


def test_a_conditional_skip_is_allowed(repo):
    _edit(repo / "packages/rollart-demo/tests/test_pool.py", "def test_shrink",
          "@pytest.mark.skipif(sys.platform == 'win32', reason='x')\ndef test_shrink")
    assert _errors(repo) == []


def test_an_unknown_status_fails(repo):
    _edit(repo / "design/rollart-demo.md", "Status: DONE", "Status: FINISHED")
    assert any("status 'FINISHED' not in" in e for e in _errors(repo))


def test_a_wrong_section_structure_fails(repo):
    _edit(repo / "design/rollart-demo.md", "## 4. Data model and state machines", "## 4. Data model")
    assert any("level-2 headings must be exactly" in e for e in _errors(repo))


def test_a_trailing_annotation_after_the_docstring_counts(repo):
    """A stub may end with its annotations (no `...`): they are still required in the code."""
    _edit(repo / "packages/rollart-demo/src/rollart/demo/pool.py", "# AST: AST_PRECONDITION(len(ranks) > 0, got=ranks)",
          "# AST: AST_PRECONDITION(len(ranks) > 1, got=ranks)")
    assert any("Pool.expand: design annotations" in e for e in _errors(repo))
