"""Table 1 of Feng & Huang (2018): Re-forwarding's memory ratio on their networks, ours beside theirs.

    python -m experiments.feng_table1 --write          # paper_figures/feng2018_table1.json, then .{md,csv} from it
    python -m experiments.feng_table1 --render         # paper_figures/feng2018_table1.{md,csv} from the JSON only
    python -m experiments.feng_table1 --nets alexnet resnet18

Every network of their Table 1 (torchvision, random weights) at their batch size and input size
(224², Inception v3 300²), traced on FakeTensors, so nothing of paper scale is allocated:

* **theoretical, their model** — Algorithm 6's eq. (1) memory over Σ_v l(v) on their optimization
  graph: a vertex per tensor, an edge per *non-inplace* operation (§5). That is our traced graph with
  every node made by an in-place op (``ReLU(inplace=True)``, ``out += identity``) merged into the
  tensor it overwrote (:func:`tensor_graph`). Beside it: Algorithm 1 alone on the splitting vertexes
  (``reforward_linear``), and Algorithm 6 on our traced graph as it is (one vertex per functional op);
* **measured** — the ``reforward`` plan of their graph, lifted onto our traced graph (:func:`lift`),
  executed on the ``fake`` backend, memory taken as the paper took it: the peak at batch 2B minus the
  peak at batch B (parameters and their gradients cancel), over the same difference for plain
  training; beside it the same for the ``reforward`` plan of the traced graph, and for Chen et al.'s √n
  segmentation (``chen``, cut at the traced graph's articulation points), their table's "Chen [8]" column.

Rows named ``…@2018`` are evidence for the differences, not part of their table: the same network
with a structure as torchvision built it in 2018 (see :data:`VARIANTS`).
"""

from __future__ import annotations

import argparse
import csv
import functools
import gc
import shlex
import sys
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pandas as pd
import torch
import torch.fx as fx
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

import recompute
from recompute.core.graph import Graph

from .record import load_artefact, write_artefact

__all__ = ["REFERENCE", "VARIANTS", "densenet_2018", "dense_block_2018", "paper_rows", "tensor_graph", "lift", "build", "images", "table_row", "run", "markdown", "record", "load", "render"]

REPO = Path(__file__).resolve().parents[1]
REFERENCE = Path(__file__).resolve().parent / "reference" / "feng2018_table1.csv"
OUT = REPO / "paper_figures" / "feng2018_table1"
ARCH = {"inceptionv3": "inception_v3"}  # their row names → torchvision's
INPUT_SIZE = {"inceptionv3": 300}  # §5: Inception v3 at 300², every other network at 224²
MB = 2**20


def paper_rows() -> dict[str, dict[str, float]]:
    """Their Table 1 by network (the copy in ``experiments/reference``)."""
    with REFERENCE.open() as f:
        return {r["network"]: {k: float(v) for k, v in r.items() if k != "network"} for r in csv.DictReader(f)}


# ---------------------------------------------------------------------------------------------------
# Their optimization graph


class _Dispatched(TorchDispatchMode):
    """The ops of a forward pass that depend on its inputs, in the order they run, by name as called
    (``relu_`` for an in-place ReLU: the functional joint graph has lost that)."""

    def __init__(self, inputs: list[torch.Tensor]):
        super().__init__()
        self.live = {id(x) for x in inputs}
        self.ops: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[override]
        out = func(*args, **(kwargs or {}))
        flat = [a for a in tree_flatten((args, kwargs))[0] if isinstance(a, torch.Tensor)]
        if any(id(a) in self.live for a in flat):
            self.live.update(id(t) for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor))
            if not func.is_view:
                self.ops.append(func._schema.name.removeprefix("aten::"))
        return out


