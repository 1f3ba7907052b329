"""The simulator's peak of a canonical strategy, block by block: the memory the DPs optimise.

For a lower-set sequence L_1 ≺ … ≺ L_k = V the canonical schedule (:func:`recompute.pricing.schedule.canonical`)
keeps the cache U_{i-1} = ∪_{j<i} ∂(L_j) ∩ V_j alive through block i's forward and backward phases,
and everything else that lives during block i depends on the pair (L_{i-1}, L_i) alone. So the exact
peak of :func:`recompute.pricing.simulate.simulate` decomposes as

    peak = max_i ( M(U_{i-1}) + B(L_{i-1}, L_i) ),   M(U) = Σ_{u ∈ U} K_u,

which is eq. (2)'s shape (Kusumoto et al. 2019, §3) with the simulator's numbers:

* K_u, the *cache bytes* of u: its values the schedule holds until its block's backward is done
  (BatchNorm's new statistics and the step's outputs are left out: they live regardless);
* B(L, L′) for a block V′ = L′ \\ L before the last: the most bytes alive, besides M(U), at any step of
  its forward phase (V′ computed, the cached part ∂(L′) ∩ V′ kept, the rest freed after its last forward
  read) and of its backward phase (V′ \\ ∂(L′) recomputed, the backward ops of V′ run, each value freed
  after its last read); for the last block (L′ = V) its forward and backward phases in one replay. It
  counts the values of the step that outlive their ops — BatchNorm statistics until the forward phase
  ends, the step's outputs, parameter gradients, the tangents in backward, gradients on their way
  from blocks above to blocks below — and each op's workspace at its step (``Program.workspace``),
  exactly as the simulator does.

:class:`BlockCosts` holds the joint graph as integer arrays (storages, their readers, each backward op's
block rule) and evaluates B(L, L′) for bitset-encoded lower sets in a numba kernel; the property tests
check ``BlockCosts.peak(seq) == simulate(program, canonical(graph, seq)).peak``. Graphs whose backward
ops read forward values in ways this decomposition does not cover (none of the zoo's) are reported by
:meth:`BlockCosts.build` returning ``None``.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

import numba
import numpy as np
from numba.cpython.unsafe.numbers import trailing_zeros

from recompute.core.families import has as _has, pack_rows, unpack_rows
from recompute.core.fxnodes import runs_once
from recompute.pricing.schedule import held
from recompute.core.storage import joint_table

if TYPE_CHECKING:
    import torch.fx as fx

    from recompute.core.graph import Graph

__all__ = ["BlockCosts", "FamilyCosts"]

_FWD, _BWD = 0, 1


def _csr(lists: Sequence[Sequence[int]]) -> tuple[np.ndarray, np.ndarray]:
    ptr = np.zeros(len(lists) + 1, np.int64)
    ptr[1:] = np.cumsum([len(x) for x in lists])
    idx = np.fromiter((u for x in lists for u in x), np.int64, count=int(ptr[-1]))
    return ptr, idx


@dataclass
class BlockCosts:
    """The joint graph of a traced step as arrays for :func:`_pair_cost` (see the module docstring).

    Ops are the joint graph's forward ops of V's members and its backward ops, numbered by execution
    order (forward, then backward), so that sorting op ids gives a phase's step order. Storages are the
    outputs of non-alias ops (one per element of a multi-output op); the prologue's, the tangents' and
    the parameters' are constants.
    """

    n: int
    n_fwd: int
    fwd_ptr: np.ndarray  # node v → its forward member ops
    fwd_idx: np.ndarray
    key_ptr: np.ndarray  # node v → backward ops x with v ∈ K(x)
    key_idx: np.ndarray
    k_ptr: np.ndarray  # op x → K(x): the minimal owners over x and its backward ancestors (n = ⊤, the last block)
    k_idx: np.ndarray
    make_ptr: np.ndarray  # op x → storages it creates
    make_idx: np.ndarray
    read_ptr: np.ndarray  # storage s → ops that read it (directly or through an alias)
    read_idx: np.ndarray
    arg_ptr: np.ndarray  # op x → the forward ops whose results it reads (its fx inputs among them)
    arg_idx: np.ndarray
    once: np.ndarray  # forward op x runs as the schedule says even where nothing reads it (random, a write)
    tied: np.ndarray  # forward op x is a getitem: it runs where the op whose element it takes does
    st_size: np.ndarray
    ws: np.ndarray  # op x → the bytes it allocates and frees inside itself (a CUDA workspace)
    st_node: np.ndarray  # forward storage → its node of V; −1 for backward storages
    st_out: np.ndarray  # a step output, a parameter gradient or a BatchNorm statistic: alive to the end
    st_held: np.ndarray  # kept until its block's backward when its node is cached (``schedule.held``)
    cache: np.ndarray  # K_v
    saved: np.ndarray  # bytes of v's storages that some backward op reads (a lower bound's weight)
    outs: np.ndarray  # bytes of v's storages alive to the end (``st_out``)
    has_own: np.ndarray  # v owns a backward op that runs in v's block whatever the sequence
    constant: int  # prologue storages (held to the end)
    tangents: int
    out_total: int

    @classmethod
    def of(cls, g: "Graph") -> "BlockCosts | None":
        """:meth:`build` for a traced graph, once per graph (kept on its program)."""
        if g.program is None:
            raise ValueError("the simulator's block costs need a traced graph (recompute.trace)")
        if not hasattr(g.program, "block_costs"):
            g.program.block_costs = cls.build(g)
        return g.program.block_costs

    @classmethod
    def build(cls, g: "Graph") -> "BlockCosts | None":
        """Arrays of ``g``'s joint graph, or ``None`` where a backward op reads a forward value other
        than its owner's or its owner's inputs' (the decomposition would not hold)."""
        p = g.program
        joint = p.joint
        fwd_nodes = [n for n in joint.forward if n.name in p.group]
        ops: list[fx.Node] = fwd_nodes + list(joint.backward)
        n_fwd = len(fwd_nodes)
        # storages: the outputs of these ops (the prologue's, the tangents' and the parameters' are constants)
        st = joint_table(joint).counted(ops)
        make = [st.made(node) for node in ops]
        st_node = [-1] * len(st.size)
        for i, node in enumerate(fwd_nodes):
            for s in make[i]:
                st_node[s] = p.group[node.name]

        readers: list[list[int]] = [[] for _ in st.size]
        fwd_read_nodes: list[set[int]] = [set() for _ in ops]
        for i, node in enumerate(ops):
            for s in st.reads(node):
                readers[s].append(i)
                if st_node[s] >= 0:
                    fwd_read_nodes[i].add(st_node[s])
        # K(x): the minimal owners over x and its backward ancestors (minimal elements of a union are
        # the minimal elements of the union of the parts' minimal elements)
        n = g.n
        reach = g.ancestors_mask()  # reach[v, u]: u = v or u reaches v
        k_of: dict[str, frozenset[int]] = {}
        k_lists: list[list[int]] = []
        for node in joint.backward:
            own = {p.owner.get(node.name, n)}
            for a in node.all_input_nodes:
                own |= k_of.get(a.name, frozenset())
            # ⊤ = n is above every node; u is minimal unless another owner reaches it
            keys = [u for u in own if u != n and not any(w != u and w != n and reach[u, w] for w in own)]
            k_of[node.name] = frozenset(keys) if keys else frozenset((n,))
            k_lists.append(sorted(k_of[node.name]))
        owner = [p.owner.get(node.name, n) for node in joint.backward]
        for j, node in enumerate(joint.backward):
            reads_fwd = fwd_read_nodes[n_fwd + j]
            if reads_fwd and (k_lists[j] != [owner[j]] or owner[j] == n
                              or any(u != owner[j] and u not in g.preds[owner[j]] for u in reads_fwd)):
                return None
        key_lists: list[list[int]] = [[] for _ in range(n)]
        for j, keys in enumerate(k_lists):
            for u in keys:
                if u < n:
                    key_lists[u].append(n_fwd + j)
        fwd_lists: list[list[int]] = [[] for _ in range(n)]
        for i, node in enumerate(fwd_nodes):
            fwd_lists[p.group[node.name]].append(i)
        # what outlives its readers
        writes = {s for name in joint.buffer_writes for s in st.of(joint.node(name))}
        outs: set[int] = set()
        for node in [*joint.user_outputs, *(joint.node(name) for name in joint.gradients)]:
            outs.update(st.of(node))
        size = st.size
        st_out = np.zeros(len(size), bool)  # BatchNorm statistics too: the schedule holds them to the end
        st_out[list(outs | writes)] = True
        node_of = np.asarray(st_node, np.int64)
        st_held = np.zeros(len(size), bool)
        for v, members in enumerate(p.members):
            for node in members:
                if held(node, joint):
                    st_held[st.of(node)] = True
        st_held &= ~st_out
        cache = np.zeros(n, np.int64)
        saved = np.zeros(n, np.int64)
        o_bytes = np.zeros(n, np.int64)
        for s, v in enumerate(st_node):
            if v < 0:
                continue
            o_bytes[v] += size[s] * st_out[s]
            if st_held[s]:
                cache[v] += size[s]
                if any(r >= n_fwd for r in readers[s]):
                    saved[v] += size[s]
        has_own = np.zeros(n, bool)
        for keys in k_lists:
            if len(keys) == 1 and keys[0] < n:
                has_own[keys[0]] = True
        constant = sum(st.table.nbytes(node) for node in p.prologue)
        tangents = sum(st.table.nbytes(joint.node(name)) for name in joint.tangents)
        fwd_ptr, fwd_idx = _csr(fwd_lists)
        key_ptr, key_idx = _csr(key_lists)
        k_ptr, k_idx = _csr([[] for _ in range(n_fwd)] + k_lists)
        make_ptr, make_idx = _csr(make)
        read_ptr, read_idx = _csr(readers)
        fwd_op = {node.name: i for i, node in enumerate(fwd_nodes)}
        arg_ptr, arg_idx = _csr([[fwd_op[a.name] for a in node.all_input_nodes if a.name in fwd_op] for node in ops])
        once = np.array([runs_once(node) for node in fwd_nodes], bool)
        tied = np.array([n.target is operator.getitem and n.args[0].name in fwd_op for n in fwd_nodes], bool)
        ws = np.array([p.workspace.get(x.name, 0) for x in ops], np.int64)
        return cls(
            n=n, n_fwd=n_fwd, fwd_ptr=fwd_ptr, fwd_idx=fwd_idx, key_ptr=key_ptr, key_idx=key_idx, k_ptr=k_ptr,
            k_idx=k_idx, make_ptr=make_ptr, make_idx=make_idx, read_ptr=read_ptr, read_idx=read_idx, arg_ptr=arg_ptr,
            arg_idx=arg_idx, once=once, tied=tied, st_size=size,
            ws=ws, st_node=node_of, st_out=st_out, st_held=st_held, cache=cache, saved=saved,
            outs=o_bytes, has_own=has_own, constant=int(constant), tangents=int(tangents),
            out_total=int(o_bytes.sum()),
        )

    def arrays(self) -> tuple:
        """The kernel's view of the joint graph (a tuple numba takes as one argument)."""
        return (self.n_fwd, self.fwd_ptr, self.fwd_idx, self.key_ptr, self.key_idx, self.k_ptr, self.k_idx,
                self.make_ptr, self.make_idx, self.read_ptr, self.read_idx, self.arg_ptr, self.arg_idx, self.once,
                self.tied, self.st_size, self.ws, self.st_node, self.st_out, self.st_held, self.cache, self.outs,
                np.int64(self.constant), np.int64(self.tangents), np.int64(self.out_total))

    def family(self, bits: np.ndarray, boundary: np.ndarray) -> "FamilyCosts":
        """Per-set terms for a family of lower sets (packed bitsets, ∅ first and V last) and their
        boundaries ∂(L)."""
        crossing_ptr, crossing_idx, before = _crossing(bits, *self.arrays())
        member = unpack_rows(bits, self.n)
        return FamilyCosts(self, bits, boundary, crossing_ptr, crossing_idx, before, member @ self.outs,
                           _scratch(len(self.k_ptr) - 1, len(self.st_size), self.n))

    def peak(self, seq: Sequence[frozenset[int]], boundary: Sequence[frozenset[int]]) -> int:
        """max_i M(U_{i-1}) + B(L_{i-1}, L_i) for one sequence (``boundary[i]`` = ∂(L_i)): the
        simulator's peak of its canonical schedule."""
        member = np.zeros((len(seq) + 1, self.n), bool)
        bd = np.zeros_like(member)
        for r, (lower, b) in enumerate(zip(seq, boundary), 1):
            member[r, list(lower)] = True
            bd[r, list(b)] = True
        fam = self.family(pack_rows(member), pack_rows(bd))
        m, best, lower = 0, 0, frozenset()
        for r in range(1, len(seq) + 1):
            best = max(best, m + fam.cost(r - 1, r))
            m += int(self.cache[sorted(boundary[r - 1] - lower)].sum())
            lower = seq[r - 1]
        return int(best)


