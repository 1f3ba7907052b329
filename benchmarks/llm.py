"""Language models at the sizes people train them: peak memory of a training step, and the longest
sequence that fits a memory budget, under PyTorch's methods and ours (``fake`` backend).

    python -m benchmarks.llm            # print the tables
    python -m benchmarks.llm --write    # and docs/models.md, paper_figures/llm_sequence.{json,png}

A killed run resumes: every step priced is kept in ``paper_figures/llm_peaks.json`` (for its commit).

Two Hugging Face models built from configs (random weights, nothing downloaded): GPT-2 (124 M
parameters) at batch 8 and 1024 tokens, and a Llama-style model of 1.1 B parameters (22 layers,
hidden 2048, grouped-query attention with 32 heads over 4 key-value heads, like TinyLlama) at batch 4
and 2048 tokens. Each step's peak is the ``fake`` backend's (every tensor storage of the real step, no
arithmetic), the parameters and AdamW's two float32 moments (8 bytes a parameter, held alike by every
method) added. The step is the one LLM training runs, ``model(ids, labels=ids).loss.backward()``: the
next-token loss inside the model (:class:`_NextTokenLoss`), the logits not handed to a loss outside
(whose gradient, batch × length × vocabulary, a planned step would hold through its whole backward).
Methods:

* eager, as plain training;
* ``gradient_checkpointing_enable()``: Hugging Face's own checkpointing of every layer (non-reentrant);
* selective activation checkpointing per layer, the compute-intensive ops saved (``torch_sac``);
* ``torch.compile``'s min-cut partition at ``activation_memory_budget`` 0.5 — its modules priced op by op,
  unfused (:func:`benchmarks.partitions.price`), where inductor would fuse pointwise ops: a modelled
  number, so labelled;
* ours with the default goal: ``recompute.optimize(model, cost_model="flops")``, the least peak within
  1.3× plain training's time, that time counted in FLOPs. The default's ``measured`` cost model times
  every op on real tensors at the traced shapes, which at the lengths searched here (tens of thousands
  of tokens) this 24 GB host cannot hold;
* ours with ``max_time=4/3``: the time of one more forward, what checkpointing every layer costs.

Each method's time at the model's size, × plain training's: ours as its plan models it (T_v in FLOPs,
a backward twice its forward); PyTorch's counted, the FLOPs of the matrix products, attention and
convolutions of its real step (:class:`_MatmulFlops`; ``torch.compile``: of its two partitions).

Then, for each method, the longest sequence (a multiple of 128) whose step fits each of
:data:`BUDGETS`, found by interpolating between the lengths priced (:func:`_longest`).
"""

from __future__ import annotations

import argparse
import copy
import functools
import json
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Callable, Sequence

import torch
import torch.fx as fx
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import flop_registry

import recompute
from benchmarks import partitions

from .common import REPO, head_commit, made_by, markdown_table, write_atomic, write_doc

GIB = 2**30
ADAM = 8  # bytes a parameter of AdamW's two float32 moments
BUDGETS = (24 * GIB, 80 * GIB)
STEP = 128  # sequence lengths searched in multiples of this
FIGURES = REPO / "paper_figures"
PEAKS = FIGURES / "llm_peaks.json"  # every (model, method, length) priced, for a run that resumes


@dataclass(frozen=True)
class LanguageModel:
    """A model at the size it is compared at."""

    name: str
    batch: int
    length: int
    build: Callable[[int], torch.nn.Module]  # the model for sequences up to the given length


def _gpt2(length: int) -> torch.nn.Module:
    import transformers

    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_positions=max(length, 1024), use_cache=False))
    # the loss Hugging Face falls back to, named, so that no warning (a graph break) is logged under torch.compile
    model.loss_type = "ForCausalLM"
    return model


@functools.cache
def _llama_at_any_length() -> torch.nn.Module:
    import transformers

    return transformers.LlamaForCausalLM(transformers.LlamaConfig(
        hidden_size=2048, intermediate_size=5632, num_hidden_layers=22, num_attention_heads=32, num_key_value_heads=4,
        vocab_size=32000, max_position_embeddings=2**17, use_cache=False))


def _llama(length: int) -> torch.nn.Module:
    """Built once (its rotary positions have no parameters: the same model at every length); a method
    that changes the model (``torch.compile``'s capture moves it to the meta device) gets a copy."""
    return copy.deepcopy(_llama_at_any_length())


MODELS = (LanguageModel("GPT-2 124M", 8, 1024, _gpt2), LanguageModel("Llama 1.1B (GQA 32/4)", 4, 2048, _llama))