def _in_place_nodes(g: Graph) -> set[int]:
    """Nodes of V made by an op that wrote into its first input in the model's own forward (``relu_``,
    ``out += identity``): one forward on FakeTensors records the ops as called, and the k-th node of
    an op in V is the k-th call of that op or of its in-place form."""
    prog = g.program
    specs = [prog.joint.node(name).meta["val"] for name in prog.user_inputs]
    model = prog.module
    with FakeTensorMode(allow_non_fake_inputs=True) as mode:
        xs = [torch.empty(v.shape, dtype=v.dtype) for v in specs]
        buffers = {k: mode.from_tensor(b) for k, b in model.named_buffers(remove_duplicate=False)}
        with torch.no_grad(), _Dispatched(xs) as record:
            torch.func.functional_call(model, buffers, tuple(xs), strict=False)
    calls: dict[str, list[bool]] = {}
    for name in record.ops:
        calls.setdefault(name.rstrip("_"), []).append(name.endswith("_") and not name.endswith("__"))
    seen: dict[str, int] = {}
    out = set()
    for v in range(g.n):  # V is numbered in the traced order
        node = prog.members[v][0]
        base = node.target._schema.name.removeprefix("aten::") if hasattr(node.target, "_schema") else ""
        k = seen.get(base, 0)
        seen[base] = k + 1
        if k < len(calls.get(base, ())) and calls[base][k]:
            out.add(v)
    return out


def tensor_graph(g: Graph) -> tuple[Graph, list[list[int]]]:
    """Feng's optimization graph (§5) from a traced graph: "every vertex is a tensor, every edge is a
    non-inplace operation". A node made by an in-place op holds the storage of the node it overwrote,
    so the two are one vertex, costed once (``M_v`` of the first). Returns the graph and, per vertex,
    its nodes of ``g``."""
    prog = g.program
    rep = list(range(g.n))
    in_place = _in_place_nodes(g)
    for v in g.topo_order:  # the overwritten node comes first, so its representative is final
        node = prog.members[v][0]
        base = node.args[0] if node.args else None
        if v in in_place and isinstance(base, fx.Node) and base.name in prog.group:
            rep[v] = rep[prog.group[base.name]]
    keep = sorted(set(rep))
    index = {r: i for i, r in enumerate(keep)}
    members: list[list[int]] = [[] for _ in keep]
    for v in range(g.n):
        members[index[rep[v]]].append(v)
    edges = {(index[rep[u]], index[rep[v]]) for v in range(g.n) for u in g.preds[v] if rep[u] != rep[v]}
    tg = Graph.from_edges(
        sorted(edges), g.mem[keep], g.time[keep], names=[g.names[r] for r in keep],
        outputs=sorted({index[rep[o]] for o in g.outputs}),
    )
    return tg, members


def lift(g: Graph, plan: recompute.Plan, members: list[list[int]]) -> recompute.Plan:
    """A plan of :func:`tensor_graph`'s graph as a plan of ``g``: each lower set takes the nodes of
    its vertexes. The image of a lower set is one (an in-place node's other inputs are predecessors
    of its vertex), and a stored vertex is cached as its last node: the tensor after the in-place ops."""
    seq = [frozenset(v for t in lower for v in members[t]) for lower in plan.lower_sets]
    return recompute.Plan.from_sequence(g, seq, method=plan.method, **plan.info)


# ---------------------------------------------------------------------------------------------------
# Networks


def dense_block_2018(block: nn.ModuleDict, x: torch.Tensor) -> torch.Tensor:
    """A DenseNet block as torchvision 0.2 (2018) ran it: each layer maps the running concatenation
    to ``growth_rate`` new maps, which are concatenated onto it, so every concatenation is the next
    layer's only input. Today's torchvision concatenates all earlier outputs afresh in every layer."""
    for layer in block.values():
        new = layer.conv2(layer.relu2(layer.norm2(layer.conv1(layer.relu1(layer.norm1(x))))))
        x = torch.cat([x, new], 1)
    return x