@dataclass
class FamilyCosts:
    """B(L, L′) over one family of lower sets: the set-wise terms and the scratch the kernel needs."""

    costs: BlockCosts
    bits: np.ndarray
    boundary: np.ndarray
    crossing_ptr: np.ndarray
    crossing_idx: np.ndarray
    before: np.ndarray  # per set L′: parameter gradients made before its block
    outs_in: np.ndarray  # per set L: bytes alive to the end made by its nodes
    scratch: tuple

    def kernel_args(self) -> tuple:
        """The arguments after (i, j) of :func:`_pair_cost`."""
        return (self.bits, self.boundary, self.crossing_ptr, self.crossing_idx, self.before, self.outs_in,
                self.costs.arrays(), self.scratch)

    def cost(self, i: int, j: int) -> int:
        """B(L_i, L_j) for rows i, j of the family (L_i ⊊ L_j)."""
        return int(_pair_cost(i, j, *self.kernel_args()))

    @classmethod
    def empty(cls) -> "FamilyCosts":
        """A family of no graph: the placeholder arguments of a DP run that does not use the simulator."""
        z, b = np.zeros(1, np.int64), np.zeros(1, bool)
        costs = BlockCosts(n=0, n_fwd=0, fwd_ptr=z, fwd_idx=z, key_ptr=z, key_idx=z, k_ptr=z, k_idx=z, make_ptr=z,
                           make_idx=z, read_ptr=z, read_idx=z, arg_ptr=z, arg_idx=z, once=b, tied=b, st_size=z, ws=z,
                           st_node=z, st_out=b, st_held=b, cache=z, saved=z, outs=z, has_own=b, constant=0, tangents=0,
                           out_total=0)
        bits = np.zeros((1, 1), np.uint64)
        return cls(costs, bits, bits, np.zeros(2, np.int64), z, z, z, _scratch(1, 1, 1))


