"""Chains and joins that recompute more than once (recompute/multirecompute): the DPs against an
exhaustive pebbling search, Theorem 3.3's c_min, Griewank–Walther's closed form, the simulator's checks,
Chen's recursion, Equiv-Chain and the graph → chain/join mapping."""

from __future__ import annotations

import heapq
import math
from functools import lru_cache

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from recompute.core.graph import Graph
from recompute.planners.pebble import (
    BranchProfile, Costs, InvalidSchedule, Op, OpKind, Profile, Schedule, c_min, c_opt, chain_of, chen_recursive, equiv_chain,
    join_dp, join_of, makespans, opt0_table, revolve, simulate,
)

from .strategies import chain as chain_graph
from .strategies import fig2_skip


# --------------------------------------------------------------------------- exhaustive search


@lru_cache(maxsize=None)
def brute_force(lengths: tuple[int, ...], slots: int, costs: Costs = Costs()) -> float:
    """Least makespan of the join pebble game by Dijkstra over memory states (bit sets of values).

    Written from the rules, not from the simulator: F_i from x_{i-1} keeps or drops it, the turn swaps
    every x_ℓ for δ_ℓ, B_i turns (x_{i-1}, δ_i) into δ_{i-1}, and any x may be dropped for free (more
    freedom than the planners use). At most ``slots`` values between two operations.
    """
    k = len(lengths)
    xb = [sum(n + 1 for n in lengths[:b]) for b in range(k)]
    db = [c_opt(lengths) + o for o in xb]
    X = lambda b, i: 1 << (xb[b] + i)  # noqa: E731
    D = lambda b, i: 1 << (db[b] + i)  # noqa: E731
    all_x = sum(X(b, i) for b in range(k) for i in range(lengths[b] + 1))
    turn_in = sum(X(b, lengths[b]) for b in range(k))
    turn_out = sum(D(b, lengths[b]) for b in range(k))
    goal = sum(D(b, 0) for b in range(k))
    start = sum(X(b, 0) for b in range(k))
    if bin(start).count("1") > slots:
        return math.inf
    dist = {start: 0.0}
    heap = [(0.0, start)]
    while heap:
        t, s = heapq.heappop(heap)
        if s & goal == goal:
            return t
        if t > dist[s]:
            continue
        moves: list[tuple[int, float]] = []
        for b in range(k):
            for i in range(1, lengths[b] + 1):
                if s & X(b, i - 1) and not s & X(b, i):
                    moves += [(s | X(b, i), costs.uf), ((s & ~X(b, i - 1)) | X(b, i), costs.uf)]
                if s & X(b, i - 1) and s & D(b, i):
                    moves.append(((s & ~X(b, i - 1) & ~D(b, i)) | D(b, i - 1), costs.ub))
        if s & turn_in == turn_in and not s & ~all_x:
            moves.append(((s & ~turn_in) | turn_out, costs.ut))
        moves += [(s & ~(1 << v), 0.0) for v in range(2 * c_opt(lengths)) if s >> v & 1 and (1 << v) & all_x]
        for n, dt in moves:
            if bin(n).count("1") <= slots and t + dt < dist.get(n, math.inf):
                dist[n] = t + dt
                heapq.heappush(heap, (t + dt, n))
    return math.inf


def _check(s: Schedule, slots: int) -> None:
    """The schedule is valid in ``slots`` slots and the simulator prices it as its planner did."""
    sim = simulate(s)
    assert sim.peak_slots <= slots == s.slots
    assert sim.makespan == pytest.approx(s.makespan)


# --------------------------------------------------------------------------- the DPs are optimal


def test_halving_memory_costs_about_25_percent() -> None:
    """Beaumont §4a: at c = C_opt/2 the makespan is ≈ 1.25× optimal (SNN, CM, chain; L = 5)."""
    L = 5
    for ls in [(2 * L,) * 3, (L, 5 * L), (6 * L,)]:
        ms = makespans(ls, c_opt(ls))
        ratio = np.interp(c_opt(ls) / 2, np.arange(len(ms)), ms) / (12 * L + 1)
        assert 1.2 < ratio < 1.3


@pytest.mark.parametrize("length", range(1, 8))
def test_revolve_equals_brute_force_on_small_chains(length: int) -> None:
    for slots in range(1, length + 3):
        best = brute_force((length,), slots)
        if math.isinf(best):
            assert slots < c_min((length,))
            with pytest.raises(ValueError, match="Theorem 3.3"):
                revolve(length, slots)
            continue
        s = revolve(length, slots)
        assert s.makespan == best
        _check(s, slots)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(0, 3), min_size=1, max_size=3).filter(lambda ls: sum(ls) <= 7),
       st.integers(0, 4), st.sampled_from([Costs(), Costs(1, 2, 1), Costs(2, 1, 0), Costs(1, 3, 5)]))
