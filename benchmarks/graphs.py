"""Table of the traced graphs of the seven paper networks at the paper's batch and input size.

    python -m benchmarks.graphs            # print the table
    python -m benchmarks.graphs --write    # and update docs/graphs.md

Tracing uses FakeTensor inputs, so no activation is allocated.
"""

from __future__ import annotations

import argparse

import recompute
from experiments import nets

from .common import head_commit, made_by, markdown_table, write_doc

# Why #V differs from the paper's where it does by more than 10% (checked against the traced ops).
REASONS = {
    "googlenet": "torchvision's GoogLeNet has BatchNorm after each of its 57 convolutions (the paper's "
    "Chainer GoogLeNet had none): 57 extra nodes; `nets.build('googlenet', batch_norm=False)` gives 139.",
}


def rows() -> list[list[object]]:
    out = []
    for name in nets.names(paper_only=True):
        s = nets.spec(name)
        model, inputs = nets.build(name, fake_inputs=True)
        g = recompute.trace(model, inputs)
        diff = (g.n - s.paper_nodes) / s.paper_nodes
        h, w = inputs[0].shape[-2:]
        out.append([
            name, s.batch_size, f"{h}×{w}", g.n, s.paper_nodes, f"{diff:+.1%}", g.num_edges,
            f"{g.total_mem() / 2**30:.2f}", g.total_time(), f"{g.program.trace_seconds:.1f}",
            REASONS.get(name, "") if abs(diff) > 0.10 else "",
        ])
    return out


HEADERS = ["network", "batch", "input", "#V", "paper #V", "Δ", "#E", "M(V) GiB", "T(V) (paper costs)",
           "trace s", "reason for Δ > 10%"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="update docs/graphs.md")
    args = parser.parse_args()
    commit = head_commit()
    text = f"{made_by(commit)}\n\n{markdown_table(HEADERS, rows())}"
    print(text)
    if args.write:
        write_doc("graphs-table", text)


if __name__ == "__main__":
    main()
