"""Check every package design doc against its code: structure, Section-5 drift, Section-6 steps.

    python scripts/design_check.py                  # all packages, table + errors, exit 1 on error
    python scripts/design_check.py rollart-proxy    # one package

What is checked (the format is defined in design/README.md):
  * the seven level-2 section headings, in order;
  * every Section-5 stub (module-level function, class, method) exists in the package's `src/` with
    the same parameters, return annotation and async-ness — unless it belongs to a NOT_STARTED step;
  * every annotation of a stub appears, in order, among the implementation's annotations, and the
    implementation's generated blocks are present and current;
  * every Section-6 step has a status in {NOT_STARTED, IN_PROGRESS, DONE}; a DONE step names tests,
    and each named test file exists and defines the named test.
"""

from __future__ import annotations

import argparse
import ast
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from expand_annotations import ANNOTATION_RE, process_text  # noqa: E402

from validation_patterns.library import PatternError, parse_annotation  # noqa: E402

PACKAGES = ("rollart-resource", "rollart-env", "rollart-reward", "rollart-proxy", "rollart-sync",
            "rollart-train", "rollart-scheduler", "rollart-app")
SECTIONS = (
    "1. Goals and non-goals",
    "2. Requirements",
    "3. Decisions",
    "4. Data model and state machines",
    "5. API and implementation spec",
    "6. Implementation plan",
    "7. Log",
)
STATUSES = ("NOT_STARTED", "IN_PROGRESS", "DONE")
MODULE_RE = re.compile(r"^Module:\s*`(?P<mod>rollart\.[\w.]+)`")
STEP_RE = re.compile(r"^###\s+Step\s+(?P<num>\d+)\s*:\s*(?P<title>.+?)\s*$")
FIELD_RE = re.compile(r"^(?P<key>Status|Methods|Validation|Tests)\s*:\s*(?P<value>.*)$")
TICKED_RE = re.compile(r"`([^`]+)`")


@dataclass
class Stub:
    module: str
    qualname: str  # "func", "Class" or "Class.method"
    signature: str | None  # None for classes
    annotations: list[str]
    line: int
    end: int  # last line, trailing comments included


@dataclass
class Step:
    num: int
    title: str
    status: str | None = None
    methods: list[str] = field(default_factory=list)
    tests: list[str] = field(default_factory=list)
    line: int = 0


@dataclass
class Report:
    package: str
    errors: list[str] = field(default_factory=list)
    specified: int = 0
    present: int = 0
    drifted: int = 0
    deferred: int = 0
    annotations: int = 0
    annotations_ok: int = 0
    steps: list[Step] = field(default_factory=list)


def signature_of(node: ast.FunctionDef | ast.AsyncFunctionDef) -> str:
    prefix = "async def" if isinstance(node, ast.AsyncFunctionDef) else "def"
    ret = f" -> {ast.unparse(node.returns)}" if node.returns is not None else ""
    return f"{prefix} {node.name}({ast.unparse(node.args)}){ret}"


def _annotations_in(lines: list[str], start: int, end: int) -> list[str]:
    """Annotation call texts (normalized) on lines start..end (1-based, inclusive)."""
    found = []
    for text in lines[start - 1 : end]:
        m = ANNOTATION_RE.match(text)
        if m:
            try:
                a = parse_annotation(m["family"], m["call"])
                found.append(f"{a.family}:{a.pattern_id}({sorted(a.args.items())})")
            except PatternError:
                found.append(f"{m['family']}:INVALID:{m['call']}")
    return found


def _block_end(lines: list[str], node: ast.stmt) -> int:
    """Last line of a def including trailing comments (ast's end_lineno stops at the last statement)."""
    end = node.end_lineno
    for no in range(end + 1, len(lines) + 1):
        text = lines[no - 1]
        if not text.strip():
            continue
        if len(text) - len(text.lstrip()) <= node.col_offset:
            break
        end = no
    return end


