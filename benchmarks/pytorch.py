"""PyTorch's own checkpointing beside our planners: measured peak against step time, per network.

    python -m benchmarks.pytorch                      # print the tables
    python -m benchmarks.pytorch --write --figures    # and update docs/benchmarks.md, paper_figures/cpu_pareto_<net>.png

Every method trains the same model on the same inputs on the ``cpu`` backend in one thread, under one
meter (:func:`recompute.measure`): the peak of live tensor bytes without the parameter gradients
(``activation_peak_bytes``) and the median of ``--iterations`` steps after one warm-up. Plain eager
training is the reference of both ratios. Our planners plan on the graph traced with the ``measured``
cost model (every node timed on this CPU, the device the run uses); the DPs are swept over budgets
from their smallest feasible peak towards vanilla's, PyTorch's methods over their knobs. Exactness is
one step compared with plain training (:func:`recompute.exactness.compare`).
"""

from __future__ import annotations

import argparse
import copy
import json
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import torch
from tqdm import tqdm

import recompute
from recompute import baselines, nets
from recompute.exactness import compare
from recompute.measure import default_loss

from .common import (NON_NEGATIVE, NON_NEGATIVE_INT, POSITIVE_INT, REPO, head_commit, made_by, markdown_table,
                     write_section)

# network → (batch, input size): the reduced CPU sizes
SIZES = {"resnet50": (8, 64), "densenet161": (8, 64), "googlenet": (8, 96), "vgg19": (4, 48), "unet": (2, 128)}
OURS = ("vanilla", "chen", "chen_greedy", "approxdp_tc", "approxdp_mc", "exactdp_tc", "exactdp_mc", "revolve")
PYTORCH = ("torch_checkpoint_sequential", "torch_checkpoint_blocks", "torch_sac", "torch_compile_budget")
METHODS = ("eager", *OURS, *PYTORCH)
SWEPT = ("approxdp_tc", "approxdp_mc", "exactdp_tc", "exactdp_mc", "revolve")  # over budgets
# inductor's C++ build takes minutes per graph on this machine; this backend runs the same min-cut
# partition (the same saved values) op by op
COMPILE_BACKEND = "aot_eager_decomp_partition"
KNOBS: dict[str, list[dict[str, Any]]] = {
    "torch_checkpoint_sequential": [{"segments": 2}, {"segments": 0}, {"segments": 8}],  # 0: ⌈√n⌉
    "torch_compile_budget": [{"budget_fraction": f, "backend": COMPILE_BACKEND} for f in (0.1, 0.3, 0.5)],
}
MIB = 2**20
FIGURES = REPO / "paper_figures"


@dataclass
class Point:
    """One method at one budget or knob on one network, as measured.

    Attributes:
        family: ``eager`` (plain training, the reference), ``ours`` or ``pytorch``.
        knob: the budget (ours, as a fraction of vanilla's simulated peak) or PyTorch's option.
        peak: peak bytes without the parameter gradients; ``None`` where it did not run.
        full_peak: the step's whole peak, parameter gradients included (what the planners minimise).
        grad_bytes: the parameter gradients' bytes at the end of the step (the floor under ``full_peak``).
        exact: :meth:`recompute.exactness.Exactness.summary`, or why it did not run.
        same_as: the label of an identical plan measured before (its numbers are reused).
        made_by: the command, commit and date that measured it (:func:`benchmarks.common.made_by`).
    """

    network: str
    method: str
    family: str
    knob: str = ""
    peak: int | None = None
    full_peak: int | None = None
    grad_bytes: int | None = None
    seconds: float | None = None
    exact: str = ""
    same_as: str = ""
    made_by: str = ""

    @property
    def label(self) -> str:
        return f"{self.method} {self.knob}".strip()


Runner = Callable[[], tuple[torch.nn.Module, Any]]  # → (the model it trains, the runner to measure)


def _planner(method: str) -> tuple[str, str | None]:
    """``approxdp_tc`` → (``approxdp``, ``tc``); any other method is a planner of its own name."""
    return tuple(method.rsplit("_", 1)) if method.endswith(("_tc", "_mc")) else (method, None)  # type: ignore[return-value]


