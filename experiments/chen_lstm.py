"""Chen et al. (2016), Fig. 6: the memory of an unrolled LSTM against the number of unrolling steps.

    python -m experiments.chen_lstm --write     # measure -> paper_figures/chen2016_lstm.json, then render
    python -m experiments.chen_lstm --render    # paper_figures/chen2016_lstm.{png,md} from the JSON only

Chen et al.'s setting (§5.3): a four-layer LSTM with 1,024 hidden units unrolled over T steps, batch 64, a
50-dimensional input at each step and a softmax over 5,000 classes; their claim: "the sub-linear plan gives
more than 4x reduction over the optimized memory plan" (Fig. 6a, T = 64 … 2,048). We unroll it as they
did, a loop over time of four ``nn.LSTMCell`` (``torch.nn.LSTM`` itself traces layer after layer, with an
articulation node between layers), each step's softmax cross-entropy taken at that step (one output layer
over all steps stacked would hold T steps' logits at once, a linear term no segmentation removes), and measure one training step on the ``fake`` backend: plain
training, Chen's √n segmentation with its two kinds of cut (``chen``'s ``cuts``: articulation nodes, of
which the unrolled graph has almost none, and the least-boundary lower sets that cut across the (h, c)
state the way Chen et al. segment over time) and ours (ApproxDP + MC at its smallest budget) where its
solve stays within minutes (``OURS_MAX_STEPS``: the DP's solve grows as a power of #V, see the table).
"""

from __future__ import annotations

import platform
import shlex
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch import nn

from .chen_depth import by_method, figure, fit_through_origin, measured_plans, save_loglog
from . import kernels
from .config import GIB
from .record import artefact_main, load_artefact
from .runner import git_commit

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "paper_figures" / "chen2016_lstm"
STEPS = (16, 32, 64, 128, 256, 512)  # unrolling steps T (Chen et al.'s Fig. 6 spans 64 … 2,048)
OURS_MAX_STEPS = 256  # ApproxDP + MC took 161 s at T = 256 and ~4× more per doubling of T
LAYERS, HIDDEN, INPUT, CLASSES, BATCH = 4, 1024, 50, 5000, 64  # Chen et al. §5.3
CLAIM_RATIO = 4  # "more than 4x reduction over the optimized memory plan"
METHODS = {"vanilla": ("vanilla", {}), "chen": ("chen", {}), "chen_least_boundary": ("chen", {"cuts": "least_boundary"}),
           "approxdp_mc": ("approxdp", {"strategy": "mc"})}
LABELS = {"vanilla": "vanilla", "chen": "Chen √n, articulation cuts",
          "chen_least_boundary": "Chen √n, least-boundary cuts", "approxdp_mc": "ours (ApproxDP + MC)"}