def _walk_defs(tree: ast.Module, lines: list[str], module: str, line_offset: int = 0) -> list[Stub]:
    stubs: list[Stub] = []
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            end = _block_end(lines, node)
            stubs.append(Stub(module, node.name, signature_of(node), _annotations_in(lines, node.lineno, end),
                              node.lineno + line_offset, end + line_offset))
        elif isinstance(node, ast.ClassDef):
            stubs.append(Stub(module, node.name, None, [], node.lineno + line_offset, node.end_lineno + line_offset))
            for sub in node.body:
                if isinstance(sub, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    end = _block_end(lines, sub)
                    stubs.append(Stub(module, f"{node.name}.{sub.name}", signature_of(sub),
                                      _annotations_in(lines, sub.lineno, end), sub.lineno + line_offset,
                                      end + line_offset))
    return stubs


def split_sections(text: str) -> tuple[list[str], dict[str, list[tuple[int, str]]]]:
    headings: list[str] = []
    body: dict[str, list[tuple[int, str]]] = {}
    current = None
    for no, line in enumerate(text.split("\n"), 1):
        if line.startswith("## "):
            current = line[3:].strip()
            headings.append(current)
            body[current] = []
        elif current is not None:
            body[current].append((no, line))
    return headings, body


def parse_spec(section: list[tuple[int, str]], report: Report) -> list[Stub]:
    stubs: list[Stub] = []
    module = None
    in_block = False
    block: list[str] = []
    block_start = 0
    for no, line in section:
        if in_block:
            if line.strip().startswith("```"):
                in_block = False
                if module is None:
                    report.errors.append(f"Section 5 line {block_start}: python block before any 'Module: `rollart...`' line")
                    continue
                src = "\n".join(block)
                try:
                    tree = ast.parse(src)
                except SyntaxError as exc:
                    report.errors.append(f"Section 5 line {block_start + (exc.lineno or 0)}: stub does not parse: {exc.msg}")
                    continue
                stubs += _walk_defs(tree, block, module, block_start)
            else:
                block.append(line)
            continue
        m = MODULE_RE.match(line.strip())
        if m:
            module = m["mod"]
        elif line.strip().startswith("```python"):
            in_block, block, block_start = True, [], no
    return stubs


def parse_steps(section: list[tuple[int, str]], report: Report) -> list[Step]:
    steps: list[Step] = []
    for no, line in section:
        m = STEP_RE.match(line)
        if m:
            steps.append(Step(int(m["num"]), m["title"], line=no))
            continue
        f = FIELD_RE.match(line.strip())
        if f and steps:
            step = steps[-1]
            value = f["value"].strip()
            if f["key"] == "Status":
                step.status = value.strip("`* ")
            elif f["key"] == "Methods":
                step.methods += TICKED_RE.findall(value)
            elif f["key"] == "Tests":
                step.tests += TICKED_RE.findall(value)
    for step in steps:
        if step.status not in STATUSES:
            report.errors.append(f"Step {step.num} ({step.title}): status {step.status!r} not in {list(STATUSES)}")
        if step.status == "DONE":
            if not step.tests:
                report.errors.append(f"Step {step.num} ({step.title}) is DONE but names no tests")
            for test in step.tests:
                problem = check_test_exists(test)
                if problem:
                    report.errors.append(f"Step {step.num} ({step.title}): {problem}")
    if not steps:
        report.errors.append("Section 6 has no '### Step N: title' steps")
    return steps


def _is_unconditional_skip(node: ast.expr) -> bool:
    """`pytest.mark.skip`, `pytest.mark.skip(...)`, `unittest.skip(...)`, `pytest.mark.skipif(True, ...)`.

    Conditional skips (`skipif` on a real condition, `importorskip`) are how optional backends are
    tested and stay allowed; a skip that always applies means the test never runs.
    """
    call = node if isinstance(node, ast.Call) else None
    target = call.func if call is not None else node
    name = target.attr if isinstance(target, ast.Attribute) else target.id if isinstance(target, ast.Name) else ""
    if name == "skip":
        return True
    if name == "skipif" and call is not None:
        cond = call.args[0] if call.args else next((k.value for k in call.keywords if k.arg == "condition"), None)
        return isinstance(cond, ast.Constant) and bool(cond.value)
    return False


def _marks_of(value: ast.expr) -> list[ast.expr]:
    return list(value.elts) if isinstance(value, (ast.List, ast.Tuple)) else [value]


def _skip_marks(tree: ast.Module, chain: list[ast.stmt]) -> str | None:
    """Where a test is unconditionally skipped: module `pytestmark`, a decorator, or a first-line `pytest.skip()`."""
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "pytestmark" for t in node.targets):
            if any(_is_unconditional_skip(m) for m in _marks_of(node.value)):
                return "the module's pytestmark skips it"
    for node in chain:
        for deco in getattr(node, "decorator_list", []):
            if _is_unconditional_skip(deco):
                return f"{node.name} is decorated with an unconditional skip"
        for stmt in getattr(node, "body", [])[:2]:
            if (isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call)
                    and isinstance(stmt.value.func, ast.Attribute) and stmt.value.func.attr == "skip"
                    and isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))):
                return f"{node.name} calls skip() unconditionally"
    return None


