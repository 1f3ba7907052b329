"""The runs that test Table 1's explanations: each flagged cell's cause tried on a network built to remove it.

    python -m experiments.explain_runs --write     # measure -> paper_figures/explanation_runs.json, then render
    python -m experiments.explain_runs --render    # paper_figures/explanation_runs.md from the JSON only

:mod:`experiments.explain` gives each Table 1 cell more than 10 points from the paper a cause; a cause
that names a difference between our network and the paper's is a guess until the network without that
difference is measured. The variants (:data:`VARIANTS`), each at the paper's batch and input size on the
``fake`` backend, with Table 1's methods (DP planners on the simulator's memory model):

* ``googlenet_no_bn`` — GoogLeNet without BatchNorm, as Szegedy et al. (2015) and the paper's Caffe-style
  network (#V = 134) had it: if BatchNorm made our reductions larger, they fall back to the paper's here.
* ``densenet161_2018`` — DenseNet-161 in torchvision's layout before its 2019 memory-efficient rewrite
  (and Chainer's): each layer concatenates its input with its new features, so every layer boundary is a
  node that all paths pass through — where Chen's segmentation may cut. If Chen's cell is −20.9 points
  because today's layout (one concatenation of all earlier features per layer) leaves it no cuts, the
  2018 layout brings it back to the paper's.
* ``vgg19_relu_copy`` — VGG-19 with every ReLU out of place, as Chainer's are: torchvision's ReLUs write
  over the convolution's output, so our plain step keeps one tensor where the paper's kept two. If this
  leaner vanilla is why VGG-19's reductions are smaller than the paper's while its peaks are no larger,
  the copy-ReLU network's vanilla is near the paper's 7.0 GB and its reductions near the paper's.
"""

from __future__ import annotations

import platform
import shlex
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import pandas as pd
import torch
import torch.nn as nn

from experiments import nets

from .config import GIB
from .feng_table1 import densenet_2018
from .record import artefact_main, load_artefact
from .runner import git_commit

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "paper_figures" / "explanation_runs"
METHODS = {  # Table 1's columns: planner, strategy
    "vanilla": ("vanilla", None), "chen": ("chen", None), "approxdp_mc": ("approxdp", "mc"),
    "approxdp_tc": ("approxdp", "tc"), "exactdp_mc": ("exactdp", "mc"), "exactdp_tc": ("exactdp", "tc"),
}


def vgg19_relu_copy() -> nn.Module:
    """torchvision's VGG-19 with every ReLU out of place (a new tensor, as Chainer's ``F.relu`` returns)."""
    model, _ = nets.build("vgg19", batch_size=1, seed=0)
    for m in model.modules():
        if isinstance(m, nn.ReLU):
            m.inplace = False
    return model


def densenet161_2018() -> nn.Module:
    """torchvision's DenseNet-161 with every dense block in the 2018 layout
    (:func:`experiments.feng_table1.densenet_2018`: each layer concatenates onto its input)."""
    return densenet_2018(nets.build("densenet161", batch_size=1, seed=0)[0])


@dataclass(frozen=True)
class Variant:
    """A network built to remove one suspected cause of a Table 1 difference."""

    name: str
    network: str  # the Table 1 network it stands for (its batch, input size and paper numbers)
    cause: str  # the explanation it tests (a cause of experiments.explain)
    builder: Callable[[], nn.Module]


VARIANTS = (
    Variant("googlenet_no_bn", "googlenet", "a larger traced graph",
            lambda: nets.build("googlenet", batch_size=1, seed=0, batch_norm=False)[0]),
    Variant("densenet161_2018", "densenet161", "Chen's segmentation", densenet161_2018),
    Variant("vgg19_relu_copy", "vgg19", "a leaner vanilla", vgg19_relu_copy),
)


@dataclass(frozen=True)
class VariantPoint:
    """One method measured on one variant (``peak_bytes``: the step's peak incl. parameters)."""

    variant: str
    network: str
    method: str
    num_nodes: int
    peak_bytes: int
    k: int | None


def _inputs(network: str) -> tuple[torch.Tensor, ...]:
    s = nets.spec(network)
    return nets.build(network, batch_size=s.batch_size, seed=0, fake_inputs=True)[1]


