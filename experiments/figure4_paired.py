"""Kusumoto et al. (2019) Figure 4 as a paired design: every method timed in the same rounds as vanilla.

    python -m experiments.figure4_paired --write                  # every network -> paper_figures/figure4_paired.json
    python -m experiments.figure4_paired --write --nets resnet50  # some networks (the others' points are kept)
    python -m experiments.figure4_paired --render                 # paper_figures/figure4_paired.{md,png} from the JSON

Figure 4's first statistics (Welch's t-tests, since removed) compared iterations as if independent: five
back-to-back steps of one run, a vanilla pooled over four runs whose own means differ, 84 t-tests with no
correction. Here each (network, batch) is timed as ``--rounds`` rounds; in each round every method —
vanilla, Chen's √n segments, ApproxDP + TC and + MC (the paper's cost model, the simulator's memory model)
— runs one training step, in an order that rotates from round to round
(:func:`recompute.doors.measure.interleaved`), after one warm-up step each. A method's time is then a
ratio to *the same round's* vanilla (or to Chen's), so what drifts between rounds cancels; the estimate is
the geometric mean of the per-round ratios, its interval a percentile bootstrap over rounds, and each
ordering's p-value (the bootstrap's two-sided tail at ratio 1) is corrected for the number of orderings
tested (Holm). An ordering is a claim only where the corrected p < 0.05; otherwise it is a tie.

The points are :data:`GRID` (on the CPU at a reduced input size, as the first Figure 4): each grid
straddles vanilla's largest batch at the paper's size, and ResNet-152's also holds twice that batch, where
the paper reports ApproxDP 1.16× faster than Chen's (``CLAIM``).
"""

from __future__ import annotations

import argparse
import functools
import math
import platform
import shlex
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

from experiments import nets

from .figures import METHOD_LABELS
from .record import load_artefact, write_artefact
from .runner import git_commit

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "paper_figures" / "figure4_paired"
METHODS = {"vanilla": None, "chen": ("chen", None), "approxdp_tc": ("approxdp", "tc"), "approxdp_mc": ("approxdp", "mc")}
PAIRS = (("approxdp_tc", "vanilla"), ("approxdp_mc", "vanilla"), ("chen", "vanilla"),
         ("approxdp_tc", "chen"), ("approxdp_mc", "chen"))
# net: (input size on the CPU, batches): the first Figure 4's grid; ResNet-152 also at 134 = 2 × vanilla's
# largest batch under 11.4 GiB at 224² (max_batch.md), the batch of the paper's 1.16× claim
GRID: dict[str, tuple[int, tuple[int, ...]]] = {
    "resnet50": (64, (64, 128, 192)), "resnet152": (64, (32, 64, 96, 134)), "vgg19": (32, (64, 128, 192)),
    "densenet161": (64, (24, 48, 72)), "googlenet": (64, (192, 384, 576)), "unet": (128, (4, 8, 16)),
    "pspnet": (128, (2, 4, 8)),
}
CLAIM = ("resnet152", 134, 1.16)  # Kusumoto et al. §5: ApproxDP 1.16× faster than Chen's at twice vanilla's largest batch
ROUNDS, BOOTSTRAP, ALPHA = 7, 10_000, 0.05


@dataclass
class PairedPoint:
    """One (network, batch): every method's seconds per step, round by round (index i: round i)."""

    net: str
    batch_size: int
    input_size: int
    times: dict[str, list[float]]
    git_commit: str | None
    device: str


def _runners(model: torch.nn.Module, inputs: tuple) -> dict[str, torch.nn.Module]:
    import recompute
    from recompute.doors.measure import default_loss

    graph = recompute.trace(model, inputs, cost_model="paper", loss_fn=default_loss)
    out: dict[str, torch.nn.Module] = {"vanilla": model}
    for name, spec in METHODS.items():
        if spec is not None:
            planner, strategy = spec
            options = {"memory_model": "simulator"} if strategy else {}
            out[name] = recompute.execute(graph, recompute.plan(graph, planner, strategy=strategy, **options))
    return out


