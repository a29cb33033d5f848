"""The import graph: the plain packages load without Lightning, and no vision_tx module imports itself back."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "vision_tx"


def test_data_metrics_backbones_and_models_import_without_lightning() -> None:
    """In a fresh interpreter. ``lightning_utilities`` (torchmetrics' helper package, which ``MeanIoU``
    brings) is not Lightning and may load."""
    code = (
        "import sys, vision_tx.data, vision_tx.metrics, vision_tx.backbones, vision_tx.models\n"
        "loaded = [m for m in sys.modules if m.split('.')[0] in ('lightning', 'pytorch_lightning')]\n"
        "assert not loaded, loaded[:5]\n"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=PACKAGE.parent, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(path: Path, known: set[str]) -> set[str]:
    """The vision_tx modules ``path`` imports anywhere (at the top or inside functions)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module, *(f"{node.module}.{alias.name}" for alias in node.names)]
        found.update(name for name in names if name in known)
    return found


def import_graph() -> dict[str, set[str]]:
    files = {module_name(path): path for path in PACKAGE.rglob("*.py")}
    graph = {name: imported_modules(path, set(files)) for name, path in files.items()}
    # Importing ``a.b.c`` runs the packages ``a.b`` and ``a`` first, except those the importer is inside
    # (a package's ``__init__`` may import its own modules).
    for name, targets in graph.items():
        parents = {".".join(t.split(".")[:i]) for t in targets for i in range(2, t.count(".") + 1)}
        targets.update(p for p in parents if not name.startswith(p + "."))
        targets.discard(name)
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    done: set[str] = set()
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        if node in stack:
            return stack[stack.index(node) :] + [node]
        if node in done:
            return None
        stack.append(node)
        for target in sorted(graph.get(node, ())):
            cycle = visit(target)
            if cycle:
                return cycle
        stack.pop()
        done.add(node)
        return None

    for node in sorted(graph):
        cycle = visit(node)
        if cycle:
            return cycle
    return None


def test_find_cycle_finds_a_planted_circle() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) is None


def test_no_import_circle_inside_vision_tx() -> None:
    cycle = find_cycle(import_graph())
    assert cycle is None, " -> ".join(cycle)


def test_model_files_import_no_sibling_but_the_shared_room() -> None:
    """``vision_tx/models/`` is one floor of siblings: a model file reads another's code only through the shared
    room (``query_detector``), besides its own official layout (``<model>_official``); an official layout may build
    on another's (D-FINE's checkpoints are RT-DETR's layout renamed); the package's face and the converter
    (``convert``) compose the models."""
    for name, targets in import_graph().items():
        if name.startswith("vision_tx.models.") and name != "vision_tx.models.convert":
            layouts = {t for t in targets if t.endswith("_official")} if name.endswith("_official") else set()
            siblings = (
                {t for t in targets if t.startswith("vision_tx.models")}
                - {"vision_tx.models.query_detector", f"{name}_official"}
                - layouts
            )
            assert not siblings, f"{name} imports {', '.join(sorted(siblings))}"
