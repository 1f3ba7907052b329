"""Chen et al. (2016), "Training Deep Nets with Sublinear Memory Cost": peak memory against depth.

    python -m experiments.chen_depth --write     # measure -> paper_figures/chen2016_depth.json, then render
    python -m experiments.chen_depth --render    # paper_figures/chen2016_depth.{png,md} from the JSON only

Chen et al.'s claims (§4.3; §5.2 and Fig. 5 of their paper): with √n segments the feature-map memory of
an n-layer network grows as O(√n) instead of O(n), and a 1,000-layer ResNet at batch 32, 224² trains in
less than 7 GB where it would need 48 GB. We sweep the depth of a torchvision bottleneck ResNet with
``blocks`` bottlenecks in each of its four stages (depth 12·blocks + 2, to 1,010) at batch 32 and 224², on the
``fake`` backend (every allocation of the real training step, nothing allocated), and measure the
activation peak (the step's peak minus parameters and buffers) of plain training, of Chen's √n
segmentation (``chen``) and of ours (ApproxDP + MC at its smallest budget). Beside them the two model
curves: a·n fitted to vanilla and b·√n fitted to Chen's points (least squares through the origin).
"""

from __future__ import annotations

import math
import platform
import shlex
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Iterator, Mapping

import torch

from .config import GIB
from .record import artefact_main, load_artefact
from .runner import git_commit

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "paper_figures" / "chen2016_depth"
BLOCKS = (1, 2, 4, 8, 16, 32, 48, 64, 84)  # bottlenecks per stage: depths 14 … 1010 (Chen's Fig. 5 spans 128 … 1024)
CLAIM_DEPTH, CLAIM_FROM_GB, CLAIM_TO_GB = 1000, 48, 7  # "a 1,000-layer deep residual network from 48G to 7G" (their abstract)
BATCH, SIZE = 32, 224
METHODS = {"vanilla": ("vanilla", {}), "chen": ("chen", {}), "approxdp_mc": ("approxdp", {"strategy": "mc"})}
LABELS = {"vanilla": "vanilla", "chen": "Chen et al. √n segments", "approxdp_mc": "ours (ApproxDP + MC)"}


@dataclass(frozen=True)
class DepthPoint:
    """One measured step: ``method`` on the ResNet with ``blocks`` bottlenecks per stage."""

    blocks: int
    depth: int  # weighted layers: 3 per bottleneck + stem conv + fc
    num_nodes: int  # #V of the traced graph
    method: str
    activation_peak_bytes: int  # measured peak minus parameters and buffers
    peak_bytes: int  # measured peak incl. parameters and buffers
    k: int | None  # lower sets (segments) of the plan; None for vanilla


def resnet(blocks: int) -> tuple[torch.nn.Module, tuple[torch.Tensor]]:
    """A torchvision bottleneck ResNet with ``blocks`` bottlenecks per stage, fake input of batch 32 at 224²."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torchvision.models.resnet import Bottleneck, ResNet

    torch.manual_seed(0)
    model = ResNet(Bottleneck, [blocks] * 4)
    with FakeTensorMode(allow_non_fake_inputs=True):
        x = torch.randn(BATCH, 3, SIZE, SIZE)
    return model, (x,)


def measured_plans(model: torch.nn.Module, inputs: tuple[torch.Tensor, ...],
                   methods: Mapping[str, tuple[str, dict[str, Any]]]) -> Iterator[tuple[str, Any, Any, Any, float]]:
    """Trace ``model`` once; then per method (name → planner and its options): the graph, the plan, one
    step measured on the ``fake`` backend and the planner's wall seconds."""
    import recompute
    from recompute.doors.measure import default_loss

    graph = recompute.trace(model, inputs, loss_fn=default_loss)
    for name, (planner, options) in methods.items():
        start = time.perf_counter()
        plan = recompute.plan(graph, planner, **options)
        solve = time.perf_counter() - start
        runner = None if planner == "vanilla" else recompute.execute(graph, plan)
        yield name, graph, plan, recompute.measure(model, inputs, runner=runner, backend="fake", iterations=1, warmup=0), solve


def measure_depth(blocks: int) -> list[DepthPoint]:
    """The three methods at one depth, each measured on the ``fake`` backend."""
    return [DepthPoint(blocks, 12 * blocks + 2, graph.n, name, m.peak_bytes, m.total_peak_bytes,
                       None if name == "vanilla" else plan.k)
            for name, graph, plan, m, _ in measured_plans(*resnet(blocks), METHODS)]


def sweep(blocks: tuple[int, ...] = BLOCKS) -> dict:
    """Every depth in ``blocks``, with what made it (commit, command, torch), as the JSON record."""
    points = []
    for b in blocks:
        points += measure_depth(b)
        print(f"blocks={b}: " + ", ".join(f"{p.method} {p.activation_peak_bytes / GIB:.2f} GiB" for p in points[-3:]),
              flush=True)
    return dict(source="Chen et al. (2016), Training Deep Nets with Sublinear Memory Cost, arXiv:1604.06174, §4.3",
                git_commit=git_commit(), command="python -m experiments.chen_depth " + shlex.join(sys.argv[1:]),
                torch_version=torch.__version__, host=platform.node(), batch_size=BATCH, input_size=SIZE,
                backend="fake", points=[asdict(p) for p in points])


def fit_through_origin(xs: list[float], ys: list[float]) -> float:
    """Least-squares c of y = c·x (through the origin)."""
    return sum(x * y for x, y in zip(xs, ys)) / sum(x * x for x in xs)


def load(path: Path) -> dict:
    """The JSON record at ``path``; FileNotFoundError saying which stage writes it."""
    return load_artefact(path, "python -m experiments.chen_depth --write (stage chen of scripts/paper_figures.sh)")


