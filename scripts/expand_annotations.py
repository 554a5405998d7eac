"""Expand `# VAL:` / `# AST:` annotations into one generated line each, or check that they are current.

    python scripts/expand_annotations.py expand [PATHS...]   # rewrite files in place
    python scripts/expand_annotations.py check  [PATHS...]   # exit 1 on any problem (CI)
    python scripts/expand_annotations.py stats  [PATHS...]   # annotations and generated lines

Right under each annotation line the tool keeps one generated line, a call of the pattern's
runtime function (`rollart.checks`, the rollart-checks distribution) with a hash in a trailing comment:

    # VAL: VAL_INT_RANGE(gpu, min=0, max=7)
    check.int_range("gpu", gpu, min=0, max=7)  # generated #3f2a9c01d2

The hash is taken over the line's code when it was written, so `check` can tell a line that
someone edited by hand (hash no longer matches the code) from a line that is merely stale
(code matches its hash but the library or the annotation now renders differently).
A module with annotations imports the runtime as `check`, everywhere the same way:
`from rollart import checks as check` (packages/rollart-checks, at the bottom of the layering, so
every package, rollart-env included, and scripts/ and examples/ import the one module).
`expand` adds or removes that import and lets ruff sort it.
`expand` also migrates the earlier four-line form (`# >>> generated ID #hash ...` through
`# <<< generated`) to the one-line form, and drops a generated line or block that no longer
sits under an annotation (what a merge can leave behind): after a merge, run `expand` again.
Annotations are found line by line: a line whose first non-blank text is `# VAL:` or `# AST:`,
outside string literals (a test may hold annotated code in a string: that is data, not code).
By default `check` and `expand` cover every tree that holds Python: packages/, scripts/ and
examples/ (an unknown pattern id anywhere fails), resolved from the repository root.
"""

from __future__ import annotations

import argparse
import ast
import io
import re
import shutil
import subprocess
import sys
import tokenize
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from validation_patterns.library import (  # noqa: E402
    RUNTIME_PATH,
    PatternError,
    block_hash,
    parse_annotation,
    render,
)

ANNOTATION_RE = re.compile(r"^(?P<indent>\s*)# (?P<family>VAL|AST): (?P<call>.+?)\s*$")
GENERATED_RE = re.compile(r"^(?P<indent>\s*)(?P<code>\S.*?)  # generated #(?P<hash>[0-9a-f]{10})\s*$")
# the earlier four-line form, migrated by `expand`
OLD_BEGIN_RE = re.compile(r"^\s*# >>> generated (?P<pid>\w+) #(?P<hash>[0-9a-f]{10})\b")
OLD_END_RE = re.compile(r"^\s*# <<< generated\s*$")
IMPORT_LINE = "from rollart import checks as check"
REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_ROOTS = ("packages", "scripts", "examples")


@dataclass(frozen=True)
class Problem:
    path: Path
    line: int
    kind: str  # not-expanded | stale | hand-edited | old-format | orphan | import | bad-annotation | unterminated
    detail: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.kind}: {self.detail}"


def import_line(path: Path) -> str:
    """How a module imports the runtime: the same line in every tree (one runtime, rollart-checks)."""
    return IMPORT_LINE


def generated_line(indent: str, code: str) -> str:
    return f"{indent}{code}  # generated #{block_hash([code])}"


def _lines_inside_strings(text: str) -> set[int]:
    """0-based indices of lines that continue a multi-line string literal (not code, not comments)."""
    inside: set[int] = set()
    try:
        for tok in tokenize.generate_tokens(io.StringIO(text).readline):
            if tok.type == tokenize.STRING and tok.end[0] > tok.start[0]:
                inside.update(range(tok.start[0], tok.end[0]))  # 1-based start+1..end == 0-based start..end-1
    except (tokenize.TokenError, SyntaxError, IndentationError):
        return set()  # not parseable as a whole (a snippet): every line counts, as before
    return inside


def _old_block_end(lines: list[str], begin: int) -> int | None:
    """Index just past the `# <<< generated` line of an old block starting at `begin`, or None."""
    j = begin + 1
    while j < len(lines) and not OLD_END_RE.match(lines[j]):
        if ANNOTATION_RE.match(lines[j]) or OLD_BEGIN_RE.match(lines[j]):
            return None
        j += 1
    return j + 1 if j < len(lines) else None


def _import_position(lines: list[str]) -> int:
    """Where to insert the runtime import: after the module's leading imports (ruff sorts it)."""
    try:
        tree = ast.parse("\n".join(lines))
    except SyntaxError:
        return 0
    position = 0
    for k, node in enumerate(tree.body):
        if k == 0 and isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
            position = node.end_lineno
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            position = node.end_lineno
        else:
            break
    return position


