"""The package's import graph: its layers, bottom up, each importing only the ones below it, and no circle.

The library is six packages, one layer each (:data:`LAYERS`): the graph and lower-set ``core``;
``capture`` (the joint trace, costs, timing, workspaces); ``pricing`` (schedules, the simulator, block
costs, memory models); ``planners`` (the registry with ``Plan``, the planners, the pebble-game
schedules); ``rewrites`` (late, at the peak, in place, cheap remat, one pipeline); and the ``doors``
(optimize, backend, execute, measure, baselines, exactness). Every import statement counts, wherever
it stands (a function-level "late" import or one under ``TYPE_CHECKING`` hides an edge, it does not
remove it). Importing ``a.b.c`` runs the packages ``a.b`` and ``a`` first, so those are edges too,
except the importer's own enclosing packages (already being imported when it runs).
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


LAYERS = ("core", "capture", "pricing", "planners", "rewrites", "doors")
TOP_LEVEL_MODULES = 8  # at most, beside the layers' packages


def layer(module: str) -> int | None:
    """The layer of a module of the package (None: the package itself, above every layer)."""
    parts = module.split(".")
    return LAYERS.index(parts[1]) if len(parts) > 1 and parts[1] in LAYERS else None


def upward(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    """The imports of a module from a layer above its own."""
    return sorted((m, n) for m, ns in graph.items() for n in ns
                  if layer(m) is not None and layer(n) is not None and layer(n) > layer(m))


def test_each_layer_imports_only_the_layers_below_it():
    assert upward(import_graph()) == []


def test_an_import_from_a_higher_layer_fails_the_check():
    graph = {"recompute.core.graph": {"recompute.doors.optimize"}, "recompute.doors.optimize": {"recompute.core.graph"}}
    assert upward(graph) == [("recompute.core.graph", "recompute.doors.optimize")]


def _outside(path: Path) -> set[str]:
    """The repository's packages beside the library (the app, its benchmarks) that a file imports."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            names.add(node.module.split(".")[0])
    return names & {"experiments", "benchmarks", "hydra_plugins", "run", "scripts", "tests"}


def test_the_library_imports_nothing_of_the_repository_around_it():
    assert {m: found for m, p in _modules().items() if (found := _outside(p))} == {}


def test_the_package_is_its_layers_and_few_modules():
    packages = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").exists()}
    assert packages == set(LAYERS)
    assert len(list(PACKAGE.glob("*.py"))) <= TOP_LEVEL_MODULES
    assert all(layer(m) is not None for m in _modules() if m != "recompute")


def test_the_library_needs_none_of_the_apps_dependencies():
    """``pip install .`` without extras: planning and training a model imports no Hydra, W&B, pandas or
    matplotlib (the app's: ``pip install .[app]``)."""
    app = ("hydra", "omegaconf", "wandb", "pandas", "matplotlib", "segmentation_models_pytorch")
    code = ("import sys, torch, recompute; m = recompute.optimize(torch.nn.Sequential(torch.nn.Linear(4, 4), "
            "torch.nn.ReLU(), torch.nn.Linear(4, 1)), (torch.randn(8, 4),)); m(torch.randn(8, 4)).sum().backward(); "
            f"print([n for n in {app!r} if n in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip().splitlines()[-1] == "[]", out.stdout


def test_the_graph_sees_late_and_type_only_imports():
    graph = import_graph()
    assert "recompute.planners.registry" in graph["recompute.planners.dp"]
    assert "recompute.capture.trace" in graph["recompute.pricing.schedule"]  # under TYPE_CHECKING
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_import_circle():
    assert circles(import_graph()) == []


def test_import_recompute_leaves_dynamo_and_the_solvers_libraries_to_their_first_use():
    # TorchDynamo (which AOTAutograd imports), inductor, sympy and networkx took `import recompute`
    # from 3.6 s to 9.5 s on this host: every CLI run that stops at a config mistake paid them
    heavy = ("torch._dynamo", "torch._inductor", "torch._functorch.aot_autograd", "sympy", "networkx")
    code = (f"import sys, recompute; recompute.plan; print([m for m in {heavy!r} if m in sys.modules]); "
            "from recompute.doors.backend import backend; print(recompute.backend is backend)")  # the lazy name resolves
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split("\n")[:2] == ["[]", "True"], out.stdout
