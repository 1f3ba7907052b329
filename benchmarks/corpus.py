"""The differential corpus: real models, each optimized by each method and one training step compared
with plain training (issue 23).

    python -m benchmarks.corpus                      # every model, every method; prints the table
    python -m benchmarks.corpus --models resnet18 lstm --methods approxdp-tc chen
    python -m benchmarks.corpus --write              # and update docs/models.md (after every model)
    python -m benchmarks.corpus --write --minutes 40 # start no model after 40 min; the table lists those left

A cell is ``bitwise`` where the loss, every gradient (the inputs' too, where an input requires grad),
every buffer and the generator's state after the step equal plain training's. Otherwise (the plan runs
other kernels, e.g. a decomposed LSTM) it gives the largest relative distance of our step from a
float64 step beside float32 eager's, and passes only if ours ≤ 2 × eager's. A method that will not
plan a model says why (``refused: ...``). Each model runs in a fresh process (``--jobs`` at a time, each one
thread), so memory is bounded by the largest model, not the sum.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import gc
import multiprocessing
import os
import platform
import resource
import signal
import sys
import textwrap
import time
import warnings
import itertools
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, ThreadPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import torch
import torch.nn as nn

import recompute
from recompute.doors.exactness import compare, float64_distance
from experiments.nets import DropoutNet

from .common import NON_NEGATIVE, POSITIVE_INT, markdown_table, write_doc

# --------------------------------------------------------------------------- the models

BATCH = 2
# A float32 model, its gradients, the reference gradients and a float64 copy with its gradients:
# 28 bytes a parameter. Models whose estimate exceeds this are listed as skipped, not run.
MEMORY_CAP = 4 * 2**30
BYTES_PER_PARAMETER = 4 + 4 + 4 + 8 + 8


@dataclass(frozen=True)
class Model:
    """One corpus entry: how to build it and its inputs (both seeded), the input it runs at.

    Attributes:
        name: the table's row name.
        family: ``torchvision``, ``smp`` or ``block`` (small models written here).
        build: the model, in train mode, seeded.
        inputs: the step's inputs, seeded (floating inputs require grad, so input gradients are compared).
        shape: the input as the table shows it, e.g. ``2×3×32²``.
        skip: why the model is not run (None: it is).
    """

    name: str
    family: str
    build: Callable[[], nn.Module]
    inputs: Callable[[], tuple[torch.Tensor, ...]]
    shape: str
    skip: str | None = None


def _seeded(make: Callable[[], Any], seed: int = 0) -> Any:
    torch.manual_seed(seed)
    return make()


def _image(size: int, channels: int = 3) -> Callable[[], tuple[torch.Tensor, ...]]:
    return lambda: (_seeded(lambda: torch.randn(BATCH, channels, size, size, requires_grad=True), 1),)


class TransformerBlock(nn.Module):
    """``nn.TransformerEncoderLayer`` with dropout, batch first, and a linear head."""

    def __init__(self, d_model: int = 32, heads: int = 4) -> None:
        super().__init__()
        self.block = nn.TransformerEncoderLayer(d_model, heads, dim_feedforward=64, dropout=0.1, batch_first=True)
        self.head = nn.Linear(d_model, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.block(x).mean(dim=1))


class TokenClassifier(nn.Module):
    """An ``nn.Embedding`` of integer tokens (the input takes no gradient, the embedding weight does)."""

    def __init__(self, vocabulary: int = 100, width: int = 32) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocabulary, width)
        self.body = nn.Sequential(nn.LayerNorm(width), nn.Linear(width, width), nn.GELU(), nn.Linear(width, 10))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.body(self.embed(tokens)).mean(dim=1)


class Recurrent(nn.Module):
    """A two-layer LSTM or GRU (no dropout between layers: the traced RNN would leave it out, so it is
    refused) and a linear head on the last step."""

    def __init__(self, cell: type[nn.RNNBase], features: int = 16, hidden: int = 32) -> None:
        super().__init__()
        self.rnn = cell(features, hidden, num_layers=2, batch_first=True)
        self.head = nn.Linear(hidden, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y, _ = self.rnn(x)
        return self.head(y[:, -1])


class StochasticDepthNet(nn.Module):
    """Residual conv-BN-ReLU blocks whose branches ``torchvision.ops.StochasticDepth`` drops per sample."""

    def __init__(self, blocks: int = 3, width: int = 8, p: float = 0.5) -> None:
        super().__init__()
        from torchvision.ops import StochasticDepth

        self.stem = nn.Conv2d(3, width, 3, padding=1)
        self.branches = nn.ModuleList(
            nn.Sequential(nn.Conv2d(width, width, 3, padding=1), nn.BatchNorm2d(width), nn.ReLU()) for _ in range(blocks)
        )
        self.drop = StochasticDepth(p, "row")
        self.head = nn.Linear(width, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.stem(x)
        for branch in self.branches:
            h = h + self.drop(branch(h))
        return self.head(h.mean(dim=(2, 3)))


def _blocks() -> list[Model]:
    seq = lambda *shape: lambda: (_seeded(lambda: torch.randn(*shape, requires_grad=True), 1),)  # noqa: E731
    return [
        Model("transformer_block", "block", lambda: _seeded(TransformerBlock), seq(BATCH, 8, 32), f"{BATCH}×8×32"),
        Model("embedding", "block", lambda: _seeded(TokenClassifier),
              lambda: (_seeded(lambda: torch.randint(0, 100, (BATCH, 12)), 1),), f"{BATCH}×12 tokens"),
        Model("lstm", "block", lambda: _seeded(lambda: Recurrent(nn.LSTM)), seq(BATCH, 10, 16), f"{BATCH}×10×16"),
        Model("gru", "block", lambda: _seeded(lambda: Recurrent(nn.GRU)), seq(BATCH, 10, 16), f"{BATCH}×10×16"),
        Model("dropout", "block", lambda: _seeded(DropoutNet), _image(16), f"{BATCH}×3×16²"),
        Model("stochastic_depth", "block", lambda: _seeded(StochasticDepthNet), _image(16), f"{BATCH}×3×16²"),
    ]


# The smallest input size each torchvision model accepts, where 32 px is too small (found by trying).
TORCHVISION_SIZE = {
    "alexnet": 64,  # its third max-pool needs ≥ 3×3
    "inception_v3": 299,  # the aux head's 5×5 conv needs 17×17 at Mixed_6e
    "maxvit_t": 224,  # every stage's input must divide into 7×7 partitions
}


def _torchvision_kwargs(name: str) -> dict[str, Any]:
    # ViT builds its position embedding for ``image_size``: set it to the input rather than run at 224
    return {"image_size": 32} if name.startswith("vit_") else {}


def _torchvision() -> list[Model]:
    import torchvision

    models = []
    names = torchvision.models.list_models(module=torchvision.models)
    # the parameter counts torchvision records for the architectures: no model is built to order or skip one
    params = {n: torchvision.models.get_model_weights(n).DEFAULT.meta["num_params"] for n in names}
    for name in sorted(names, key=params.__getitem__):  # smallest first: a cut-short run leaves out the largest
        size = TORCHVISION_SIZE.get(name, 32)
        kwargs = _torchvision_kwargs(name)
        build = lambda name=name, kwargs=kwargs: _seeded(  # noqa: E731
            lambda: torchvision.models.get_model(name, weights=None, **kwargs))
        skip = None
        if params[name] * BYTES_PER_PARAMETER > MEMORY_CAP:
            skip = (f"memory: {params[name] / 1e6:.0f} M parameters, ~{params[name] * BYTES_PER_PARAMETER / 2**30:.1f} GiB "
                    f"with gradients and the float64 step (cap {MEMORY_CAP / 2**30:.0f} GiB)")
        shape = f"{BATCH}×3×{size}²" + "".join(f", {k}={v}" for k, v in kwargs.items())
        models.append(Model(name, "torchvision", build, _image(size), shape, skip))
    return models


SMP_ENCODER = "resnet18"
SMP_SIZE = {"PAN": 128}  # its pyramid attention max-pools the 1/32 map three times: 32 and 64 px are too small
# DPT takes only timm ViT encoders; the smallest, at any input size (dynamic_img_size)
SMP_KWARGS = {"DPT": {"encoder_name": "tu-vit_tiny_patch16_224", "dynamic_img_size": True}}
SMP_ARCHITECTURES = ("Unet", "UnetPlusPlus", "MAnet", "Linknet", "FPN", "PSPNet", "PAN", "DeepLabV3",
                     "DeepLabV3Plus", "UPerNet", "Segformer", "DPT")


def _smp() -> list[Model]:
    models = []
    for arch in SMP_ARCHITECTURES:
        kwargs = {"encoder_name": SMP_ENCODER, **SMP_KWARGS.get(arch, {})}
        size = SMP_SIZE.get(arch, 32)

        def build(arch: str = arch, kwargs: dict[str, Any] = kwargs) -> nn.Module:
            import segmentation_models_pytorch as smp

            return _seeded(lambda: getattr(smp, arch)(encoder_weights=None, classes=2, **kwargs))

        models.append(Model(f"smp.{arch}({kwargs['encoder_name']})", "smp", build, _image(size), f"{BATCH}×3×{size}²"))
    return models


def _tokens(length: int = 16, vocabulary: int = 100) -> Callable[[], tuple[torch.Tensor, ...]]:
    return lambda: (_seeded(lambda: torch.randint(0, vocabulary, (BATCH, length)), 1),)


def _hf(config: str, model: str, **options: Any) -> Callable[[], nn.Module]:
    """A transformers model built from its config (no download) at a small size, dropout as configured."""

    def build() -> nn.Module:
        import transformers

        return _seeded(lambda: getattr(transformers, model)(getattr(transformers, config)(**options)))

    return build


class Seq2Seq(nn.Module):
    """An encoder-decoder taking the source and the target as positional inputs (``labels=``: the
    decoder reads the target shifted right and the model returns its loss beside the logits)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, source: torch.Tensor, target: torch.Tensor) -> Any:
        return self.model(source, labels=target)


