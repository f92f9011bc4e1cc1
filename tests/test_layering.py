"""The architecture as the code has it, not as prose promises it: no import cycle between modules, no upward
import between the layers (pyproject.toml's import-linter contract: function-level imports count), and the
step's vocabulary a leaf that both sides of the torch line share."""

import ast
from pathlib import Path

import grimp
from importlinter.cli import lint_imports

REPO = Path(__file__).resolve().parent.parent
LEAF = REPO / "advisor" / "prediction" / "step.py"


def test_no_upward_import_between_the_layers(monkeypatch):
    monkeypatch.chdir(REPO)
    assert lint_imports(config_filename=str(REPO / "pyproject.toml"), no_cache=True, no_logo=True) == 0


def test_no_module_imports_itself_through_another():
    graph = grimp.build_graph("advisor", cache_dir=None)
    cycles = set()
    for module in graph.modules:
        for imported in graph.find_modules_directly_imported_by(module):
            back = graph.find_shortest_chain(importer=imported, imported=module)
            if back:
                cycles.add(tuple(sorted((module, imported))))
    assert not cycles, f"import cycles: {sorted(cycles)}"


def test_the_traced_steps_vocabulary_imports_nothing_of_ours():
    tree = ast.parse(LEAF.read_text())
    ours = [
        n.module if isinstance(n, ast.ImportFrom) else a.name
        for n in ast.walk(tree)
        if isinstance(n, ast.Import | ast.ImportFrom)
        for a in n.names
        if (n.module if isinstance(n, ast.ImportFrom) else a.name or "").split(".")[0]
        in ("advisor", "measure")
    ]
    assert ours == []
