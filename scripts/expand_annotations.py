"""Expand `# VAL:` / `# AST:` annotations into generated blocks, or check that they are current.

    python scripts/expand_annotations.py expand [PATHS...]   # rewrite files in place
    python scripts/expand_annotations.py check  [PATHS...]   # exit 1 on any problem (CI)

Right under each annotation line the tool keeps one generated block:

    # VAL: VAL_INT_RANGE(gpu, min=0, max=7)
    # >>> generated VAL_INT_RANGE #3f2a9c01d2 (edit the annotation, not this block)
    if isinstance(gpu, bool) or ...:
        raise ValueError(...)
    # <<< generated

The hash is taken over the block's code when it was written, so `check` can tell a block that
someone edited by hand (hash no longer matches the code) from a block that is merely stale
(code matches its hash but the library or the annotation now renders differently).
Annotations are found line by line: a line whose first non-blank text is `# VAL:` or `# AST:`,
outside string literals (a test may hold annotated code in a string: that is data, not code).
By default `check` and `expand` cover every tree that holds Python: packages/, scripts/ and
examples/ (an unknown pattern id anywhere fails), resolved from the repository root.
"""

from __future__ import annotations

import argparse
import io
import re
import sys
import tokenize
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from validation_patterns.library import (  # noqa: E402
    Annotation,
    PatternError,
    block_hash,
    parse_annotation,
    render,
)

ANNOTATION_RE = re.compile(r"^(?P<indent>\s*)# (?P<family>VAL|AST): (?P<call>.+?)\s*$")
BEGIN_RE = re.compile(r"^\s*# >>> generated (?P<pid>\w+) #(?P<hash>[0-9a-f]{10})\b")
END_RE = re.compile(r"^\s*# <<< generated\s*$")
REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_ROOTS = ("packages", "scripts", "examples")


@dataclass(frozen=True)
class Problem:
    path: Path
    line: int
    kind: str  # not-expanded | stale | hand-edited | bad-annotation | unterminated
    detail: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.kind}: {self.detail}"


def _block_lines(indent: str, annotation: Annotation) -> list[str]:
    body = render(annotation)
    head = f"{indent}# >>> generated {annotation.pattern_id} #{block_hash(body)} (edit the annotation, not this block)"
    return [head, *(indent + ln for ln in body), f"{indent}# <<< generated"]


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


def process_text(text: str, path: Path = Path("<text>")) -> tuple[str, list[Problem]]:
    """Return (expanded text, problems found in the input as it was)."""
    lines = text.split("\n")
    in_strings = _lines_inside_strings(text)
    out: list[str] = []
    problems: list[Problem] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        out.append(line)
        match = ANNOTATION_RE.match(line) if i not in in_strings else None
        i += 1
        if not match:
            continue
        indent = match["indent"]
        # find an existing block right under the annotation
        existing: list[str] | None = None
        existing_hash = None
        if i < len(lines) and BEGIN_RE.match(lines[i]):
            existing_hash = BEGIN_RE.match(lines[i])["hash"]
            j = i + 1
            while j < len(lines) and not END_RE.match(lines[j]):
                if ANNOTATION_RE.match(lines[j]) or BEGIN_RE.match(lines[j]):
                    break
                j += 1
            if j >= len(lines) or not END_RE.match(lines[j]):
                problems.append(Problem(path, i + 1, "unterminated", "generated block has no '# <<< generated' line"))
                continue
            existing = lines[i + 1 : j]
            block_end = j + 1
        try:
            annotation = parse_annotation(match["family"], match["call"])
        except PatternError as exc:
            problems.append(Problem(path, i, "bad-annotation", str(exc)))
            if existing is not None:
                out.extend(lines[i:block_end])
                i = block_end
            continue
        fresh = _block_lines(indent, annotation)
        if existing is None:
            problems.append(Problem(path, i, "not-expanded", annotation.source))
        else:
            stripped = [ln[len(indent):] if ln.startswith(indent) else ln.lstrip() for ln in existing]
            if block_hash(stripped) != existing_hash:
                problems.append(Problem(path, i, "hand-edited", f"block under {annotation.source} was edited by hand"))
            elif [lines[i], *existing, lines[block_end - 1]] != fresh:
                problems.append(Problem(path, i, "stale", f"block under {annotation.source} differs from the library"))
            i = block_end
        out.extend(fresh)
    return "\n".join(out), problems


def iter_files(paths: list[str]) -> list[Path]:
    files: list[Path] = []
    for p in map(Path, paths or [str(REPO_ROOT / root) for root in DEFAULT_ROOTS]):
        if p.is_file():
            files.append(p)
        elif p.is_dir():
            files.extend(sorted(q for q in p.rglob("*.py") if ".venv" not in q.parts))
    return files


def expand_paths(paths: list[str]) -> list[Problem]:
    """Rewrite files; return the problems that expansion cannot fix (bad annotations)."""
    unfixable: list[Problem] = []
    for f in iter_files(paths):
        text = f.read_text()
        new, problems = process_text(text, f)
        unfixable += [p for p in problems if p.kind in ("bad-annotation", "unterminated")]
        if new != text:
            f.write_text(new)
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("command", choices=["expand", "check"])
    parser.add_argument("paths", nargs="*", help=f"files or folders (default: {' '.join(DEFAULT_ROOTS)})")
    args = parser.parse_args(argv)
    if args.command == "expand":
        problems = expand_paths(args.paths)
        for p in problems:
            print(p, file=sys.stderr)
        return 1 if problems else 0
    problems, count = check_paths(args.paths)
    for p in problems:
        print(p, file=sys.stderr)
    print(f"expand --check: {count} annotations, {len(problems)} problems")
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
