"""The time model against real CPU steps: predicted / measured step seconds, per network and plan.

    OMP_NUM_THREADS=1 python -m benchmarks.timemodel            # print the table
    OMP_NUM_THREADS=1 python -m benchmarks.timemodel --write    # and update docs/simulator.md

For each of the paper's seven networks at a reduced size (:data:`benchmarks.cpu_time.SIZES`), the
vanilla plan and three recomputing plans of different overhead run on our executor in one thread.
The measured time is the median over ``--steps`` steps of the thread's CPU time (``time.thread_time``:
the machine is shared, and wall time would count the other processes' turns). The predicted time is
:class:`recompute.capture.timing.TimeModel`'s sum over the plan's schedule, on the same clock, of per-op costs
timed where the ops run: in ``--steps`` plain (vanilla) steps of the same network
(:meth:`~recompute.capture.timing.TimeModel.observe`); the few keys that step does not run (``getitem``) are
timed alone. So the vanilla row checks that a step's time is the sum of its ops', and the three
recomputing rows predict steps that were not timed, their recomputations priced as the plain step
runs those ops.

The two are taken in ``--rounds`` interleaved rounds (the plan's steps, then the plain step's ops timed
anew), and the ratio is the median of the rounds' ratios: this host's speed drifts (the same VGG-19
step measured 0.83 s one day and 1.78 s another), and op timings taken minutes before the steps they
predict moved the ratio with it (DenseNet-161's four plans: 0.86–1.02 in one run, 1.36–1.54 in the
next); within a round both sides see the same host.

PyTorch's methods are priced the same way: the ATen calls one step of each makes (recorded by
:class:`recompute.capture.timing.Recorder`: checkpointing's recomputations included) at the same op costs —
``checkpoint`` per block, ``checkpoint_sequential`` with ⌈√n⌉ segments, selective checkpointing per
block; and ``torch.compile`` at ``activation_memory_budget`` 0.5, whose min-cut partition of the same
step is priced op by op, unfused (:func:`benchmarks.partitions.price`), against the step inductor
compiles: how far the model that prices PyTorch's compiled points at the paper's sizes is from them.
Every network runs at its size and at ``--batches`` × its batch.

``--alone`` times every op alone instead, with the core's private cache flushed before each call (the
table before 2026-12-06): on this project's host it under-predicted the ResNets' steps by 8–14%.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any, Callable, Sequence

import torch

import recompute
from experiments import nets
from recompute.doors.baselines import Unsupported
from recompute.doors.measure import default_loss
from benchmarks.partitions import capture, torch_partition
from recompute.capture.timing import OpCall, Recorder, TimeModel, module_calls, schedule_calls

from .common import POSITIVE_INT, head_commit, made_by, markdown_table, write_doc
from .cpu_time import SIZES

# (label, method, strategy): no recomputation, then three plans of growing overhead
PLANS = [("vanilla", "vanilla", None), ("chen", "chen", None), ("approxdp-tc min", "approxdp", "tc"),
         ("approxdp-mc min", "approxdp", "mc")]
# PyTorch's methods, eager (label, baseline, options), priced by the calls their step records
PYTORCH = [("checkpoint per block", "torch_checkpoint_blocks", {}),
           ("checkpoint_sequential √n", "torch_checkpoint_sequential", {"segments": 0}),
           ("SAC per block", "torch_sac", {})]
COMPILE_BUDGET = 0.5  # the activation_memory_budget of the compiled row
FLUSH_BYTES = 4 * 2**20  # twice this machine's 2 MiB L2 cache per core
HEADERS = ["network", "batch × input", "plan or method", "overhead (cost units)", "predicted overhead s (median)", "predicted s (median)",
           "measured s (median)", "predicted / measured (median of rounds)", "rounds' range"]


def step(runner: Callable[..., torch.Tensor], model: torch.nn.Module, inputs: tuple) -> None:
    """One training step (``runner(*inputs)`` is the loss), its parameters' gradients then dropped."""
    runner(*inputs).backward()
    for p in model.parameters():
        p.grad = None


def step_seconds(run_step: Callable[[], None], steps: int) -> float:
    """Median thread CPU seconds of ``steps`` training steps."""
    times = []
    for _ in range(steps):
        start = time.thread_time()
        run_step()
        times.append(time.thread_time() - start)
    return statistics.median(times)


def recorded(runner: Callable[..., Any], model: torch.nn.Module, inputs: tuple) -> list[OpCall]:
    """The ATen calls of one training step of ``runner`` (a recomputation in backward is a call too)."""
    with Recorder() as recorder:
        step(runner, model, inputs)
    return recorder.calls