def densenet_2018(model: nn.Module) -> nn.Module:
    """``model`` (a torchvision DenseNet) with every dense block run as in 2018 (:func:`dense_block_2018`):
    the same modules and parameters, and the same outputs."""
    from torchvision.models.densenet import _DenseBlock

    for block in model.modules():
        if isinstance(block, _DenseBlock):
            block.forward = functools.partial(dense_block_2018, block)
    return model


VARIANTS: dict[str, tuple[str, Callable[[nn.Module], nn.Module]]] = {
    "densenet121@2018": ("densenet121", densenet_2018),
    "densenet201@2018": ("densenet201", densenet_2018),
}


def build(name: str) -> nn.Module:
    """The torchvision network of row ``name`` (random weights, train mode). Inception v3 is built
    without its auxiliary classifier, whose second output the paper's single-target graph lacks."""
    import torchvision.models as tvm

    base, patch = VARIANTS.get(name, (name, lambda m: m))
    arch = ARCH.get(base, base)
    options: dict[str, Any] = {"aux_logits": False, "init_weights": False} if arch == "inception_v3" else {}
    torch.manual_seed(0)
    return patch(getattr(tvm, arch)(weights=None, **options).train())


def images(name: str, batch: int) -> tuple[torch.Tensor]:
    """A FakeTensor batch at the row's input size: shapes only, nothing allocated."""
    size = INPUT_SIZE.get(VARIANTS.get(name, (name,))[0], 224)
    with FakeTensorMode():
        return (torch.empty(batch, 3, size, size),)


# ---------------------------------------------------------------------------------------------------
# One row


def _ratio(p: recompute.Plan, key: str = "feng_memory") -> float:
    return p.info[key] / p.info["feng_vanilla"]


def _theoretical(g: Graph, image: int) -> dict[str, Any]:
    """Eq. (1) ratios of Algorithms 6 and 1 on their graph and of Algorithm 6 on the traced graph."""
    tg, _ = tensor_graph(g)
    theirs, linear, ours = recompute.plan(tg, "reforward"), recompute.plan(tg, "reforward_linear"), recompute.plan(g, "reforward")
    return {
        "vertices": tg.n, "traced_nodes": g.n, "theoretical_ratio": _ratio(theirs),
        # Algorithm 1's path starts at the source: counted as the input image, s is always stored
        "with_input_ratio": (theirs.info["feng_memory"] + image) / (theirs.info["feng_vanilla"] + image),
        "linear_ratio": _ratio(linear), "traced_ratio": _ratio(ours),
        "traced_executed_ratio": _ratio(ours, "feng_memory_blocks"),
        "solve_seconds": theirs.solve_seconds, "solve_seconds_traced": ours.solve_seconds,
        "solve_seconds_linear": linear.solve_seconds,
        "hierarchy_depth": theirs.info["hierarchy_depth"], "max_terms_tried": theirs.info["max_terms_tried"],
    }


def _peaks(model: nn.Module, inputs: tuple[torch.Tensor], g: Graph) -> dict[str, int]:
    """Peaks on ``fake`` of plain training, of the ``reforward`` plan of their graph (lifted onto the
    traced one), of the ``reforward`` plan of the traced graph and of Chen's √n segmentation."""
    tg, members = tensor_graph(g)
    plans = {"theirs": lift(g, recompute.plan(tg, "reforward"), members), "traced": recompute.plan(g, "reforward"),
             "chen": recompute.plan(g, "chen")}
    out = {"vanilla": recompute.measure(model, inputs, backend="fake").peak_bytes}
    for key, plan in plans.items():
        out[key] = recompute.measure(model, inputs, runner=recompute.execute(g, plan), backend="fake").peak_bytes
    return out


