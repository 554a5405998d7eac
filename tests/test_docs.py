"""The docs site: the generated config reference and API pages (issue 14 item 3), its figures and the
pages that include the examples (issue 25 item 6)."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
import types
from pathlib import Path

from pydantic import BaseModel

from rollart.app import config as config_module

ROOT = Path(__file__).resolve().parents[1]


def _load(name: str) -> types.ModuleType:
    spec = importlib.util.spec_from_file_location(name, ROOT / "docs" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("mkdocs_gen_files", types.ModuleType("mkdocs_gen_files"))  # only used at build time
    spec.loader.exec_module(module)
    return module


def test_config_reference_lists_every_field_of_every_section_with_a_description():
    page = _load("gen_config_reference").render_config_reference()
    models = [m for m in vars(config_module).values()
              if isinstance(m, type) and issubclass(m, BaseModel) and m.__module__ == config_module.__name__
              and not m.__name__.startswith("_")]
    assert len(models) >= 12
    for model in models:
        assert f"`{model.__name__}`" in page, model.__name__
        for name, field in model.model_fields.items():
            assert field.description, f"{model.__name__}.{name} has no docstring (the reference shows it)"
            assert f"| `{name}` |" in page, f"{model.__name__}.{name}"
    assert "## `tasks[]`" in page and "## `rollout.pools[]`" in page and "## `tasks[].reward`" in page


def test_api_pages_document_each_public_module_once():
    gen = _load("gen_api")
    for pkg in gen.PACKAGES:
        modules = gen.public_modules(pkg)
        assert modules and len(modules) == len(set(modules))
        page = gen.render_page(pkg)
        assert page.count(f"::: rollart.{pkg}\n") == 1 and "members: false" in page  # no re-exports twice
        assert all(not part.startswith("_") for m in modules for part in m.split(".")[2:])
    assert "rollart.train.models" in gen.public_modules("train")
    for mod in gen.MODULES:
        assert (ROOT / "packages" / f"rollart-{mod}" / "src" / "rollart" / f"{mod}.py").is_file()
        assert gen.render_module_page(mod).count(f"::: rollart.{mod}\n") == 1


def _table_rows(page: str) -> list[list[str]]:
    """The cells of every field row, split where Python-Markdown splits them (at each unescaped `|`)."""
    rows = []
    for line in page.splitlines():
        if line.startswith("| `"):
            rows.append([c.strip() for c in re.split(r"(?<!\\)\|", line.strip())[1:-1]])
    return rows


def test_config_reference_type_cells_hold_no_pipe_or_backslash():
    """A union rendered `str | None` split its cell, escaped as `str \\| None` it showed the backslash (issue 25)."""
    rows = _table_rows(_load("gen_config_reference").render_config_reference())
    assert len(rows) > 50
    for row in rows:
        assert len(row) == 5, row  # field, type, default, constraints, description: nothing split a cell
        assert "\\" not in row[1] and "|" not in row[1], row
    types_shown = {row[1] for row in rows}
    assert "`str` or `None`" in types_shown and "`str`, `RewardService` or `None`" in types_shown
    assert "one of `Qwen3-8B`, `Qwen3-32B`, `Qwen3-30B-A3B`, `Qwen3-235B-A22B` or `None`" in types_shown


DOCS = ROOT / "docs"
_IMAGE = re.compile(r"!\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
_SNIPPET = re.compile(r"^\s*-{1,}8<-{1,}\s+\"([^\"]+)\"", re.M)


def test_every_image_a_docs_page_references_exists():
    """A missing figure renders as a broken image; mkdocs --strict does not catch it in every case."""
    found = 0
    for page in sorted(DOCS.glob("*.md")):
        for target in _IMAGE.findall(page.read_text()):
            assert "://" not in target, f"{page.name}: {target} is outside the repository"
            found += 1
            assert (page.parent / target).is_file(), f"{page.name} shows {target}, which does not exist"
    assert found >= 3  # the simulator's timeline and the demo's two figures


def test_getting_started_shows_the_demo_figures_the_script_draws():
    text = (DOCS / "getting-started.md").read_text()
    for name in ("demo_reward.png", "demo_timeline.png"):
        assert f"(img/{name})" in text
        assert (DOCS / "img" / name).stat().st_size < 150_000, f"{name}: keep committed PNGs small"
    assert "scripts/docs_figures.py" in text and "first-env-and-pipeline.md" in text


def test_overview_page_draws_the_architecture_in_mermaid():
    text = (DOCS / "index.md").read_text()
    blocks = re.findall(r"^```mermaid\n(.*?)^```", text, re.M | re.S)
    assert len(blocks) >= 2
    layering = blocks[0]
    for pkg in ("rollart-app", "rollart-scheduler", "rollart-train", "rollart-proxy", "rollart-reward",
                "rollart-sync", "rollart-env", "rollart-resource", "rollart-checks"):
        assert pkg in layering, pkg
    flow = "\n".join(blocks[1:])
    for part in ("EnvManager", "LLMProxy", "inference workers", "ScoringSink", "SampleBuffer", "trainer",
                 "TimeSharingController", "shrink", "expand", "load_weights"):
        assert part in flow, part
    mkdocs = (ROOT / "mkdocs.yml").read_text()
    assert "name: mermaid" in mkdocs and "pymdownx.superfences.fence_code_format" in mkdocs


def test_first_env_page_includes_existing_files_and_is_in_the_nav():
    text = (DOCS / "first-env-and-pipeline.md").read_text()
    included = _SNIPPET.findall(text)
    assert set(included) >= {"examples/user_env.py", "examples/configs/user_env.yaml", "examples/frozenlake_grpo.py"}
    for path in included:
        assert (ROOT / path).is_file(), f"the page includes {path}, which does not exist"
    mkdocs = (ROOT / "mkdocs.yml").read_text()
    assert "first-env-and-pipeline.md" in mkdocs and "check_paths: true" in mkdocs
    assert "first-env-and-pipeline.md" in (ROOT / "README.md").read_text()


def test_the_hand_composed_pipeline_the_first_env_page_shows_runs(tmp_path):
    """The page says its code blocks are the code the tests run; this is the test for frozenlake_grpo.py."""
    env = {**os.environ, "TMPDIR": str(tmp_path)}  # the script writes its run directory with mkdtemp
    done = subprocess.run([sys.executable, str(ROOT / "examples" / "frozenlake_grpo.py"), "--iterations", "2"],
                          capture_output=True, text=True, timeout=300, env=env, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    assert re.search(r"^iter\s+2\s+reward [+-]\d", done.stdout, re.M), done.stdout
    (metrics,) = tmp_path.glob("frozenlake-*/metrics.jsonl")
    assert len(metrics.read_text().splitlines()) == 2