def check_test_exists(ref: str) -> str | None:
    """None if the listed test exists and can run; a DONE step's test that is always skipped proves nothing."""
    path, _, name = ref.partition("::")
    file = ROOT / path
    if not file.is_file():
        return f"test file {path} does not exist"
    if not name:
        return None
    tree = ast.parse(file.read_text())
    parts = name.replace("::", ".").split(".")
    scope: list[ast.stmt] = tree.body
    chain: list[ast.stmt] = []
    for part in parts:
        match = next((n for n in scope if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
                      and n.name == part), None)
        if match is None:
            # module-level assignment, e.g. TestMachine = Machine.TestCase
            if any(isinstance(n, ast.Assign) and any(isinstance(t, ast.Name) and t.id == part for t in n.targets)
                   for n in scope):
                break
            return f"test {name!r} not found in {path}"
        chain.append(match)
        scope = getattr(match, "body", [])
    skipped = _skip_marks(tree, chain)
    return f"test {name!r} in {path} is marked skip ({skipped}): it never runs" if skipped else None


def module_file(package: str, module: str) -> Path | None:
    src = ROOT / "packages" / package / "src"
    rel = Path(*module.split("."))
    for cand in (src / rel.with_suffix(".py"), src / rel / "__init__.py"):
        if cand.is_file():
            return cand
    return None


def step_status_of(qualname: str, steps: list[Step]) -> str | None:
    for name in (qualname, qualname.split(".")[0]):
        for step in steps:
            if name in step.methods:
                return step.status
    return None


def check_package(package: str) -> Report:
    report = Report(package)
    doc = ROOT / "design" / f"{package}.md"
    if not doc.is_file():
        report.errors.append(f"design doc {doc.relative_to(ROOT)} is missing")
        return report
    headings, body = split_sections(doc.read_text())
    if tuple(headings) != SECTIONS:
        report.errors.append(f"level-2 headings must be exactly {list(SECTIONS)}, got {headings}")
        return report
    stubs = parse_spec(body[SECTIONS[4]], report)
    report.steps = parse_steps(body[SECTIONS[5]], report)
    impl_cache: dict[Path, tuple[dict[str, Stub], set[int]]] = {}
    for stub in stubs:
        report.specified += 1
        report.annotations += len(stub.annotations)
        deferred = step_status_of(stub.qualname, report.steps) == "NOT_STARTED"
        path = module_file(package, stub.module)
        impl = None
        if path is not None:
            if path not in impl_cache:
                text = path.read_text()
                lines = text.split("\n")
                defs = {s.qualname: s for s in _walk_defs(ast.parse(text), lines, stub.module)}
                bad_lines = {p.line for p in process_text(text, path)[1]}
                impl_cache[path] = (defs, bad_lines)
            impl = impl_cache[path][0].get(stub.qualname)
        if impl is None:
            if deferred:
                report.deferred += 1
            else:
                where = f"module {stub.module}" + ("" if path else " (file not found)")
                report.errors.append(f"{stub.qualname} (design line {stub.line}) is missing from {where}")
            continue
        report.present += 1
        if stub.signature != impl.signature:
            report.drifted += 1
            report.errors.append(f"{stub.module}.{stub.qualname} drifted:\n    design: {stub.signature}\n    code:   {impl.signature}")
        it = iter(impl.annotations)
        if not all(any(a == b for b in it) for a in stub.annotations):
            report.errors.append(f"{stub.module}.{stub.qualname}: design annotations {stub.annotations} "
                                 f"are not all present, in order, in the code {impl.annotations}")
            continue
        bad = impl_cache[path][1]
        stale = [ln for ln in bad if impl.line <= ln <= impl.end]
        if stale:
            report.errors.append(f"{stub.module}.{stub.qualname}: annotations not expanded or stale at lines {sorted(stale)}"
                                 " (run make expand)")
        else:
            report.annotations_ok += len(stub.annotations)
    return report


def print_table(reports: list[Report]) -> None:
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:  # pragma: no cover - rich is a dev dependency
        for r in reports:
            print(r)
        return
    table = Table(title="Design check")
    for col in ("package", "specified", "present", "drifted", "deferred", "annotations expanded", "steps done", "errors"):
        table.add_column(col, justify="left" if col == "package" else "right")
    for r in reports:
        done = sum(1 for s in r.steps if s.status == "DONE")
        table.add_row(r.package, str(r.specified), str(r.present), str(r.drifted), str(r.deferred),
                      f"{r.annotations_ok}/{r.annotations}", f"{done}/{len(r.steps)}", str(len(r.errors)))
    Console(width=140).print(table)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("packages", nargs="*", help=f"default: all of {', '.join(PACKAGES)}")
    args = parser.parse_args(argv)
    for name in args.packages:
        if name not in PACKAGES:
            parser.error(f"unknown package {name!r}; choose from {list(PACKAGES)}")
    reports = [check_package(p) for p in (args.packages or PACKAGES)]
    print_table(reports)
    failed = False
    for r in reports:
        for err in r.errors:
            failed = True
            print(f"{r.package}: {err}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
