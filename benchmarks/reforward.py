"""Re-forwarding beside Chen's segmentation and the DPs on the seven networks of Kusumoto et al.

    python -m benchmarks.reforward                 # print the table
    python -m benchmarks.reforward --write         # and update docs/planners.md
    python -m benchmarks.reforward --nets vgg19 --methods chen reforward

Each network at the paper's batch and input size; every plan is executed for one training step on the
``fake`` backend (parameters included in the peak). Overhead is eq. (1) of Kusumoto et al. (the forward
cost the backward pass repeats, in the trace's cost units) and its share of one forward pass T(V). The
DPs run at their smallest feasible budget under the ``liveness`` memory model (priced by the simulator);
Re-forwarding has no budget: its own memory model, eq. (1) of Feng & Huang, is the last column.
Solve times are one call each, after a warm-up that compiles the DPs' numba kernels.
"""

from __future__ import annotations

from typing import Any

from tqdm import tqdm

import recompute
from experiments import nets
from recompute.pricing.memory_model import MemoryModel

from .common import head_commit, made_by, markdown_table, net_method_args, write_doc

LIVENESS = {"memory_model": MemoryModel.liveness}
METHODS: dict[str, tuple[str, str | None, dict[str, Any]]] = {
    "vanilla": ("vanilla", None, {}),
    "chen": ("chen", None, {}),
    **{f"{dp}_{st}": (dp, st, LIVENESS) for dp in ("approxdp", "exactdp") for st in ("tc", "mc")},
    "reforward_linear": ("reforward_linear", None, {}),
    "reforward": ("reforward", None, {}),
}
HEADERS = ["network", "method", "measured GiB (fake)", "vs vanilla", "overhead (cost units)", "overhead / T(V)",
           "blocks k", "solve s", "Feng eq. (1) GiB"]
GIB = 2**30


def rows_for(name: str, labels: list[str], bar: tqdm) -> list[list[object]]:
    """One row per method on network ``name``."""
    model, inputs = nets.build(name, fake_inputs=True)
    graph = recompute.trace(model, inputs)
    vanilla = recompute.measure(model, inputs, backend="fake").total_peak_bytes
    out: list[list[object]] = []
    for label in labels:
        bar.set_postfix_str(f"{name} {label}")
        method, strategy, options = METHODS[label]
        plan = recompute.plan(graph, method, strategy=strategy, **options)
        peak = vanilla if method == "vanilla" else recompute.measure(
            model, inputs, runner=recompute.execute(graph, plan), backend="fake").total_peak_bytes
        feng = plan.info.get("feng_memory")
        out.append([
            name, label, f"{peak / GIB:.2f}", f"{peak / vanilla - 1:+.1%}", plan.overhead,
            f"{plan.overhead / graph.total_time():.0%}", plan.k, f"{plan.solve_seconds:.2f}",
            f"{feng / GIB:.2f}" if feng is not None else "",
        ])
        bar.update()
    return out


def main() -> None:
    args = net_method_args(__doc__, list(METHODS))
    commit = head_commit()
    small = recompute.trace(*nets.build("resblock"))
    for method, strategy, options in METHODS.values():  # compile (or load) the numba kernels before timing
        recompute.plan(small, method, strategy=strategy, **options)
    bar = tqdm(total=len(args.nets) * len(args.methods), desc="reforward", leave=False)
    rows = [row for name in args.nets for row in rows_for(name, args.methods, bar)]
    bar.close()
    text = f"{made_by(commit)}\n\n{markdown_table(HEADERS, rows)}"
    print(text)
    if args.write:
        write_doc("reforward-table", text)


if __name__ == "__main__":
    main()
