"""The package's import graph has no circle: each module imports only modules below it.

Every import statement counts, wherever it stands (a function-level "late" import or one under
``TYPE_CHECKING`` hides a circle, it does not remove it). Importing ``a.b.c`` runs the packages
``a.b`` and ``a`` first, so those are edges too, except the importer's own enclosing packages
(already being imported when it runs).
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "recompute"


def _modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def _imported(module: str, path: Path, known: set[str]) -> set[str]:
    """The package modules ``module`` imports (anywhere in its file), with the packages they run."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join([*package.split(".")[: len(package.split(".")) - node.level + 1], *filter(None, [base])])
            names.add(base)
            names |= {f"{base}.{a.name}" for a in node.names}  # ``from . import lowerset`` imports a module
    ancestors = {module.rsplit(".", i)[0] for i in range(module.count(".") + 1)}
    edges = set()
    for name in names:
        parts = name.split(".")
        for i in range(1, len(parts) + 1):
            prefix = ".".join(parts[:i])
            if prefix in known and prefix not in ancestors and prefix != module:
                edges.add(prefix)
    return edges


def import_graph() -> dict[str, set[str]]:
    modules = _modules()
    return {m: _imported(m, p, set(modules)) for m, p in modules.items()}


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    return found


def test_the_graph_sees_late_and_type_only_imports():
    graph = import_graph()
    assert "recompute.plan" in graph["recompute.planners.dp"]
    assert "recompute.trace" in graph["recompute.schedule"]  # under TYPE_CHECKING
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_import_circle():
    assert circles(import_graph()) == []


def test_import_recompute_leaves_dynamo_and_the_solvers_libraries_to_their_first_use():
    # TorchDynamo (which AOTAutograd imports), inductor, sympy and networkx took `import recompute`
    # from 3.6 s to 9.5 s on this host: every CLI run that stops at a config mistake paid them
    heavy = ("torch._dynamo", "torch._inductor", "torch._functorch.aot_autograd", "sympy", "networkx")
    code = (f"import sys, recompute; recompute.plan; print([m for m in {heavy!r} if m in sys.modules]); "
            "from recompute.dynamo import backend; print(recompute.backend is backend)")  # the lazy name resolves
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split("\n")[:2] == ["[]", "True"], out.stdout