def time_point(net: str, batch: int, size: int, rounds: int = ROUNDS, device: str = "cpu") -> PairedPoint:
    """The four methods on ``net`` at ``batch`` × ``size``², ``rounds`` interleaved rounds after a warm-up."""
    from recompute.doors.measure import interleaved, training_step

    model, inputs = nets.build(net, batch_size=batch, input_size=size, seed=0)
    if device == "cuda":
        model, inputs = model.cuda(), tuple(x.cuda() for x in inputs)
    params = list(model.parameters())
    steps = {m: functools.partial(training_step, r, params, inputs) for m, r in _runners(model, inputs).items()}
    interleaved(steps, 1)  # warm-up: first-call set-up of every kernel, not timed
    where = (torch.cuda.get_device_name() if device == "cuda"
             else f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} threads")
    return PairedPoint(net, batch, size, interleaved(steps, rounds), git_commit(), where)


# ---------------------------------------------------------------------------------------------------
# Statistics


@dataclass(frozen=True)
class Ordering:
    """``a`` against ``b`` at one point: the geometric-mean ratio of their same-round times, its 95%
    bootstrap interval, the bootstrap p-value at ratio 1, Holm's correction of it, and the verdict."""

    net: str
    batch_size: int
    a: str
    b: str
    ratio: float
    low: float
    high: float
    p: float
    p_holm: float
    verdict: str


def _bootstrap(logs: np.ndarray, rng: np.random.Generator) -> tuple[float, float, float]:
    """95% percentile interval of exp(mean) over rounds resampled, and the two-sided p at log-ratio 0."""
    idx = rng.integers(0, len(logs), size=(BOOTSTRAP, len(logs)))
    means = logs[idx].mean(axis=1)
    low, high = np.quantile(means, [0.025, 0.975])
    tail = min((means <= 0).sum(), (means >= 0).sum())
    return math.exp(low), math.exp(high), min(1.0, 2 * (tail + 1) / (BOOTSTRAP + 1))


def _holm(ps: list[float]) -> list[float]:
    """Holm's step-down adjusted p-values (family-wise error over all of ``ps``)."""
    order = sorted(range(len(ps)), key=ps.__getitem__)
    adjusted, running = [0.0] * len(ps), 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (len(ps) - rank) * ps[i]))
        adjusted[i] = running
    return adjusted


def orderings(points: list[PairedPoint], alpha: float = ALPHA) -> list[Ordering]:
    """Every ordering of :data:`PAIRS` at every point, corrected together (Holm) over all of them."""
    rng = np.random.default_rng(0)
    raw = []
    for pt in points:
        for a, b in PAIRS:
            if a in pt.times and b in pt.times:
                logs = np.log(np.asarray(pt.times[a]) / np.asarray(pt.times[b]))
                raw.append((pt, a, b, math.exp(logs.mean()), *_bootstrap(logs, rng)))
    adjusted = _holm([r[-1] for r in raw])
    out = []
    for (pt, a, b, ratio, low, high, p), p_holm in zip(raw, adjusted):
        verdict = "tie" if p_holm >= alpha else f"{METHOD_LABELS[a]} {'faster' if ratio < 1 else 'slower'}"
        out.append(Ordering(pt.net, pt.batch_size, a, b, ratio, low, high, p, p_holm, verdict))
    return out


# ---------------------------------------------------------------------------------------------------
# Records and artefacts


def load(path: Path = OUT.with_suffix(".json")) -> dict:
    """The JSON record; FileNotFoundError saying what writes it."""
    return load_artefact(path, "python -m experiments.figure4_paired --write (stage figure4_paired of scripts/paper_figures.sh)")


def _points(record: dict) -> list[PairedPoint]:
    return [PairedPoint(**p) for p in record["points"]]


def _claim_line(found: list[Ordering]) -> str:
    net, batch, speedup = CLAIM
    rows = [o for o in found if (o.net, o.batch_size, o.b) == (net, batch, "chen")]
    if not rows:
        return ""
    said = "; ".join(f"{METHOD_LABELS[o.a]} / Chen's = {o.ratio:.3f} [{o.low:.3f}, {o.high:.3f}] ({o.verdict})" for o in rows)
    return (f"\nThe paper's claim: at {net} batch {batch} (twice vanilla's largest batch) ApproxDP is {speedup}× faster "
            f"than Chen's, a ratio of {1 / speedup:.3f}. Here (CPU, {rows[0].net} at a reduced input): {said}.\n")