_SMALL_TRANSFORMER = dict(vocab_size=100, bos_token_id=0, eos_token_id=0, pad_token_id=0)
_DECODER = dict(_SMALL_TRANSFORMER, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2)


def _huggingface() -> list[Model]:
    """Hugging Face transformers models from configs (no weights downloaded), a few layers of 64."""
    t5 = _hf("T5Config", "T5ForConditionalGeneration", **_SMALL_TRANSFORMER, d_model=64, d_ff=128, d_kv=16,
             num_layers=2, num_heads=4, decoder_start_token_id=0)
    pair = lambda: (*_tokens()(), _seeded(lambda: torch.randint(0, 100, (BATCH, 12)), 2))  # noqa: E731
    return [
        Model("hf.gpt2", "huggingface", _hf("GPT2Config", "GPT2LMHeadModel", **_SMALL_TRANSFORMER, n_layer=2,
                                            n_embd=64, n_head=4, n_positions=64), _tokens(), f"{BATCH}×16 tokens"),
        Model("hf.llama (GQA, RoPE)", "huggingface", _hf("LlamaConfig", "LlamaForCausalLM", **_DECODER),
              _tokens(), f"{BATCH}×16 tokens"),
        Model("hf.qwen2", "huggingface", _hf("Qwen2Config", "Qwen2ForCausalLM", **_DECODER), _tokens(), f"{BATCH}×16 tokens"),
        Model("hf.bert (masked LM)", "huggingface",
              _hf("BertConfig", "BertForMaskedLM", vocab_size=100, hidden_size=64, intermediate_size=128,
                  num_hidden_layers=2, num_attention_heads=4), _tokens(), f"{BATCH}×16 tokens"),
        Model("hf.t5 (encoder-decoder)", "huggingface", lambda: Seq2Seq(t5()), pair, f"{BATCH}×16 → {BATCH}×12 tokens"),
        Model("hf.vit", "huggingface", _hf("ViTConfig", "ViTForImageClassification", image_size=32, patch_size=8,
                                           hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                           num_attention_heads=4, hidden_dropout_prob=0.1), _image(32), f"{BATCH}×3×32²"),
    ]


