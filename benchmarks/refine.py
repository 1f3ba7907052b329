"""Plans between the two strategies (``recompute.refine``) at the paper's size: peak against recomputation.

    python -m benchmarks.refine                  # DenseNet-161, batch 32, 224², limits 0.95 and 0.99 GiB
    python -m benchmarks.refine --write          # and update docs/planners.md

The network's step is traced on fake inputs and planned in the paper's costs (10 per convolution, 1
otherwise) with the simulator's memory model. Each row is run as the executor runs it with both
rewrites (``recompute.rewrites.pipeline.with_rewrites(recompute_late=True, in_place=True)``): its simulated peak, parameters
and buffers included, and its recomputation in cost units, the late copies included. The refined
plans are the memory-centric plan with the time-centric plan's nested lower sets inserted within each
``--limits`` (GiB, parameters included).
"""

from __future__ import annotations

import argparse
import time

import recompute
from experiments import nets
from recompute.core.storage import state_bytes
from recompute.doors.measure import default_loss
from benchmarks.refining import finest, refine

from .common import POSITIVE, head_commit, made_by, markdown_table, write_doc
from recompute.rewrites.pipeline import with_rewrites

GIB = 2**30
HEADERS = ["plan", "peak GiB (late, in place, +params)", "recomputation (cost units)", "late recomputations",
           "lower sets", "search s"]


def run(name: str, batch: int, size: int, limits: list[float]) -> list[list[object]]:
    model, inputs = nets.build(name, batch_size=batch, input_size=size, seed=0, fake_inputs=True)
    params = state_bytes(model)
    g = recompute.trace(model, inputs, loss_fn=default_loss)
    tc, mc = (recompute.plan(g, "approxdp", strategy=s, memory_model="simulator") for s in ("tc", "mc"))
    plans = [("time-centric", tc, 0.0), ("memory-centric", mc, 0.0),
             ("every nested set inserted", recompute.Plan.from_sequence(g, finest(mc.lower_sets, tc.lower_sets),
                                                                         method="approxdp", strategy="mc",
                                                                         memory_model=mc.memory_model), 0.0)]
    for limit in limits:
        start = time.perf_counter()
        plans.append((f"refined within {limit:g} GiB", refine(g, mc, tc, int(limit * GIB) - params),
                      time.perf_counter() - start))
    rows = []
    for label, p, seconds in plans:
        run_ = with_rewrites(p, g, recompute_late=True, in_place=True)
        rows.append([label, f"{(run_.peak + params) / GIB:.3f}", run_.overhead,
                     run_.info.get("late recomputations", 0), len(p.lower_sets), f"{seconds:.1f}" if seconds else ""])
        print(" | ".join(map(str, rows[-1])), flush=True)
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--net", default="densenet161", choices=nets.names(paper_only=True))
    parser.add_argument("--limits", nargs="+", type=POSITIVE, default=[0.95, 0.99], help="GiB, parameters included")
    parser.add_argument("--write", action="store_true", help="update docs/planners.md")
    args = parser.parse_args(argv)
    commit = head_commit()
    paper = nets.spec(args.net)
    rows = run(args.net, paper.batch_size, paper.input_size[0], args.limits)
    shape = f"{args.net}, batch {paper.batch_size}, {paper.input_size[0]}²"
    text = f"{made_by(commit, shape, argv=argv)}\n\n{markdown_table(HEADERS, rows)}"
    print(text)
    if args.write:
        write_doc("refine", text)


if __name__ == "__main__":
    main()