def _plans(graph: recompute.Graph, method: str, budgets: int, vanilla_peak: int) -> list[tuple[str, recompute.Plan]]:
    """``method``'s plans with their knob labels: a method of :data:`SWEPT` at ``budgets`` budgets from
    its smallest feasible peak up towards vanilla's simulated one (equally spaced, vanilla's excluded);
    any other planner's one plan."""
    planner, strategy = _planner(method)
    first = recompute.plan(graph, planner, strategy=strategy)
    if method not in SWEPT:
        return [("", first)]
    out = [(f"budget min = {first.peak / vanilla_peak:.2f}", first)]
    for j in range(1, budgets):
        budget = first.peak + (vanilla_peak - first.peak) * j // budgets
        out.append((f"budget {budget / vanilla_peak:.2f}", recompute.plan(graph, planner, strategy=strategy, budget=budget)))
    return out


def variant_count(methods: Sequence[str], budgets: int) -> int:
    """How many points :func:`run_net` lists for ``methods`` on a network (for the progress bar)."""
    return sum(budgets if m in SWEPT else len(KNOBS.get(m, [{}])) for m in methods)


def _variants(name: str, model: torch.nn.Module, inputs: tuple, methods: Sequence[str], budgets: int,
              max_overhead: float) -> Iterator[tuple[Point, Runner | None, Any]]:
    """Each method × budget or knob: its point (not yet measured), how to make its runner (``None``: a
    plan predicted to recompute more than ``max_overhead`` forward passes, not run), and a key under
    which identical plans share one measurement."""
    graph = None
    if any(m in OURS for m in methods):
        graph = recompute.trace(model, inputs, cost_model="measured", loss_fn=default_loss)
        vanilla_peak = recompute.plan(graph, "vanilla").peak
    for method in methods:
        if method == "eager":
            yield Point(name, method, "eager", exact="reference"), lambda: (model, None), "eager"
        elif method in OURS:
            for knob, p in _plans(graph, method, budgets, vanilla_peak):
                key = (tuple(p.lower_sets), None if p.schedule is None else tuple(p.schedule.steps))
                point = Point(name, method, "ours", knob)
                forwards = p.overhead / graph.total_time()
                if forwards > max_overhead:
                    point.exact = f"not run: recomputes {forwards:.1f} forward passes (measured costs)"
                    yield point, None, key
                else:
                    yield point, (lambda p=p: (model, recompute.execute(graph, p, model))), key
        else:
            for options in KNOBS.get(method, [{}]):
                knob = ", ".join(f"{k}={'√n' if (k, v) == ('segments', 0) else v}" for k, v in options.items()
                                 if k != "backend")
                yield Point(name, method, "pytorch", knob), (lambda m=method, o=options: _wrapped(model, m, o)), None


def _wrapped(model: torch.nn.Module, method: str, options: dict[str, Any]) -> tuple[torch.nn.Module, Any]:
    """A copy of ``model`` under PyTorch's ``method``: the checkpoint variants turn in-place modules out
    of place for good, and a compiled module must not hit the graphs compiled for another budget."""
    torch._dynamo.reset()
    wrapped = recompute.optimize(copy.deepcopy(model), method=method, **options)
    return wrapped.model, wrapped


def run_net(name: str, batch: int, size: int, methods: Sequence[str] = METHODS, *, budgets: int = 3,
            iterations: int = 5, warmup: int = 1, max_overhead: float = 3.0, bar: tqdm | None = None) -> list[Point]:
    """Measure every method of ``methods`` on network ``name`` at ``batch`` × ``size``² (see the module
    docstring); a plan predicted to recompute more than ``max_overhead`` forward passes is listed, not run."""
    torch.manual_seed(0)
    model, inputs = nets.build(name, batch_size=batch, input_size=size, seed=0)
    points: list[Point] = []
    seen: dict[Any, Point] = {}
    for point, make, key in _variants(name, model, inputs, methods, budgets, max_overhead):
        if bar is not None:
            bar.set_postfix_str(f"{name} {point.label}")
        if key is not None and key in seen:
            first = seen[key]
            point.peak, point.full_peak, point.grad_bytes, point.seconds = (first.peak, first.full_peak,
                                                                            first.grad_bytes, first.seconds)
            point.exact, point.same_as = first.exact, first.label
        elif make is not None:
            try:
                trained, runner = make()
                r = recompute.measure(trained, inputs, runner=runner, backend="cpu", warmup=warmup, iterations=iterations)
                point.peak, point.full_peak, point.seconds = r.activation_peak_bytes, r.peak_bytes, r.seconds
                point.grad_bytes = r.grad_bytes
                if runner is not None:
                    point.exact = compare(trained, runner, inputs, seed=0).summary()
            except baselines.Unsupported as e:  # a baseline that does not apply to this net is a result
                point.exact = f"does not run: {e}"
            except RuntimeError as e:
                if point.family != "pytorch":
                    raise
                # PyTorch's method failing on a zoo net (an in-place op on what a checkpoint keeps) is a result too
                point.exact = f"fails: {str(e).splitlines()[0][:160]}"
        if key is not None and key not in seen:
            seen[key] = point
        points.append(point)
        if bar is not None:
            bar.update()
    return points