# timm architectures at their smallest, dropout and stochastic depth on; the input each accepts
TIMM = {"vit_tiny_patch16_224": 32, "convnext_atto": 32, "swin_tiny_patch4_window7_224": 56, "efficientnet_b0": 32,
        "regnetx_002": 32, "resnet18d": 32}
TIMM_KWARGS = {"vit_tiny_patch16_224": {"img_size": 32}, "swin_tiny_patch4_window7_224": {"img_size": 56, "depths": (1, 1, 1, 1)}}


def _timm() -> list[Model]:
    def build(name: str) -> nn.Module:
        import timm

        return _seeded(lambda: timm.create_model(name, pretrained=False, drop_rate=0.1, drop_path_rate=0.1,
                                                 **TIMM_KWARGS.get(name, {})))

    return [Model(f"timm.{name}", "timm", lambda name=name: build(name), _image(size), f"{BATCH}×3×{size}²")
            for name, size in TIMM.items()]


def corpus() -> list[Model]:
    """Every model of the corpus, skipped ones included (with their reason)."""
    return [*_blocks(), *_huggingface(), *_timm(), *_smp(), *_torchvision()]


def model(name: str) -> Model:
    """The corpus entry ``name``; ValueError naming the entries otherwise."""
    entries = {m.name: m for m in corpus()}
    if name not in entries:
        raise ValueError(f"no corpus model {name!r}; choose among {', '.join(entries)}")
    return entries[name]


