"""The house's shape in figures: modules per folder, longest functions, SQL outside kb/, local imports.

Run `python bench/house.py` before and after a restructuring; issue 38's note quotes its output. Reads the
source with `ast` only (no import of advisor), so it runs on any checkout.
"""

import ast
import re
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent / "advisor"
SQL = re.compile(
    r"^\s*(SELECT\b.*\bFROM\b|SELECT\s+\w+\(|INSERT\s+(OR\s+\w+\s+)?INTO|UPDATE\s+\w+\s+SET|DELETE\s+FROM|CREATE\s+"
    r"(TABLE|INDEX|VIEW|TEMP|UNIQUE)|DROP\s+(TABLE|INDEX|VIEW)|ALTER\s+TABLE|PRAGMA\s+\w|ATTACH\s|BEGIN\b|WITH\s+\w+\s+AS)",
    re.S,
)
HEAVY = ("torch", "numpy", "transformers", "datasets", "scipy", "pandas", "peft")


def modules() -> list[Path]:
    return sorted(p for p in ROOT.rglob("*.py") if "__pycache__" not in p.parts)


def per_folder() -> Counter:
    return Counter(str(p.parent.relative_to(ROOT.parent)) for p in modules() if p.name != "__init__.py")


def longest_functions(n: int = 10) -> list[tuple[int, str]]:
    found = []
    for p in modules():
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                found.append((node.end_lineno - node.lineno + 1, f"{p.relative_to(ROOT.parent)}:{node.name}"))
    return sorted(found, reverse=True)[:n]


LONG = (
    600  # issue 49: no module over this many lines, but the migrations and the rules' schema (data as code)
)
EXEMPT = ("migrations.py", "rules_schema.py")


def long_modules() -> list[tuple[int, str]]:
    """(lines, module) of every module over LONG lines, the exempt ones marked."""
    found = [(len(p.read_text().splitlines()), p) for p in modules()]
    return sorted(
        (
            (n, f"{p.relative_to(ROOT.parent)}{' (exempt)' if p.name in EXEMPT else ''}")
            for n, p in found
            if n > LONG
        ),
        reverse=True,
    )


def _text(node: ast.AST) -> str | None:
    """A string literal's text, an f-string's literal parts joined; None for anything else."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(v.value if isinstance(v, ast.Constant) else "x" for v in node.values)
    return None


def sql_outside_kb() -> list[str]:
    """SQL statements (string literals that read as one) and `.execute*(` calls in modules outside advisor/kb/."""
    hits = set()
    for p in modules():
        if (ROOT / "kb") in p.parents:
            continue
        for node in ast.walk(ast.parse(p.read_text())):
            text = _text(node)
            called = isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            if (text and SQL.match(text)) or (
                called and node.func.attr in ("execute", "executemany", "executescript")
            ):
                hits.add(f"{p.relative_to(ROOT.parent)}:{node.lineno}")
    return sorted(hits, key=lambda h: (h.split(":")[0], int(h.split(":")[1])))


def _top_level_heavy(tree: ast.Module) -> bool:
    for node in tree.body:
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
        if isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module]
        if any(n.split(".")[0] in HEAVY for n in names):
            return True
    return False


def local_project_imports() -> list[str]:
    """Imports of advisor's own modules inside a function of a module that already loads a heavy library."""
    hits = []
    for p in modules():
        tree = ast.parse(p.read_text())
        if not _top_level_heavy(tree):
            continue
        for fn in ast.walk(tree):
            if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            for node in ast.walk(fn):
                if isinstance(node, ast.ImportFrom) and (
                    node.level or (node.module or "").startswith("advisor")
                ):
                    hits.append(f"{p.relative_to(ROOT.parent)}:{node.lineno}")
    return sorted(set(hits))


def function_level_imports() -> tuple[int, int]:
    """(imports of advisor's own modules inside a function, those of them with no comment saying why)."""
    total = bare = 0
    for p in modules():
        lines = p.read_text().splitlines()
        for fn in ast.walk(ast.parse("\n".join(lines))):
            if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            for node in ast.walk(fn):
                if isinstance(node, ast.ImportFrom) and (
                    node.level or (node.module or "").startswith("advisor")
                ):
                    total += 1
                    said = "#" in lines[node.lineno - 1] or "#" in lines[node.end_lineno - 1]
                    above = lines[node.lineno - 2].strip() if node.lineno > 1 else ""
                    bare += not (said or above.startswith(("#", "from advisor")))
    return total, bare


def main() -> None:
    folders = per_folder()
    print("modules per folder:")
    for folder, count in sorted(folders.items()):
        print(f"  {count:3d}  {folder}")
    print(f"largest folder: {max(folders.values())} modules; {len(modules())} files in all")
    long = long_modules()
    print(
        f"modules over {LONG} lines: {sum('exempt' not in m for _, m in long)} (and {sum('exempt' in m for _, m in long)} exempt)"
    )
    for lines, name in long:
        print(f"  {lines:4d}  {name}")
    print("longest functions (lines):")
    for lines, name in longest_functions():
        print(f"  {lines:4d}  {name}")
    sql = sql_outside_kb()
    print(f"SQL statements outside advisor/kb/: {len(sql)}")
    for hit in sql:
        print(f"  {hit}")
    local = local_project_imports()
    print(
        f"project imports inside functions of modules that load {'/'.join(HEAVY[:2])}... at the top: {len(local)}"
    )
    if "-v" in sys.argv:
        for hit in local:
            print(f"  {hit}")
    total, bare = function_level_imports()
    print(f"imports of advisor's modules inside functions: {total} ({bare} with no comment saying why)")


if __name__ == "__main__":
    main()