def _scratch(n_ops: int, n_st: int, n: int) -> tuple:
    """Work arrays of :func:`_pair_cost`: a stamp, per op its stamp and step, the steps, the live-bytes
    deltas, the (birth, death, bytes) events (a storage's, or a workspace's), the block's nodes, per op
    the stamp of the phase that reads its result."""
    return (np.zeros(1, np.int64), np.full(n_ops, -1, np.int64), np.zeros(n_ops, np.int64), np.empty(n_ops, np.int64),
            np.zeros(n_ops + 2, np.int64), np.empty((n_st + n_ops + 16, 3), np.int64), np.empty(max(n, 1), np.int64),
            np.full(n_ops, -1, np.int64))


@numba.njit(cache=True)
def _meets(bits: np.ndarray, r: int, k_ptr: np.ndarray, k_idx: np.ndarray, x: int, n: int, top: bool) -> bool:
    """K(x) ∩ L_r ≠ ∅ (⊤ belongs to L_r iff ``top``)."""
    for e in range(k_ptr[x], k_ptr[x + 1]):
        u = k_idx[e]
        if u == n:
            if top:
                return True
        elif _has(bits, r, u):
            return True
    return False


@numba.njit(cache=True)
def _crossing(bits, n_fwd, fwd_ptr, fwd_idx, key_ptr, key_idx, k_ptr, k_idx, make_ptr, make_idx, read_ptr, read_idx,
              arg_ptr, arg_idx, once, tied, st_size, ws, st_node, st_out, st_held, cache, outs, constant, tangents, out_total):  # fmt: skip
    """Per set L′: the backward storages made before its block and read in it or after (gradients on
    their way down), and the bytes of parameter gradients made before it."""
    k = bits.shape[0]
    n = fwd_ptr.shape[0] - 1
    n_ops = k_ptr.shape[0] - 1
    ptr = np.zeros(k + 1, np.int64)
    out = np.empty(16, np.int64)
    before = np.zeros(k, np.int64)
    for r in range(k):
        is_top = r == k - 1  # the family's last set is V
        cnt = ptr[r]
        for x in range(n_fwd, n_ops):
            if _meets(bits, r, k_ptr, k_idx, x, n, is_top):
                continue  # x runs in L′'s block or later
            for e in range(make_ptr[x], make_ptr[x + 1]):
                s = make_idx[e]
                if st_out[s]:
                    before[r] += st_size[s]
                    continue
                for f in range(read_ptr[s], read_ptr[s + 1]):
                    if _meets(bits, r, k_ptr, k_idx, read_idx[f], n, is_top):
                        if cnt >= out.shape[0]:
                            grown = np.empty(2 * out.shape[0], np.int64)
                            grown[: out.shape[0]] = out
                            out = grown
                        out[cnt] = s
                        cnt += 1
                        break
        ptr[r + 1] = cnt
    return ptr, out[: ptr[k]].copy(), before


