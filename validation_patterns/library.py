"""Load the validation-pattern library and render a pattern into code.

Why a data file plus Jinja2: the patterns are *data* (id, parameters, exception, message,
template) that three consumers read — the expansion tool, the design-doc check and the docs
catalogue — so they live in one YAML file, and the code they expand to is a Jinja2 template
because Jinja2 is the well-kept, widely known way to render text with conditionals.
Annotations are parsed with :mod:`ast` (an annotation is a Python call expression), so no
hand-written parser decides what a parameter is. An annotation renders to one line that calls
the pattern's runtime function in ``rollart.checks`` (packages/rollart-checks, the one copy).
"""

from __future__ import annotations

import ast
import functools
import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import jinja2
import yaml
from pydantic import BaseModel, ConfigDict

LIBRARY_PATH = Path(__file__).with_name("patterns.yaml")
COMMON_PARAMS = ("exc", "name")
RUNTIME_PATH = Path(__file__).resolve().parents[1] / "packages" / "rollart-checks" / "src" / "rollart" / "checks.py"


class PatternError(ValueError):
    """An annotation names an unknown pattern or gives it the wrong parameters."""


class Param(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str
    kind: Literal["expr", "int", "bool", "str"]
    doc: str
    default: str | None = None


class Pattern(BaseModel):
    model_config = ConfigDict(extra="forbid")
    id: str
    checks: str
    params: list[Param]
    exception: str
    message: str
    named: str | None = None  # the parameter whose value the message names (VAL patterns)
    code: str

    @property
    def family(self) -> str:
        return self.id.split("_", 1)[0]


class Library(BaseModel):
    model_config = ConfigDict(extra="forbid")
    version: int
    patterns: dict[str, Pattern]

    @property
    def digest(self) -> str:
        return hashlib.sha256(LIBRARY_PATH.read_bytes()).hexdigest()[:12]


@functools.lru_cache(maxsize=4)
def load_library(path: Path = LIBRARY_PATH) -> Library:
    raw = yaml.safe_load(path.read_text())
    for pid, body in raw["patterns"].items():
        body["id"] = pid
    return Library.model_validate(raw)


@dataclass(frozen=True)
class Annotation:
    """One parsed `# VAL:` / `# AST:` annotation."""

    family: str  # "VAL" or "AST"
    pattern_id: str
    args: dict[str, str]  # param name -> normalized source text (what the design check compares)
    source: str  # the call text as written
    written: dict[str, str] = field(default_factory=dict)  # param name -> source text as written

    @property
    def line(self) -> str:
        return f"# {self.family}: {self.source}"


def parse_annotation(family: str, text: str) -> Annotation:
    """Parse `VAL_X(a, k=v)`; raise PatternError naming what is wrong."""
    lib = load_library()
    try:
        node = ast.parse(text.strip(), mode="eval").body
    except SyntaxError as exc:
        raise PatternError(f"annotation is not a call expression: {text!r} ({exc.msg})") from None
    if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name):
        raise PatternError(f"annotation must look like PATTERN_ID(arg, key=value), got {text!r}")
    pid = node.func.id
    call_text = text.strip()
    written = {}
    if pid not in lib.patterns:
        raise PatternError(f"unknown pattern id {pid!r}; known: {sorted(lib.patterns)}")
    pattern = lib.patterns[pid]
    if pattern.family != family:
        raise PatternError(f"pattern {pid} belongs under '# {pattern.family}:', not '# {family}:'")
    names = [p.name for p in pattern.params]
    args: dict[str, str] = {}
    if len(node.args) > len(names):
        raise PatternError(f"{pid} takes at most {len(names)} positional parameters {names}, got {len(node.args)}")
    for param_name, arg in zip(names, node.args):
        args[param_name] = ast.unparse(arg)
        written[param_name] = ast.get_source_segment(call_text, arg)
    for kw in node.keywords:
        if kw.arg is None:
            raise PatternError(f"{pid}: **kwargs are not allowed in annotations")
        if kw.arg not in names and kw.arg not in COMMON_PARAMS:
            raise PatternError(f"{pid}: unknown parameter {kw.arg!r}; allowed: {names + list(COMMON_PARAMS)}")
        if kw.arg in args:
            raise PatternError(f"{pid}: parameter {kw.arg!r} given twice")
        args[kw.arg] = ast.unparse(kw.value)
        written[kw.arg] = ast.get_source_segment(call_text, kw.value)
    by_name = {p.name: p for p in pattern.params}
    for param in pattern.params:
        if param.name not in args:
            if param.default is None:
                raise PatternError(f"{pid}: missing required parameter {param.name!r}")
            continue
        _check_kind(pid, param, args[param.name])
    if "name" in args:
        _check_kind(pid, Param(name="name", kind="str", doc=""), args["name"])
        args["name"] = ast.literal_eval(args["name"])
    elif pattern.named is not None and display_name(args[pattern.named]) is None:
        raise PatternError(f"{pid}: {args[pattern.named]!r} is not a plain name or attribute; "
                           f"say how the caller knows it with name=\"...\"")
    for name in args:
        if name in by_name and by_name[name].kind == "str":
            args[name] = ast.literal_eval(args[name])
    return Annotation(family=family, pattern_id=pid, args=args, source=call_text, written=written)