# --------------------------------------------------------------------------- the methods


@dataclass(frozen=True)
class Method:
    """A method of ``recompute.optimize`` as the corpus calls it."""

    method: str
    strategy: str | None = None
    options: tuple[tuple[str, Any], ...] = ()

    @property
    def label(self) -> str:
        return f"{self.method}-{self.strategy}" if self.strategy else self.method


# exactdp enumerates every lower set: past this many it refuses (TooManyLowerSets) rather than run for hours
EXACT_LOWER_SETS = 20_000
METHODS = (
    Method("approxdp", "tc"),
    Method("approxdp", "mc"),
    Method("chen"),
    Method("exactdp", "tc", (("max_lower_sets", EXACT_LOWER_SETS),)),
    Method("revolve"),
    Method("reforward"),
)


def method(label: str) -> Method:
    """The corpus method labelled ``label`` (``approxdp-tc``); ValueError naming the labels otherwise."""
    labels = {m.label: m for m in METHODS}
    if label not in labels:
        raise ValueError(f"no corpus method {label!r}; choose among {', '.join(labels)}")
    return labels[label]


# --------------------------------------------------------------------------- one step against plain training


class Kind(str, Enum):
    """What a cell found."""

    BITWISE = "bitwise"  # loss, gradients, buffers and the generator's state equal plain training's
    WITHIN = "within"  # not bitwise; no farther from the float64 step than twice float32 eager
    WORSE = "worse"  # not bitwise and farther than that
    REFUSED = "refused"  # optimize raised: the method will not plan this model
    ERROR = "error"  # the optimized step raised, ran no plan, left the generator elsewhere or timed out


@dataclass(frozen=True)
class Outcome:
    """How one method's step compares with plain training.

    Attributes:
        ours, eager: for ``WITHIN``/``WORSE``, the largest relative distance of our step and of
            float32 eager's from a float64 step.
        reason: for ``REFUSED``/``ERROR``, the first line of what was raised or found.
    """

    kind: Kind
    ours: float | None = None
    eager: float | None = None
    reason: str = ""

    @property
    def ok(self) -> bool:
        return self.kind in (Kind.BITWISE, Kind.WITHIN, Kind.REFUSED)

    @property
    def measured(self) -> bool:
        return self.kind in (Kind.BITWISE, Kind.WITHIN, Kind.WORSE)

    def cell(self) -> str:
        if self.kind is Kind.BITWISE:
            return "bitwise"
        if self.kind in (Kind.WITHIN, Kind.WORSE):
            return f"{self.ours:.1e} (eager {self.eager:.1e})" + ("" if self.ok else " **WORSE**")
        return f"{self.kind.value}: {self.reason}"


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    # at a word, marked: a reason cut mid-word read as a different one
    return textwrap.shorten(f"{type(e).__name__}: {text[0] if text else ''}", 200, placeholder=" …").replace("|", "/")


class _Timeout(BaseException):
    """Raised by the CPU-time alarm; a BaseException, so that no ``except Exception`` on the way
    (ours or the library's) takes it for a model's failure."""


def _alarm(signum: int, frame: Any) -> None:
    raise _Timeout()


def _step(net: nn.Module, inputs: tuple[torch.Tensor, ...], m: Method) -> Outcome:
    try:
        wrapped = recompute.optimize(net, inputs, method=m.method, strategy=m.strategy, **dict(m.options))
    except Exception as e:  # noqa: BLE001 — a refusal is a result of the corpus, recorded with its reason
        return Outcome(Kind.REFUSED, reason=_first_line(e))
    try:
        wrapped.last = None
        result = compare(net, wrapped, inputs)
        if wrapped.last is None:
            return Outcome(Kind.ERROR, reason="the step did not run a plan")
        if "rng" in result.unequal:
            return Outcome(Kind.ERROR, reason="the generator's state after the step differs from plain training's")
        if result.bitwise:
            return Outcome(Kind.BITWISE)
        ours, eager = float64_distance(net, wrapped, inputs)
    except Exception as e:  # noqa: BLE001 — the optimized step failing is the finding to record
        return Outcome(Kind.ERROR, reason=_first_line(e))
    return Outcome(Kind.WITHIN if ours <= 2 * eager else Kind.WORSE, ours, eager)