def render(record: dict, out: Path = OUT) -> None:
    """``<out>.md`` (ratios with intervals, every ordering with its corrected p) and ``<out>.png``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    points = _points(record)
    found = orderings(points)
    commits = sorted({(p.git_commit or "unknown")[:7] for p in points})
    lines = ["| net | batch | input | rounds | " + " | ".join(f"{METHOD_LABELS[a]} / {METHOD_LABELS[b]}" for a, b in PAIRS) + " |",
             "|---|---|---|---|" + "---|" * len(PAIRS)]
    by = {(o.net, o.batch_size, o.a, o.b): o for o in found}
    for p in points:
        cells = []
        for a, b in PAIRS:
            o = by.get((p.net, p.batch_size, a, b))
            cells.append("–" if o is None else f"{o.ratio:.3f} [{o.low:.3f}, {o.high:.3f}] p={o.p_holm:.3f} {o.verdict}")
        lines.append(f"| {p.net} | {p.batch_size} | {p.input_size}² | {len(p.times['vanilla'])} | " + " | ".join(cells) + " |")
    claims = sum(o.verdict != "tie" for o in found)
    out.with_suffix(".md").write_text(
        f"Figure 4 as a paired design: ratios of same-round step times (geometric mean over rounds, 95% bootstrap "
        f"interval, Holm-corrected p over all {len(found)} orderings; a verdict only where p < {ALPHA}, else a tie: "
        f"{claims} of {len(found)} are claims). Device: {points[0].device if points else '–'}. Records at commit "
        f"{', '.join(commits)} by `python -m experiments.figure4_paired --write --nets <net>`, a network at a time "
        f"(the last: `{record['command']}`).\n\n" + "\n".join(lines) + "\n" + _claim_line(found))
    nets_ = list(dict.fromkeys(p.net for p in points))
    fig, axes = plt.subplots(1, max(1, len(nets_)), figsize=(3.2 * max(1, len(nets_)), 3.4), squeeze=False)
    for ax, net in zip(axes[0], nets_):
        for a, colour in (("chen", "tab:green"), ("approxdp_tc", "tab:red"), ("approxdp_mc", "tab:orange")):
            os_ = [o for o in found if o.net == net and (o.a, o.b) == (a, "vanilla")]
            xs = [o.batch_size for o in os_]
            ax.errorbar(xs, [o.ratio for o in os_], yerr=[[o.ratio - o.low for o in os_], [o.high - o.ratio for o in os_]],
                        marker="o", ms=3, capsize=2, color=colour, label=METHOD_LABELS[a])
        ax.axhline(1, color="tab:blue", lw=1, label="vanilla")
        ax.set(title=net, xlabel="batch")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("step time / same round's vanilla")
    axes[0][0].legend(fontsize=7)
    fig.suptitle(f"Figure 4, paired: 95% bootstrap intervals over rounds; records at {', '.join(commits)}", fontsize=9)
    fig.tight_layout()
    fig.savefig(out.with_suffix(".png"), dpi=110, metadata={"Software": None})
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    what = ap.add_mutually_exclusive_group(required=True)
    what.add_argument("--write", action="store_true", help="time the points, write the JSON record, render")
    what.add_argument("--render", action="store_true", help="render the table and figure from the JSON record")
    ap.add_argument("--nets", nargs="+", choices=list(GRID), default=list(GRID))
    ap.add_argument("--rounds", type=int, default=ROUNDS, help="interleaved rounds per point (≥ 3)")
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                    help="cpu: GRID's reduced input sizes; cuda: each network's paper input size, on the GPU")
    args = ap.parse_args(argv)
    if args.rounds < 3:
        ap.error(f"--rounds {args.rounds}: a bootstrap over rounds needs at least 3")
    if args.device == "cuda" and not torch.cuda.is_available():
        ap.error("--device cuda: no CUDA device here (torch.cuda.is_available() is False)")
    json_path = OUT.with_suffix(".json")
    if args.write:
        kept = [p for p in _points(load(json_path)) if p.net not in args.nets] if json_path.exists() else []
        fresh = []
        for net in args.nets:
            size, batches = GRID[net]
            size = nets.spec(net).input_size[0] if args.device == "cuda" else size
            for b in batches:
                fresh.append(time_point(net, b, size, args.rounds, args.device))
                print(f"{net} b{b}: " + ", ".join(f"{m} {np.median(t):.3f} s" for m, t in fresh[-1].times.items()), flush=True)
        order = {n: i for i, n in enumerate(GRID)}
        points = sorted(kept + fresh, key=lambda p: (order[p.net], p.batch_size))
        record = dict(source="Kusumoto et al. (2019) Figure 4, timed as a paired design",
                      command="python -m experiments.figure4_paired " + shlex.join(sys.argv[1:] if argv is None else argv),
                      torch_version=torch.__version__, points=[asdict(p) for p in points])
        write_artefact(json_path, record)
    render(load(json_path))


if __name__ == "__main__":
    main()