def display_name(source: str) -> str | None:
    """How a caller knows the value of an expression: `count`, `params.top_p`, `self._version` ->
    `version`; None when the expression is not a plain name, attribute or constant subscript."""
    node = ast.parse(source, mode="eval").body
    parts: list[str] = []
    while isinstance(node, (ast.Attribute, ast.Subscript)):
        if isinstance(node, ast.Subscript):
            if not isinstance(node.slice, ast.Constant):
                return None
            return source if display_name(ast.unparse(node.value)) is not None else None
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    if node.id in ("self", "cls") and parts:
        parts[-1] = parts[-1].lstrip("_") or parts[-1]
    else:
        parts.append(node.id)
    return ".".join(reversed(parts))


def _is_plain(node: ast.expr) -> bool:
    """A value the message may show without computing anything (shown eagerly, not lazily)."""
    if isinstance(node, (ast.Name, ast.Constant)):
        return True
    if isinstance(node, ast.Attribute):
        return _is_plain(node.value)
    if isinstance(node, ast.Subscript):
        return _is_plain(node.value) and isinstance(node.slice, ast.Constant)
    if isinstance(node, ast.Tuple):
        return all(_is_plain(elt) for elt in node.elts)
    return False


def _check_kind(pid: str, param: Param, source: str) -> None:
    if param.kind == "expr":
        if "\\" in source:
            raise PatternError(f"{pid}: parameter {param.name!r} may not contain a backslash, got {source!r}")
        return
    try:
        value = ast.literal_eval(source)
    except ValueError:
        raise PatternError(f"{pid}: parameter {param.name!r} must be a {param.kind} literal, got {source!r}") from None
    expected = {"int": int, "bool": bool, "str": str}[param.kind]
    if type(value) is not expected:
        raise PatternError(f"{pid}: parameter {param.name!r} must be a {param.kind} literal, got {source!r}")


_ENV = jinja2.Environment(undefined=jinja2.StrictUndefined, keep_trailing_newline=False, autoescape=False)


def string_literal(text: str) -> str:
    """A double-quoted Python string literal (the project's quote style) holding ``text``."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def render(annotation: Annotation) -> list[str]:
    """The code (one line, unindented) that an annotation expands to."""
    pattern = load_library().patterns[annotation.pattern_id]
    args = annotation.args  # str parameters as values, expressions as normalized source
    code = {**args, **{k: v for k, v in annotation.written.items() if k not in ("msg", "name")}}  # as written
    values: dict[str, str] = {p.name: code.get(p.name, p.default or "") for p in pattern.params}
    values["exc_arg"] = f", exc={code['exc']}" if "exc" in code else ""
    if pattern.named is not None:
        values["name"] = string_literal(args.get("name") or display_name(args[pattern.named]))
    if "other" in values:
        values["other_name"] = string_literal(display_name(values["other"]) or values["other"])
    if pattern.family == "AST":
        values["what"] = string_literal(args.get("msg") or code["cond"])
        got = code.get("got", "None")
        if got == "None":
            values["got_arg"] = ""
        elif _is_plain(ast.parse(got, mode="eval").body):
            values["got_arg"] = f", got={got}"
        else:
            values["got_arg"] = f", got_lazy=lambda: {got}"
    text = _ENV.from_string(pattern.code).render(**values)
    return [ln.rstrip() for ln in text.splitlines() if ln.strip()]


def block_hash(lines: list[str]) -> str:
    return hashlib.sha256("\n".join(ln.strip() for ln in lines).encode()).hexdigest()[:10]
