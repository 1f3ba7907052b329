"""Plans that recompute more than once (Revolve, Chen's recursion, Beaumont's join DP) beside the best canonical plan.

    python -m benchmarks.multirecompute                 # print the table
    python -m benchmarks.multirecompute --write         # and update docs/planners.md
    python -m benchmarks.multirecompute --nets vgg19 --methods chen revolve

Each network at its paper batch and input size, traced with its loss as the app traces it. Every plan
runs one training step on the ``fake`` backend (measured GiB, parameters included) beside the
simulator's peak of its schedule plus the parameters (simulated GiB). Canonical plans (each value
recomputed at most once): ApproxDP and ExactDP, TC and MC, at their smallest budget with the
``liveness`` memory model, Chen's √n and greedy segmentations. Multi-recompute plans: ``revolve`` and
``chen_recursive`` on the chain of the graph's articulation steps, ``join_dp`` on the join networks,
at the slot count of the smallest simulated peak. "vs best canonical" compares the measured peak with
the smallest measured canonical peak of the network; recomputations count the op instances of the
joint graph that the schedule runs again, and their cost is Σ T_v over every recomputation of a node
of V (eq. (1) of Kusumoto et al. for the canonical plans) as a share of one forward pass T(V).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tqdm import tqdm

import recompute
from experiments import nets
from recompute.doors.measure import default_loss
from recompute.pricing.memory_model import MemoryModel

from .common import head_commit, made_by, markdown_table, net_method_args, write_doc

LIVENESS = {"memory_model": MemoryModel.liveness}
CANONICAL: dict[str, tuple[str, str | None, dict[str, Any]]] = {
    "vanilla": ("vanilla", None, {}),
    **{f"{dp}_{st}": (dp, st, LIVENESS) for dp in ("approxdp", "exactdp") for st in ("tc", "mc")},
    "chen": ("chen", None, {}),
    "chen_greedy": ("chen_greedy", None, {}),
}
MULTI = ("revolve", "chen_recursive", "join_dp")
METHODS = [*CANONICAL, *MULTI]
NETS = ["snn", "cross_modal", "vgg19", "unet"]
HEADERS = ["network", "method", "slots", "measured GiB (fake)", "simulated GiB", "vs best canonical",
           "recomputations", "recomputed cost / T(V)", "solve s"]
GIB = 2**30


@dataclass
class Row:
    """One plan on one network (``peak`` None: the planner could not plan it, ``note`` says why)."""

    net: str
    method: str
    peak: int | None = None
    simulated: int | None = None
    slots: int | None = None
    recomputations: int | None = None
    overhead: float | None = None
    solve_seconds: float | None = None
    note: str = ""

    @property
    def multi(self) -> bool:
        return self.method in MULTI


def rows_for(name: str, labels: list[str], bar: tqdm) -> list[Row]:
    """Plan, execute and measure every method of ``labels`` on network ``name``."""
    model, inputs = nets.build(name, fake_inputs=True)
    graph = recompute.trace(model, inputs, loss_fn=default_loss)
    out: list[Row] = []
    for label in labels:
        bar.set_postfix_str(f"{name} {label}")
        bar.update()
        if label == "join_dp" and nets.spec(name).num_inputs < 2:
            out.append(Row(name, label, note="one input: not a join"))
            continue
        method, strategy, options = CANONICAL.get(label, (label, None, {}))
        try:
            plan = recompute.plan(graph, method, strategy=strategy, **options)
        except Exception as exc:  # e.g. too many lower sets for exactdp on a join: a row that says so
            out.append(Row(name, label, note=type(exc).__name__))
            continue
        executor = recompute.execute(graph, plan)
        got = recompute.measure(model, inputs, runner=executor, backend="fake")
        out.append(Row(name, label, got.total_peak_bytes, plan.peak + got.param_bytes, plan.slots,
                       executor.schedule.recomputations(), plan.overhead / graph.total_time(), plan.solve_seconds))
    return out


def _best(rows: list[Row], multi: bool) -> Row | None:
    done = [r for r in rows if r.peak is not None and r.multi == multi]
    return min(done, key=lambda r: r.peak) if done else None


def table(rows: list[Row]) -> str:
    """The markdown table, each network's rows against its best canonical peak."""
    cells = []
    for r in rows:
        canon = _best([s for s in rows if s.net == r.net], multi=False)
        if r.peak is None:
            cells.append([r.net, r.method, "—", "—", "—", r.note, "—", "—", "—"])
            continue
        vs = f"{r.peak / canon.peak - 1:+.1%}" if canon is not None else "—"
        cells.append([r.net, r.method, r.slots if r.slots is not None else "—", f"{r.peak / GIB:.2f}",
                      f"{r.simulated / GIB:.2f}", vs, r.recomputations, f"{r.overhead:.2f}", f"{r.solve_seconds:.1f}"])
    return markdown_table(HEADERS, cells)


def verdicts(rows: list[Row]) -> str:
    """Per network: the best multi-recompute plan against the best canonical one."""
    lines = []
    for name in dict.fromkeys(r.net for r in rows):
        mine = [r for r in rows if r.net == name]
        multi, canon = _best(mine, True), _best(mine, False)
        if multi is None or canon is None:
            continue
        word = "below" if multi.peak < canon.peak else "not below"
        lines.append(f"* **{name}**: {multi.method} at {multi.slots} slots, {multi.peak / GIB:.2f} GiB — {word} "
                     f"the best canonical plan ({canon.method}, {canon.peak / GIB:.2f} GiB) by "
                     f"{multi.peak / canon.peak - 1:+.1%}, with {multi.recomputations} recomputed op instances "
                     f"against {canon.recomputations}.")
    return "\n".join(lines)


def main() -> None:
    args = net_method_args(__doc__, METHODS, NETS)
    commit = head_commit()
    bar = tqdm(total=len(args.nets) * len(args.methods), desc="multirecompute", leave=False)
    rows = [row for name in args.nets for row in rows_for(name, args.methods, bar)]
    bar.close()
    text = f"{made_by(commit)}\n\n{table(rows)}\n\n{verdicts(rows)}"
    print(text)
    if args.write:
        write_doc("multirecompute-table", text)


if __name__ == "__main__":
    main()
