"""The schedule record of a chain or join, and its simulator (makespan, peak slots, peak bytes).

The model is the pebble game of Beaumont et al. (2020, §2, Definition 2.3 and Problem 2.4), whose
k = 1 case is Griewank & Walther's (2000) adjoint chain. A join has k branches; branch b has steps
1..ℓ_b and forward data x_0^b..x_ℓ^b (x_0^b its input):

* ``F_i``: x_i = F_i(x_{i-1}); three variants, named as in Beaumont et al. (2019, heterogeneous chains):
  ``F∅`` drops x_{i-1} (x_i takes its slot: the move along a branch costs no slot), ``Fck`` keeps
  x_{i-1} as a checkpoint, ``Fall`` keeps x_{i-1} *and* the step's tape (the activations autograd saves
  inside step i), so that B_i need not run step i again.
* the turn ``T``: reads every x_ℓ^b and writes the backward data δ_ℓ^b in the same slots (Beaumont's
  x̄; δ here, because rotor's x̄ is the tape). Its cost is ut.
* ``B_i``: δ_{i-1} = B_i(x_{i-1}, δ_i), written over δ_i; x_{i-1} and step i's tape are then freed
  (nothing needs them once step i is back-propagated).

Initial memory: {x_0^b}; final memory: {δ_0^b}. A *slot* holds one x or δ (unit sizes, the papers'
model); the slot count is taken between operations, which is what makes ``F∅``, ``T`` and ``B``
in-place and gives Theorem 3.3's c_min (2k + 1) and the paper's C_opt (Σ(ℓ_b + 1)). With per-step
sizes (:class:`Profile`) the simulator also prices bytes, counting an operation's inputs and outputs
together while it runs, plus the tape B_i rebuilds when no ``Fall`` kept it.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

import numpy as np

__all__ = [
    "OpKind", "Op", "TURN", "Value", "Schedule", "Costs", "BranchProfile", "Profile", "Simulation",
    "InvalidSchedule", "simulate",
]


class OpKind(enum.Enum):
    """The operations of the pebble game (see the module docstring)."""

    F_NONE = "F∅"
    F_CK = "Fck"
    F_ALL = "Fall"
    TURN = "T"
    B = "B"

    @property
    def is_forward(self) -> bool:
        return self in (OpKind.F_NONE, OpKind.F_CK, OpKind.F_ALL)


@dataclass(frozen=True, slots=True)
class Op:
    """One operation: ``kind`` on step ``step`` (1..ℓ_b) of branch ``branch``; the turn has both 0."""

    kind: OpKind
    branch: int = 0
    step: int = 0

    def __str__(self) -> str:
        return "T" if self.kind is OpKind.TURN else f"{self.kind.value}[{self.branch}]{self.step}"


TURN = Op(OpKind.TURN)


@dataclass(frozen=True, order=True, slots=True)
class Value:
    """A datum that occupies a slot: ``x`` (forward) or ``δ`` (backward) at position ``index`` of ``branch``."""

    kind: str
    branch: int
    index: int

    def __str__(self) -> str:
        return f"{self.kind}[{self.branch}]{self.index}"


@dataclass(frozen=True)
class Costs:
    """Uniform costs of the papers' homogeneous model: every forward step uf, every backward step ub,
    the turn ut (Beaumont §2b; their evaluation uses uf = ub = ut = 1)."""

    uf: float = 1.0
    ub: float = 1.0
    ut: float = 1.0


@dataclass(frozen=True)
class Schedule:
    """A schedule of a join with branch lengths ``lengths`` (one branch: a chain).

    Attributes:
        lengths: ℓ_1..ℓ_k.
        ops: the operations in execution order.
        slots: the slot bound c it was planned for (its peak slot count is at most this).
        method: the planner that made it (``revolve``, ``join_dp``, ``equiv_chain``, ``chen_recursive``).
        makespan: the planner's own prediction under ``costs``.
        costs: the uniform costs it was planned with.
        info: planner facts.
    """

    lengths: tuple[int, ...]
    ops: tuple[Op, ...]
    slots: int
    method: str
    makespan: float
    costs: Costs = Costs()
    info: dict[str, Any] = field(default_factory=dict, compare=False)

    def __len__(self) -> int:
        return len(self.ops)

    def count(self, kind: OpKind) -> int:
        """How many operations of ``kind``."""
        return sum(op.kind is kind for op in self.ops)

    def forwards_per_step(self) -> list[np.ndarray]:
        """Per branch, how many times each step 1..ℓ_b runs forward (1 everywhere: no recomputation)."""
        runs = [np.zeros(n, dtype=np.int64) for n in self.lengths]
        for op in self.ops:
            if op.kind.is_forward:
                runs[op.branch][op.step - 1] += 1
        return runs

    def __str__(self) -> str:
        return " ".join(map(str, self.ops))


@dataclass(frozen=True)
class BranchProfile:
    """Per-step costs and sizes of one branch (arrays indexed from step 1, i.e. ``uf[i-1]`` is step i).

    Attributes:
        uf, ub: forward and backward cost of each step (ℓ entries).
        x: bytes of x_0..x_ℓ (ℓ + 1 entries); δ_i has the size of x_i.
        tape: bytes step i keeps for its backward besides its input (ℓ entries).
    """

    uf: np.ndarray
    ub: np.ndarray
    x: np.ndarray
    tape: np.ndarray

    def __post_init__(self) -> None:
        n = len(self.uf)
        if len(self.ub) != n or len(self.tape) != n or len(self.x) != n + 1:
            raise ValueError(f"a branch of {n} steps needs {n} uf, ub, tape and {n + 1} x entries")

    @property
    def length(self) -> int:
        return len(self.uf)


@dataclass(frozen=True)
class Profile:
    """Per-step costs and sizes of a join (one branch: a chain) for :func:`simulate`.

    Attributes:
        branches: one :class:`BranchProfile` per branch.
        ut: cost of the turn.
        turn_bytes: bytes the turn holds while it runs (e.g. a loss head's activations).
        rebuild: B_i re-runs step i (cost uf_i, its tape transiently) when ``Fall`` kept no tape for it,
            as a real network does; the papers' abstract B (``False``) costs ub whatever is stored.
    """

    branches: tuple[BranchProfile, ...]
    ut: float = 1.0
    turn_bytes: int = 0
    rebuild: bool = False

    @property
    def lengths(self) -> tuple[int, ...]:
        return tuple(b.length for b in self.branches)

    @classmethod
    def uniform(cls, lengths: Sequence[int], costs: Costs = Costs()) -> "Profile":
        """The papers' homogeneous model: unit sizes, no tape, uniform costs."""
        one = lambda n, v: np.full(n, v, dtype=float)  # noqa: E731
        return cls(
            tuple(BranchProfile(one(n, costs.uf), one(n, costs.ub), np.ones(n + 1, np.int64), np.zeros(n, np.int64))
                  for n in lengths),
            ut=costs.ut,
        )


class InvalidSchedule(ValueError):
    """An operation whose inputs are not in memory, a slot bound exceeded, or a wrong final memory."""

    def __init__(self, index: int, op: Op | None, reason: str):
        self.index, self.op = index, op
        where = f"op {index} ({op})" if op is not None else ("the start" if index < 0 else "the end")
        super().__init__(f"invalid schedule at {where}: {reason}")


@dataclass(frozen=True)
class Simulation:
    """What :func:`simulate` found.

    Attributes:
        makespan: Σ of the operations' costs.
        peak_slots: most values (x or δ) held between two operations, initial inputs included.
        peak_bytes: most bytes held during an operation (inputs, outputs and tapes together).
        table: the slot contents after each operation (``None``: a free slot), ``peak_slots`` wide:
            a value keeps its slot while it lives and an in-place operation writes into its input's.
    """

    makespan: float
    peak_slots: int
    peak_bytes: int
    table: tuple[tuple[Value | None, ...], ...]


class _Memory:
    """Slot assignment: a new value takes a given slot (in place) or the lowest free one."""

    def __init__(self, initial: Iterable[Value]):
        self.slot: dict[Value, int] = {}
        self.free: list[int] = []
        self.width = 0
        for v in initial:
            self.add(v)

    def add(self, v: Value, slot: int | None = None) -> None:
        if slot is None:
            if self.free:
                slot = min(self.free)
                self.free.remove(slot)
            else:
                slot, self.width = self.width, self.width + 1
        self.slot[v] = slot

    def drop(self, v: Value) -> None:
        self.free.append(self.slot.pop(v))

    def move(self, old: Value, new: Value) -> None:
        self.slot[new] = self.slot.pop(old)

    def row(self) -> tuple[Value | None, ...]:
        out: list[Value | None] = [None] * self.width
        for v, s in self.slot.items():
            out[s] = v
        return tuple(out)


def simulate(schedule: Schedule, profile: Profile | None = None, *, slots: int | None = None) -> Simulation:
    """Run ``schedule`` on the pebble game, checking every operation (raises :class:`InvalidSchedule`).

    ``profile`` defaults to the uniform one of ``schedule.costs``; ``slots`` (default the schedule's
    own bound) is the slot bound to check.
    """
    lengths = schedule.lengths
    prof = profile or Profile.uniform(lengths, schedule.costs)
    if prof.lengths != lengths:
        raise ValueError(f"profile lengths {prof.lengths} differ from the schedule's {lengths}")
    bound = schedule.slots if slots is None else slots
    x = lambda b, i: Value("x", b, i)  # noqa: E731
    d = lambda b, i: Value("δ", b, i)  # noqa: E731
    size = lambda v: int(prof.branches[v.branch].x[v.index])  # noqa: E731
    mem = _Memory(x(b, 0) for b in range(len(lengths)))
    tapes: set[tuple[int, int]] = set()  # (branch, step) whose tape Fall kept

    def held() -> int:
        return sum(map(size, mem.slot)) + sum(int(prof.branches[b].tape[i - 1]) for b, i in tapes)

    if len(mem.slot) > bound:
        raise InvalidSchedule(-1, None, f"the {len(mem.slot)} inputs alone exceed {bound} slots")
    def fail(why: str) -> InvalidSchedule:  # about the operation the loop is at
        return InvalidSchedule(n, op, why)

    makespan, peak_slots, peak_bytes, table = 0.0, len(mem.slot), held(), []
    turned = False
    for n, op in enumerate(schedule.ops):
        b, i = op.branch, op.step
        if op.kind is OpKind.TURN:
            if turned:
                raise fail("the turn runs once")
            ins = [x(c, ell) for c, ell in enumerate(lengths)]
            missing = [str(v) for v in ins if v not in mem.slot]
            if missing:
                raise fail(f"the turn needs {', '.join(missing)}")
            peak_bytes = max(peak_bytes, held() + sum(map(size, ins)) + prof.turn_bytes)
            for c, v in enumerate(ins):
                mem.move(v, d(c, lengths[c]))
            makespan += prof.ut
            turned = True
        else:
            if not (0 <= b < len(lengths) and 1 <= i <= lengths[b]):
                raise fail(f"no step {i} on branch {b} (lengths {lengths})")
            bp = prof.branches[b]
            if op.kind.is_forward:
                src, dst = x(b, i - 1), x(b, i)
                if src not in mem.slot:
                    raise fail(f"needs {src}")
                if dst in mem.slot:
                    raise fail(f"{dst} is already in memory")
                keep_tape = op.kind is OpKind.F_ALL
                peak_bytes = max(peak_bytes, held() + size(dst) + (int(bp.tape[i - 1]) if keep_tape else 0))
                if op.kind is OpKind.F_NONE:
                    mem.move(src, dst)
                else:
                    mem.add(dst)
                if keep_tape:
                    tapes.add((b, i))
                makespan += float(bp.uf[i - 1])
            else:
                src, grad = x(b, i - 1), d(b, i)
                if not turned or grad not in mem.slot:
                    raise fail(f"needs {grad}")
                if src not in mem.slot:
                    raise fail(f"needs {src}")
                taped = (b, i) in tapes
                rebuilt = 0 if taped else int(bp.tape[i - 1])
                peak_bytes = max(peak_bytes, held() + size(d(b, i - 1)) + rebuilt)
                mem.drop(src)
                mem.move(grad, d(b, i - 1))
                tapes.discard((b, i))
                makespan += float(bp.ub[i - 1]) + (float(bp.uf[i - 1]) if prof.rebuild and not taped else 0.0)
        if len(mem.slot) > bound:
            raise fail(f"{len(mem.slot)} values held, over the bound of {bound} slots")
        peak_slots = max(peak_slots, len(mem.slot))
        table.append(mem.row())
    final = {d(b, 0) for b in range(len(lengths))}
    if set(mem.slot) != final or tapes:
        left = sorted(map(str, set(mem.slot) ^ final)) + [f"tape[{b}]{i}" for b, i in sorted(tapes)]
        raise InvalidSchedule(len(schedule.ops), None, f"final memory must be exactly the δ_0; differs by {left}")
    width = max((len(r) for r in table), default=0)
    table = [r + (None,) * (width - len(r)) for r in table]
    return Simulation(makespan, peak_slots, peak_bytes, tuple(table))
