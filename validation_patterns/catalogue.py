"""Render the pattern library as a Markdown catalogue (the docs site's validation-pattern page)."""

from __future__ import annotations

from validation_patterns.library import load_library, parse_annotation, render


def render_catalogue() -> str:
    lib = load_library()
    out = [
        "# Validation-pattern catalogue",
        "",
        f"Generated from `validation_patterns/patterns.yaml` (library version {lib.version}). "
        "Annotate code with `# VAL: ID(args)` or `# AST: ID(args)` and run `make expand`; "
        "every pattern also accepts `exc=YourError` to raise a package's own exception class and "
        "`name=\"...\"` to say how the message names the value. Each annotation expands to one line "
        "calling the runtime `rollart.checks` (the rollart-checks distribution, one module every package imports).",
        "",
        "| id | checks | raises |",
        "|---|---|---|",
    ]
    out += [f"| [`{p.id}`](#{p.id.lower()}) | {p.checks} | `{p.exception}` |" for p in lib.patterns.values()]
    for p in lib.patterns.values():
        out += ["", f"## {p.id}", "", p.checks, "", "| parameter | kind | default | meaning |", "|---|---|---|---|"]
        out += [f"| `{prm.name}` | {prm.kind} | {('`' + prm.default + '`') if prm.default is not None else 'required'} | {prm.doc} |"
                for prm in p.params]
        example_args = ", ".join(f"{prm.name}" for prm in p.params if prm.default is None)
        example = f"{p.id}({example_args})"
        body = "\n".join(render(parse_annotation(p.family, example)))
        out += ["", f"Raises `{p.exception}` with the message `{p.message}`.", "", "Example expansion:", "",
                "```python", f"# {p.family}: {example}", body, "```"]
    return "\n".join(out) + "\n"