def _ratio(x: float | None, base: float | None, digits: int = 2) -> str:
    return "—" if x is None or not base else f"{x / base:.{digits}f}×"


def net_table(points: list[Point]) -> str:
    """One network's markdown table: peak and time against eager, exactness."""
    eager = next(p for p in points if p.family == "eager")
    rows = [[p.method, p.knob + (f" (= {p.same_as})" if p.same_as else ""),
             "—" if p.peak is None else f"{p.peak / MIB:.1f}", _ratio(p.peak, eager.peak),
             "—" if p.full_peak is None else f"{p.full_peak / MIB:.1f}",
             "—" if p.seconds is None else f"{p.seconds:.3f}", _ratio(p.seconds, eager.seconds), p.exact]
            for p in points]
    return markdown_table(["method", "budget / knob", "peak MiB (no param. grads)", "peak × eager",
                           "whole peak MiB", "s / step",
                           "time × eager", "exact"], rows)


def _best_at(ours: list[Point], seconds: float, metric: str) -> Point | None:
    """Our smallest ``metric`` (a peak attribute of :class:`Point`) at a step time ≤ ``seconds``."""
    fit = [p for p in ours if p.seconds <= seconds and getattr(p, metric) is not None]
    return min(fit, key=lambda p: (getattr(p, metric), p.seconds)) if fit else None


def verdict(points: list[Point], metric: str = "peak") -> list[Any]:
    """The summary row of one network on ``metric`` (``peak``: without the parameter gradients, or
    ``full_peak``: the whole step): PyTorch's smallest, our smallest at no more time, their ratio and
    whether it is ≤ 0.8; the largest such ratio over all of PyTorch's points; and the parameter
    gradients' bytes (the floor under a whole peak)."""
    eager = next(p for p in points if p.family == "eager")
    ran = [p for p in points if getattr(p, metric) is not None and not p.same_as]
    ours = [p for p in ran if p.family == "ours"]
    theirs = [p for p in ran if p.family == "pytorch"]
    grads = "—" if eager.grad_bytes is None else f"{eager.grad_bytes / MIB:.1f}"
    if not ours or not theirs:
        return [points[0].network, "—", "—", "—", "—", "—", grads]
    size = lambda p: getattr(p, metric)  # noqa: E731
    best = min(theirs, key=lambda p: (size(p), p.seconds))
    mine = _best_at(ours, best.seconds, metric)

    def show(p: Point) -> str:
        return f"{p.label}: {size(p) / MIB:.1f} MiB = {size(p) / size(eager):.2f}× at {p.seconds / eager.seconds:.2f}× time"

    ratio = None if mine is None else size(mine) / size(best)
    worst = []
    for t in theirs:
        m = _best_at(ours, t.seconds, metric)
        worst.append((size(m) / size(t) if m else float("inf"), t.label))
    w_ratio, w_label = max(worst)
    return [points[0].network, show(best), "none as fast" if mine is None else show(mine),
            "—" if ratio is None else f"{ratio:.2f}", "yes" if ratio is not None and ratio <= 0.8 else "**no**",
            "none as fast" if w_ratio == float("inf") else f"{w_ratio:.2f} (vs {w_label})", grads]


VERDICT_HEADERS = ["network", "PyTorch's smallest", "ours: smallest at ≤ its time", "ours / theirs",
                   "≤ 0.8×", "largest ours / theirs over PyTorch's points", "param. grads MiB"]


