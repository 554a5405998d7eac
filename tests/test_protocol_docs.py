"""Every `typing.Protocol` states its contract in the API reference (issue 25 item 5).

Why a test: the API pages (docs/gen_api.py, mkdocstrings) show no entry for a member without a
docstring, so a Protocol method left bare is a seam a newcomer cannot see. This walks the source
with `ast` (no import, so a missing optional dependency cannot hide a module) and names each
public method, property or attribute of a Protocol class that has no docstring.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOURCES = sorted(ROOT.glob("packages/*/src/**/*.py"))
PROTOCOL_NAMES = {"Protocol", "typing.Protocol", "typing_extensions.Protocol"}


def _dotted(node: ast.expr) -> str:
    """`a.b.c` for a Name/Attribute chain, "" for anything else."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        inner = _dotted(node.value)
        return f"{inner}.{node.attr}" if inner else ""
    return ""


def is_protocol(cls: ast.ClassDef) -> bool:
    """True when one of the bases is `Protocol`, `typing.Protocol` or `Protocol[...]`."""
    for base in cls.bases:
        target = base.value if isinstance(base, ast.Subscript) else base
        if _dotted(target) in PROTOCOL_NAMES:
            return True
    return False


def undocumented_members(cls: ast.ClassDef) -> list[str]:
    """Names of the public methods, properties and annotated attributes of `cls` without a docstring.

    An attribute's docstring is the string literal right after it (PEP 257, as griffe reads it).
    """
    missing = []
    body = cls.body
    for i, node in enumerate(body):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            if not node.name.startswith("_") and not ast.get_docstring(node):
                missing.append(node.name)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            if node.target.id.startswith("_"):
                continue
            following = body[i + 1] if i + 1 < len(body) else None
            documented = (isinstance(following, ast.Expr) and isinstance(following.value, ast.Constant)
                          and isinstance(following.value.value, str) and following.value.value.strip())
            if not documented:
                missing.append(node.target.id)
    return missing


def protocol_classes() -> list[tuple[str, ast.ClassDef]]:
    found = []
    for path in SOURCES:
        src_root = next(p for p in path.parents if p.name == "src")
        parts = path.relative_to(src_root).with_suffix("").parts
        module = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef) and is_protocol(node):
                found.append((module, node))
    return found


def test_the_walk_finds_the_central_seams():
    names = {f"{module}.{cls.name}" for module, cls in protocol_classes()}
    for expected in ("rollart.env.protocols.Env", "rollart.env.protocols.LLMClient",
                     "rollart.env.protocols.TrajectorySink", "rollart.env.protocols.PromptBuilder",
                     "rollart.reward.protocol.RewardFn", "rollart.sync.model_update.WeightLoader",
                     "rollart.resource.ledger.TransitionHook", "rollart.scheduler.pipeline.Trainer",
                     "rollart.scheduler.settings.PipelineConfig"):
        assert expected in names, expected


def test_protocol_detection_covers_every_spelling():
    tree = ast.parse("import typing\nclass A(Protocol): ...\nclass B(typing.Protocol): ...\n"
                     "class C(Protocol[T]): ...\nclass D(Base, Protocol): ...\nclass E(Base): ...\n")
    classes = [n for n in tree.body if isinstance(n, ast.ClassDef)]
    assert [c.name for c in classes if is_protocol(c)] == ["A", "B", "C", "D"]


def test_member_check_sees_methods_properties_and_attributes():
    tree = ast.parse('class P(Protocol):\n    """doc"""\n    a: int\n    b: int\n    """b doc"""\n'
                     "    def m(self) -> None: ...\n    @property\n    def p(self) -> int: ...\n"
                     '    async def n(self) -> None:\n        """n doc"""\n    def _private(self): ...\n')
    assert undocumented_members(tree.body[0]) == ["a", "m", "p"]


def test_every_protocol_class_and_public_member_has_a_docstring():
    problems = []
    for module, cls in protocol_classes():
        if not ast.get_docstring(cls):
            problems.append(f"{module}.{cls.name} (class)")
        problems += [f"{module}.{cls.name}.{name}" for name in undocumented_members(cls)]
    assert not problems, "Protocol members without a docstring (the API reference hides them):\n  " + \
        "\n  ".join(problems)
