"""Plain eager training's step beside our executor's plain step, priced by the head-to-head's time model in rounds.

    OMP_NUM_THREADS=1 python -m benchmarks.plain_steps --net vgg19 --rounds 4

PyTorch's plain eager step and ours without recomputation (``recompute.plan(graph, "vanilla")``, as
planned and in place, :func:`~recompute.rewrites.pipeline.with_in_place`) run the same ATen calls, but where ours
writes into a tensor that exists (ReLU's backward: ``threshold_backward.grad_input``) or decomposes
an op otherwise (dropout). In the head-to-head the keys they do not share are timed minutes apart,
beside the other job. Here each round times every op of the three steps afresh, one step right after
the other (the order turned round from one round to the next), at the head-to-head's probe batches and
on huge pages as it does, so that the steps' difference shows beside the rounds' spread.
"""

from __future__ import annotations

import argparse
import statistics
from collections import defaultdict

import torch

from experiments import nets
from recompute.capture.timing import BatchExtrapolation

from .common import POSITIVE_INT, markdown_table
from .extrapolation import in_process, op_kind
from .head_to_head import HUGE_PAGES, PLAIN, PROPORTIONAL, probe_batches, probe_model, step_calls

STEPS = ("eager", *PLAIN)


def rounds(net: str, batch: int, size: int, count: int) -> tuple[list[list[object]], list[list[object]]]:
    """Rows (round, step timed first, seconds of each step, ours ÷ eager) for ``count`` rounds, and rows
    (op kind, median seconds of each step) for the op kinds whose seconds differ between the steps."""
    torch.set_num_threads(1)
    small, large = probe_batches(net, batch)
    calls = {s: {b: step_calls(net, b, size, s) for b in {small, large, batch}} for s in STEPS}
    per_round: list[list[object]] = []
    by_kind: dict[str, list[dict[str, float]]] = {s: [] for s in STEPS}  # each round's seconds per op kind
    for r in range(count):
        ex = BatchExtrapolation(probe_model(), small, large, batch, proportional=PROPORTIONAL)
        for s in STEPS:
            ex.add(calls[s][small], calls[s][large], calls[s][batch])
        order = STEPS if r % 2 == 0 else STEPS[::-1]
        seconds = {s: ex.seconds(calls[s][batch]) for s in order}  # each step's new keys timed in turn
        per_round.append([r + 1, order[0], *(f"{seconds[s]:.3f}" for s in STEPS),
                          *(f"{seconds[s] / seconds['eager']:.4f}" for s in STEPS[1:])])
        for s in STEPS:
            kinds: dict[str, float] = defaultdict(float)
            for c, t in zip(calls[s][batch], ex.costs(calls[s][batch])):
                kinds[op_kind(c)] += t
            by_kind[s].append(kinds)
    every = {k for s in STEPS for kinds in by_kind[s] for k in kinds}
    medians = {k: {s: statistics.median(kinds.get(k, 0.0) for kinds in by_kind[s]) for s in STEPS} for k in every}
    differ = sorted((k for k, m in medians.items() if len({round(m[s], 3) for s in STEPS}) > 1),
                    key=lambda k: -max(medians[k].values()))
    return per_round, [[k, *(f"{medians[k][s]:.3f}" for s in STEPS)] for k in differ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--net", default="vgg19")
    parser.add_argument("--batch", type=POSITIVE_INT, help="default: the paper's")
    parser.add_argument("--size", type=POSITIVE_INT, help="default: the paper's")
    parser.add_argument("--rounds", type=POSITIVE_INT, default=4)
    args = parser.parse_args()
    paper = nets.spec(args.net)
    batch, size = args.batch or paper.batch_size, args.size or paper.input_size[0]
    per_round, kinds = in_process(HUGE_PAGES, rounds, args.net, batch, size, args.rounds)
    print(f"{args.net}, batch {batch}, {size}², one thread, huge pages, probes {probe_batches(args.net, batch)}\n")
    print(markdown_table(["round", "timed first", *(f"{s} s" for s in STEPS), *(f"{s} ÷ eager" for s in STEPS[1:])],
                         per_round))
    print("\nop kinds whose seconds differ (median over the rounds)\n")
    print(markdown_table(["op kind", *(f"{s} s" for s in STEPS)], kinds))


if __name__ == "__main__":
    main()