def _priced(name: str, batch: int, size: int, model: torch.nn.Module, inputs: tuple, steps: int, repeats: int,
            rounds: int, alone: bool) -> list[list[object]]:
    """Every row of one network at one batch (see the module docstring)."""
    graph = recompute.trace(model, inputs, loss_fn=default_loss)
    plain_plan = recompute.plan(graph, "vanilla")  # the step whose ops are timed where they run
    vanilla, plain = schedule_calls(graph.program, plain_plan.runs(graph)), recompute.execute(graph, plain_plan, model)
    # what each row runs (a step of the model's own: executors return the loss) and the calls it is priced by
    cases: list[tuple[str, str, Callable[[], None], Callable[[], list[OpCall]]]] = []
    for label, method, strategy in PLANS:
        p = recompute.plan(graph, method, strategy=strategy)
        ex = recompute.execute(graph, p, model)
        cases.append((label, str(p.overhead), lambda ex=ex: step(ex, model, inputs),
                      lambda p=p: schedule_calls(graph.program, p.runs(graph))))
    for label, method, options in PYTORCH:
        try:
            wrapped = recompute.optimize(model, method=method, **options)
        except Unsupported as e:
            print(f"{name} {label}: not run ({e})", flush=True)
            continue
        loss_step = lambda *xs, w=wrapped: default_loss(w(*xs))  # noqa: E731
        cases.append((label, "–", lambda s=loss_step: step(s, model, inputs),
                       lambda s=loss_step: recorded(s, model, inputs)))
    c = capture(model, inputs)
    fw, bw = torch_partition(c, COMPILE_BUDGET)
    compiled = recompute.optimize(model, method="torch_compile_budget", budget_fraction=COMPILE_BUDGET)
    cases.append((f"compile budget {COMPILE_BUDGET} (priced unfused, op by op)", "–",
                  lambda: step(lambda *xs: default_loss(compiled(*xs)), model, inputs),
                  lambda: [*module_calls(fw), *module_calls(bw)]))
    rows = []
    for label, overhead, run_step, calls_of in cases:
        run_step()  # warm-up (compiles)
        calls = calls_of()
        paired = []
        for _ in range(rounds):
            measured = step_seconds(run_step, steps)
            fresh = TimeModel(repeats=repeats, clock="thread", flush_bytes=FLUSH_BYTES if alone else 0)
            if not alone:
                fresh.observe(lambda: step(plain, model, inputs), steps)
            predicted = fresh.seconds(calls)  # the overhead from the same timings: most keys are shared
            paired.append((predicted, measured, predicted - fresh.seconds(vanilla)))
        predicted, measured, extra = (statistics.median(side) for side in zip(*paired))
        ratios = [a / b for a, b, _ in paired]
        rows.append([name, f"{batch}×{size}²", label, overhead, f"{extra:.3f}", f"{predicted:.3f}",
                     f"{measured:.3f}", f"{statistics.median(ratios):.3f}", f"{min(ratios):.3f}–{max(ratios):.3f}"])
        print(" | ".join(map(str, rows[-1])), flush=True)
    return rows


def run(names: list[str], steps: int, repeats: int, rounds: int, alone: bool = False,
        batches: Sequence[int] = (1,)) -> list[list[object]]:
    rows = []
    for name in names:
        batch, size = SIZES[name]
        for times in batches:
            model, inputs = nets.build(name, batch_size=batch * times, input_size=size, seed=0)
            rows += _priced(name, batch * times, size, model, inputs, steps, repeats, rounds, alone)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nets", nargs="+", default=list(SIZES), choices=list(SIZES))
    parser.add_argument("--steps", type=POSITIVE_INT, default=3, help="timed steps per plan and round")
    parser.add_argument("--rounds", type=POSITIVE_INT, default=5, help="rounds of steps, then the ops timed anew")
    parser.add_argument("--repeats", type=POSITIVE_INT, default=5, help="timed calls per op key timed alone")
    parser.add_argument("--alone", action="store_true",
                        help="time every op alone, the core's cache flushed before each call (the model before 2026-12-06)")
    parser.add_argument("--batches", nargs="+", type=POSITIVE_INT, default=[1, 2],
                        help="multiples of each network's batch to run at")
    parser.add_argument("--write", action="store_true", help="update docs/simulator.md")
    args = parser.parse_args()
    torch.set_num_threads(1)
    commit = head_commit()
    rows = run(args.nets, args.steps, args.repeats, args.rounds, args.alone, args.batches)
    ours = max(abs(float(r[-2]) - 1) for r in rows if r[2] in {label for label, *_ in PLANS})
    eager = max((abs(float(r[-2]) - 1) for r in rows if r[2] in {label for label, *_ in PYTORCH}), default=0.0)
    compiled = [float(r[-2]) for r in rows if r[2].startswith("compile")]
    summary = (f"largest error: our executor's plans {ours:.1%}, PyTorch's eager methods {eager:.1%}"
               + (f"; the compiled step priced unfused op by op {min(compiled):.2f}–{max(compiled):.2f}× its measured time"
                  if compiled else ""))
    text = f"{made_by(commit, summary)}\n\n{markdown_table(HEADERS, rows)}"
    print(text)
    if args.write:
        write_doc("time-model", text)


if __name__ == "__main__":
    main()
