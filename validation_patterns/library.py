"""Load the validation-pattern library and render a pattern into code.

Why a data file plus Jinja2: the patterns are *data* (id, parameters, exception, message,
template) that three consumers read — the expansion tool, the design-doc check and the docs
catalogue — so they live in one YAML file, and the code they expand to is a Jinja2 template
because Jinja2 is the well-kept, widely known way to render text with conditionals.
Annotations are parsed with :mod:`ast` (an annotation is a Python call expression), so no
hand-written parser decides what a parameter is.
"""

from __future__ import annotations

import ast
import functools
import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import jinja2
import yaml
from pydantic import BaseModel, ConfigDict

LIBRARY_PATH = Path(__file__).with_name("patterns.yaml")
COMMON_PARAMS = ("exc",)


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
    args: dict[str, str]  # param name -> normalized source text
    source: str  # the call text as written

    @property
    def line(self) -> str:
        return f"# {self.family}: {self.source}"


def _escape_string_literal(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"')


def _escape_fstring_literal(text: str) -> str:
    return _escape_string_literal(text).replace("{", "{{").replace("}", "}}")


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
    for kw in node.keywords:
        if kw.arg is None:
            raise PatternError(f"{pid}: **kwargs are not allowed in annotations")
        if kw.arg not in names and kw.arg not in COMMON_PARAMS:
            raise PatternError(f"{pid}: unknown parameter {kw.arg!r}; allowed: {names + list(COMMON_PARAMS)}")
        if kw.arg in args:
            raise PatternError(f"{pid}: parameter {kw.arg!r} given twice")
        args[kw.arg] = ast.unparse(kw.value)
    by_name = {p.name: p for p in pattern.params}
    for param in pattern.params:
        if param.name not in args:
            if param.default is None:
                raise PatternError(f"{pid}: missing required parameter {param.name!r}")
            continue
        _check_kind(pid, param, args[param.name])
    for name in args:
        if name in by_name and by_name[name].kind == "str":
            args[name] = ast.literal_eval(args[name])
    return Annotation(family=family, pattern_id=pid, args=args, source=text.strip())


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


def render(annotation: Annotation) -> list[str]:
    """The code lines (unindented) that an annotation expands to."""
    pattern = load_library().patterns[annotation.pattern_id]
    values: dict[str, str] = {"exc": annotation.args.get("exc", pattern.exception)}
    for param in pattern.params:
        values[param.name] = annotation.args.get(param.name, param.default or "")
    for name in list(values):
        values[f"{name}_text"] = _escape_fstring_literal(values[name])
        values[f"{name}_plain"] = _escape_string_literal(values[name])
    text = _ENV.from_string(pattern.code).render(**values)
    lines = [ln.rstrip() for ln in text.splitlines() if ln.strip()]
    return lines


def block_hash(lines: list[str]) -> str:
    return hashlib.sha256("\n".join(ln.strip() for ln in lines).encode()).hexdigest()[:10]
