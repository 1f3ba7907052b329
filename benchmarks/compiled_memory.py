"""One partition run op by op and compiled by inductor, on a CUDA GPU: what each holds, beside the simulator.

    python -m benchmarks.compiled_memory --nets vgg19 --budgets 0.5      # on a CUDA GPU (refuses without)

For each network at the paper's batch and size: PyTorch's min-cut partition under each
``activation_memory_budget`` and our time-centric DP at its smallest peak, each trained once op by op
(the ``aot_eager`` way: every ATen op a call, cuDNN's workspaces taken per call) and once compiled by
inductor. Beside the measured CUDA peaks: the simulator's peak of the (forward, backward) pair
without and with each op's workspace (:mod:`recompute.capture.workspace`). Where the compiled step holds
less than the simulated one with workspaces, a planner for inductor must not plan around them.
"""

from __future__ import annotations

import argparse
import copy
from typing import Any, Callable

import torch
import torch.fx as fx
from torch._dynamo.backends.common import aot_autograd
from torch._dynamo.backends.debugging import boxed_nop
from torch._functorch.partitioners import min_cut_rematerialization_partition

import recompute
from experiments import nets
from benchmarks.partitions import _decompositions
from recompute.core.storage import state_bytes
from recompute.pricing.simulate import simulate_partition
from recompute.capture.workspace import Workspace

from .common import FRACTION, head_commit, made_by, markdown_table
from .head_to_head_cuda import require_cuda

GIB = 2**30
HEADERS = ["network", "partition", "runtime", "simulated GiB", "simulated with workspaces GiB", "measured GiB"]


def simulated(forward: fx.GraphModule, backward: fx.GraphModule, workspace: Workspace) -> tuple[int, int]:
    """The pair's simulated peak without and with each op's workspace at its step."""
    ws = workspace.of_nodes([*forward.graph.nodes, *backward.graph.nodes])
    return simulate_partition(forward, backward).peak, simulate_partition(forward, backward, workspace=ws).peak


def run_net(name: str, budgets: list[float]) -> list[list[Any]]:
    model, inputs = nets.build(name, seed=0)
    model, inputs = model.cuda(), tuple(x.cuda() for x in inputs)
    params = state_bytes(model)
    workspace = Workspace(torch.device("cuda"))
    rows = []

    def measured(compile_: Callable[[torch.nn.Module], Any]) -> int:
        torch._dynamo.reset()
        torch.cuda.empty_cache()
        own = copy.deepcopy(model)
        m = recompute.measure(own, inputs, runner=compile_(own), backend="cuda", iterations=2)
        return m.peak_bytes + m.param_bytes

    def row(partition: str, runtime: str, pair: tuple[fx.GraphModule, fx.GraphModule], peak: int) -> None:
        without, with_ws = simulated(*pair, workspace)
        rows.append([name, partition, runtime, f"{(without + params) / GIB:.3f}", f"{(with_ws + params) / GIB:.3f}",
                     f"{peak / GIB:.3f}"])
        print(" | ".join(rows[-1]), flush=True)

    for budget in budgets:
        pairs: list[tuple[fx.GraphModule, fx.GraphModule]] = []

        def partition(joint: fx.GraphModule, joint_inputs: Any, **kwargs: Any) -> tuple[fx.GraphModule, fx.GraphModule]:
            pairs.append(min_cut_rematerialization_partition(joint, joint_inputs, compiler="inductor", **kwargs))
            return pairs[-1]

        with torch._functorch.config.patch(activation_memory_budget=budget, activation_memory_budget_solver="dp"):
            aot = aot_autograd(fw_compiler=boxed_nop, bw_compiler=boxed_nop, decompositions=_decompositions,
                               partition_fn=partition, keep_inference_input_mutations=True)
            op_by_op = measured(lambda own: torch.compile(own, backend=aot))
            compiled = measured(torch.compile)
        row(f"min-cut budget {budget:g}", "op by op", pairs[0], op_by_op)
        row(f"min-cut budget {budget:g}", "inductor", pairs[0], compiled)
    for runtime in ("eager", "inductor"):
        b = recompute.backend("approxdp", strategy="tc", runtime=runtime, cost_model="flops", memory_model="simulator")
        peak = measured(lambda own: torch.compile(own, backend=b))
        part = b.partitions[-1]
        row("ours: approxdp_tc, smallest", "op by op" if runtime == "eager" else runtime, (part.forward, part.backward), peak)
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nets", nargs="+", default=["vgg19"], choices=nets.names(paper_only=True))
    parser.add_argument("--budgets", nargs="+", type=FRACTION, default=[0.5], help="PyTorch's activation_memory_budget")
    args = parser.parse_args(argv)
    device = require_cuda()
    commit = head_commit()
    rows = [r for name in args.nets for r in run_net(name, args.budgets)]
    print(f"{made_by(commit, f'on {device}', f'torch {torch.__version__}', argv=argv)}\n\n{markdown_table(HEADERS, rows)}")


if __name__ == "__main__":
    main()
