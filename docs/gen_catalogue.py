"""Generate the validation-pattern catalogue page from the library at docs build time."""

from __future__ import annotations

import sys
from pathlib import Path

import mkdocs_gen_files

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from validation_patterns.catalogue import render_catalogue  # noqa: E402

with mkdocs_gen_files.open("validation-patterns.md", "w") as page:
    page.write(render_catalogue())