def process_text(text: str, path: Path = Path("<text>")) -> tuple[str, list[Problem]]:
    """Return (expanded text, problems found in the input as it was)."""
    lines = text.split("\n")
    in_strings = _lines_inside_strings(text)
    wanted_import = import_line(path)
    out: list[str] = []
    problems: list[Problem] = []
    annotations = 0
    i = 0
    while i < len(lines):
        line = lines[i]
        if i in in_strings:
            out.append(line)
            i += 1
            continue
        match = ANNOTATION_RE.match(line)
        if not match:
            if GENERATED_RE.match(line) or OLD_BEGIN_RE.match(line):
                end = i + 1 if GENERATED_RE.match(line) else _old_block_end(lines, i)
                if end is not None:
                    problems.append(Problem(path, i + 1, "orphan", "generated code not under an annotation"))
                    i = end
                    continue
            out.append(line)
            i += 1
            continue
        out.append(line)
        i += 1
        indent = match["indent"]
        # the generated code right under the annotation: one line, or an old four-line block
        existing: str | None = None
        old_form = False
        block_end = i
        if i < len(lines) and i not in in_strings and GENERATED_RE.match(lines[i]):
            existing = lines[i]
            block_end = i + 1
        elif i < len(lines) and OLD_BEGIN_RE.match(lines[i]):
            end = _old_block_end(lines, i)
            if end is None:
                problems.append(Problem(path, i + 1, "unterminated", "generated block has no '# <<< generated' line"))
                continue
            old_form, block_end = True, end
        try:
            annotation = parse_annotation(match["family"], match["call"])
        except PatternError as exc:
            problems.append(Problem(path, i, "bad-annotation", str(exc)))
            out.extend(lines[i:block_end])
            i = block_end
            continue
        annotations += 1
        fresh = generated_line(indent, render(annotation)[0])
        if old_form:
            problems.append(Problem(path, i, "old-format", f"four-line block under {annotation.source}; `expand` migrates it"))
        elif existing is None:
            problems.append(Problem(path, i, "not-expanded", annotation.source))
        else:
            found = GENERATED_RE.match(existing)
            if block_hash([found["code"]]) != found["hash"]:
                problems.append(Problem(path, i, "hand-edited", f"line under {annotation.source} was edited by hand"))
            elif existing != fresh:
                problems.append(Problem(path, i, "stale", f"line under {annotation.source} differs from the library"))
        i = block_end
        out.append(fresh)
    present = [k for k, ln in enumerate(out) if ln == wanted_import]
    if annotations and not present:
        problems.append(Problem(path, 1, "import", f"missing `{wanted_import}`"))
        out.insert(_import_position(out), wanted_import)
    elif present and not annotations:
        problems.append(Problem(path, present[0] + 1, "orphan", f"`{wanted_import}` but no annotation"))
        del out[present[0]]
    return "\n".join(out), problems


def iter_files(paths: list[str]) -> list[Path]:
    files: list[Path] = []
    for p in map(Path, paths or [str(REPO_ROOT / root) for root in DEFAULT_ROOTS]):
        if p.is_file():
            files.append(p)
        elif p.is_dir():
            files.extend(sorted(q for q in p.rglob("*.py") if ".venv" not in q.parts))
    return files


def _sort_imports(files: list[Path]) -> None:
    """Let ruff put an inserted import where isort wants it (the project's import order)."""
    ruff = shutil.which("ruff") or shutil.which("ruff", path=str(Path(sys.executable).parent))
    if files and ruff:
        subprocess.run([ruff, "check", "--select", "I", "--fix", "--quiet", *map(str, files)], check=False,
                       capture_output=True)


def expand_paths(paths: list[str]) -> list[Problem]:
    """Rewrite files and runtime copies; return the problems expansion cannot fix (bad annotations)."""
    unfixable: list[Problem] = []
    files = iter_files(paths)
    new_imports: list[Path] = []
    for f in files:
        text = f.read_text()
        new, problems = process_text(text, f)
        unfixable += [p for p in problems if p.kind in ("bad-annotation", "unterminated")]
        if new != text:
            f.write_text(new)
            if any(p.kind == "import" for p in problems):
                new_imports.append(f)
    _sort_imports(new_imports)
    return unfixable


def check_paths(paths: list[str]) -> tuple[list[Problem], int]:
    """Return (problems, number of annotations seen)."""
    problems: list[Problem] = []
    count = 0
    for f in iter_files(paths):
        text = f.read_text()
        in_strings = _lines_inside_strings(text)
        count += sum(1 for i, ln in enumerate(text.split("\n")) if i not in in_strings and ANNOTATION_RE.match(ln))
        problems += process_text(text, f)[1]
    return problems, count


def stats(paths: list[str]) -> dict[str, int]:
    """Annotations and the lines generated for them (either form), plus the runtime's lines."""
    result = {"annotations": 0, "generated lines": 0, "old-format blocks": 0, "runtime lines": 0}
    files = iter_files(paths)
    for f in files:
        lines = f.read_text().split("\n")
        in_strings = _lines_inside_strings("\n".join(lines))
        inside_old = False
        for i, ln in enumerate(lines):
            if i in in_strings:
                continue
            if ANNOTATION_RE.match(ln):
                result["annotations"] += 1
            elif OLD_BEGIN_RE.match(ln):
                result["old-format blocks"] += 1
                inside_old = True
            if inside_old or GENERATED_RE.match(ln):
                result["generated lines"] += 1
            if OLD_END_RE.match(ln):
                inside_old = False
    result["runtime lines"] = len(RUNTIME_PATH.read_text().splitlines())
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("command", choices=["expand", "check", "stats"])
    parser.add_argument("paths", nargs="*", help=f"files or folders (default: {' '.join(DEFAULT_ROOTS)})")
    args = parser.parse_args(argv)
    if args.command == "expand":
        problems = expand_paths(args.paths)
        for p in problems:
            print(p, file=sys.stderr)
        return 1 if problems else 0
    if args.command == "stats":
        print(", ".join(f"{k}: {v}" for k, v in stats(args.paths).items()))
        return 0
    problems, count = check_paths(args.paths)
    for p in problems:
        print(p, file=sys.stderr)
    print(f"expand --check: {count} annotations, {len(problems)} problems")
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
