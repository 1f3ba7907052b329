"""Peak memory of every method on the seven paper networks at the paper's batch sizes (``fake`` backend).

    python -m benchmarks.memory                    # print the table
    python -m benchmarks.memory --write            # and update docs/benchmarks.md
    python -m benchmarks.memory --nets vgg19 resnet50 --methods approxdp_tc chen

For each network × method: the measured peak of one training step (FakeTensor execution, exact at the
allocation level, parameters included), the planner's eq. (2) prediction (+ parameters), their ratio,
the reduction vs vanilla, and the paper's Table 1 reduction.
"""

from __future__ import annotations

import argparse

from tqdm import tqdm

import recompute
from recompute import nets

from .common import REPO, markdown_table, paper_table1, write_section

METHODS = {
    "vanilla": ("vanilla", None),
    "chen": ("chen", None),
    "chen_greedy": ("chen_greedy", None),
    "approxdp_mc": ("approxdp", "mc"),
    "approxdp_tc": ("approxdp", "tc"),
    "exactdp_mc": ("exactdp", "mc"),
    "exactdp_tc": ("exactdp", "tc"),
}
PAPER_COLUMN = {"vanilla": "vanilla_gb", "chen": "chen_gb", "approxdp_mc": "approxdp_mc_gb",
                "approxdp_tc": "approxdp_tc_gb", "exactdp_mc": "exactdp_mc_gb", "exactdp_tc": "exactdp_tc_gb"}
GIB = 2**30


def run(net_names: list[str], method_names: list[str]) -> list[list[object]]:
    paper = paper_table1()
    rows = []
    bar = tqdm(total=len(net_names) * len(method_names), desc="memory", leave=False)
    for name in net_names:
        model, inputs = nets.build(name, fake_inputs=True)
        graph = recompute.trace(model, inputs)
        vanilla = recompute.measure(model, inputs, backend="fake").total_peak_bytes
        ref = paper.get(name, {})
        for label in method_names:
            method, strategy = METHODS[label]
            bar.set_postfix_str(f"{name} {label}")
            try:
                plan = recompute.plan(graph, method, strategy=strategy)
            except Exception as exc:  # e.g. too many lower sets for exactdp: a row that says so
                rows.append([name, label, "—", "—", "—", "—", "—", "—", "—", type(exc).__name__])
                bar.update()
                continue
            got = recompute.measure(model, inputs, runner=recompute.execute(graph, plan), backend="fake")
            predicted = plan.peak + got.param_bytes
            paper_red = ""
            if label in PAPER_COLUMN and ref:
                paper_red = f"{ref[PAPER_COLUMN[label]]:.1f} GB ({ref[PAPER_COLUMN[label]] / ref['vanilla_gb'] - 1:+.0%})"
            rows.append([
                name, label, f"{got.total_peak_bytes / GIB:.2f}", f"{predicted / GIB:.2f}",
                f"{predicted / got.total_peak_bytes:.2f}", f"{got.total_peak_bytes / vanilla - 1:+.1%}",
                paper_red, plan.overhead, f"{plan.solve_seconds:.2f}", "",
            ])
            bar.update()
    bar.close()
    return rows


HEADERS = ["network", "method", "measured GiB (fake)", "predicted GiB (eq. 2)", "predicted / measured",
           "reduction vs vanilla", "paper Table 1", "overhead (cost units)", "solve s", "note"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nets", nargs="+", default=nets.names(paper_only=True))
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS))
    parser.add_argument("--write", action="store_true", help="update docs/benchmarks.md")
    args = parser.parse_args()
    table = markdown_table(HEADERS, run(args.nets, args.methods))
    print(table)
    if args.write:
        write_section(REPO / "docs" / "benchmarks.md", "memory-table", table)


if __name__ == "__main__":
    main()