def test_join_dp_equals_brute_force_on_tiny_joins(lengths: list[int], extra: int, costs: Costs) -> None:
    ls = tuple(lengths)
    for slots in sorted({c_min(ls) - 1, c_min(ls) + extra, c_opt(ls)}):
        best = brute_force(ls, slots, costs)
        assert makespans(ls, slots, costs)[slots] == best
        if math.isfinite(best):
            _check(join_dp(ls, slots, costs), slots)


@pytest.mark.parametrize("lengths", [(2, 2), (3, 2), (2, 2, 2), (1, 3), (1, 1, 2), (1,), (3,), (0, 2), (0, 0)])
def test_c_min_is_theorem_3_3(lengths: tuple[int, ...]) -> None:
    """Theorem 3.3: 2k + 1 (5 for two branches, 7 for three), 2k with a branch of length 1."""
    need = c_min(lengths)
    assert math.isinf(brute_force(lengths, need - 1)) and math.isfinite(brute_force(lengths, need))
    assert makespans(lengths, need)[need - 1] == math.inf
    k = len(lengths)
    if min(lengths) >= 1:
        assert need == 2 * k + (0 if 1 in lengths else 1)


def test_c_min_and_c_opt_at_the_papers_sizes() -> None:
    """§4: SNN (2L, 2L, 2L) from 7 slots, CM (L, 5L) from 5; minimal makespan from 6L+3, 6L+2, 6L+1."""
    for L in (2, 5):
        for ls, cmin, copt in [((2 * L,) * 3, 7, 6 * L + 3), ((L, 5 * L), 5, 6 * L + 2), ((6 * L,), 3, 6 * L + 1)]:
            ms = makespans(ls, copt)
            assert c_min(ls) == cmin and c_opt(ls) == copt
            assert np.isinf(ms[cmin - 1]) and np.isfinite(ms[cmin])
            floor = 6 * L * 2 + 1  # every step once forward and once backward, and the turn
            assert ms[copt] == floor < ms[copt - 1]
            assert (np.diff(ms[cmin:]) <= 0).all()  # more memory never hurts


def test_revolve_matches_griewank_walther_closed_form() -> None:
    """Forward steps only (ub = ut = 0): Griewank & Walther's t(l, s) = r·l − β(s + 1, r − 1), β(s, r) =
    C(s + r, s), with s = slots − 2 snapshots, plus our one step that feeds the turn."""

    def t(l: int, s: int) -> int:
        r = next(r for r in range(l + 1) if math.comb(s + r, s) >= l)
        return r * l - math.comb(s + r, s + 1)

    for l in range(1, 30):
        for s in range(1, 7):
            assert revolve(l, s + 2, Costs(1, 0, 0)).makespan == t(l, s) + 1


def test_opt0_small_values() -> None:
    """One checkpoint: l(l−1)/2 forwards; enough slots: l − 1 forwards (Opt0 starts from x_0, δ_l)."""
    opt, _ = opt0_table(12, 14)
    for l in range(2, 13):
        assert opt[l, 3] == l * (l - 1) / 2 + l
        assert opt[l, l + 1] == (l - 1) + l and opt[l, l + 1] == opt[l, 14]


# --------------------------------------------------------------------------- the simulator


def test_simulator_tracks_slots_and_rejects_bad_schedules() -> None:
    s = revolve(3, 3)
    sim = simulate(s)
    assert sim.peak_slots == 3 and len(sim.table) == len(s.ops)
    assert [str(v) for v in sim.table[-1] if v is not None] == ["δ[0]0"]
    # the F∅ move keeps x's slot: x_1 then x_2 sit where x_1 was written
    assert sim.table[0][1] is not None and sim.table[1][1].index == 2
    with pytest.raises(InvalidSchedule, match="over the bound"):
        simulate(s, slots=2)
    bad = Schedule((2,), (Op(OpKind.F_CK, 0, 1), Op(OpKind.F_NONE, 0, 2), Op(OpKind.TURN), Op(OpKind.B, 0, 2)),
                   3, "hand", 0.0)
    with pytest.raises(InvalidSchedule, match=r"op 3 .*needs x\[0\]1"):
        simulate(bad)
    leak = Schedule((1,), (Op(OpKind.F_CK, 0, 1), Op(OpKind.TURN)), 3, "hand", 0.0)
    with pytest.raises(InvalidSchedule, match="final memory"):
        simulate(leak)


