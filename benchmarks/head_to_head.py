"""PyTorch's min-cut partitioner against ours at the paper's batch and input size: peak against step time.

    OMP_NUM_THREADS=1 python -m benchmarks.head_to_head            # print the tables (two networks at a time)
    OMP_NUM_THREADS=1 python -m benchmarks.head_to_head --write    # and docs/paper_scale.md, paper_figures/pareto_<net>.{png,json}

Per network, the training step (model, then :func:`recompute.doors.measure.default_loss`) is compiled once
on the ``meta`` device at the paper's batch and input size, with inductor's decompositions, and its
joint graph captured (:func:`benchmarks.partitions.capture`); nothing is computed. On that one graph:

* PyTorch: ``min_cut_rematerialization_partition`` over ``activation_memory_budget`` ∈ :data:`BUDGETS`
  × every ``activation_memory_budget_solver`` torch ships (:data:`benchmarks.partitions.SOLVERS`);
* ours: ``recompute.backend(...)``'s partition for vanilla, the time-centric DP over ``--budgets``
  budgets of its own from its smallest plan's towards vanilla's and the memory-centric DP at its
  smallest, planned with the ``simulator`` memory model and the ``measured`` cost model given
  the time model below (:data:`PLANNING`: the DPs minimise the very seconds the points are priced
  by); each as planned and with cheap ops recomputed in the backward where that keeps
  fewer bytes, at each weight of :data:`REMAT_WEIGHTS` (``+remat w``, :mod:`recompute.rewrites.remat`), and at
  :data:`SPLIT_WEIGHT` also with each convolution backward split where that frees its input earlier
  (``+split conv``, ``recompute.backend(split_convolutions=True)``: a lower peak for more time).

Every (forward, backward) pair is priced the same way: its peak by :func:`recompute.pricing.simulate.simulate_partition`
(plus parameters and buffers: everything the step holds, gradients included) and its step time by
:class:`recompute.capture.timing.BatchExtrapolation` — each op timed alone on this CPU (one thread, thread CPU
time) at two probe batches and extended linearly to the paper's (an op of :data:`PROPORTIONAL`
seconds or more at the small probe in proportion to the batch, untimed at the large one). The probes
allocate as the paper-scale calls do (``python -m benchmarks.extrapolation`` compares them): with
:data:`HUGE_PAGES`, since under glibc's default a paper-scale output is mapped on fresh 4-KiB pages
that its op faults in, a cost a probe's small outputs, reused from freed memory, do not pay. Both
partitions run the same ops as the unpartitioned step (random ops are never recomputed by either), so
every point is ``exact``.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import hashlib
import json
import multiprocessing
import os
import time
import traceback
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import asdict, dataclass, replace
from datetime import date
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable, Sequence

import torch
import torch.fx as fx

import recompute
from recompute.core.storage import state_bytes
from recompute.doors import baselines
from recompute.capture import costs
from experiments import nets
from recompute.capture.convsplit import split_convolution_backwards
from recompute.rewrites.inplace import simulated_in_place
from recompute.core.graph import Graph
from recompute.doors.measure import default_loss
from recompute.rewrites.peak import needed_splits
from benchmarks.partitions import (SOLVERS, JointCapture, Priced, capture, our_partition, price, split_convolutions,
                                  split_plan, torch_partition)
from recompute.pricing.memory_model import MemoryModel
from recompute.planners.registry import InfeasibleBudget, Plan, spec
from benchmarks.refining import finest, refine, step_peak
from recompute.pricing.simulate import simulate_partition
from recompute.capture.timing import BatchExtrapolation, OpCall, Recorder, TimeModel, module_calls, schedule_calls

from .common import (POSITIVE, POSITIVE_INT, REPO, command_line, head_commit, markdown_table, shared_cache_bytes, write_atomic,
                     write_doc)
from recompute.rewrites.pipeline import with_in_place, with_late_recompute, with_peak_recompute, with_rewrites

NETWORKS = ("resnet50", "resnet152", "vgg19", "densenet161", "googlenet", "unet", "pspnet")
BUDGETS = (0.0, 0.1, 0.3, 0.5, 1.0)  # activation_memory_budget grid
SOLVER_FREE = (0.0, 1.0)  # budgets min-cut answers without its solver (everything recomputable, or nothing)
REMAT_WEIGHTS = (None, 0.0, 0.25)
SPLIT_WEIGHT = 0.0  # the remat weight our plans are also listed at with split_convolutions
REMAT_CEILING = 4.0**5  # the largest remat weight remat_within tries
# PyTorch's eager methods and their knobs (segments 0: ⌈√n⌉), after plain eager training (their time reference)
EAGER_BASELINES: list[tuple[str, dict[str, Any]]] = [
    ("torch_checkpoint_blocks", {}), ("torch_checkpoint_sequential", {"segments": 2}),
    ("torch_checkpoint_sequential", {"segments": 0}), ("torch_checkpoint_sequential", {"segments": 8}),
    ("torch_sac", {}),
]
EAGER = [("eager", {}), *EAGER_BASELINES]  # recompute.backend(remat=...): off, then the price of a recomputed byte
PROBES = (2, 4)  # batches the ops are timed at (batch 1 decomposes some ops differently)
# where those under-price the paper's batch (``benchmarks.extrapolation``, huge pages, ops at batch 32):
# GoogLeNet's many small ops cost 0.54, 0.50, 0.54, 0.59 and 0.62 s per sample at batches 2 to 32, so
# probes at 2 and 4 extend to 0.76× of its ops' time at 32, at 4 and 8 to 0.92×, at 8 and 16 to 1.00×;
# DenseNet-161's probes at 2 and 4 to 0.78× (``sub`` 0.49×, ``mul`` 0.61×), at 4 and 8 to 0.88×
PROBES_OF = {"googlenet": (8, 16), "densenet161": (4, 8)}
# PyTorch's CPU allocator maps a tensor of 2 MiB or more on transparent huge pages (read once per
# process, at its first allocation: set before the networks' processes start); a user's own setting stands
HUGE_PAGES = {"THP_MEM_ALLOC_ENABLE": "1"}
PROPORTIONAL = 0.1  # seconds at the small probe from which an op is extended in proportion to the batch
# the order the networks are handed to the jobs: the longest first, so that no long one starts last (at
# 84d811a, 24:28 in all: DenseNet-161 789 s, ResNet-152 575, PSPNet 435, U-Net 385 of which 296 timing its
# 572² ops, GoogLeNet 367, ResNet-50 176, VGG-19 93); U-Net not at the start: at eaa6513 DenseNet-161 beside
# it waited 305 s for the timing lock, its planning ran 20% slower, and the run took 31:33
LONGEST_FIRST = ("densenet161", "resnet152", "pspnet", "unet", "googlenet", "resnet50", "vgg19")
# our planners minimise the simulator's peak of the schedule that runs, at measured costs: on the CPU
# the seconds the points are priced by (``time_model``), on a GPU each op timed on it
PLANNING = {"cost_model": "measured", "memory_model": "simulator"}
FIGURES = REPO / "paper_figures"
GIB = 2**30
FAST = 1.3  # the time, × plain training's, within which the bar compares the smallest peaks
BAR = 0.8  # the bar: our smallest peak ≤ this × PyTorch's smallest within FAST, at ≤ its time
BAR_BUDGETS = 4  # DP budgets searched at the bar's time where the other searches fall short of it


@dataclass
class Method:
    """Which method ran where: the network at a batch and input size, the method, its knob (PyTorch's
    budget and solver, or our budget; ``min``: the smallest feasible) and its family (``ours`` or
    ``pytorch``)."""

    network: str
    batch_size: int
    input_size: int
    method: str
    knob: str
    family: str


@dataclass
class Point(Method):
    """One partition of one network's step at the paper's size, priced.

    Attributes:
        method: ``min_cut`` (PyTorch's partitioner) or our planner (``vanilla``, ``approxdp_tc``…).
        peak: bytes at the step's peak, parameters, buffers and parameter gradients included.
        seconds: predicted step time on this CPU, one thread.
        time_ratio: ``seconds`` ÷ plain training's on the same runtime: eager PyTorch's for its eager
            methods (checkpoint, SAC: eager ops), the unpartitioned compiled step's for the partitions
            (inductor's decomposed ops, run one by one). Methods are compared by it.
        saved_bytes: the activations the forward module keeps for backward (None: not a partition).
        exact: the step computes what the unpartitioned one does (same ops, random ops never recomputed).
        commit: the commit the point was made at (a network's points are kept across runs of others).
    """

    peak: int
    seconds: float
    time_ratio: float
    saved_bytes: int | None
    exact: bool = True
    commit: str = ""


def _capture(name: str, batch: int, size: int) -> JointCapture:
    """The joint graph of ``name``'s step at ``batch`` × ``size``², on the meta device."""
    model, inputs = nets.build(name, batch_size=batch, input_size=size, seed=0, fake_inputs=True)
    model = model.to("meta")
    return capture(model, [torch.empty(x.shape, device="meta") for x in inputs])


def _fingerprint(gm: fx.GraphModule) -> bytes:
    """What a module runs (each node's op, target and arguments, by the nodes' names), hashed, without
    writing its Python code: two partitions with the same fingerprints are priced once."""
    text = "\n".join(f"{n.name} {n.op} {n.target} {n.args} {n.kwargs}" for n in gm.graph.nodes)
    return hashlib.blake2b(text.encode(), digest_size=16).digest()


def probes_of(name: str) -> tuple[int, int]:
    """The batches network ``name``'s ops are timed at."""
    return PROBES_OF.get(name, PROBES)


def probe_batches(name: str, batch: int) -> tuple[int, int]:
    """The batches ``name``'s ops are timed at for a step at ``batch``: its probes (:func:`probes_of`),
    or ``batch`` itself where it is no larger than the small probe (PSPNet's 2)."""
    probes = probes_of(name)
    return probes if batch > probes[0] else (batch, batch)


def time_model(name: str, size: int, target: JointCapture, batch: int, model_t: TimeModel) -> BatchExtrapolation:
    """Op costs at ``batch`` from the same step's joint graph timed at the network's probe batches
    (:data:`PROBES_OF`, else :data:`PROBES`; at ``batch`` itself where it is no larger than the small
    probe: PSPNet's 2)."""
    small, large = probe_batches(name, batch)
    ex = BatchExtrapolation(model_t, small, large, batch, proportional=PROPORTIONAL)
    captured = {b: target if b == batch else _capture(name, b, size) for b in (small, large, batch)}
    ex.add(*(module_calls(captured[b].joint) for b in (small, large, batch)))
    # the ops our partitions with split_convolutions run in place of a convolution's backward
    ex.add(*(module_calls(split_convolution_backwards(captured[b].copy(), where_input_dies=False))
             for b in (small, large, batch)))
    return ex


def run_net(name: str, budgets: int, model_t: TimeModel, solvers: Sequence[str] = SOLVERS,
            torch_budgets: Sequence[float] = BUDGETS, batch: int | None = None, size: int | None = None,
            eager: Sequence[tuple[str, dict[str, Any]]] = EAGER, own_process: bool = False) -> list[Point]:
    """Every partition of network ``name`` (at the paper's size unless ``batch``/``size`` are given).
    ``own_process``: the garbage collector is set for the step's graphs, hundreds of thousands of
    objects that each collection walked (a third of a DenseNet-161 split's time): it runs less often,
    and once captured the graphs are frozen out of its way, never to be collected in this process."""
    if own_process:
        gc.set_threshold(50_000, 20, 100)
    paper = nets.spec(name)
    batch = paper.batch_size if batch is None else batch
    size = paper.input_size[0] if size is None else size
    c = _capture(name, batch, size)
    ex = time_model(name, size, c, batch, model_t)
    # our executor's plain steps (traced here, before the collector is set aside: the traces are kept
    # for the executor's points) are priced right after plain eager training's below, so that the keys
    # they do not share with it (ReLU's backward into its input, dropout's fused op) are timed back to
    # back with its own: timed minutes apart, 0.2 s of VGG-19's 146-s step once put ours above eager's,
    # which its ops timed together put below in every round (``benchmarks.plain_steps``)
    plain = [ex.probe(step_calls(name, batch, size, s), lambda b, s=s: step_calls(name, b, size, s)) for s in PLAIN]
    if own_process:
        gc.collect()
        gc.freeze()
    planning = {**PLANNING, "cost_options": {"time_model": ex}}
    points: list[Point] = []
    priced: dict[tuple[bytes, bytes], Priced] = {}  # by the modules' fingerprints: a partition met again is priced once

    def cost(fw: fx.GraphModule, bw: fx.GraphModule) -> Priced:
        key = (_fingerprint(fw), _fingerprint(bw))
        priced[key] = priced[key] if key in priced else price(c, fw, bw, ex)
        return priced[key]

    def add(method: str, knob: str, family: str, fw: fx.GraphModule, bw: fx.GraphModule) -> None:
        q = cost(fw, bw)
        ratio = q.seconds / points[0].seconds if points else 1.0  # the first is the unpartitioned step
        points.append(Point(name, batch, size, method, knob, family, q.peak, q.seconds, ratio, q.saved_bytes))
        print(f"{name} {method} {knob}: {q.peak / GIB:.3f} GiB, {q.seconds:.2f} s", flush=True)

    mine: list[tuple[str, str, Any, dict[float | None, float]]] = []  # our plans and their seconds per remat weight
    splits: dict[tuple[int, tuple[frozenset[int], ...], float | None, bool], Any] = {}  # (graph, plan, remat weight, split) → modules
    peaks: dict[int, int] = {}  # a split (by id: each is made once) → its step's simulated peak

    def split(graph: Graph, p: Plan, weight: float | None = None, convolutions: bool = False) -> Any:
        """Plan ``p`` of ``graph`` split into modules, with cheap ops recomputed at remat ``weight`` (and
        with ``convolutions``, their backwards split where that frees the input earlier): each once (~3 s
        on DenseNet-161), as the searches below meet the same plans and weights again."""
        key = (id(graph), tuple(p.lower_sets), weight, convolutions)
        if key not in splits:
            splits[key] = (split_convolutions(c, split(graph, p, weight)) if convolutions
                           else split_plan(c, graph, p, weight))
        return splits[key]

    def simulated(q: Any) -> int:
        """The simulated peak of split ``q``'s step, parameters included: the searches' test (pricing
        each probe in seconds too made the run 4 minutes longer)."""
        if id(q) not in peaks:
            peaks[id(q)] = simulate_partition(q.forward, q.backward).peak + c.param_bytes
        return peaks[id(q)]

    def ours(method: str, knob: str, part: Any) -> None:
        """A plan of ours as planned (but vanilla: the reference, added first) and at each remat weight."""
        seconds = {}
        for weight in REMAT_WEIGHTS:
            q = part if weight is None else split(part.graph, part.plan, weight)
            if weight is not None or method != "vanilla":
                add(method if weight is None else f"{method}+remat {weight:g}", knob, "ours", q.forward, q.backward)
            seconds[weight] = cost(q.forward, q.backward).seconds
        # at the memory-lean end, also each convolution backward split where that frees its input
        q = split(part.graph, part.plan, SPLIT_WEIGHT, convolutions=True)
        add(f"{method}+remat {SPLIT_WEIGHT:g}+split conv", knob, "ours", q.forward, q.backward)
        mine.append((method, knob, part, seconds))

    _, _, vanilla = our_partition(c, "vanilla", strategy=None, **planning)
    splits[id(vanilla.graph), tuple(vanilla.plan.lower_sets), None, False] = vanilla
    add("vanilla", "", "ours", vanilla.forward, vanilla.backward)  # the unpartitioned step: every ratio's reference
    solver_free: dict[float, tuple[fx.GraphModule, fx.GraphModule]] = {}
    for solver in solvers:
        for b in torch_budgets:
            # torch answers budgets 0 and 1 before it calls a solver: partitioned once, listed per solver
            fw, bw = solver_free[b] if b in solver_free else torch_partition(c, b, solver)
            if b in SOLVER_FREE:
                solver_free[b] = fw, bw
            add("min_cut", f"budget {b:g}, {solver}", "pytorch", fw, bw)
    eager_pts = eager_points(name, batch, size, ex, eager[:1])
    for calls in plain:
        ex.seconds(calls)
    eager_pts += eager_points(name, batch, size, ex, eager[1:], eager_pts[0].seconds if eager_pts else None)
    # our executor's memory-centric plan is also refined to the time of the bar (PyTorch's points are all in)
    bar = smallest_fast([p for p in points + eager_pts if p.family == "pytorch"])
    theirs = [p for p in points + eager_pts if p.family == "pytorch"]
    executor = [pt for split in (False, True) for pt in executor_points(
        name, batch, size, ex, budgets, eager_pts[0].seconds if eager_pts else None, bar.time_ratio if bar else None,
        conv_splits=split, theirs=[] if split else theirs)]
    ours("vanilla", "", vanilla)
    first = our_partition(c, "approxdp", strategy="tc", **planning)[2]
    splits[id(first.graph), tuple(first.plan.lower_sets), None] = first
    ours("approxdp_tc", "budget min", first)
    listed: set[tuple[frozenset[int], ...]] = {tuple(first.plan.lower_sets)}  # our time-centric plans added
    smallest_mc = our_partition(c, "approxdp", strategy="mc", **planning)[2]
    ours("approxdp_mc", "budget min", smallest_mc)

    # The searches below step the DP's own budget, in its own memory model (the simulator's B(L, L')
    # where the block decomposition covers the graph, else liveness): one solve per budget, where
    # plan()'s budget, a simulated peak, would search the model's budget for each anew
    g = first.graph
    model = MemoryModel(first.plan.info.get("model", first.plan.memory_model))
    smallest = first.plan.model_peak or first.plan.peak  # the DP's budget at our smallest time-centric plan
    everything = model.peak(g, [frozenset(range(g.n))])  # and at vanilla's
    tried: dict[int, Plan | None] = {smallest: first.plan}  # the DP's budget → our time-centric plan there (None: infeasible)

    def planned(budget: int) -> Plan | None:
        if budget not in tried:
            try:
                tried[budget] = spec("approxdp").solve(g, budget, "tc", {"memory_model": model})
            except InfeasibleBudget:
                tried[budget] = None
        return tried[budget]

    def tc(budget: int) -> Any:
        """Our time-centric plan at ``budget`` split into modules, and it and its remat variants added
        once per distinct plan; None where infeasible."""
        p = planned(budget)
        if p is None:
            return None
        if tuple(p.lower_sets) not in listed:
            listed.add(tuple(p.lower_sets))
            ours("approxdp_tc", f"budget {budget / everything:.2f} of vanilla", split(g, p))
        return split(g, p)


    def bisect(up: Any, steps: int) -> tuple[int, int]:
        """``steps`` bisections of the DP's budget between our smallest time-centric plan's and
        vanilla's, moving the low end up where ``up`` holds for the time-centric plan at the middle
        (a :class:`Plan`, None where infeasible): the bracket (lo, hi) left."""
        lo, hi = smallest, everything
        for _ in range(steps):
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if up(planned(mid)) else (lo, mid)
        return lo, hi

    def fitted(peak: int, weight: float | None = 0.0) -> int | None:
        """The largest planner budget whose time-centric plan, with cheap ops recomputed at remat
        ``weight`` (0: every one; None: as planned), holds ≤ ``peak``; None where not even the smallest
        does. A planner's budget bounds the canonical schedule's peak, which holds each cached value to
        the end of its block's backward while the modules drop it after its last read (and remat drops
        more): a budget equal to ``peak`` plans too tight a step."""
        def fits(p: Plan | None) -> bool:
            return p is not None and simulated(split(g, p, weight)) <= peak

        return bisect(fits, steps=8)[0] if fits(first.plan) else None

    def smallest_within(limit: float) -> int:
        """Our time-centric plan (and its remat variants) at the smallest planner budget whose step as
        planned takes ≤ ``limit`` seconds: our smallest peak within a PyTorch point's time (the DP's
        smallest, listed already, where it is that fast). Returns that budget."""
        def too_slow(p: Plan | None) -> bool:
            return p is None or cost(split(g, p).forward, split(g, p).backward).seconds > limit

        if not too_slow(first.plan):
            return smallest
        budget = bisect(too_slow, steps=5)[1]
        tc(budget)
        return budget

    bisected: set[tuple[str, str, int | float]] = set()  # (plan, knob, peak or time) searched already

    def remat_turn(part: Any, holds: Callable[[Any], bool], steps: int = 5) -> tuple[Any, Any]:
        """``part`` with cheap ops recomputed at the two remat weights around where ``holds`` turns false
        (it holds at small weights, which recompute most), as (weight, partition) or None where not
        reached: the weight grows ×4 from 1 while ``holds``, then ``steps`` bisections. Weights above 1
        recompute only ops that save many times the bytes they cost (at :data:`REMAT_CEILING`: little
        but the free moves)."""
        lo, hi, below, above = 0.0, 1.0, None, None
        while hi <= REMAT_CEILING:
            q = split(part.graph, part.plan, hi)
            if not holds(q):
                above = hi, q
                break
            lo, hi, below = hi, hi * 4, (hi, q)
        for _ in range(steps if above is not None else 0):
            mid = (lo + hi) / 2
            q = split(part.graph, part.plan, mid)
            if holds(q):
                lo, below = mid, (mid, q)
            else:
                hi, above = mid, (mid, q)
        return below, above

    def remat_point(method: str, knob: str, bound: int | float, found: Any) -> None:
        """Add the (weight, partition) a remat search found, if any; each plan is searched once per bound."""
        bisected.add((method, knob, bound))
        if found is not None:
            add(f"{method}+remat", f"{knob} weight {found[0]:.3g}".strip(), "ours", found[1].forward, found[1].backward)

    def faster_at(budget: int, limit: float, target: int) -> None:
        """Our time-centric plan at ``budget`` with as many cheap ops recomputed as keep its step ≤
        ``limit`` seconds, where it is that fast as planned and, with every cheap op recomputed (the
        least peak remat reaches from it), ≤ ``target`` bytes: a search that cannot reach the bar is
        not run (DenseNet-161 at bfdae25: four searches from 1.68 GiB for a bar of 0.99 GiB)."""
        p = planned(budget)
        if (p is not None and simulated(split(g, p, 0.0)) <= target
                and cost(split(g, p).forward, split(g, p).backward).seconds <= limit):
            remat_faster("approxdp_tc", f"budget {budget / everything:.2f} of vanilla", split(g, p), limit, steps=3)

    def remat_within(method: str, knob: str, part: Any, peak: int) -> None:
        """``part`` with the fewest cheap ops recomputed that hold its step ≤ ``peak``."""
        if (method, knob, peak) not in bisected:
            remat_point(method, knob, peak, remat_turn(part, lambda q: simulated(q) <= peak)[0])

    def remat_faster(method: str, knob: str, part: Any, limit: float, steps: int = 5) -> None:
        """``part`` with the most cheap ops recomputed whose step takes ≤ ``limit`` seconds: the smallest
        peak remat reaches from it within that time (``steps`` bisections of the weight)."""
        if (method, knob, limit) not in bisected:
            turn = remat_turn(part, lambda q: cost(q.forward, q.backward).seconds > limit, steps)
            remat_point(method, knob, limit, turn[1])  # the first weight past the turn: fast enough

    # the time-centric DP over an even grid; then, at the peak of each PyTorch point no plan of ours
    # matches yet, the DP at the largest budget whose step with cheap ops recomputed fits it (our least
    # time at ≤ that peak) and it and vanilla with as few cheap ops recomputed as reach it, and where
    # that is not enough the DP at the largest budget whose step as planned fits it; below the DP's
    # smallest peak, vanilla and its smallest time- and memory-centric plans with as few as reach it
    # (VGG-19: the DP's smallest with cheap ops recomputed, 4.71 GiB, is above vanilla's, 4.13)
    def matched(t: Point) -> bool:
        """Whether a point of ours found so far reaches ≤ ``t``'s peak at ≤ its time."""
        return dominated(t, [p for p in points + executor if p.family == "ours"])

    for j in range(1, budgets):
        tc(smallest + (everything - smallest) * j // budgets)
    for t in sorted([p for p in points if p.family == "pytorch"] + eager_pts, key=lambda t: t.peak):
        if matched(t) or t.peak - c.param_bytes >= vanilla.peak:
            continue
        budget = fitted(t.peak)
        plans = [("vanilla", "", vanilla)]
        if budget is None:
            plans += [("approxdp_tc", "budget min", first), ("approxdp_mc", "budget min", smallest_mc)]
        else:
            knob = "budget min" if budget == smallest else f"budget {budget / everything:.2f} of vanilla"
            plans.append(("approxdp_tc", knob, tc(budget)))
        for method, knob, part in plans:
            if not matched(t):
                remat_within(method, knob, part, t.peak)
        # recomputing a few more blocks can cost less than every cheap op (ResNet-152 at min-cut 0.3's
        # 4.12 GiB: budget 0.50 of vanilla as planned 4.05 GiB at 1.051× plain; the 0.56 whose cheap ops
        # fit it, with them 3.82 GiB at 1.138×)
        if budget is not None and not matched(t) and (as_planned := fitted(t.peak, weight=None)) is not None:
            tc(as_planned)
    # the bar: our smallest peak within the time of PyTorch's smallest within 1.3× plain
    # training's: the DP's smallest budget within it, and each plan of ours within it with as many
    # cheap ops recomputed as still fit (where its +remat 0 is too slow); where that falls short of
    # the bar, the DP's budgets from that smallest halfway to vanilla's whose plan with every cheap op
    # recomputed reaches the bar, each with as many recomputed as keep it as fast (a larger budget
    # leaves more time for cheap recomputation, and the pair that gives the least peak is found by
    # neither search alone: ResNet-50 at the budget-0.5 greedy cut's 1.127× in one run, 3.06 GiB as
    # planned at 0.40 of vanilla, 2.97 at 0.44 with remat 0.5);
    # and within 1.3×
    if bar := smallest_fast([p for p in points if p.family == "pytorch"] + eager_pts):
        limit = bar.time_ratio * points[0].seconds * (1 + SAME_TIME)
        low = smallest_within(limit)
        for method, knob, part, seconds in list(mine):
            if seconds[None] <= limit < seconds[0.0]:
                remat_faster(method, knob, part, limit)
        best = best_at([p for p in points + executor if p.family == "ours"], ratio=bar.time_ratio)
        if best is None or best.peak > BAR * bar.peak:
            for j in range(1, BAR_BUDGETS + 1):
                faster_at(low + (everything - low) * j // (2 * BAR_BUDGETS), limit, int(BAR * bar.peak))
    smallest_within(FAST * points[0].seconds)
    return points + eager_pts + executor


# the executor's plans the peak pass starts from (one pass on DenseNet-161 takes 5-20 s; from the DP's
# other budgets and Chen's segments it reached no lower peak; from vanilla's it recomputed far more for
# as much, ResNet-152 1.29 GiB at 7.7× plain training's time, and took minutes)
AT_PEAK = {("approxdp_tc", "budget min"), ("approxdp_mc", "budget min"), ("approxdp_mc refined", "at its own peak")}
SPLIT = "+split conv"  # the executor's plans on the step traced with split convolution backwards
NEAR_PLAIN = 0.01  # PyTorch's points within this of plain training's time are met with a capped pass from ours


def rewritten(graph: recompute.Graph, plans: list[tuple[str, str, Plan]], *, peak_only: bool = False
              ) -> list[tuple[str, str, Plan]]:
    """(method, knob, plan) for ``plans``, each also with cheap values recomputed again before late
    reads where that lowers its peak (``+late``, :func:`~recompute.rewrites.pipeline.with_late_recompute`), run with
    eager PyTorch's memory habits (``+in-place``, :func:`~recompute.rewrites.pipeline.with_in_place`), both
    (``+late+in-place``, :func:`~recompute.rewrites.pipeline.with_rewrites`: the late recomputations that the step
    run in place needs), and in place with the values held across its peak recomputed after it
    (``+peak+in-place``, :func:`~recompute.rewrites.pipeline.with_peak_recompute`; for the plans of :data:`AT_PEAK`):
    the executor's points, here and in ``benchmarks.head_to_head_cuda``. ``peak_only``: only the last."""
    peak = [(f"{method}+peak+in-place", knob, with_rewrites(p, graph, recompute_at_peak=True, in_place=True))
            for method, knob, p in plans if (method.removesuffix(SPLIT), knob) in AT_PEAK]
    if peak_only:
        return peak
    late = [(f"{method}+late", knob, q) for method, knob, p in plans if (q := with_late_recompute(p, graph)) is not p]
    both = [(f"{method}+late+in-place", knob, with_in_place(q, graph)) for method, knob, p in plans
            if (q := with_late_recompute(p, graph, then_in_place=True)) is not p]
    return plans + late + [(f"{method}+in-place", knob, with_in_place(p, graph)) for method, knob, p in plans] + both + peak


def refined(graph: recompute.Graph, tc: Plan, mc: Plan, fast: Callable[[Plan], bool] | None = None,
            steps: int = 5) -> list[tuple[str, str, Plan]]:
    """(method, knob, plan) for the memory-centric plan ``mc`` refined with the time-centric plan
    ``tc``'s nested lower sets (:func:`benchmarks.refining.refine`): at ``mc``'s own peak as the executor
    runs it (late and in place), and, given ``fast`` (whether a plan's step is fast enough), at the
    smallest peak where it is, bisected in ``steps`` between that peak and the most refined plan's;
    each distinct plan once."""
    own = step_peak(graph, mc.lower_sets)
    top = max(own, step_peak(graph, finest(mc.lower_sets, tc.lower_sets)))  # the finest can hold less: infeasible
    found = [("at its own peak", refine(graph, mc, tc, own))]
    if fast is not None and fast(best := refine(graph, mc, tc, top)):
        lo, hi = own, top
        for _ in range(steps):
            mid = (lo + hi) // 2
            if fast(p := refine(graph, mc, tc, mid)):
                best, hi = p, mid
            else:
                lo = mid
        found.append(("at the bar's time", best))
    out: list[tuple[str, str, Plan]] = []
    for knob, p in found:
        if p is not mc and all(p.lower_sets != q.lower_sets for _, _, q in out):
            out.append(("approxdp_mc refined", knob, p))
    return out


def executor_points(name: str, batch: int, size: int, ex: BatchExtrapolation, budgets: int,
                    eager_seconds: float | None, bar_ratio: float | None = None,
                    conv_splits: bool | frozenset[str] = False, theirs: Sequence[Point] = ()) -> list[Point]:
    """Our planners on the eager path (``recompute.optimize``: the step traced op by op, the plan run by
    our executor, bitwise plain training's): vanilla, the time-centric DP from its smallest feasible peak towards
    vanilla's, the memory-centric DP, it refined towards the time-centric one at its own peak and at the
    smallest peak whose step, late and in place, takes ≤ ``bar_ratio`` × plain eager training's time
    (:func:`refined`), and Chen's √n segments, each also recomputing late and running in place
    (:func:`rewritten`). Peak: the plan's simulated peak (= the ``fake`` backend's,
    ``tests/test_simulate.py``) plus parameters and buffers; time: the schedule's ATen calls against
    plain eager training's (``eager_seconds``), the step traced at the probe batches too where an op key
    has no probe yet (a trace of DenseNet-161 takes half a minute). ``conv_splits``: the step
    traced with its convolution backwards split (``recompute.trace(..., split_convolutions=...)``), the
    weight's gradient first, so that the peak pass may free the convolution's input, or recompute it,
    before the input's gradient is made; each plan listed as ``… +split conv+peak+in-place`` only. With
    ``True`` every split is planned, and the points listed are those of the step traced again with
    the splits their peaks need alone (:func:`recompute.rewrites.peak.needed_splits`; a split costs time:
    up to 1.24× the fused op on large maps), none where no peak needs one. ``theirs``: PyTorch's
    points within :data:`NEAR_PLAIN` of plain training's time that hold less than our plain step in
    place, each met where it can be by that step with the peak pass capped at its time
    (:func:`capped_pass`; ResNet-152's budget-1 cuts, 7.95 GiB at 1.004×, had been lost by ties)."""
    traced, params = traced_step(name, batch, size, conv_splits)
    every_split = conv_splits is True

    def probed(p: Plan) -> list[OpCall]:
        """``p``'s ATen calls at the target batch, matched at the probe batches where a key needs it."""
        def at(b: int) -> list[OpCall]:
            step = traced_step(name, b, size, conv_splits)[0]
            return schedule_calls(step.program, p.runs(step))

        return ex.probe(at(batch), at)

    # the forward ops probed first, so that the planners price each node in extrapolated seconds (a
    # split changes no forward op: they are probed already)
    if not every_split:
        probed(recompute.plan(traced, "vanilla"))
    g = replace(traced, time=costs.cost(PLANNING["cost_model"], traced.program, time_model=ex),
                cost_model=PLANNING["cost_model"])
    dp = {"memory_model": PLANNING["memory_model"]}
    plain = recompute.plan(g, "vanilla")
    vanilla = plain.peak
    first = recompute.plan(g, "approxdp", strategy="tc", **dp)
    # the step that recomputes nothing: plain training's ops, priced as PyTorch's eager step is
    plans = [("vanilla", "", plain), ("approxdp_tc", "budget min", first)]
    for j in range(1, 1 if conv_splits else budgets):  # split: only the plans of AT_PEAK are listed
        budget = first.peak + (vanilla - first.peak) * j // budgets
        with contextlib.suppress(InfeasibleBudget):
            plans.append(("approxdp_tc", f"budget {budget / vanilla:.2f} of vanilla",
                          recompute.plan(g, "approxdp", strategy="tc", budget=budget, **dp)))
    mc = recompute.plan(g, "approxdp", strategy="mc", **dp)
    plans.append(("approxdp_mc", "budget min", mc))

    def fast(p: Plan) -> bool:
        run = with_rewrites(p, g, recompute_late=True, in_place=True)
        return ex.seconds(probed(run)) <= bar_ratio * eager_seconds

    plans += refined(g, first, mc, fast if bar_ratio and eager_seconds and not conv_splits else None)
    if every_split:
        p = g.program
        needed = frozenset().union(*(needed_splits(p, q.runs(g), simulated_in_place(p))
                                     for _, _, q in rewritten(g, plans, peak_only=True)))
        print(f"{name}: the peaks need {len(needed)} split convolution backwards", flush=True)
        return executor_points(name, batch, size, ex, budgets, eager_seconds, bar_ratio, needed) if needed else []
    if conv_splits:
        plans = [(f"{method}{SPLIT}", knob, p) for method, knob, p in plans]
    else:
        plans.append(("chen", "√n segments", recompute.plan(g, "chen")))

    points: list[Point] = []

    def add_point(method: str, knob: str, p: Plan) -> None:
        seconds = ex.seconds(probed(p))
        ratio = seconds / eager_seconds if eager_seconds else float("nan")
        points.append(Point(name, batch, size, f"executor {method}", knob, "ours", p.peak + params, seconds, ratio, None))
        print(f"{name} executor {method} {knob}: {(p.peak + params) / GIB:.3f} GiB, {seconds:.2f} s", flush=True)

    listed = rewritten(g, plans, peak_only=bool(conv_splits))
    for method, knob, p in listed:
        add_point(method, knob, p)
    # at the bar's time: the plan whose peak pass reaches least, with as much of the pass as stays as fast
    passed = [(pt, q) for pt, (method, _, q) in zip(points, listed) if method.endswith("+peak+in-place")]
    if bar_ratio and eager_seconds and passed:
        least, full = min(passed, key=lambda x: (x[0].peak, x[0].seconds))
        base = {(f"executor {method}+peak+in-place", knob): p for method, knob, p in plans}[least.method, least.knob]
        if least.time_ratio > bar_ratio and (
                found := capped_pass(g, base, full.overhead - base.overhead,
                                     lambda q: ex.seconds(probed(q)) <= bar_ratio * eager_seconds)):
            add_point(least.method.removeprefix("executor "), f"{least.knob} at the bar's time".strip(), found)
    # PyTorch's points at about plain training's time: our plain step in place with a little of the pass
    in_place_plain = with_in_place(plain, g)
    for t in sorted(theirs, key=lambda t: t.peak):
        if eager_seconds and t.time_ratio <= 1 + NEAR_PLAIN and t.peak < in_place_plain.peak + params and not any(
                q.peak <= t.peak and q.time_ratio <= t.time_ratio * (1 + SAME_TIME) for q in points):
            limit = t.time_ratio * (1 + SAME_TIME) * eager_seconds
            found = capped_pass(g, plain, NEAR_PLAIN * float(g.time.sum()), lambda q: ex.seconds(probed(q)) <= limit)
            if found is not None and found.peak + params <= t.peak:
                add_point("vanilla+peak+in-place", f"capped at {label(t)}'s time", found)
    return points


def capped_pass(graph: recompute.Graph, base: Plan, most: float, fast: Callable[[Plan], bool], steps: int = 4
                ) -> Plan | None:
    """``base`` with the peak pass run in place (:func:`~recompute.rewrites.pipeline.with_peak_recompute`) at the
    largest cap on its added cost, bisected in ``steps`` up to ``most``, whose step is ``fast``; None
    where none is or none holds less than ``base`` in place. The pass is greedy: capped, it takes other
    moves, and its peak does not fall evenly with the cap."""
    lo, hi, best = 0.0, most, None
    for _ in range(steps):
        mid = (lo + hi) / 2
        if fast(q := with_in_place(with_peak_recompute(base, graph, limit=mid, then_in_place=True), graph)):
            lo, best = mid, q
        else:
            hi = mid
    return best if best is not None and best.peak < with_in_place(base, graph).peak else None


@lru_cache(maxsize=None)
def traced_step(name: str, batch: int, size: int, conv_splits: bool | frozenset[str] = False
                ) -> tuple[recompute.Graph, int]:
    """``recompute.trace`` of ``name``'s training step at ``batch`` × ``size``² (on fake inputs; each
    once per process: DenseNet-161's takes half a minute), and the bytes of the model's parameters and
    buffers."""
    model, inputs = nets.build(name, batch_size=batch, input_size=size, seed=0, fake_inputs=True)
    params = state_bytes(model)
    return recompute.trace(model, inputs, loss_fn=default_loss, split_convolutions=conv_splits), params


PLAIN = ("ours", "ours in place")  # our executor's plain steps: vanilla as planned, and in place


def step_calls(name: str, batch: int, size: int, step: str) -> list[OpCall]:
    """The ATen calls of one plain step of ``name`` at ``batch`` × ``size``²: ``eager`` (plain eager
    training) or one of :data:`PLAIN`."""
    if step == "eager":
        return _eager_calls(name, batch, size, "eager", {})
    g = traced_step(name, batch, size)[0]
    p = recompute.plan(g, "vanilla")
    return schedule_calls(g.program, (with_in_place(p, g) if step == "ours in place" else p).runs(g))


def _eager_calls(name: str, batch: int, size: int, method: str, options: dict[str, Any]) -> list[OpCall]:
    """The ATen calls of one eager step of ``method`` (``eager``: plain training) on the meta device,
    written as the CPU's (where the time model runs them)."""
    model, inputs = nets.build(name, batch_size=batch, input_size=size, seed=0, fake_inputs=True)
    model = model.to("meta")
    runner = model if method == "eager" else recompute.optimize(model, method=method, **options)
    with Recorder(device="cpu") as recorder:  # the keys of the traced steps' ops, timed once for both
        default_loss(runner(*(torch.empty(x.shape, device="meta") for x in inputs))).backward()
    return recorder.calls


def _eager_peak(name: str, batch: int, size: int, method: str, options: dict[str, Any]) -> int:
    """Everything one eager step of ``method`` holds at its peak, parameters included (``fake`` backend)."""
    model, inputs = nets.build(name, batch_size=batch, input_size=size, seed=0)
    runner = None if method == "eager" else recompute.optimize(model, method=method, **options)
    m = recompute.measure(model if runner is None else runner.model, inputs, runner=runner, backend="fake")
    return m.peak_bytes + m.param_bytes


def eager_points(name: str, batch: int, size: int, ex: BatchExtrapolation,
                 methods: Sequence[tuple[str, dict[str, Any]]], reference: float | None = None) -> list[Point]:
    """PyTorch's eager methods (and plain eager training first, their time reference, unless
    ``reference`` gives its seconds): peak on the ``fake`` backend, time of their recorded ATen calls
    extrapolated from the probe batches."""
    points: list[Point] = []
    for method, options in methods:
        knob = ", ".join(f"{k}={'√n' if (k, v) == ('segments', 0) else v}" for k, v in options.items())
        try:
            # the probe batches' steps only where an op key has no probe yet: checkpointing recomputes
            # plain training's own ops, and each step of DenseNet-161 on meta tensors takes seconds
            target = ex.probe(_eager_calls(name, batch, size, method, options),
                              lambda b: _eager_calls(name, b, size, method, options))  # noqa: B023
            peak = _eager_peak(name, batch, size, method, options)
        except (baselines.Unsupported, RuntimeError) as e:
            # a method that refuses or fails on this network is reported and the others still run
            print(f"{name} {method} {knob}: did not run ({type(e).__name__}: {str(e)[:200]})", flush=True)
            continue
        seconds = ex.seconds(target)
        reference = seconds if reference is None else reference
        points.append(Point(name, batch, size, method, knob, "pytorch", peak, seconds, seconds / reference, None))
        print(f"{name} {method} {knob}: {peak / GIB:.3f} GiB, {seconds:.2f} s", flush=True)
    return points


# predicted times are sums of per-op costs: two partitions that run the same ops differ only by the
# order of the summation (~1e-15 relative), while one op less or more moves a step by ≥ 1e-8
SAME_TIME = 1e-9
# peaks this close are one peak to a user: the four solvers' budget-0.1 cuts of DenseNet-161 hold
# 1.3355 GB within 15 kB of each other, at 1.166× to 1.294× plain training's time
SAME_PEAK = 1e-4


def best_at(ours: list[Point], *, ratio: float | None = None, peak: int | None = None) -> Point | None:
    """Our smallest peak at ≤ ``ratio`` (time × plain training's; equal up to :data:`SAME_TIME`), or our
    least time at ≤ ``peak``."""
    if ratio is not None:
        fit = [p for p in ours if p.time_ratio <= ratio * (1 + SAME_TIME)]
        return min(fit, key=lambda p: (p.peak, p.time_ratio)) if fit else None
    fit = [p for p in ours if p.peak <= peak]
    return min(fit, key=lambda p: (p.time_ratio, p.peak)) if fit else None


MODELLED = "min_cut"  # PyTorch's compiled partitions, priced here by an unfused op-by-op model


def modelled(p: Point) -> bool:
    """Whether ``p`` is one of PyTorch's compiled partitions: this benchmark runs their modules op by op,
    unfused, where inductor fuses pointwise chains and reuses buffers (run for real on the CPU, VGG-19's
    budget-1 step at batch 16, 112² held 871.6 MiB against 1331.9 simulated op by op:
    ``python -m benchmarks.measured``). Shown, labelled so, and kept out of the verdict."""
    return p.method == MODELLED


def smallest_fast(theirs: list[Point]) -> Point | None:
    """PyTorch's smallest peak within :data:`FAST` × plain training's time among the methods priced as
    they run (its eager methods: :func:`modelled` points are not), the fastest of those equal to it up to
    :data:`SAME_PEAK` (the issue's bar: ours ≤ :data:`BAR` × it within the same time)."""
    fast = [t for t in theirs if t.time_ratio <= FAST and not modelled(t)]
    if not fast:
        return None
    smallest = min(t.peak for t in fast)
    return min((t for t in fast if t.peak <= smallest * (1 + SAME_PEAK)), key=lambda p: (p.time_ratio, p.peak))


def dominated(theirs: Point, ours: list[Point]) -> bool:
    """Whether a point of ``ours`` reaches ≤ ``theirs``' peak at ≤ its time."""
    mine = best_at(ours, ratio=theirs.time_ratio)
    return mine is not None and mine.peak <= theirs.peak


def label(p: Point) -> str:
    return f"{p.knob} [unfused op-by-op model]" if modelled(p) else f"{p.method} {p.knob}".strip()


def net_table(points: list[Point]) -> str:
    """Each distinct PyTorch point (identical partitions merged) beside our best at its time and at its peak."""
    ours = [p for p in points if p.family == "ours"]
    merged: dict[tuple[int, float], list[Point]] = {}
    for p in points:
        if p.family == "pytorch":
            merged.setdefault((p.peak, round(p.time_ratio, 6)), []).append(p)
    rows = []
    for (peak, ratio), ps in sorted(merged.items()):
        at_time, at_peak = best_at(ours, ratio=min(p.time_ratio for p in ps)), best_at(ours, peak=peak)
        rows.append(["; ".join(label(p) for p in ps), f"{peak / GIB:.2f}", f"{ratio:.3f}×",
                     "none as fast" if at_time is None else f"{at_time.peak / GIB:.2f} ({at_time.peak / peak:.2f}×) {at_time.method} {at_time.knob}",
                     "none as small" if at_peak is None else f"{at_peak.time_ratio:.3f}× {at_peak.method} {at_peak.knob}",
                     "yes" if at_time is not None and at_time.peak <= peak else "**no**"])
    ours_rows = [[f"{p.method} {p.knob}", f"{p.peak / GIB:.2f}", f"{p.time_ratio:.3f}×"] for p in ours]
    return (markdown_table(["PyTorch (min-cut budget and solver, or eager method)", "peak GiB", "time × plain", "ours: smallest peak at ≤ its time",
                            "ours: least time at ≤ its peak", "ours ≤ its peak at ≤ its time"], rows)
            + "\n\nOurs:\n\n" + markdown_table(["plan", "peak GiB", "time × plain"], ours_rows))


def verdict(points: list[Point]) -> list[str]:
    """One summary row: dominated PyTorch points, and ours against PyTorch's smallest peak within 1.3× plain
    training's time, at ≤ that point's time and at ≤ 1.3× (the issue's bar: "within the same time")."""
    eager = next(p for p in points if p.method == "vanilla")
    ours = [p for p in points if p.family == "ours"]
    theirs = [p for p in points if p.family == "pytorch"]
    undominated = [t for t in theirs if not dominated(t, ours)]
    best = smallest_fast(theirs)
    if best is None:
        bar = ["—"] * 3
    else:
        mine = [best_at(ours, ratio=r) for r in (best.time_ratio, FAST)]
        bar = [f"{best.peak / GIB:.2f} ({label(best)}, {best.time_ratio:.3f}×)",
               *("none as fast" if m is None else f"{m.peak / GIB:.2f} ({m.peak / best.peak:.2f}×, {m.time_ratio:.3f}×)" for m in mine)]
    return [points[0].network, f"{points[0].batch_size} × {points[0].input_size}²", f"{eager.peak / GIB:.2f}", *bar,
            f"{len(theirs) - len(undominated)} / {len(theirs)}"]


VERDICT_HEADERS = ["network", "batch × input", "vanilla peak GiB",
                   "PyTorch's smallest peak at ≤ 1.3× plain training's time (its eager methods; the compiled "
                   "partitions are an unfused op-by-op model, not in the verdict)",
                   "ours at ≤ its time", "ours at ≤ 1.3×", "PyTorch points we match or beat (≤ peak at ≤ time)"]


def figure(points: list[Point], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 5))
    for method in dict.fromkeys(p.method for p in points):
        ps = [p for p in points if p.method == method]
        theirs = ps[0].family == "pytorch"
        for solver in dict.fromkeys(p.knob.split(", ")[-1] for p in ps) if method == "min_cut" else [None]:
            # PyTorch's points as markers (its peak is not monotone in the budget); ours joined by peak
            qs = sorted((p for p in ps if solver is None or p.knob.endswith(solver)), key=lambda p: p.peak)
            ax.plot([p.time_ratio for p in qs], [p.peak / GIB for p in qs],
                    marker="s" if method == "min_cut" else "^" if theirs else "o", linestyle="" if theirs else "-",
                    label=f"PyTorch min-cut ({solver})" if solver else f"PyTorch {method}" if theirs else method)
    ax.set_xlabel("predicted step time × plain training's on the same runtime (cpu, 1 thread)")
    ax.set_ylabel("peak GiB (parameters and gradients included)")
    p0 = points[0]
    ax.set_title(f"{p0.network}, batch {p0.batch_size} × {p0.input_size}²: circles ours, squares and triangles PyTorch")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1))
    fig.tight_layout()
    write_atomic(path, lambda tmp: fig.savefig(tmp, dpi=120, format="png"))
    plt.close(fig)


def save(points: list[Point], folder: Path = FIGURES) -> None:
    path = folder / f"pareto_{points[0].network}.json"
    text = json.dumps([asdict(p) for p in points], indent=1)
    write_atomic(path, lambda tmp: Path(tmp).write_text(text))


def load(name: str, folder: Path = FIGURES) -> list[Point] | None:
    path = folder / f"pareto_{name}.json"
    if not path.exists():
        return None
    rows = json.loads(path.read_text())
    return [Point(**r) for r in rows] if rows and "time_ratio" in rows[0] else None


def provenance(done: dict[str, list[Point]]) -> str:
    """Which networks' points were made at which commit."""
    by_commit: dict[str, list[str]] = {}
    for name, points in done.items():
        by_commit.setdefault(points[0].commit or "unknown", []).append(name)
    return "; ".join(f"commit {c}: {', '.join(names)}" for c, names in by_commit.items())


def report(done: dict[str, list[Point]], header: str) -> str:
    names = sorted(done, key=lambda n: NETWORKS.index(n) if n in NETWORKS else len(NETWORKS))
    tables = [f"**{n}** (batch {done[n][0].batch_size}, {done[n][0].input_size}²)\n\n{net_table(done[n])}" for n in names]
    return "\n\n".join([header, markdown_table(VERDICT_HEADERS, [verdict(done[n]) for n in names]), *tables])


def probe_model(repeats: int = 3, enough: float = 0.05, lock: Any = None, flush: bool = False) -> TimeModel:
    """How the head-to-head times the probes: one thread, thread CPU time. ``flush``: the shared cache
    flushed before each timed call (``benchmarks.extrapolation``'s last regime). At the paper's batch
    no op's operands fit in the shared cache, at the probes many do: GoogLeNet's ops timed at batches 2
    and 4 extend to 0.68× of their time at 32 (``sub`` 0.25×), flushed to 0.91×. The head-to-head does
    not flush: it made DenseNet-161's probe timing 12× longer."""
    return TimeModel(repeats=repeats, clock="thread", lock=lock, enough=enough,
                     flush_bytes=2 * shared_cache_bytes() if flush else 0)


def _net_points(name: str, budgets: int, repeats: int, enough: float, lock: Any) -> tuple[list[Point], dict[str, float]]:
    """One network's points in a process of its own (one thread: the op timings assume it), timing ops
    only while holding ``lock`` (the jobs' planning runs beside another's timing, never two timings),
    and where the time went: in all, timing ops, waiting for the lock."""
    torch.set_num_threads(1)
    start = time.perf_counter()
    model_t = probe_model(repeats, enough, lock)
    points = run_net(name, budgets, model_t, own_process=True)
    return points, {"all": time.perf_counter() - start, **model_t.spent}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nets", nargs="+", default=list(NETWORKS), choices=list(NETWORKS))
    parser.add_argument("--budgets", type=POSITIVE_INT, default=4, help="budgets of the time-centric DP, the smallest feasible first")
    parser.add_argument("--repeats", type=POSITIVE_INT, default=3, help="timed calls per op key, at most")
    parser.add_argument("--enough", type=POSITIVE, default=0.05, help="seconds of timed calls after which a key is not timed again")
    parser.add_argument("--jobs", type=POSITIVE_INT, default=2, help="networks run at once, one process and one thread each")
    parser.add_argument("--write", action="store_true", help="update docs/paper_scale.md and paper_figures/pareto_<net>.*")
    parser.add_argument("--render", action="store_true",
                        help="run nothing: write docs/paper_scale.md's section and the figures from the stored points")
    args = parser.parse_args()
    commit = head_commit()
    done = {n: ps for n in NETWORKS if (args.write or args.render) and (ps := load(n)) is not None}
    if args.render:
        for name, points in done.items():
            figure(points, FIGURES / f"pareto_{name}.png")
        header = (f"Rendered by `{command_line()}` ({date.today()}) from the points made by `OMP_NUM_THREADS=1 python -m "
                  f"benchmarks.head_to_head --write` at {provenance(done)}.")
        write_doc("head-to-head", report(done, header))
        return
    start = time.perf_counter()
    command = command_line(env=("OMP_NUM_THREADS", *HUGE_PAGES))  # before the defaults below are set
    for key, value in HUGE_PAGES.items():
        os.environ.setdefault(key, value)
    spawn = multiprocessing.get_context("spawn")
    # a fresh process per network: what run_net(own_process=True) keeps from the collector dies with it
    with spawn.Manager() as manager, ProcessPoolExecutor(args.jobs, mp_context=spawn, max_tasks_per_child=1) as pool:
        lock = manager.Lock()
        order = sorted(args.nets, key=lambda n: LONGEST_FIRST.index(n) if n in LONGEST_FIRST else -1)
        running = {pool.submit(_net_points, name, args.budgets, args.repeats, args.enough, lock): name for name in order}
        failed: dict[str, BaseException] = {}
        for future in as_completed(running):
            name = running[future]
            try:
                points, spent = future.result()
            except Exception as e:  # reported at the end; the other networks' points are still written
                traceback.print_exception(e)
                failed[name] = e
                continue
            print(f"{name}: {len(points)} points in {spent['all']:.0f} s (timing ops {spent['measuring']:.0f} s, "
                  f"waiting for the other job's timing {spent['waiting']:.0f} s)", flush=True)
            done[name] = [replace(p, commit=commit) for p in points]
            header = (f"`{command}` (last run {date.today()}: {', '.join(args.nets)}, {time.perf_counter() - start:.0f} s"
                      f" so far; `--nets` runs some and keeps the others' points). Points made at {provenance(done)}.")
            print(net_table(done[name]), flush=True)
            if args.write:
                save(done[name])
                figure(done[name], FIGURES / f"pareto_{name}.png")
                write_doc("head-to-head", report(done, header))
    print(report(done, ""))
    if failed:
        raise SystemExit("head_to_head: " + "; ".join(f"{n} failed ({type(e).__name__}: {e})" for n, e in failed.items())
                         + (": their points from an earlier run are kept" if args.write else ""))


if __name__ == "__main__":
    main()