def figure(points: list[Point], path: Path) -> None:
    """Peak against step time (both × eager), every method; a line joins a method's budgets or knobs."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    eager = next(p for p in points if p.family == "eager")
    fig, ax = plt.subplots(figsize=(9, 5))
    style = {"ours": ("o", "-"), "pytorch": ("s", "--"), "eager": ("*", "")}
    for method in dict.fromkeys(p.method for p in points):
        ps = sorted((p for p in points if p.method == method and p.peak is not None and not p.same_as),
                    key=lambda p: p.seconds)
        if not ps:
            continue
        marker, line = style[ps[0].family]
        ax.plot([p.seconds / eager.seconds for p in ps], [p.peak / eager.peak for p in ps], marker=marker,
                linestyle=line, markersize=12 if method == "eager" else 6, label=method)
    ax.set_xlabel("step time × eager (median, cpu, 1 thread)")
    ax.set_ylabel("peak without parameter gradients × eager")
    ax.set_title(f"{points[0].network}: peak vs step time (circles: ours, squares: PyTorch's)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1))
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def save(points: list[Point], folder: Path = FIGURES) -> None:
    """Keep one network's points beside its figure, so that a run of other networks reports it too."""
    path = folder / f"cpu_pareto_{points[0].network}.json"
    path.write_text(json.dumps([asdict(p) for p in points], indent=1, ensure_ascii=False))


def load(name: str, folder: Path = FIGURES) -> list[Point] | None:
    """The points :func:`save` kept for network ``name``, if any."""
    path = folder / f"cpu_pareto_{name}.json"
    return [Point(**d) for d in json.loads(path.read_text())] if path.exists() else None


def report(done: dict[str, list[Point]]) -> str:
    """Every network's table (in :data:`SIZES` order), then the verdicts."""
    names = [n for n in SIZES if n in done]
    tables = [f"**{n}** (batch {SIZES[n][0]}, {SIZES[n][1]}²; {done[n][0].made_by or 'command and commit not recorded'})"
              f"\n\n{net_table(done[n])}" for n in names]
    verdicts = [f"**{title}**\n\n" + markdown_table(VERDICT_HEADERS, [verdict(done[n], metric) for n in names])
                for metric, title in (("peak", "Peak without the parameter gradients"),
                                      ("full_peak", "Whole peak (parameter gradients included)"))]
    return "\n\n".join([*tables, *verdicts])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nets", nargs="+", default=list(SIZES), choices=list(SIZES))
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS))
    parser.add_argument("--budgets", type=POSITIVE_INT, default=3, help="budgets per swept method (DPs, revolve), the smallest feasible one first")
    parser.add_argument("--warmup", type=NON_NEGATIVE_INT, default=1)
    parser.add_argument("--iterations", type=POSITIVE_INT, default=5)
    parser.add_argument("--max-overhead", type=NON_NEGATIVE, default=3.0,
                        help="skip plans predicted to recompute more forward passes than this")
    parser.add_argument("--write", action="store_true", help="update docs/benchmarks.md")
    parser.add_argument("--figures", action="store_true", help="write paper_figures/cpu_pareto_<net>.png")
    args = parser.parse_args()
    torch.set_num_threads(1)
    made = made_by(head_commit())
    # with --write, the networks not run now are reported from what an earlier run kept
    done = {n: ps for n in SIZES if args.write and (ps := load(n)) is not None}
    total = variant_count(args.methods, args.budgets) * len(args.nets)
    with tqdm(total=total, desc="pytorch vs ours", leave=False) as bar:
        for name in args.nets:
            batch, size = SIZES[name]
            done[name] = [replace(p, made_by=made) for p in run_net(
                name, batch, size, args.methods, budgets=args.budgets, iterations=args.iterations,
                warmup=args.warmup, max_overhead=args.max_overhead, bar=bar)]
            print(f"{name}\n{net_table(done[name])}\n", flush=True)
            if args.figures:
                figure(done[name], FIGURES / f"cpu_pareto_{name}.png")
            if args.write:  # after every network, so that a long run stopped early keeps what it measured
                save(done[name])
                write_section(REPO / "docs" / "benchmarks.md", "pytorch-pareto", report(done))
    print("\n\n".join(report(done).split("\n\n")[-4:]))


if __name__ == "__main__":
    main()
