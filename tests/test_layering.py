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


def _contract(name_starts: str) -> dict:
    import tomllib

    contracts = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    return next(c for c in contracts if c["name"].startswith(name_starts))


def test_every_wing_of_measuring_is_a_layer_of_its_contract():
    """A new sub-folder or module of advisor/measuring/ is placed in the layers, never left outside them."""
    contract = _contract("measuring's wings")
    placed = {name.strip() for layer in contract["layers"] for name in layer.split("|")}
    measuring = REPO / "advisor" / "measuring"
    present = {p.stem for p in measuring.glob("*.py") if p.name != "__init__.py"}
    present |= {p.name for p in measuring.iterdir() if (p / "__init__.py").exists()}
    assert present == placed


def test_no_folder_of_advisor_holds_more_than_a_dozen_modules():
    """Issue 38: a folder past about twelve modules hides its jobs; split it into wings."""
    folders = {}
    for p in (REPO / "advisor").rglob("*.py"):
        if p.name != "__init__.py" and "__pycache__" not in p.parts:
            folders.setdefault(p.parent.relative_to(REPO).as_posix(), []).append(p.name)
    assert {f: len(m) for f, m in folders.items() if len(m) > 12} == {}


# Folders of tests/ that name no package of advisor: the fixtures, and the fault catalogue, which attacks
# every command at once (hostile files, inputs, processes) and so belongs to no one package.
NOT_A_PACKAGE = {"fixtures", "faults"}


def test_every_test_folder_mirrors_a_package_of_advisor():
    """Issue 49: tests/measuring/grid/ tests advisor/measuring/grid/, so a test is found where its code is."""
    tests = REPO / "tests"
    folders = {
        p.relative_to(tests)
        for p in tests.rglob("*")
        if p.is_dir() and "__pycache__" not in p.parts and p.relative_to(tests).parts[0] not in NOT_A_PACKAGE
    }
    assert folders, "no test folders found"
    assert sorted(str(f) for f in folders if not (REPO / "advisor" / f / "__init__.py").is_file()) == []