def check(entry: Model, m: Method, net: nn.Module | None = None, inputs: tuple[torch.Tensor, ...] | None = None,
          *, timeout: int = 0) -> Outcome:
    """Optimize ``entry``'s model with ``m``, run one step and compare it with plain training's
    (``net``/``inputs``: already built ones, reused across methods). ``timeout`` seconds of CPU time
    (0: none) bound the whole cell: CPU time, so that a machine busy with other work cuts no cell
    short; on the main thread only (SIGVTALRM)."""
    net = net if net is not None else entry.build()
    inputs = inputs if inputs is not None else entry.inputs()
    if not timeout:
        return _step(net, inputs, m)
    signal.signal(signal.SIGVTALRM, _alarm)
    signal.setitimer(signal.ITIMER_VIRTUAL, timeout)
    try:
        return _step(net, inputs, m)
    except _Timeout:
        return Outcome(Kind.ERROR, reason=f"timeout: the cell took more than {timeout} s of CPU time")
    finally:
        signal.setitimer(signal.ITIMER_VIRTUAL, 0)


# --------------------------------------------------------------------------- the whole corpus


@dataclass
class Row:
    """One model's results: an outcome per method, its wall time and the peak RSS of its process."""

    model: Model
    outcomes: dict[str, Outcome] = field(default_factory=dict)
    seconds: float = 0.0
    peak_rss: int = 0
    died: str | None = None


def run_model(name: str, labels: Sequence[str], timeout: int) -> tuple[dict[str, Outcome], float, int]:
    """Every method on one model (in the calling process): outcomes, seconds, peak RSS in bytes."""
    torch.set_num_threads(1)
    warnings.simplefilter("ignore")
    start = time.perf_counter()
    entry = model(name)
    net, inputs = entry.build(), entry.inputs()
    outcomes = {}
    for label in labels:
        began = time.perf_counter()
        outcomes[label] = check(entry, method(label), net, inputs, timeout=timeout)
        print(f"    {label}: {outcomes[label].cell()} ({time.perf_counter() - began:.0f} s)", flush=True)
        gc.collect()
    return outcomes, time.perf_counter() - start, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _warm_up() -> None:
    """Import what the children use, so that each forked process inherits the imports (some 8 s)
    instead of paying them again. Nothing runs autograd here: a process that has run a backward pass
    cannot fork one that runs another."""
    import segmentation_models_pytorch  # noqa: F401
    import torchvision  # noqa: F401

    recompute.methods()  # imports the planners and baselines


def _row(i: int, count: int, entry: Model, labels: Sequence[str], timeout: int) -> Row:
    """One model's row, from a fresh process forked from this one: its memory is returned when it
    ends, and a model that kills its process costs only its own row."""
    row = Row(entry)
    if entry.skip is None:
        print(f"[{i}/{count}] {entry.name} {entry.shape}", flush=True)
        with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("fork")) as pool:
            try:
                row.outcomes, row.seconds, row.peak_rss = pool.submit(run_model, entry.name, labels, timeout).result()
            except BrokenProcessPool:
                row.died = "its process died (out of memory?)"
    print(f"[{i}/{count}] {entry.name}: {entry.skip or row.died or 'done'} ({row.seconds:.0f} s, "
          f"peak RSS {row.peak_rss / 2**30:.2f} GiB)", flush=True)
    return row


def run(models: Sequence[Model], labels: Sequence[str], timeout: int, minutes: float = 0,
        jobs: int = 1) -> Iterator[Row]:
    """Each model in a process of its own, ``jobs`` at a time, rows yielded as they finish. After
    ``minutes`` (0: never) no further model starts."""
    _warm_up()
    start = time.perf_counter()
    with ThreadPoolExecutor(jobs) as threads:  # each thread waits on one model's process

        def submit(i: int, entry: Model) -> Future[Row] | None:
            if minutes and time.perf_counter() - start > 60 * minutes:
                return None
            return threads.submit(_row, i, len(models), entry, labels, timeout)

        queue = iter(enumerate(models, 1))
        pending = {f for f in (submit(i, e) for i, e in itertools.islice(queue, jobs)) if f}
        while pending:
            done, pending = wait(pending, return_when=FIRST_COMPLETED)
            for future in done:
                yield future.result()
                following = next(queue, None)
                if following and (f := submit(*following)):
                    pending.add(f)


