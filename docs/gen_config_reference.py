"""Generate the run-config reference page from the pydantic models of `rollart.app.config`.

Run at docs build time by mkdocs-gen-files (so the page can never lag the models); `python
docs/gen_config_reference.py` prints the page. Each section lists every field with its type, its
default, its constraints and its description (the field's docstring or `Field(description=...)`).
"""

from __future__ import annotations

import inspect
import re
import sys
import types
import typing
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel
from pydantic_core import PydanticUndefined

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "packages" / "rollart-app" / "src"))

_CONSTRAINTS = (("ge", ">="), ("gt", ">"), ("le", "<="), ("lt", "<"), ("min_length", "min length"),
                ("max_length", "max length"))


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    """The pydantic models an annotation holds (directly, in a list, or in a union)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in typing.get_args(annotation) for m in _models_in(arg)]


def _cell(text: str) -> str:
    """Markdown table cells may not hold a bare `|`."""
    return text.replace("|", "\\|")


def _is_union(annotation: Any) -> bool:
    return typing.get_origin(annotation) in (typing.Union, types.UnionType)


def _either(parts: list[str]) -> str:
    """`a`, `b` or `c`: a union in words, because a `|` in a table cell splits the cell, and escaped
    as `\\|` inside a code span it shows the backslash."""
    return parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " or " + parts[-1]


def _code_name(annotation: Any) -> str:
    """A type as Python text without a `|`: unions nested in a generic read `Optional[int]`, `Union[a, b]`."""
    if annotation is type(None) or annotation is None:
        return "None"
    if annotation is Any:
        return "Any"
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if _is_union(annotation):
        rest = [a for a in args if a is not type(None)]
        if len(rest) == 1 and len(args) == 2:
            return f"Optional[{_code_name(rest[0])}]"
        return f"Union[{', '.join(_code_name(a) for a in args)}]"
    if origin is Literal:
        return f"Literal[{', '.join(repr(a) for a in args)}]"
    if origin is not None:
        return f"{getattr(origin, '__name__', repr(origin))}[{', '.join(_code_name(a) for a in args)}]"
    if isinstance(annotation, type):
        return annotation.__name__
    return re.sub(r"\b(typing|rollart\.app\.config)\.", "", repr(annotation)).replace("|", "or")


def _type_name(annotation: Any) -> str:
    """The type column: a union as `str` or `None`, a Literal as one of its values."""
    if typing.get_origin(annotation) is Literal:
        return "one of " + _either([f"`{a}`" for a in typing.get_args(annotation)])
    if _is_union(annotation):
        literals = [a for a in typing.get_args(annotation) if typing.get_origin(a) is Literal]
        values = [f"`{v}`" for lit in literals for v in typing.get_args(lit)]
        others = [f"`{_code_name(a)}`" for a in typing.get_args(annotation) if typing.get_origin(a) is not Literal]
        return ("one of " if values else "") + _either(values + others)
    return f"`{_code_name(annotation)}`"


def _default(field: Any) -> str:
    if field.default_factory is not None:
        value = field.default_factory()
        if isinstance(value, BaseModel):
            return "(the section's defaults)"
        if isinstance(value, list) and value and isinstance(value[0], BaseModel):
            return _cell("`" + repr([v.model_dump(exclude_defaults=True) for v in value]) + "`")
        return _cell(f"`{value!r}`")
    if field.default is PydanticUndefined:
        return "**required**"
    return _cell(f"`{field.default!r}`")


def _constraints(field: Any) -> str:
    out = []
    for meta in field.metadata:
        for attr, sign in _CONSTRAINTS:
            value = getattr(meta, attr, None)
            if value is not None:
                out.append(f"{sign} {value}")
    return ", ".join(out)


def _doc(obj: Any) -> str:
    return _cell(" ".join((obj or "").split()))


def _section(path: str, model: type[BaseModel], out: list[str], seen: set[str]) -> None:
    heading = f"`{path}`" if path else "Top level"
    out += [f"## {heading}", "", f"`{model.__name__}`: " + inspect.cleandoc(model.__doc__ or ""), ""]
    out += ["| field | type | default | constraints | description |", "|---|---|---|---|---|"]
    nested: list[tuple[str, type[BaseModel]]] = []
    for name, field in model.model_fields.items():
        out.append(f"| `{name}` | {_type_name(field.annotation)} | {_default(field)} | {_constraints(field)} | "
                   f"{_doc(field.description)} |")
        for sub in _models_in(field.annotation):
            is_list = typing.get_origin(field.annotation) is list
            sub_path = f"{path}.{name}" if path else name
            nested.append((f"{sub_path}[]" if is_list else sub_path, sub))
    out.append("")
    for sub_path, sub in nested:
        if sub_path not in seen:
            seen.add(sub_path)
            _section(sub_path, sub, out, seen)


def render_config_reference() -> str:
    """The Markdown of the config reference page: every section and field of `RunConfig`."""
    from rollart.app.config import RunConfig

    out = ["# Config reference", "",
           "Every key of a run config (`rollart plan` / `rollart run CONFIG`), generated from the pydantic models",
           "in `rollart.app.config` when the docs are built. Unknown keys are errors; `--set dotted.key=value`",
           "overrides any of them (list items by index: `rollout.pools.0.devices=2`). Examples: `examples/configs/`.",
           ""]
    _section("", RunConfig, out, set())
    return "\n".join(out)


if __name__ == "<run_path>":  # mkdocs-gen-files
    import mkdocs_gen_files

    with mkdocs_gen_files.open("config-reference.md", "w") as page:
        page.write(render_config_reference())
elif __name__ == "__main__":
    print(render_config_reference())