class UnrolledLSTM(nn.Module):
    """Chen et al.'s LSTM unrolled over time: at each step the four cells in turn, then the step's softmax
    over the classes against its target; the step's loss is the sum over steps."""

    def __init__(self, layers: int = LAYERS, hidden: int = HIDDEN, inputs: int = INPUT, classes: int = CLASSES):
        super().__init__()
        self.cells = nn.ModuleList(nn.LSTMCell(inputs if i == 0 else hidden, hidden) for i in range(layers))
        self.out = nn.Linear(hidden, classes)

    def forward(self, x: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        state: list[tuple[torch.Tensor, torch.Tensor] | None] = [None] * len(self.cells)
        loss = x.new_zeros(())
        for step, target in zip(x.unbind(0), targets.unbind(0)):
            h = step
            for i, cell in enumerate(self.cells):
                state[i] = cell(h, state[i])
                h = state[i][0]
            loss = loss + nn.functional.cross_entropy(self.out(h), target, reduction="sum")
        return loss


@dataclass(frozen=True)
class StepsPoint:
    """One measured step: ``method`` on the LSTM unrolled over ``steps`` time steps."""

    steps: int
    num_nodes: int  # #V of the traced graph
    method: str
    activation_peak_bytes: int  # measured peak minus parameters and buffers (parameter gradients included)
    peak_bytes: int  # measured peak incl. parameters and buffers
    k: int | None  # lower sets (segments) of the plan; None for vanilla
    solve_seconds: float  # the planner's wall time


def lstm(steps: int) -> tuple[nn.Module, tuple[torch.Tensor, torch.Tensor]]:
    """The unrolled LSTM, a fake input of ``steps`` × batch 64 × 50 and the fake targets of every step."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    torch.manual_seed(0)
    model = UnrolledLSTM()
    with FakeTensorMode(allow_non_fake_inputs=True):
        x = torch.randn(steps, BATCH, INPUT)
        targets = torch.randint(0, CLASSES, (steps, BATCH))
    return model, (x, targets)


def measure_steps(steps: int) -> list[StepsPoint]:
    """Every method at one length, each measured on the ``fake`` backend (ours only up to OURS_MAX_STEPS)."""
    methods = {m: how for m, how in METHODS.items() if m != "approxdp_mc" or steps <= OURS_MAX_STEPS}
    return [StepsPoint(steps, graph.n, name, m.peak_bytes, m.total_peak_bytes, None if name == "vanilla" else plan.k,
                       round(solve, 2))
            for name, graph, plan, m, solve in measured_plans(*lstm(steps), methods)]


def sweep(steps: tuple[int, ...] = STEPS) -> dict:
    """Every length in ``steps``, with what made it (commit, command, torch), as the JSON record."""
    kernels.load({planner for planner, _ in METHODS.values()})  # numba's one-off load is no planner's solve time
    points = []
    for t in steps:
        fresh = measure_steps(t)
        points += fresh
        print(f"T={t} (#V {fresh[0].num_nodes}): " + ", ".join(
            f"{p.method} {p.activation_peak_bytes / GIB:.2f} GiB ({p.solve_seconds:.1f} s)" for p in fresh), flush=True)
    parameters = sum(p.numel() * p.element_size() for p in UnrolledLSTM().parameters())
    return dict(source="Chen et al. (2016), Training Deep Nets with Sublinear Memory Cost, arXiv:1604.06174, §5.3",
                git_commit=git_commit(), command="python -m experiments.chen_lstm " + shlex.join(sys.argv[1:]),
                torch_version=torch.__version__, host=platform.node(), batch_size=BATCH, layers=LAYERS,
                hidden=HIDDEN, input_dim=INPUT, classes=CLASSES, parameter_bytes=parameters, backend="fake",
                points=[asdict(p) for p in points])


def load(path: Path) -> dict:
    """The JSON record at ``path``; FileNotFoundError saying which stage writes it."""
    return load_artefact(path, "python -m experiments.chen_lstm --write (stage chen of scripts/paper_figures.sh)")


def render(record: dict, out: Path = OUT) -> None:
    """``<out>.png`` (activation peak against T, log-log, with a·T fitted to vanilla) and ``<out>.md``."""
    by = by_method([StepsPoint(**p) for p in record["points"]], METHODS, "steps")
    steps = [p.steps for p in by["vanilla"]]
    gib = {m: [p.activation_peak_bytes / GIB for p in ps] for m, ps in by.items()}
    a = fit_through_origin(steps, gib["vanilla"])
    fig, ax = figure()
    for m, style in zip(METHODS, ("o-", "v-", "s-", "^-")):
        ax.plot([p.steps for p in by[m]], gib[m], style, ms=4, label=LABELS[m])
    ax.plot(steps, [a * t for t in steps], ":", color="0.4", label=f"{a:.4f}·T (linear, fit to vanilla)")
    save_loglog(fig, ax, record, out, xlabel="unrolling steps T", xbase=2,
                title=f"Chen et al. (2016) Fig. 6: {record['layers']}-layer LSTM, {record['hidden']} hidden, batch "
                      f"{record['batch_size']}, {record['backend']} backend")
    out.with_suffix(".md").write_text(_table(record, by, steps) + _claim(record, by))


def _table(record: dict, by: dict[str, list[StepsPoint]], steps: list[int]) -> str:
    """The records as a table: GiB, k and solve seconds per method and T ("—" where a method did not run)."""
    cell = {(p.method, p.steps): p for ps in by.values() for p in ps}
    rows = ["| T | #V | " + " | ".join(f"{LABELS[m]}: GiB (k, solve s)" for m in METHODS) + " |",
            "|---|---|" + "---|" * len(METHODS)]
    for i, t in enumerate(steps):
        shown = []
        for m in METHODS:
            p = cell.get((m, t))
            shown.append("—" if p is None else f"{p.activation_peak_bytes / GIB:.3f}"
                         + ("" if p.k is None else f" ({p.k}, {p.solve_seconds:.1f})"))
        rows.append(f"| {t} | {by['vanilla'][i].num_nodes} | " + " | ".join(shown) + " |")
    return (f"Chen et al. (2016) Fig. 6, a {record['layers']}-layer LSTM ({record['hidden']} hidden, input "
            f"{record['input_dim']}, {record['classes']} classes) unrolled over T steps: activation peak of one "
            f"training step (`fake` backend, batch {record['batch_size']}; parameter gradients, "
            f"{record['parameter_bytes'] / GIB:.3f} GiB, included), records at commit {record['git_commit'][:7]} "
            f"by `{record['command']}`. Ours is solved up to T = {max(p.steps for p in by['approxdp_mc'])}.\n\n"
            + "\n".join(rows) + "\n")


def _claim(record: dict, by: dict[str, list[StepsPoint]]) -> str:
    """Chen et al.'s "more than 4x reduction" at our longest T. Their Fig. 6a counts feature maps only;
    ours counts parameter gradients too, and subtracting all of them (as if every one were live at the
    peak) gives an upper bound on the feature-map ratio: the claim is decided where both agree."""
    plain, chen = by["vanilla"][-1], by["chen_least_boundary"][-1]
    grads = record["parameter_bytes"]
    ratio = plain.activation_peak_bytes / chen.activation_peak_bytes
    bound = (plain.activation_peak_bytes - grads) / max(chen.activation_peak_bytes - grads, 1)
    verdict = ("holds" if ratio > CLAIM_RATIO else "does not hold" if bound <= CLAIM_RATIO
               else "is undecided (it holds only on the upper bound)")
    return (f"\nChen et al.'s claim, more than {CLAIM_RATIO}× less memory with the sub-linear plan: at T = "
            f"{plain.steps} plain training holds {plain.activation_peak_bytes / GIB:.2f} GiB and Chen's √n "
            f"(least-boundary cuts) {chen.activation_peak_bytes / GIB:.2f} GiB, {ratio:.1f}× less; with the "
            f"{grads / GIB:.3f} GiB of parameter gradients taken out of both, at most {bound:.1f}× less. "
            f"The claim {verdict} here.\n")


def main(argv: list[str] | None = None) -> None:
    artefact_main(__doc__, OUT.with_suffix(".json"), lambda args: sweep(tuple(args.steps)), render, load,
                  lambda ap: ap.add_argument("--steps", type=int, nargs="+", default=list(STEPS), help="unrolling steps T"),
                  argv)

if __name__ == "__main__":
    main()