def test_profile_bytes_tapes_and_rebuild() -> None:
    """Per-step sizes: bytes are counted while an op runs; Fall keeps a tape that spares B's rebuild."""
    bp = BranchProfile(np.array([1.0, 2.0]), np.array([3.0, 4.0]), np.array([0, 10, 100]), np.array([5, 7]))
    prof = Profile((bp,), ut=0.5, rebuild=True)
    ops = (Op(OpKind.F_CK, 0, 1), Op(OpKind.F_ALL, 0, 2), Op(OpKind.TURN), Op(OpKind.B, 0, 2), Op(OpKind.B, 0, 1))
    s = Schedule((2,), ops, 3, "hand", 0.0)
    sim = simulate(s, prof)
    # B_1 rebuilds step 1 (+1), B_2 uses the kept tape
    assert sim.makespan == 1 + 2 + 0.5 + 4 + 3 + 1
    # during the turn: x_0, x_1, x_2, tape_2 and δ_2 = 0 + 10 + 100 + 7 + 100
    assert sim.peak_bytes == 217


# --------------------------------------------------------------------------- Chen, Equiv-Chain


@pytest.mark.parametrize("k", [1, 2, 3])
def test_chen_recursive_is_valid_logarithmic_and_never_beats_revolve(k: int) -> None:
    for n in (1, 2, 5, 9, 16, 27, 40):
        s = chen_recursive(n, k)
        sim = simulate(s)
        assert sim.makespan == s.makespan
        levels = math.ceil(math.log(n, k + 1)) if n > 1 else 0
        assert s.slots <= k * levels + 3  # g(n) = k·log_{k+1} n, plus x_0, the moving value and δ
        assert s.makespan >= revolve(n, s.slots).makespan
    assert chen_recursive(4, 3).makespan == 2 * 4 + 1  # k ≥ n − 1 stores everything


@pytest.mark.parametrize("length, slots", [(3, 9), (6, 9), (6, 12), (10, 15), (1, 6)])
def test_equiv_chain_is_valid_and_never_beats_the_optimum(length: int, slots: int) -> None:
    ls = (length,) * 3
    s = equiv_chain(ls, slots)
    _check(s, slots)
    assert s.makespan >= makespans(ls, slots)[slots]
    with pytest.raises(ValueError, match="equal"):
        equiv_chain((2, 3), 10)


# --------------------------------------------------------------------------- graph mapping


def _partition(jm) -> list[int]:
    return sorted([v for br in jm.branches for st_ in br for v in st_.nodes] + list(jm.head))


def test_chain_of_a_chain_graph_has_one_step_per_node() -> None:
    g = chain_graph(6, mem=[1, 2, 3, 4, 5, 6], time=[1, 1, 2, 2, 3, 3])
    jm = chain_of(g)
    assert jm.lengths == (6,) and jm.head == ()
    assert [s.nodes for s in jm.branches[0]] == [(v,) for v in range(6)]
    assert list(jm.profile.branches[0].x) == [0, 1, 2, 3, 4, 5, 6]
    assert list(jm.profile.branches[0].uf) == [1, 1, 2, 2, 3, 3]
    s = revolve(6, 4)
    sim = simulate(s, jm.profile)
    assert sim.peak_bytes > 0 and sim.makespan > s.makespan  # rebuilt tapes add the forwards again


def test_chain_of_kusumoto_fig2_is_one_long_step() -> None:
    # the skip from the first node to the last leaves only the source as a cut
    jm = chain_of(fig2_skip(6))
    assert [s.nodes for s in jm.branches[0]] == [(0,), (1, 2, 3, 4, 5)]


def test_join_of_a_two_source_graph() -> None:
    # branch 0: 0→1→2, branch 1: 3→4, head 5 (reads 2 and 4) → 6
    g = Graph.from_edges([(0, 1), (1, 2), (3, 4), (2, 5), (4, 5), (5, 6)], [1] * 7, [1] * 7)
    jm = join_of(g)
    assert jm.lengths == (3, 2) and jm.head == (5, 6)
    assert _partition(jm) == list(range(7))
    assert jm.profile.ut == 3 * 2
    _check(join_dp(jm.lengths, 5), 5)
    with pytest.raises(ValueError, match="exactly one node"):
        join_of(Graph.from_edges([(0, 1), (0, 2), (1, 2), (3, 2), (1, 4)], [1] * 5, [1] * 5))
    with pytest.raises(ValueError, match="two inputs"):
        join_of(g.__class__.from_edges([(0, 1)], [1, 1], [1, 1]))
