"""Plans between the two canonical strategies: a coarse lower-set sequence refined with a finer one's.

The approximate DP's memory-centric strategy (Kusumoto §4.4) takes the fewest, largest lower sets its
smallest budget allows, and recomputes most; the time-centric one takes many and recomputes least.
The DP prices a plan in its own memory model, where both reach the same smallest budget. The step
that runs is cheaper: its cheap values recomputed late and its ops run in place
(:func:`~recompute.rewrites.pipeline.with_late_recompute`, :func:`~recompute.rewrites.pipeline.with_in_place`) hold far less
in the memory-centric plan's long blocks. At that peak the memory-centric plan is the only one the DP
offers, and it costs its whole recomputation: on DenseNet-161 (batch 32, 224², paper costs, late and
in place) 0.912 GiB at 1585 units against the time-centric plan's 1.053 GiB at 434.

:func:`refine` searches between them. Where every lower set of the fine sequence is nested with every
one of the coarse sequence (L ⊆ L′ or L′ ⊆ L), a run of fine sets strictly inside a coarse block
(L_{i-1}, L_i) can be inserted into the coarse sequence: the result is a chain of lower sets again, a
canonical strategy whose block V_i is split, so that less of it is recomputed. Greedily, the run whose
insertion saves the most overhead (eq. 1) while the step's simulated peak stays within a limit is
inserted, until none fits; a run that does not fit is halved and its halves are tried in later
rounds. Each try is one simulation of the step as it runs.
"""

from __future__ import annotations

from typing import Callable, Sequence

from recompute.core import lowerset
from recompute.core.graph import Graph
from recompute.rewrites.inplace import in_place
from recompute.planners.registry import InfeasibleBudget, Plan
from recompute.rewrites.remat import recompute_late
from recompute.pricing.schedule import canonical
from recompute.pricing.simulate import simulate

__all__ = ["refine", "nested_runs", "finest", "step_peak"]

Run = tuple[int, tuple[frozenset[int], ...]]  # (coarse block index, fine lower sets inside it, in order)


def nested_runs(coarse: Sequence[frozenset[int]], fine: Sequence[frozenset[int]]) -> list[Run]:
    """For each block (L_{i-1}, L_i) of ``coarse``, the sets of ``fine`` strictly between its ends that
    are nested with every set of ``coarse`` (the others could not be inserted): one run per block
    that has any."""
    runs = []
    below: frozenset[int] = frozenset()
    for i, upper in enumerate(coarse):
        inside = tuple(x for x in fine if below < x < upper)
        if inside:
            runs.append((i, inside))
        below = upper
    return runs


def step_peak(graph: Graph, seq: Sequence[frozenset[int]], *, late: bool = True, written_in_place: bool = True) -> int:
    """The simulated peak of the canonical schedule of ``seq`` as the executor runs it: in place
    (``written_in_place``), and with every cheap value recomputed late where that is lower (``late``:
    :func:`recompute.rewrites.remat.recompute_late`, the least peak :func:`~recompute.rewrites.pipeline.with_rewrites`
    reaches; recomputing every one can also raise it, where the copies meet at the peak)."""
    p = graph.program
    s = canonical(graph, seq)
    schedules = [s, recompute_late(p, s)] if late else [s]
    return min(simulate(p, in_place(p, x) if written_in_place else x).peak for x in schedules)


def _merged(coarse: Sequence[frozenset[int]], inserted: Sequence[Run]) -> list[frozenset[int]]:
    """``coarse`` with each run's sets placed before the end of its block."""
    before: dict[int, list[frozenset[int]]] = {}
    for i, sets in inserted:
        before.setdefault(i, []).extend(sets)
    out: list[frozenset[int]] = []
    for i, upper in enumerate(coarse):
        out += sorted(before.get(i, ()), key=len)
        out.append(upper)
    return out


def finest(coarse: Sequence[frozenset[int]], fine: Sequence[frozenset[int]]) -> list[frozenset[int]]:
    """``coarse`` with every set of ``fine`` nested in its blocks inserted: the most any refinement
    inserts."""
    return _merged(coarse, nested_runs(coarse, fine))


def refine(graph: Graph, coarse: Plan, fine: Plan, limit: int,
           peak: Callable[[Graph, Sequence[frozenset[int]]], int] = step_peak) -> Plan:
    """``coarse``'s lower-set sequence with as many of ``fine``'s nested lower sets inserted as keep
    ``peak`` (default :func:`step_peak`: the step recomputing late and in place) ≤ ``limit`` bytes,
    chosen greedily by the overhead they save (module docstring); ``coarse`` itself where no insertion
    fits. Raises :class:`~recompute.planners.registry.InfeasibleBudget` naming ``coarse``'s own peak where that
    exceeds ``limit``. The plan is ``coarse``'s method and
    strategy with ``info["refined with"]`` the number of ``fine``'s sets inserted (the DP's own
    diagnostics are not carried over); its ``peak`` is its canonical schedule's, as for any
    lower-set plan (apply :func:`~recompute.rewrites.pipeline.with_late_recompute` and
    :func:`~recompute.rewrites.pipeline.with_in_place` to run it as ``peak`` priced it)."""
    seq = list(coarse.lower_sets)
    if (least := peak(graph, seq)) > limit:
        raise InfeasibleBudget(f"{coarse.method} refined", limit, least)
    inserted: list[Run] = []
    candidates = nested_runs(seq, fine.lower_sets)
    cost = lowerset.overhead(graph, seq)
    while candidates:
        trials = [(run, _merged(seq, [*inserted, run])) for run in candidates]
        tried = sorted(((cost - lowerset.overhead(graph, trial), run, trial) for run, trial in trials),
                       key=lambda t: -t[0])
        candidates = []
        for k, (saved, run, trial) in enumerate(tried):
            if saved <= 0:
                continue
            if peak(graph, trial) <= limit:
                inserted.append(run)
                cost -= saved
                candidates += [r for _, r, _ in tried[k + 1:]]
                break
            if len(run[1]) > 1:
                mid = len(run[1]) // 2
                candidates += [(run[0], run[1][:mid]), (run[0], run[1][mid:])]
    if not inserted:
        return coarse
    return Plan.from_sequence(graph, _merged(seq, inserted), method=coarse.method, strategy=coarse.strategy,
                              memory_model=coarse.memory_model,
                              **{"refined with": sum(len(sets) for _, sets in inserted)})