class _NextTokenLoss(torch.nn.Module):
    """A causal language model's training loss as its users compute it: ``model(ids, labels=ids).loss``."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.model(ids, labels=ids).loss


def _itself(loss: torch.Tensor) -> torch.Tensor:
    return loss


def _measured(model: torch.nn.Module, ids: torch.Tensor, runner: Callable[..., Any] | None = None) -> int:
    """The ``fake`` peak of a training step of ``model`` (wrapped in :class:`_NextTokenLoss`), run by
    ``runner`` (a module wrapping ``model``, or an executor of the wrapped model)."""
    return recompute.measure(model, (ids,), runner=runner, backend="fake", loss_fn=_itself).peak_bytes


def _ids(model: torch.nn.Module, batch: int, length: int) -> torch.Tensor:
    with FakeTensorMode():
        return torch.empty(batch, length, dtype=torch.long)


@dataclass(frozen=True)
class Step:
    """A training step priced: its peak (bytes, ``fake`` backend, parameters not counted) and, where the
    method models it, its time (× plain training's step, in the FLOPs the plan was chosen by)."""

    peak: int
    time: float | None = None


Method = Callable[[torch.nn.Module, torch.Tensor], Step]


def _eager(model: torch.nn.Module, ids: torch.Tensor) -> Step:
    return Step(_measured(_NextTokenLoss(model), ids), 1.0)


def _with_hf_checkpointing(model: torch.nn.Module) -> torch.nn.Module:
    model.gradient_checkpointing_enable()
    return model


def _with_sac(model: torch.nn.Module) -> torch.nn.Module:
    return recompute.optimize(model, method="torch_sac")


def _hf_checkpointing(model: torch.nn.Module, ids: torch.Tensor) -> Step:
    _with_hf_checkpointing(model)
    try:
        return Step(_measured(_NextTokenLoss(model), ids))
    finally:
        model.gradient_checkpointing_disable()


def _sac(model: torch.nn.Module, ids: torch.Tensor) -> Step:
    return Step(_measured(_NextTokenLoss(model), ids, runner=_NextTokenLoss(_with_sac(model))))


def _partitions(model: torch.nn.Module, ids: torch.Tensor, budget: float) -> tuple[partitions.JointCapture, fx.GraphModule, fx.GraphModule]:
    meta = torch.empty(ids.shape, dtype=ids.dtype, device="meta")
    c = partitions.capture(_NextTokenLoss(model.to("meta")), [meta], loss_fn=_itself)
    return c, *partitions.torch_partition(c, budget)


def _compiled(model: torch.nn.Module, ids: torch.Tensor) -> Step:
    c, fw, bw = _partitions(model, ids, 0.5)
    return Step(partitions.price(c, fw, bw, _NoTime()).peak - c.param_bytes)


class _NoTime:
    """A time model that prices nothing: the compiled partition's peak is what is compared here."""

    def seconds(self, calls: Sequence[Any]) -> float:
        return 0.0


def _ours(model: torch.nn.Module, ids: torch.Tensor, **goal: float) -> Step:
    trained = _NextTokenLoss(model)
    m = recompute.optimize(trained, cost_model="flops", **goal)
    return Step(_measured(trained, ids, runner=m), m.plan.time_ratio)


class _MatmulFlops(TorchDispatchMode):
    """The FLOPs of the ops dispatched under it that ``torch.utils.flop_counter`` has a formula for
    (matrix products, attention, convolutions): the work recomputation adds, pointwise ops left out."""

    def __init__(self) -> None:
        super().__init__()
        self.total = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        out = func(*args, **(kwargs or {}))
        formula = flop_registry.get(func._overloadpacket)
        if formula is not None:
            self.total += formula(*args, **(kwargs or {}), out_val=out)
        return out


def _step_flops(model: torch.nn.Module, batch: int, length: int) -> int:
    """:class:`_MatmulFlops` of a training step of ``model`` (``model(ids, labels=ids).loss.backward()``),
    on fake tensors."""
    with FakeTensorMode(allow_non_fake_inputs=True) as mode, _MatmulFlops() as count:
        ids = mode.from_tensor(torch.zeros(batch, length, dtype=torch.long))
        _NextTokenLoss(model)(ids).backward()
    return count.total


def _graph_flops(*gms: fx.GraphModule) -> int:
    """:class:`_MatmulFlops` of what ``gms`` run, from their nodes' traced values."""
    total = 0
    for gm in gms:
        for n in gm.graph.nodes:
            formula = flop_registry.get(getattr(n.target, "_overloadpacket", None))
            if n.op == "call_function" and formula is not None:
                val = lambda a: a.meta["val"]  # noqa: E731
                total += formula(*fx.node.map_arg(n.args, val), **fx.node.map_arg(n.kwargs, val), out_val=n.meta["val"])
    return total


@functools.cache
def _plain_flops(lm: LanguageModel) -> int:
    """:func:`_step_flops` of plain training at ``lm``'s size, counted once for every method it divides."""
    return _step_flops(lm.build(lm.length).train(), lm.batch, lm.length)


def _counted_time(lm: LanguageModel, label: str) -> float | None:
    """The step time of PyTorch's method ``label`` at ``lm``'s size, × plain training's, in
    :class:`_MatmulFlops`: counted in its real step (the ``torch.compile`` point: in its two partitions
    against the partitions that save everything)."""
    if label in _RUNS:
        return _step_flops(_RUNS[label](lm.build(lm.length).train()), lm.batch, lm.length) / _plain_flops(lm)
    if label == COMPILED:
        ids = torch.empty(lm.batch, lm.length, dtype=torch.long, device="meta")
        return _graph_flops(*_partitions(lm.build(lm.length), ids, 0.5)[1:]) / \
            _graph_flops(*_partitions(lm.build(lm.length), ids, 1.0)[1:])
    return None


COMPILED = "torch.compile budget 0.5 [unfused op-by-op model]"
_RUNS = {"Hugging Face gradient checkpointing": _with_hf_checkpointing, "SAC per layer": _with_sac}

METHODS: dict[str, Method] = {
    "eager": _eager,
    "Hugging Face gradient checkpointing": _hf_checkpointing,
    "SAC per layer": _sac,
    COMPILED: _compiled,
    "ours (default goal, time in FLOPs)": _ours,
    "ours, max_time=4/3 (one more forward, as HF's)": functools.partial(_ours, max_time=4 / 3),
}


@dataclass
class Row:
    """One method on one model: the step's peak at the model's size, and the longest sequence per budget."""

    model: str
    method: str
    batch: int
    length: int
    peak_with_params: int | None
    time: float | None  # modelled, × plain training's step (None: not modelled)
    longest: dict[str, int | None]
    seconds: float
    commit: str = ""


class Peaks:
    """Every step priced so far, kept in :data:`PEAKS` (written atomically after each one) so that a killed
    run resumes where it stopped; a file of another commit is started afresh (its code priced it)."""

    def __init__(self, path: Path, commit: str, *, stored_only: bool = False):
        self.path, self.commit, self.stored_only = path, commit, stored_only
        stored = json.loads(path.read_text()) if path.exists() else {}
        self.steps: dict[str, Step] = ({k: Step(*v) for k, v in stored.get("steps", {}).items()}
                                       if stored.get("commit") == commit else {})

    def get(self, key: str, price: Callable[[], Step]) -> Step:
        if key not in self.steps:
            if self.stored_only:
                raise SystemExit(f"{self.path} holds no step {key!r} priced at {self.commit}: run without --priced-at")
            self.steps[key] = price()
            text = json.dumps({"commit": self.commit, "steps": {k: [s.peak, s.time] for k, s in self.steps.items()}}, indent=1)
            write_atomic(self.path, lambda tmp: Path(tmp).write_text(text))
        return self.steps[key]


def run_model(lm: LanguageModel, methods: Sequence[str], budgets: Sequence[int], commit: str,
              peaks: Peaks | None = None) -> list[Row]:
    """Each method's peak at the model's size and its longest sequence per budget; ``peaks`` keeps
    (and resumes from) every step priced."""
    rows = []
    for label in methods:
        start = time.perf_counter()

        def price(length: int) -> Step:
            model = lm.build(length).train()
            params = sum(p.numel() for p in model.parameters())
            step = METHODS[label](model, _ids(model, lm.batch, length))
            step = replace(step, peak=step.peak + params * 4 + ADAM * params)
            print(f"{lm.name} {label} at {length} tokens: {step.peak / GIB:.2f} GiB", flush=True)
            return step

        priced: dict[int, Step] = {}

        def at(length: int) -> Step:
            if length not in priced:
                key = f"{lm.name} | {label} | {length}"
                priced[length] = price(length) if peaks is None else peaks.get(key, lambda: price(length))
            return priced[length]

        here = at(lm.length)
        if here.time is None:
            here = replace(here, time=_counted_time(lm, label))
        longest = {f"{b / GIB:g} GiB": _longest(lambda n: at(n).peak, b, known=sorted(priced)) for b in budgets}
        rows.append(Row(lm.name, label, lm.batch, lm.length, here.peak, here.time, longest,
                        time.perf_counter() - start, commit))
    return rows


def _longest(peak: Callable[[int], int], budget: int, cap: int = 2**17, known: Sequence[int] = ()) -> int | None:
    """The longest multiple of :data:`STEP` up to ``cap`` whose ``peak`` (rising with the length) fits
    ``budget``, from the lengths ``known`` (priced already) on. A length priced may cost minutes
    (``recompute.optimize`` plans each one), so the next is where the line through the two nearest
    priced lengths meets the budget (a peak grows about linearly with the length), kept a
    :data:`STEP` inside the bracket, and every other probe in a bracket its midpoint: bisection's
    bound on the probes, a few in practice."""
    if peak(STEP) > budget:
        return None
    lo, hi = STEP, None  # the longest length known to fit, the shortest known not to
    for n in known:
        if n % STEP == 0 and STEP < n <= cap:
            lo, hi = (max(lo, n), hi) if peak(n) <= budget else (lo, n if hi is None else min(hi, n))
    below = max((n for n in (STEP, *known) if n < lo and n % STEP == 0), default=STEP)
    interpolate = True
    while hi is None or hi - lo > STEP:
        if hi is None:  # beyond the longest that fits: the line through the two longest that fit, 20% over
            if lo == cap:
                return cap
            slope = (peak(lo) - peak(below)) / (lo - below) if lo > below else 0
            guess = lo + (budget - peak(lo)) / slope * 1.2 if slope > 0 else 2 * lo
            n = min(cap, max(lo + STEP, min(4 * lo, _multiple(guess))))
        elif interpolate:
            guess = lo + (budget - peak(lo)) * (hi - lo) / max(peak(hi) - peak(lo), 1)
            n = min(hi - STEP, max(lo + STEP, _multiple(guess)))
        else:
            n = (lo + hi) // 2 // STEP * STEP
        interpolate = hi is None or not interpolate
        if peak(n) <= budget:
            below, lo = lo, n
        else:
            hi = n
    return lo


def _multiple(length: float) -> int:
    return int(length) // STEP * STEP


def table(rows: Sequence[Row]) -> str:
    budgets = list(rows[0].longest)
    return markdown_table(
        ["model", "method", "peak at batch × length (GiB, with parameters and AdamW)",
         "modelled time (× plain, FLOPs)", *(f"longest sequence in {b}" for b in budgets)],
        [[r.model, r.method, f"{r.peak_with_params / GIB:.2f} at {r.batch} × {r.length}",
          "–" if r.time is None else f"{r.time:.2f}",
          *(f"{r.longest[b]:,}" if r.longest[b] else "none" for b in budgets)] for r in rows])


def figure(rows: Sequence[Row], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = list(dict.fromkeys(r.model for r in rows))
    budgets = list(rows[0].longest)
    fig, axes = plt.subplots(1, len(models), figsize=(6 * len(models), 4), squeeze=False)
    for ax, model in zip(axes[0], models):
        ours = [r for r in rows if r.model == model]
        width = 0.8 / len(budgets)
        for j, b in enumerate(budgets):
            ax.barh([i + j * width for i in range(len(ours))], [r.longest[b] or 0 for r in ours], height=width, label=b)
        ax.set_yticks([i + width * (len(budgets) - 1) / 2 for i in range(len(ours))], [r.method for r in ours], fontsize=7)
        ax.set_xlabel("longest sequence that fits (tokens)")
        ax.set_title(f"{model}, batch {ours[0].batch}")
        ax.legend(fontsize=7)
    fig.tight_layout()
    write_atomic(path, lambda tmp: fig.savefig(tmp, dpi=120, format="png"))
    plt.close(fig)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=[m.name for m in MODELS], choices=[m.name for m in MODELS])
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS))
    parser.add_argument("--write", action="store_true", help="update docs/models.md and paper_figures/llm_sequence.*")
    parser.add_argument("--priced-at", metavar="COMMIT",
                        help="the steps priced at COMMIT (kept in paper_figures/llm_peaks.json), none priced anew: "
                             "a table of runs made in separate clones, named as theirs")
    args = parser.parse_args(argv)
    commit = head_commit()
    peaks = Peaks(PEAKS, args.priced_at or commit, stored_only=bool(args.priced_at))
    rows = [r for lm in MODELS if lm.name in args.models
            for r in run_model(lm, args.methods, BUDGETS, peaks.commit, peaks)]
    text = table(rows)
    print(text)
    if args.write:
        write_atomic(FIGURES / "llm_sequence.json",
                     lambda tmp: Path(tmp).write_text(json.dumps([asdict(r) for r in rows], indent=1)))
        figure(rows, FIGURES / "llm_sequence.png")
        how = "fake backend; peaks with parameters and AdamW moments"
        if args.priced_at:
            how += f"; the steps priced at {args.priced_at[:7]}, PyTorch's FLOPs counted here"
        write_doc("llm", f"{made_by(commit, how, argv=argv)}\n\n{text}\n\n![longest sequence](../paper_figures/llm_sequence.png)")


if __name__ == "__main__":
    main()