def by_method(points: list[Any], methods: Mapping[str, Any], x: str) -> dict[str, list[Any]]:
    """The points of each method, ordered by their attribute ``x``."""
    return {m: sorted((p for p in points if p.method == m), key=lambda p: getattr(p, x)) for m in methods}


def figure() -> tuple[Any, Any]:
    """A figure and its axes, drawn off-screen."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt.subplots(figsize=(6.4, 4.4))


def save_loglog(fig: Any, ax: Any, record: dict, out: Path, *, xlabel: str, title: str, xbase: int = 10) -> None:
    """Log-log axes (as Chen et al.'s Fig. 5 and 6: y = α·x^β is a line of slope β), the commit and command of
    ``record`` stamped on the figure, written to ``<out>.png`` without a creation date (re-renders are identical)."""
    import matplotlib.pyplot as plt

    ax.set_xscale("log", base=xbase)
    ax.set_yscale("log")
    ax.set(xlabel=xlabel, ylabel="activation peak (GiB)")
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.text(0.01, 0.005, f"records at commit {record['git_commit'][:7]}: {record['command']}", fontsize=6, color="0.4")
    fig.tight_layout(rect=(0, 0.02, 1, 1))
    fig.savefig(out.with_suffix(".png"), dpi=130, metadata={"Software": None})
    plt.close(fig)


def render(record: dict, out: Path = OUT) -> None:
    """``<out>.png`` (activation peak against depth, with the a·n and b·√n curves) and ``<out>.md`` (the table)."""
    by = by_method([DepthPoint(**p) for p in record["points"]], METHODS, "depth")
    depths = [p.depth for p in by["vanilla"]]
    gib = {m: [p.activation_peak_bytes / GIB for p in ps] for m, ps in by.items()}
    a = fit_through_origin(depths, gib["vanilla"])
    b = fit_through_origin([math.sqrt(d) for d in depths], gib["chen"])
    fig, ax = figure()
    for m, style in zip(METHODS, ("o-", "s-", "^-")):
        ax.plot(depths, gib[m], style, ms=4, label=LABELS[m])
    grid = [depths[0] + i * (depths[-1] - depths[0]) / 100 for i in range(101)]
    ax.plot(grid, [a * d for d in grid], ":", color="0.4", label=f"{a:.3f}·n (linear, fit to vanilla)")
    ax.plot(grid, [b * math.sqrt(d) for d in grid], "--", color="0.4", label=f"{b:.3f}·√n (fit to Chen)")
    save_loglog(fig, ax, record, out, xlabel="depth n (weighted layers of the bottleneck ResNet)",
                title=f"Chen et al. (2016) Fig. 5: memory vs depth, batch {record['batch_size']}, "
                      f"{record['input_size']}², {record['backend']} backend")
    rows = ["| depth n | #V | " + " | ".join(f"{LABELS[m]} (GiB)" for m in METHODS) + " | Chen k | ours k |",
            "|---|---|" + "---|" * len(METHODS) + "---|---|"]
    for i, d in enumerate(depths):
        rows.append(f"| {d} | {by['vanilla'][i].num_nodes} | " + " | ".join(f"{gib[m][i]:.2f}" for m in METHODS)
                    + f" | {by['chen'][i].k} | {by['approxdp_mc'][i].k} |")
    growth = {m: gib[m][-1] / gib[m][0] for m in METHODS}
    out.with_suffix(".md").write_text(
        f"Chen et al. (2016), memory vs depth: activation peak of one training step (`fake` backend, batch "
        f"{record['batch_size']}, {record['input_size']}²), records at commit {record['git_commit'][:7]} by "
        f"`{record['command']}`.\n\n" + "\n".join(rows) + "\n\n"
        f"From depth {depths[0]} to {depths[-1]} ({depths[-1] / depths[0]:.1f}× the layers, "
        f"√ of that {math.sqrt(depths[-1] / depths[0]):.1f}×) the activation peak grows "
        + ", ".join(f"{growth[m]:.1f}× for {LABELS[m]}" for m in METHODS) + ".\n" + _claim(by)
    )


def _claim(by: dict[str, list[DepthPoint]]) -> str:
    """Chen et al.'s headline (1,000 layers: 48 GB → under 7 GB) against our deepest point, if it reaches it."""
    last = {m: ps[-1] for m, ps in by.items()}
    if last["vanilla"].depth < CLAIM_DEPTH:
        return ""
    total = {m: p.peak_bytes / GIB for m, p in last.items()}
    act = {m: p.activation_peak_bytes / GIB for m, p in last.items()}
    under = "holds" if max(total["chen"], total["approxdp_mc"]) < CLAIM_TO_GB else "does not hold"
    return (f"\nChen et al.'s headline, a {CLAIM_DEPTH:,}-layer ResNet from {CLAIM_FROM_GB} GB to under "
            f"{CLAIM_TO_GB} GB: at depth {last['vanilla'].depth} plain training holds {act['vanilla']:.1f} GiB of "
            f"activations ({total['vanilla']:.1f} GiB with parameters and their gradients); Chen's √n segments "
            f"{act['chen']:.1f} GiB ({total['chen']:.1f}), ours {act['approxdp_mc']:.1f} GiB "
            f"({total['approxdp_mc']:.1f}). The \"under {CLAIM_TO_GB} GB\" claim {under} here, with parameters counted.\n")


def main(argv: list[str] | None = None) -> None:
    artefact_main(__doc__, OUT.with_suffix(".json"), lambda args: sweep(tuple(args.blocks)), render, load,
                  lambda ap: ap.add_argument("--blocks", type=int, nargs="+", default=list(BLOCKS),
                                             help="bottlenecks per stage"), argv)

if __name__ == "__main__":
    main()