@numba.njit(cache=True)
def _replay(m, base, events, ev_count, delta):
    """Highest live bytes over ``m`` steps: ``base`` plus each event (birth, death, bytes) on
    [birth, death]."""
    for t in range(m + 1):
        delta[t] = 0
    for e in range(ev_count):
        delta[events[e, 0]] += events[e, 2]
        delta[events[e, 1] + 1] -= events[e, 2]
    live, best = base, np.int64(0)
    for t in range(m):
        live += delta[t]
        if t == 0 or live > best:
            best = live
    return best


@numba.njit(cache=True)
def _block_nodes(bits, i, j, out):
    """V′ = L_j \\ L_i into ``out``; returns |V′|."""
    c = 0
    for w in range(bits.shape[1]):
        word = bits[j, w] & ~bits[i, w]
        while word:
            out[c] = (w << 6) + trailing_zeros(word)
            word &= word - np.uint64(1)
            c += 1
    return c


@numba.njit(cache=True)
def _pair_cost(i, j, bits, boundary, crossing_ptr, crossing_idx, before, outs_in, arrays, scratch):
    """B(L_i, L_j) (the module docstring): the larger of the block's forward and backward phases, or
    both at once for the last block (j is the family's last row, V)."""
    (n_fwd, fwd_ptr, fwd_idx, key_ptr, key_idx, k_ptr, k_idx, make_ptr, make_idx, read_ptr, read_idx, arg_ptr, arg_idx,
     once, tied, st_size, ws, st_node, st_out, st_held, cache, outs, constant, tangents, out_total) = arrays
    stamp_box, mark, step_of, steps, delta, events, nodes, need = scratch
    n = fwd_ptr.shape[0] - 1
    last = j == bits.shape[0] - 1
    nv = _block_nodes(bits, i, j, nodes)
    cached = np.int64(0)
    for a in range(nv):
        if _has(boundary, j, nodes[a]):
            cached += cache[nodes[a]]
    # ---- forward phase: the forward ops of V′ (for the last block, followed by its backward ops)
    stamp_box[0] += 1
    stamp = stamp_box[0]
    m = 0
    for a in range(nv):
        v = nodes[a]
        for e in range(fwd_ptr[v], fwd_ptr[v + 1]):
            steps[m] = fwd_idx[e]
            m += 1
    f = m
    if last:
        m = _add_backward(i, nodes, nv, n, key_ptr, key_idx, k_ptr, k_idx, mark, stamp, steps, m, bits, True)
    srt = steps[:m]
    srt.sort()
    for t in range(m):
        mark[srt[t]] = stamp
        step_of[srt[t]] = t
    ev = 0
    for t in range(m):
        x = srt[t]
        for e in range(make_ptr[x], make_ptr[x + 1]):
            s = make_idx[e]
            v = st_node[s]
            if st_out[s] or (not last and st_held[s] and _has(boundary, j, v)):
                death = m - 1  # to the end, or cached
            else:
                death = _death(s, t, m, i, bits, n, read_ptr, read_idx, k_ptr, k_idx, mark, step_of, stamp,
                               last and v < 0)
            events[ev, 0], events[ev, 1], events[ev, 2] = t, death, st_size[s]
            ev += 1
    ev = _add_workspaces(srt, m, ws, events, ev)
    if last:
        if m > f and tangents > 0:  # the tangents arrive when the forward phase ends
            events[ev, 0], events[ev, 1], events[ev, 2] = f, m - 1, tangents
            ev += 1
        return _replay(m, constant + outs_in[i], events, ev, delta)
    fwd_peak = _replay(m, constant + outs_in[i], events, ev, delta)
    # ---- backward phase: recompute V′ \\ ∂(L′), then the backward ops of the block
    stamp_box[0] += 1
    stamp = stamp_box[0]
    m = 0
    for a in range(nv):
        v = nodes[a]
        if not _has(boundary, j, v):
            for e in range(fwd_ptr[v], fwd_ptr[v + 1]):
                steps[m] = fwd_idx[e]
                m += 1
    m = _add_backward(i, nodes, nv, n, key_ptr, key_idx, k_ptr, k_idx, mark, stamp, steps, m, bits, False)
    srt = steps[:m]
    srt.sort()
    for t in range(m):
        mark[srt[t]] = stamp
    m = _drop_unread(srt, m, n_fwd, arg_ptr, arg_idx, once, tied, mark, need, stamp)
    if m == 0:
        return fwd_peak
    srt = steps[:m]
    for t in range(m):
        step_of[srt[t]] = t
    ev = 0
    for t in range(m):
        x = srt[t]
        for e in range(make_ptr[x], make_ptr[x + 1]):
            s = make_idx[e]
            if st_node[s] < 0 and st_out[s]:
                death = m - 1  # a parameter gradient (a recomputed copy is no output)
            else:
                death = _death(s, t, m, i, bits, n, read_ptr, read_idx, k_ptr, k_idx, mark, step_of, stamp,
                               st_node[s] < 0)
            events[ev, 0], events[ev, 1], events[ev, 2] = t, death, st_size[s]
            ev += 1
    ev = _add_workspaces(srt, m, ws, events, ev)
    for e in range(crossing_ptr[j], crossing_ptr[j + 1]):
        s = crossing_idx[e]
        events[ev, 0], events[ev, 2] = 0, st_size[s]
        events[ev, 1] = _death(s, 0, m, i, bits, n, read_ptr, read_idx, k_ptr, k_idx, mark, step_of, stamp, True)
        ev += 1
    base = constant + tangents + out_total + before[j] + cached
    return max(fwd_peak, _replay(m, base, events, ev, delta))