def measure_variant(v: Variant) -> list[VariantPoint]:
    """Table 1's methods on ``v`` at its network's paper batch and size (``fake`` backend)."""
    import recompute
    from recompute.doors.measure import default_loss

    inputs, model = _inputs(v.network), v.builder()
    graph = recompute.trace(model, inputs, loss_fn=default_loss)
    points = []
    for name, (planner, strategy) in METHODS.items():
        options = {"memory_model": "simulator"} if strategy else {}
        plan = recompute.plan(graph, planner, strategy=strategy, **options)
        runner = None if planner == "vanilla" else recompute.execute(graph, plan)
        m = recompute.measure(model, inputs, runner=runner, backend="fake", iterations=1, warmup=0)
        points.append(VariantPoint(v.name, v.network, name, graph.n, m.total_peak_bytes,
                                   None if planner == "vanilla" else plan.k))
        print(f"{v.name} {name}: {m.total_peak_bytes / GIB:.2f} GiB", flush=True)
    return points


def sweep(variants: tuple[Variant, ...] = VARIANTS) -> dict:
    """Every variant, with what made it (commit, command, torch), as the JSON record."""
    points = [p for v in variants for p in measure_variant(v)]
    return dict(source="runs testing the explanations of paper_figures/differences.md (experiments.explain)",
                git_commit=git_commit(), command="python -m experiments.explain_runs " + shlex.join(sys.argv[1:]),
                torch_version=torch.__version__, host=platform.node(), backend="fake",
                points=[asdict(p) for p in points])


def load(path: Path = OUT.with_suffix(".json")) -> dict:
    """The JSON record; FileNotFoundError saying what writes it."""
    return load_artefact(path, "python -m experiments.explain_runs --write (stage explain of scripts/paper_figures.sh)")


def points(record: dict) -> list[VariantPoint]:
    return [VariantPoint(**p) for p in record["points"]]


def frame(path: Path = OUT.with_suffix(".json")) -> pd.DataFrame | None:
    """The runs as a table (variant, network, method, num_nodes, peak_bytes, k) for
    :func:`experiments.explain.explanations`; None where they have not been made."""
    return pd.DataFrame([asdict(p) for p in points(load(path))]) if path.exists() else None


def render(record: dict, out: Path = OUT) -> None:
    """``<out>.md``: each variant's peaks and reductions beside the paper's Table 1 row of its network."""
    from .figures import METHOD_LABELS, paper_table1

    paper = paper_table1().set_index(["network", "method"])
    rows = ["| run | stands for | method | #V ours / paper | peak (GiB) | reduction | paper's | points from the paper |",
            "|---|---|---|---|---|---|---|---|"]
    by = {}
    for p in points(record):
        by.setdefault(p.variant, []).append(p)
    for name, ps in by.items():
        vanilla = next(p for p in ps if p.method == "vanilla")
        for p in ps:
            ref = paper.loc[(p.network, p.method)]
            red = 1 - p.peak_bytes / vanilla.peak_bytes
            cells = [f"{p.peak_bytes / GIB:.2f}", "–", f"{ref['paper_peak_gb']:.1f} GB", "–"] if p is vanilla else [
                f"{p.peak_bytes / GIB:.2f}", f"{-100 * red:+.1f}%",
                f"{ref['paper_peak_gb']:.1f} GB ({-100 * ref['paper_reduction']:+.0f}%)",
                f"{100 * (red - ref['paper_reduction']):+.1f}"]
            rows.append(f"| `{name}` | {p.network} | {METHOD_LABELS[p.method]} | {p.num_nodes} / "
                        f"{int(ref['paper_num_nodes'])} | " + " | ".join(cells) + " |")
    out.with_suffix(".md").write_text(
        f"Runs testing the explanations (`fake` backend, each network's paper batch and input size, DP planners on "
        f"the simulator's memory model), records at commit {record['git_commit'][:7]} by `{record['command']}`.\n\n"
        + "\n".join(rows) + "\n")


def main(argv: list[str] | None = None) -> None:
    artefact_main(__doc__, OUT.with_suffix(".json"),
                  lambda args: sweep(tuple(v for v in VARIANTS if v.name in args.variants)), render, load,
                  lambda ap: ap.add_argument("--variants", nargs="+", choices=[v.name for v in VARIANTS],
                                             default=[v.name for v in VARIANTS]), argv)

if __name__ == "__main__":
    main()
