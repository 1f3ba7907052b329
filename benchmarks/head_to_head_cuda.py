"""The head-to-head on a CUDA GPU: every method's real peak and step time at the paper's batch and size.

    python -m benchmarks.head_to_head_cuda            # print the tables (refuses without a CUDA GPU)
    python -m benchmarks.head_to_head_cuda --write    # and docs/gpu.md, paper_figures/cuda_pareto_<net>.json

:mod:`benchmarks.head_to_head` predicts peaks and times on the CPU from one captured joint graph; this
runs the steps. Per network, on the GPU, each method trains the paper's network on random inputs at
the paper's batch and input size under :func:`recompute.measure` (``backend="cuda"``:
``torch.cuda.max_memory_allocated`` above what the parameters hold, synchronised wall time, median of
``--iterations`` steps after one warm-up):

* eager training (``vanilla``, the reference of the time ratios);
* PyTorch: ``torch.compile`` (inductor) under ``activation_memory_budget`` ∈
  :data:`benchmarks.head_to_head.BUDGETS` × every solver torch ships, ``checkpoint`` per block,
  ``checkpoint_sequential`` (2, √n, 8 segments) and selective activation checkpointing;
* ours compiled: ``torch.compile(backend=recompute.backend(..., runtime="inductor"))`` for vanilla and
  the time-centric DP at its smallest feasible peak and at the head-to-head's budgets, each without and
  with cheap rematerialization (:data:`benchmarks.head_to_head.REMAT_WEIGHTS`);
* ours eager (``executor ...``): the step traced once on the GPU (cuDNN's workspaces counted, ops timed
  there), vanilla (what running the step op by op costs), the time- and memory-centric DPs' smallest
  plans and Chen's √n segments, each also with cheap values recomputed late where that lowers its peak,
  run by our executor.

``--eager`` leaves out every compiled point (a network's inductor compiles take minutes); with
``--write`` it keeps those an earlier run measured, and the table names both commands.

A method that runs out of GPU memory is recorded with no peak (``oom``) and the run goes on. Points
carry the device's name; ``exact`` is false for inductor's points (its fused kernels round differently
from eager's).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Callable, Iterator

import torch

import recompute
from experiments import nets
from recompute.doors.measure import default_loss
from benchmarks.partitions import SOLVERS

from .common import (FRACTION, NON_NEGATIVE, POSITIVE_INT, REPO, head_commit, made_by, markdown_table, write_atomic,
                     write_doc)
from .head_to_head import BUDGETS, EAGER_BASELINES, NETWORKS, PLANNING, REMAT_WEIGHTS, Method, refined, rewritten

FIGURES = REPO / "paper_figures"
GIB = 2**30


@dataclass
class CudaPoint(Method):
    """One method on one network, measured on the GPU (``peak`` None where it did not run: ``status``
    says why, ``oom`` or the method's refusal)."""

    peak: int | None
    seconds: float | None
    device: str
    exact: bool
    status: str = "ok"
    made_by: str = ""  # the command, torch and commit the point was measured with
    predicted: int | None = None  # our executor's plans: the simulated peak (workspaces counted), params included


def load(name: str, folder: Path = FIGURES) -> list[CudaPoint] | None:
    """The points a previous ``--write`` kept for network ``name``."""
    path = folder / f"cuda_pareto_{name}.json"
    points = [CudaPoint(**r) for r in json.loads(path.read_text())] if path.exists() else []
    return points or None


def provenance(points: list[CudaPoint]) -> str:
    """What measured the points: one command, or the eager points' and the compiled points' where an
    ``--eager`` run kept an earlier run's compiled points."""
    by = {p.exact: p.made_by or "command not recorded" for p in reversed(points)}
    if len(set(by.values())) == 1:
        return next(iter(by.values()))
    return f"{by[True]}; compiled points: {by[False]}"


def report(done: dict[str, list[CudaPoint]]) -> str:
    """One table per network, each under the command, torch version and commit that measured it."""
    names = sorted(done, key=lambda n: NETWORKS.index(n) if n in NETWORKS else len(NETWORKS))
    return "\n\n".join(f"**{n}** (batch {done[n][0].batch_size}, {done[n][0].input_size}², {done[n][0].device}; "
                        f"{provenance(done[n])})\n\n{net_table(done[n])}" for n in names)


def require_cuda() -> str:
    """The GPU's name, or a clear refusal where there is none."""
    if not torch.cuda.is_available():
        raise SystemExit("benchmarks.head_to_head_cuda needs a CUDA GPU (torch.cuda.is_available() is False); "
                         "on the CPU run `python -m benchmarks.head_to_head`, which predicts peaks and times")
    return torch.cuda.get_device_name()


Make = Callable[[], tuple[torch.nn.Module, Any]]


@dataclass(frozen=True)
class Grid:
    """Which points run: PyTorch's compile budgets × solvers, and our time-centric DP at ``ours`` budgets
    (the smallest feasible peak, then evenly towards vanilla's) × cheap-rematerialization weights; none
    of these where ``compiled`` is false (the eager methods and our executor's plans run either way)."""

    budgets: tuple[float, ...] = BUDGETS
    solvers: tuple[str, ...] = SOLVERS
    ours: int = 4
    remat: tuple[float | None, ...] = REMAT_WEIGHTS
    compiled: bool = True


def _compiled(model: torch.nn.Module, **options: Any) -> Make:
    """A fresh copy of ``model`` and its ``torch.compile`` (the step's gradients land on the copy)."""
    def make() -> tuple[torch.nn.Module, Any]:
        own = copy.deepcopy(model)
        return own, torch.compile(own, **options)

    return make


def _optimized(model: torch.nn.Module, method: str, options: dict[str, Any]) -> Make:
    def make() -> tuple[torch.nn.Module, Any]:
        wrapped = recompute.optimize(copy.deepcopy(model), method=method, **options)
        return wrapped.model, wrapped

    return make


def _executed(model: torch.nn.Module, graph: recompute.Graph, plan: recompute.Plan) -> Make:
    return lambda: (model, recompute.execute(graph, plan, model))


def _executor(model: torch.nn.Module, inputs: tuple) -> Iterator[tuple[str, str, Make]]:
    """(method, knob, make) for our plans on the eager path, as ``benchmarks.head_to_head`` lists them:
    one trace of the step on the model's device, its ops timed there (``measured``). Where tracing or
    planning fails, one point says so and the run goes on."""
    try:
        graph = recompute.trace(model, inputs, loss_fn=default_loss, cost_model=PLANNING["cost_model"])
        # vanilla run by the executor: what interpreting the step costs beside plain eager training
        tc, mc = (recompute.plan(graph, "approxdp", strategy=s) for s in ("tc", "mc"))
        plans = [("vanilla", "", recompute.plan(graph, "vanilla")), ("approxdp_tc", "budget min", tc),
                 ("approxdp_mc", "budget min", mc), *refined(graph, tc, mc),
                 ("chen", "√n segments", recompute.plan(graph, "chen"))]
        plans = rewritten(graph, plans)
    except Exception as e:  # recorded by run_net as the point's failure
        def failed(error: Exception = e) -> tuple[torch.nn.Module, Any]:
            raise error

        yield "executor", "", failed
        return
    for method, knob, p in plans:
        yield f"executor {method}", knob, _executed(model, graph, p)


def _runners(model: torch.nn.Module, inputs: tuple, grid: Grid) -> Iterator[tuple[str, str, str, Make, Any]]:
    """(method, knob, family, make the model and its runner, the context to measure it in) per method."""
    yield "vanilla", "", "ours", lambda: (model, None), contextlib.nullcontext()
    for method, options in EAGER_BASELINES:
        knob = ", ".join(f"{k}={'√n' if (k, v) == ('segments', 0) else v}" for k, v in options.items())
        yield method, knob, "pytorch", _optimized(model, method, options), contextlib.nullcontext()
    for method, knob, make in _executor(model, inputs):
        yield method, knob, "ours", make, contextlib.nullcontext()
    if not grid.compiled:
        return
    for solver in grid.solvers:
        for b in grid.budgets:
            patch = torch._functorch.config.patch(activation_memory_budget=b, activation_memory_budget_solver=solver)
            yield "min_cut", f"budget {b:g}, {solver}", "pytorch", _compiled(model), patch
    # the partitions' simulated peaks; planning needs no compiler, so these run eager
    probe = recompute.backend("vanilla", **PLANNING)
    first = recompute.backend("approxdp", strategy="tc", **PLANNING)
    for b in (probe, first):
        torch._dynamo.reset()
        torch.compile(copy.deepcopy(model), backend=b)(*inputs)
    vanilla_peak, min_peak = probe.partitions[-1].peak, first.partitions[-1].peak
    steps = grid.ours
    budgets = [None, *(min_peak + (vanilla_peak - min_peak) * j // steps for j in range(1, steps))]
    for weight in grid.remat:
        for budget in budgets:
            knob = "budget min" if budget is None else f"budget {budget / vanilla_peak:.2f} of vanilla"
            backend = recompute.backend("approxdp", strategy="tc", budget=budget, runtime="inductor", remat=weight, **PLANNING)
            method = "approxdp_tc" if weight is None else f"approxdp_tc+remat {weight:g}"
            yield method, knob, "ours", _compiled(model, backend=backend), contextlib.nullcontext()


def run_net(name: str, iterations: int = 5, batch: int | None = None, size: int | None = None,
            grid: Grid = Grid(), backend: str = "cuda") -> list[CudaPoint]:
    """Every method of ``grid`` on network ``name`` on the GPU (the paper's batch and size unless given;
    ``backend="cpu"`` runs the same list on the CPU, where the tests check it)."""
    device = require_cuda() if backend == "cuda" else backend
    spec = nets.spec(name)
    batch = spec.batch_size if batch is None else batch
    size = spec.input_size[0] if size is None else size
    model, inputs = nets.build(name, batch_size=batch, input_size=size, seed=0)
    model, inputs = model.to(backend), tuple(x.to(backend) for x in inputs)
    points = []
    for method, knob, family, make, context in _runners(model, inputs, grid):
        torch._dynamo.reset()
        peak, seconds, status, predicted = None, None, "ok", None
        try:
            with context:
                own, runner = make()
                m = recompute.measure(own, inputs, runner=runner, backend=backend, iterations=iterations)
            peak, seconds = m.peak_bytes + m.param_bytes, m.seconds
            if isinstance(runner, recompute.Executor):
                predicted = runner.plan.peak + m.param_bytes
        except torch.OutOfMemoryError:
            status = "oom"  # recorded; the next method runs
        except (ValueError, NotImplementedError) as e:  # a method that refuses this model (baselines.Unsupported)
            status = f"unsupported: {e}"
        except Exception as e:  # e.g. a compiler error on this device: recorded, and the next method runs
            status = f"failed: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        finally:
            own = runner = None
            if backend == "cuda":
                torch.cuda.empty_cache()
        compiled = method == "min_cut" or (family == "ours" and not method.startswith(("vanilla", "executor")))
        points.append(CudaPoint(name, batch, size, method, knob, family, peak, seconds, device, not compiled, status,
                                predicted=predicted))
        shown = status if peak is None else f"{peak / GIB:.3f} GiB, {seconds:.3f} s"
        shown += "" if predicted is None else f" (simulated {predicted / GIB:.3f} GiB)"
        print(f"{name} {method} {knob}: {shown}", flush=True)
    return points


def net_table(points: list[CudaPoint]) -> str:
    eager = next(p for p in points if p.method == "vanilla")
    rows = [[p.family, f"{p.method} {p.knob}".strip(), p.status if p.peak is None else f"{p.peak / GIB:.2f}",
             "" if p.predicted is None else f"{p.predicted / GIB:.2f}",
             "—" if p.seconds is None else f"{p.seconds:.3f}",
             "—" if p.seconds is None or eager.seconds is None else f"{p.seconds / eager.seconds:.3f}×"]
            for p in sorted(points, key=lambda p: (p.peak is None, p.peak or 0))]
    return markdown_table(["family", "method", "peak GiB", "simulated GiB", "step s", "time × eager"], rows)


def _weight(text: str) -> float | None:
    """A cheap-rematerialization weight from 0 up, or ``off`` (none)."""
    if text == "off":
        return None
    try:
        return NON_NEGATIVE(text)
    except argparse.ArgumentTypeError as e:
        raise argparse.ArgumentTypeError(f"{e}, nor 'off'") from e


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nets", nargs="+", default=list(NETWORKS), choices=list(NETWORKS))
    parser.add_argument("--iterations", type=POSITIVE_INT, default=5, help="timed steps per method (after one warm-up)")
    parser.add_argument("--budgets", nargs="+", type=FRACTION, default=list(BUDGETS), help="PyTorch's activation_memory_budget grid")
    parser.add_argument("--solvers", nargs="+", default=list(SOLVERS), choices=list(SOLVERS))
    parser.add_argument("--ours", type=POSITIVE_INT, default=Grid.ours, help="budgets of our time-centric DP, the smallest feasible first")
    parser.add_argument("--remat", nargs="+", type=_weight, default=list(REMAT_WEIGHTS),
                        help="cheap-rematerialization weights of our points ('off': none)")
    parser.add_argument("--eager", action="store_true", help="only the eager methods and our executor's plans (no torch.compile)")
    parser.add_argument("--write", action="store_true", help="update docs/gpu.md and paper_figures/cuda_pareto_<net>.json")
    args = parser.parse_args(argv)
    require_cuda()
    grid = Grid(tuple(args.budgets), tuple(args.solvers), args.ours, tuple(args.remat), not args.eager)
    made = made_by(head_commit(), f"torch {torch.__version__}", argv=argv)
    # a run of some networks keeps the others' points (each table names what measured it)
    done = {n: ps for n in NETWORKS if args.write and (ps := load(n)) is not None}
    for name in args.nets:
        # an --eager run keeps the network's compiled points (minutes of inductor compiles each)
        kept = [p for p in done.get(name, []) if not p.exact] if args.eager else []
        done[name] = [replace(p, made_by=made) for p in run_net(name, args.iterations, grid=grid)] + kept
        print(net_table(done[name]), flush=True)
        if args.write:
            text = json.dumps([asdict(p) for p in done[name]], indent=1)
            write_atomic(FIGURES / f"cuda_pareto_{name}.json", lambda tmp: Path(tmp).write_text(text))
            write_doc("cuda-head-to-head", report(done))


if __name__ == "__main__":
    main()