@numba.njit(cache=True)
def _drop_unread(srt, m, n_fwd, arg_ptr, arg_idx, once, tied, mark, need, stamp):
    """Drop from the backward phase's ``m`` sorted steps the recomputed forward ops whose results no
    later kept step reads (as :func:`recompute.pricing.schedule.canonical` does; the ``getitem``s of a kept
    op stay), unmarking them; returns how many steps are kept, moved to the front of ``srt`` in order."""
    for t in range(m - 1, -1, -1):
        x = srt[t]
        if x < n_fwd and need[x] != stamp and not once[x]:
            mark[x] = -1
            continue
        for e in range(arg_ptr[x], arg_ptr[x + 1]):
            need[arg_idx[e]] = stamp
    kept = 0
    for t in range(m):
        x = srt[t]
        if mark[x] != stamp and tied[x] and mark[arg_idx[arg_ptr[x]]] == stamp:
            mark[x] = stamp  # the getitem of a kept multi-output op: its tuple lives until the last one
        if mark[x] == stamp:
            srt[kept] = x
            kept += 1
    return kept


@numba.njit(cache=True)
def _add_workspaces(srt, m, ws, events, ev):
    """An event for each step's workspace (alive during that step alone); returns the event count."""
    for t in range(m):
        if ws[srt[t]] > 0:
            events[ev, 0], events[ev, 1], events[ev, 2] = t, t, ws[srt[t]]
            ev += 1
    return ev