def table(rows: Sequence[Row], labels: Sequence[str]) -> str:
    """The models × methods table; the reasons of refusals, errors and skips as numbered notes below it
    (one reason is often shared by many cells)."""
    notes: dict[str, int] = {}

    def note(kind: str, reason: str) -> str:
        return f"{kind} [{notes.setdefault(reason, len(notes) + 1)}]"

    body = []
    for r in rows:
        if r.model.skip or r.died:
            cells = [note("skipped", r.model.skip) if r.model.skip else note("error", r.died)] + [""] * (len(labels) - 1)
        else:
            cells = [o.cell() if o.measured else note(o.kind.value, o.reason)
                     for o in (r.outcomes[label] for label in labels)]
        rss = f"{r.peak_rss / 2**30:.2f}" if r.peak_rss else "–"
        body.append([r.model.name, r.model.shape, *cells, f"{r.seconds:.0f}", rss])
    listed = "\n".join(f"{i}. {reason}" for reason, i in notes.items())
    return markdown_table(["model", "input", *labels, "s", "peak RSS GiB"], body) + ("\n\n" + listed if notes else "")


def _cpu() -> str:
    """The CPU's model name (Linux), else the architecture."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return platform.machine()
    return next((ln.split(":", 1)[1].strip() for ln in lines if ln.startswith("model name")), platform.machine())


def _header(argv: Sequence[str], labels: Sequence[str], timeout: int) -> str:
    from experiments.runner import git_commit

    date = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    return (
        f"`python -m benchmarks.corpus {' '.join(argv)}` at commit {git_commit()}, {date}, on "
        f"{platform.node()} ({_cpu()}, {os.cpu_count()} cores, torch {torch.__version__}, one thread a model). "
        f"Each model in train mode, batch {BATCH}, one step of each method with `optimize`'s defaults (the "
        f"DPs at their smallest feasible budget) from the same generator state as plain float32 training. **bitwise**: the loss, every gradient "
        f"(floating inputs require grad, so theirs too), every buffer and the generator's state after the "
        f"step equal plain training's. Otherwise: the largest relative distance of our step from a float64 "
        f"step, with float32 eager's beside it; it passes when ours ≤ 2 × eager's (**WORSE** otherwise). "
        f"**refused**: `recompute.optimize` raised (the reason is its message). exactdp refuses past "
        f"{EXACT_LOWER_SETS} lower sets; a cell is cut after {timeout} s of CPU time. Methods: {', '.join(labels)}."
    )


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", help="corpus model names (default: all)")
    parser.add_argument("--methods", nargs="+", default=[m.label for m in METHODS], choices=[m.label for m in METHODS])
    parser.add_argument("--timeout", type=POSITIVE_INT, default=300, help="seconds of CPU time a model × method cell may take")
    parser.add_argument("--minutes", type=NON_NEGATIVE, default=0,
                        help="start no model after this many minutes (0: run them all); the table lists those left")
    parser.add_argument("--write", action="store_true", help="update docs/models.md (after every model)")
    parser.add_argument("--jobs", type=POSITIVE_INT, default=1, help="models run at once (each in its own one-thread process)")
    args = parser.parse_args(argv)
    if args.jobs < 1:
        parser.error(f"--jobs must be at least 1, got {args.jobs}")
    if args.timeout <= 0:
        parser.error(f"--timeout must be a positive number of seconds, got {args.timeout}")
    if not args.minutes >= 0:
        parser.error(f"--minutes must be 0 (no limit) or a positive number, got {args.minutes}")
    try:
        models = [model(n) for n in args.models] if args.models else corpus()
    except ValueError as e:
        parser.error(f"--models: {e}")
    header = _header(argv, args.methods, args.timeout)
    rows: list[Row] = []

    def text() -> str:
        ran = {r.model.name for r in rows}
        left = [m.name for m in models if m.name not in ran]
        tail = f"\n\nNot run (the run's {args.minutes:g} minutes were over): {', '.join(left)}." if left else ""
        return header + "\n\n" + table(rows, args.methods) + tail

    order = {m.name: i for i, m in enumerate(models)}
    for row in run(models, args.methods, args.timeout, args.minutes, args.jobs):
        rows.append(row)
        rows.sort(key=lambda r: order[r.model.name])
        if args.write:  # after every model: a run cut short still leaves its table
            write_doc("corpus-table", text())
    print(text())
    bad = [(r.model.name, k) for r in rows for k, o in r.outcomes.items() if not o.ok] + [
        (r.model.name, "process") for r in rows if r.died]
    if bad:
        print(f"{len(bad)} cells fail: {bad}", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
