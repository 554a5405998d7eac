"""Generate one API reference page per package at docs build time (mkdocs-gen-files).

Why generated: each public name is documented once, in the module that defines it (the package
page shows only the package docstring, not its re-exports), and a new module appears without
anyone editing a page. Private modules (`_name`) and `__main__` are left out.
"""

from __future__ import annotations

from pathlib import Path

import mkdocs_gen_files

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("resource", "proxy", "env", "reward", "sync", "train", "scheduler", "app")
# distributions that are one module in the namespace (rollart-checks): one page, every member shown
MODULES = ("checks",)


def public_modules(package: str) -> list[str]:
    """Dotted names of the package's public modules and sub-packages, in path order."""
    src = ROOT / "packages" / f"rollart-{package}" / "src"
    out = []
    for path in sorted((src / "rollart" / package).rglob("*.py")):
        parts = path.relative_to(src).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        if len(parts) > 2 and not any(p.startswith("_") for p in parts[2:]):
            out.append(".".join(parts))
    return out


def render_page(package: str) -> str:
    """The Markdown of `api/<package>.md`: the package docstring, then every public module."""
    lines = [f"# rollart.{package}", "", f"::: rollart.{package}", "    options:", "      members: false",
             "      show_root_heading: false", ""]
    for module in public_modules(package):
        lines += [f"::: {module}", "    options:", "      heading_level: 2", ""]
    return "\n".join(lines)


def render_module_page(module: str) -> str:
    """The Markdown of `api/<module>.md` for a one-module distribution: its docstring and every function."""
    return "\n".join([f"# rollart.{module}", "", f"::: rollart.{module}", "    options:", "      show_root_heading: false", ""])


if __name__ == "<run_path>":  # mkdocs-gen-files
    for pkg in PACKAGES:
        with mkdocs_gen_files.open(f"api/{pkg}.md", "w") as page:
            page.write(render_page(pkg))
    for mod in MODULES:
        with mkdocs_gen_files.open(f"api/{mod}.md", "w") as page:
            page.write(render_module_page(mod))