@numba.njit(cache=True)
def _death(s, t, m, i, bits, n, read_ptr, read_idx, k_ptr, k_idx, mark, step_of, stamp, may_outlive):
    """Last step of the phase at which storage ``s`` (made at step ``t``) is alive: its last read in the
    phase, or the phase's end when (``may_outlive``) a block below still reads it."""
    death = t
    for fr in range(read_ptr[s], read_ptr[s + 1]):
        r = read_idx[fr]
        if mark[r] == stamp:
            if step_of[r] > death:
                death = step_of[r]
        elif may_outlive and _meets(bits, i, k_ptr, k_idx, r, n, False):
            return m - 1
    return death


@numba.njit(cache=True)
def _add_backward(i, nodes, nv, n, key_ptr, key_idx, k_ptr, k_idx, mark, stamp, steps, m, bits, last):
    """Append the backward ops of block (L_i, L_j): K(x) meets V′ and misses L_i."""
    for a in range(nv):
        v = nodes[a]
        for e in range(key_ptr[v], key_ptr[v + 1]):
            x = key_idx[e]
            if mark[x] != stamp and not _meets(bits, i, k_ptr, k_idx, x, n, False):
                mark[x] = stamp
                steps[m] = x
                m += 1
    if last:  # ops of no node of V (K = {⊤}) run in the last block
        for x in range(k_ptr.shape[0] - 1):
            if k_ptr[x + 1] - k_ptr[x] == 1 and k_idx[k_ptr[x]] == n and mark[x] != stamp:
                mark[x] = stamp
                steps[m] = x
                m += 1
    return m