def table_row(name: str, paper: dict[str, dict[str, float]], measure: bool = True) -> dict[str, Any]:
    """Every column of the table for one network (see the module docstring)."""
    start = time.perf_counter()
    ref = paper.get(VARIANTS.get(name, (name,))[0], {})
    batch = int(ref.get("batch", 32))
    model = build(name)
    row: dict[str, Any] = {"network": name, "batch": batch}
    peaks = []
    for b in (batch, 2 * batch) if measure else (batch,):
        inputs = images(name, b)
        g = recompute.trace(model, inputs)
        if b == batch:
            row.update(input=int(inputs[0].shape[-1]), **_theoretical(g, inputs[0].numel() * inputs[0].element_size()))
        if measure:
            peaks.append(_peaks(model, inputs, g))
        del g, inputs
        gc.collect()  # a traced program holds its FakeTensors: one at a time keeps a process under 2 GB
    row.update(paper_theoretical_ratio=ref.get("theoretical_ratio"), paper_measured_ratio=ref.get("measured_ratio"))
    if measure:
        diff = {key: peaks[1][key] - peaks[0][key] for key in peaks[0]}
        row.update(measured_ratio=diff["theirs"] / diff["vanilla"], traced_measured_ratio=diff["traced"] / diff["vanilla"],
                   chen_ratio=diff["chen"] / diff["vanilla"], vanilla_mb=diff["vanilla"] / MB,
                   reforward_mb=diff["theirs"] / MB, chen_mb=diff["chen"] / MB,
                   paper_regular_mb=ref.get("regular_mb"), paper_reforwarding_mb=ref.get("reforwarding_mb"),
                   paper_chen_ratio=ref["chen_mb"] / ref["regular_mb"] if ref else None)
    for kind in ("theoretical", "measured", "chen"):
        if row.get(f"{kind}_ratio") is not None and row.get(f"paper_{kind}_ratio") is not None:
            row[f"{kind}_diff_points"] = 100 * (row[f"{kind}_ratio"] - row[f"paper_{kind}_ratio"])
    row["wall_seconds"] = time.perf_counter() - start
    return row


def run(names: list[str], measure: bool = True) -> pd.DataFrame:
    paper = paper_rows()
    rows = []
    for name in names:
        rows.append(table_row(name, paper, measure))
        print(f"{name}: done in {rows[-1]['wall_seconds']:.0f} s", flush=True)
    return pd.DataFrame(rows)


# ---------------------------------------------------------------------------------------------------
# Output


def _pair(ours: float, paper: float | None, diff: float | None) -> str:
    if ours is None or pd.isna(ours):
        return "—"
    if paper is None or pd.isna(paper):
        return f"{ours:.4f}"
    return f"{ours:.4f} / {paper:.4f} ({diff:+.1f})"


COLUMNS = [
    "network", "batch × input", "#V theirs / traced", "theoretical: ours / paper (Δ pts)", "input counted",
    "Alg. 1 only", "traced graph", "measured (fake): ours / paper (Δ pts)", "measured, traced plan",
    "Chen's √n (fake): ours / paper (Δ pts)", "solve s",
]


