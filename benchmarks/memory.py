"""Peak memory of every method on the seven paper networks at the paper's batch sizes (``fake`` backend).

    python -m benchmarks.memory                    # print the table
    python -m benchmarks.memory --write            # and update docs/planners.md
    python -m benchmarks.memory --nets vgg19 resnet50 --methods approxdp_tc chen

For each network × method: the measured peak of one training step (FakeTensor execution, exact at the
allocation level, parameters included); the plan's peak as ``recompute.plan`` reports it on a traced
graph, the simulator's (:mod:`recompute.pricing.simulate`); the planner's own model's (``Plan.model_peak``:
eq. (2), or the liveness model for the ``+live`` rows), each with its ratio to the measured one; the
reduction vs vanilla in the model's eyes and as measured; and the paper's Table 1. All peaks include
the parameters.
"""

from __future__ import annotations

from tqdm import tqdm

import recompute
from experiments import nets
from recompute.pricing.memory_model import MemoryModel

from .common import head_commit, made_by, markdown_table, net_method_args, paper_table1, write_doc

# label → (method, strategy, memory model): the DPs with the paper's eq. (2) and with the liveness model
METHODS = {
    "vanilla": ("vanilla", None, None),
    "chen": ("chen", None, None),
    "chen_greedy": ("chen_greedy", None, None),
    **{f"{dp}_{st}{suffix}": (dp, st, model)
       for model, suffix in ((MemoryModel.paper, ""), (MemoryModel.liveness, "+live"))
       for dp in ("approxdp", "exactdp") for st in ("mc", "tc")},
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
        model_vanilla = {m: recompute.plan(graph, "vanilla", memory_model=m).model_peak
                         for m in (MemoryModel.paper, MemoryModel.liveness)}
        ref = paper.get(name, {})
        for label in method_names:
            method, strategy, memory_model = METHODS[label]
            bar.set_postfix_str(f"{name} {label}")
            try:
                options = {"memory_model": memory_model} if memory_model else {}
                plan = recompute.plan(graph, method, strategy=strategy, **options)
            except Exception as exc:  # e.g. too many lower sets for exactdp: a row that says so
                rows.append([name, label, *("—" for _ in HEADERS[2:-1]), type(exc).__name__])
                bar.update()
                continue
            got = recompute.measure(model, inputs, runner=recompute.execute(graph, plan), backend="fake")
            measured = got.total_peak_bytes
            simulated, modelled = plan.peak + got.param_bytes, plan.model_peak + got.param_bytes
            paper_red = ""
            column = PAPER_COLUMN.get(label.removesuffix("+live"))
            if column and ref:
                paper_red = f"{ref[column]:.1f} GB ({ref[column] / ref['vanilla_gb'] - 1:+.0%})"
            rows.append([
                name, label, f"{measured / GIB:.2f}", f"{simulated / GIB:.2f}", f"{simulated / measured:.3f}",
                f"{modelled / GIB:.2f}", f"{modelled / measured:.2f}",
                f"{plan.model_peak / model_vanilla[memory_model or MemoryModel.paper] - 1:+.1%}",
                f"{measured / vanilla - 1:+.1%}",
                paper_red, plan.overhead, f"{plan.solve_seconds:.2f}", "",
            ])
            bar.update()
    bar.close()
    return rows


HEADERS = ["network", "method", "measured GiB (fake)", "simulated GiB", "simulated / measured", "model GiB",
           "model / measured", "model's reduction", "measured reduction vs vanilla", "paper Table 1",
           "overhead (cost units)", "solve s", "note"]


def main() -> None:
    args = net_method_args(__doc__, list(METHODS))
    commit = head_commit()
    text = f"{made_by(commit)}\n\n{markdown_table(HEADERS, run(args.nets, args.methods))}"
    print(text)
    if args.write:
        write_doc("memory-table", text)


if __name__ == "__main__":
    main()
