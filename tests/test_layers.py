"""The layers of DESIGN.md ("Layout") hold: no import runs up, no circle, followed transitively.

Every import counts, at module level or inside a function (a lazy import is still a dependency), except those
under ``if TYPE_CHECKING:``. Importing ``autosync.a.b`` also runs ``autosync/a/__init__.py``, so a subpackage's
``__init__`` is a dependency of each of its modules. The root ``autosync/__init__.py`` loads the API lazily
(PEP 562) and is checked apart: at import time it may import only the lowest layers.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parent.parent / "autosync"

#: DESIGN.md's layer order, lowest first; each layer may import only itself and the layers before it
LAYERS = [
    ("errors", "validation", "context", "cluster", "workloads", "cache", "outputs"),
    ("plans",),
    ("strategy",),
    ("datasets",),
    ("executor",),
    ("profiler",),
    ("efficiency",),
    ("models",),
    ("search",),
    ("present",),
    ("api",),
    ("integrations",),
    ("cli",),
]


def layer_of(module: str) -> int:
    """The layer of ``module``; the root package (the public face, loading the API lazily) is above them all."""
    if "." not in module:
        return len(LAYERS)
    top = module.split(".")[1]
    for i, names in enumerate(LAYERS):
        if top in names:
            return i
    raise AssertionError(f"{module} belongs to no layer of DESIGN.md: add it to LAYERS (and to DESIGN.md)")


def _name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_type_checking(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)


def _imports(tree: ast.AST, module: str, is_pkg: bool, known: set[str], top_level_only: bool = False) -> set[str]:
    """The autosync modules ``tree`` imports (resolved to the longest known module name)."""
    def resolve(name: str) -> str | None:
        while name and name not in known:
            name = name.rpartition(".")[0]
        return name or None

    found: set[str] = set()

    def visit(node: ast.AST, depth: int) -> None:
        if _is_type_checking(node):
            return
        if isinstance(node, ast.Import):
            found.update(filter(None, (resolve(a.name) for a in node.names if a.name.startswith("autosync"))))
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                pkg = module if is_pkg else module.rpartition(".")[0]
                for _ in range(node.level - 1):
                    pkg = pkg.rpartition(".")[0]
                base = f"{pkg}.{base}" if base else pkg
            if base.startswith("autosync"):
                found.update(filter(None, (resolve(f"{base}.{a.name}") for a in node.names)))
        if top_level_only and isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            return
        for child in ast.iter_child_nodes(node):
            visit(child, depth + 1)

    visit(tree, 0)
    found.discard(module)
    return found


def import_graph(root: Path = PKG, parents: bool = True) -> dict[str, set[str]]:
    """module -> the autosync modules it depends on: its imports and, with ``parents``, its parent packages (the
    root's excepted), whose ``__init__`` runs first. A parent's ``__init__`` importing its own modules is how
    packages work, so circles are looked for without the parent edges."""
    files = {_name(p, root): p for p in root.rglob("*.py")}
    known = set(files)
    graph = {}
    for module, path in files.items():
        deps = _imports(ast.parse(path.read_text()), module, path.name == "__init__.py", known)
        parent = module.rpartition(".")[0]
        while parents and parent.count("."):          # autosync.a.b depends on autosync.a (not on the lazy root)
            deps.add(parent)
            parent = parent.rpartition(".")[0]
        deps.discard(module)
        graph[module] = deps
    return graph


def reach(graph: dict[str, set[str]], start: str) -> dict[str, list[str]]:
    """Every module ``start`` reaches, with one path to it."""
    paths, todo = {start: [start]}, [start]
    while todo:
        m = todo.pop()
        for d in sorted(graph.get(m, ())):
            if d not in paths:
                paths[d] = paths[m] + [d]
                todo.append(d)
    return paths


def violations(root: Path = PKG) -> list[str]:
    graph, explicit = import_graph(root), import_graph(root, parents=False)
    found = []
    for module in sorted(graph):
        if module == PKG.name:
            continue
        for target, path in reach(graph, module).items():
            if layer_of(target) > layer_of(module):
                found.append(f"{module} reaches {target}, a higher layer: {' -> '.join(path)}")
        for d in sorted(explicit[module]):
            back = reach(explicit, d)
            if module in back:
                found.append(f"circle: {' -> '.join([module] + back[module])}")
    return found


def test_no_import_runs_up_and_there_is_no_circle():
    assert violations() == []


def test_the_root_package_imports_only_the_lowest_layers_at_import_time():
    root = PKG / "__init__.py"
    known = set(import_graph())
    eager = _imports(ast.parse(root.read_text()), PKG.name, True, known, top_level_only=True)
    assert all(layer_of(m) <= layer_of("autosync.strategy") for m in eager), eager


def test_the_cost_model_and_the_registry_reach_nothing_of_the_executor():
    graph = import_graph()
    for module in graph:
        if module.startswith(("autosync.models", "autosync.plans")):
            reached = [m for m in reach(graph, module) if m.startswith("autosync.executor")]
            assert reached == [], f"{module} reaches {reached}: {' -> '.join(reach(graph, module)[reached[0]])}"


def test_the_check_fails_on_a_deliberate_bad_import(tmp_path):
    """A copy of the package with imports running up: the store importing the API (the API imports the store:
    a circle too) and the context importing the strategy."""
    import shutil

    copy = tmp_path / "autosync"
    shutil.copytree(PKG, copy, ignore=shutil.ignore_patterns("data", "v2", "pretrained", "__pycache__"))
    store = copy / "datasets" / "store.py"
    store.write_text(store.read_text() + "\n\ndef _bad():\n    from autosync import api  # noqa: F401\n")
    context = copy / "context.py"        # and the lowest layer importing the strategy, which imports it back
    context.write_text(context.read_text() + "\n\ndef _bad():\n    from autosync.strategy import Strategy  # noqa: F401\n")
    found = violations(copy)
    assert any("autosync.datasets.store reaches autosync.api" in f for f in found), found[:3]
    assert any("autosync.context reaches autosync.strategy" in f for f in found), found[:3]
    assert any(f.startswith("circle:") for f in found), found[:3]


@pytest.mark.parametrize("folder", sorted(p.name for p in PKG.iterdir() if p.is_dir() and (p / "__init__.py").exists()))
def test_every_subpackage_has_a_layer(folder):
    layer_of(f"autosync.{folder}")