def markdown(df: pd.DataFrame) -> str:
    """The table (ours / paper, Δ in points) and the rows that differ by more than 10 points."""
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    records = df.to_dict("records")
    for r in records:
        cells = [
            r["network"], f"{r['batch']} × {r['input']}²", f"{r['vertices']} / {r['traced_nodes']}",
            _pair(r["theoretical_ratio"], r["paper_theoretical_ratio"], r.get("theoretical_diff_points")),
            f"{r['with_input_ratio']:.4f}", f"{r['linear_ratio']:.4f}", f"{r['traced_ratio']:.4f}",
            _pair(r.get("measured_ratio"), r["paper_measured_ratio"], r.get("measured_diff_points")),
            _pair(r.get("traced_measured_ratio"), None, None),
            _pair(r.get("chen_ratio"), r.get("paper_chen_ratio"), r.get("chen_diff_points")),
            f"{r['solve_seconds']:.2f} / {r['solve_seconds_traced']:.2f}",
        ]
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    far = [f"{r['network']} ({kind} {r[f'{kind}_diff_points']:+.1f})" for r in records
           for kind in ("theoretical", "measured")
           if not pd.isna(r.get(f"{kind}_diff_points", np.nan)) and abs(r[f"{kind}_diff_points"]) > 10]
    paper = [r for r in records if "@" not in r["network"]]

    def within(kind: str, points: float) -> str:
        near = [r for r in paper if not pd.isna(r.get(f"{kind}_diff_points", np.nan))
                and abs(r[f"{kind}_diff_points"]) <= points]
        return (f"{kind} within {points:g} points of the paper on {len(near)} of {len(paper)}"
                + (f" ({', '.join(r['network'] for r in near)})" if near else ""))

    notes = [
        "",
        "Closeness: " + "; ".join([within("theoretical", 3), within("measured", 3), within("measured", 6)]) + ".",
        "",
        "Ratios are Re-forwarding / regular (lower is better). *theoretical*: eq. (1) of Algorithm 6 over "
        "Σ l(v) on their graph (a vertex per tensor, in-place ops merged); *input counted*: the same with the "
        "input image as the source vertex, always stored; *Alg. 1 only*: the linear split on the splitting "
        "vertexes; *traced graph*: Algorithm 6 on our graph (a vertex per functional op); *measured*: the "
        "`reforward` plan of their graph (lifted onto the traced graph) run on the `fake` backend, "
        "(peak at 2B − peak at B) over the same for plain training, as the paper measured; *measured, traced "
        "plan*: the same for the `reforward` plan of the traced graph; *Chen's √n*: the same for Chen et al.'s "
        "segmentation of the traced graph (`chen`), beside their Chen [8] MB over their regular MB. Solve s: Algorithm 6 on their graph / on "
        "the traced graph. Rows `…@2018` are evidence (torchvision's 2018 DenseNet layout), not in their table.",
        "",
        "More than 10 points from the paper: " + (", ".join(far) if far else "none") + ".",
    ]
    return "\n".join(lines + notes)


def record(df: pd.DataFrame, command: str) -> dict[str, Any]:
    """The rows of a run with what made them (commit, command, torch): the JSON behind the table."""
    from .runner import git_commit

    rows = df.drop(columns="wall_seconds").to_dict("records")  # native floats: exact through JSON
    return dict(source="Feng & Huang (2018), Cutting Down Training Memory by Re-forwarding, Table 1",
                git_commit=git_commit(), command=command, torch_version=torch.__version__, rows=rows)


def load(path: Path) -> dict:
    """The JSON record at ``path``; FileNotFoundError saying which stage writes it."""
    return load_artefact(path, "python -m experiments.feng_table1 --write (stage feng of scripts/paper_figures.sh)")


def render(rec: dict[str, Any], out: Path = OUT) -> None:
    """``<out>.csv`` (every column) and ``<out>.md`` (the table) from a :func:`record`, nothing measured."""
    df = pd.DataFrame(rec["rows"])
    df.to_csv(out.with_suffix(".csv"), index=False, float_format="%.4f")
    out.with_suffix(".md").write_text(
        "# Feng & Huang (2018), Table 1: ours / paper\n\n"
        f"Records at commit {rec['git_commit'][:7]} by `{rec['command']}` (see `paper_figures/README.md`).\n\n"
        + markdown(df) + "\n"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nets", nargs="+", default=[*paper_rows(), *VARIANTS])
    parser.add_argument("--no-measure", action="store_true", help="theoretical ratios only (no fake execution)")
    what = parser.add_mutually_exclusive_group()
    what.add_argument("--write", action="store_true", help=f"write {OUT.relative_to(REPO)}.json and render it")
    what.add_argument("--render", action="store_true", help=f"{OUT.relative_to(REPO)}.{{md,csv}} from its .json only")
    args = parser.parse_args()
    json_path = OUT.with_suffix(".json")
    if args.render:
        render(load(json_path))
        return
    df = run(args.nets, measure=not args.no_measure)
    print(markdown(df))
    if args.write:
        rec = record(df, "python -m experiments.feng_table1 " + shlex.join(sys.argv[1:]))
        write_artefact(json_path, rec)
        render(rec)


if __name__ == "__main__":
    main()
