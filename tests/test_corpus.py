"""The CI subset of the differential corpus (``benchmarks/corpus.py``): a few small real models, each
optimized and one training step compared with plain training's (not with a stored result)."""

from __future__ import annotations

import pytest
import torch
import torchvision

from benchmarks import corpus
import recompute
from recompute.doors.exactness import compare, float64_distance

# The ops of our step are eager's, so everything must be bitwise equal; the traced LSTM runs decomposed
# kernels where eager runs a fused one, so it is held to the float64 yardstick instead.
SUBSET = ["resnet18", "smp.Unet(resnet18)", "transformer_block", "embedding", "lstm", "gru", "dropout",
          "stochastic_depth"]
NOT_BITWISE = {"lstm"}


# today's models from the libraries people train with (transformers, timm), from configs, dropout on
LIBRARIES = [m.name for m in corpus.corpus() if m.family in ("huggingface", "timm")]


@pytest.mark.parametrize("name", LIBRARIES)
def test_a_library_models_step_is_plain_trainings(name):
    assert corpus.check(corpus.model(name), corpus.method("approxdp-mc")).kind is corpus.Kind.BITWISE


@pytest.mark.slow
@pytest.mark.parametrize("label", [m.label for m in corpus.METHODS])
@pytest.mark.parametrize("name", LIBRARIES)
def test_every_method_trains_a_library_model_like_plain_training(name, label):
    outcome = corpus.check(corpus.model(name), corpus.method(label))
    assert outcome.ok, outcome


@pytest.mark.parametrize("label", ["approxdp-tc", "chen"])
@pytest.mark.parametrize("name", SUBSET)
def test_a_step_of_an_optimized_model_is_plain_trainings(name, label):
    outcome = corpus.check(corpus.model(name), corpus.method(label))
    if name in NOT_BITWISE:
        assert outcome.kind is corpus.Kind.WITHIN, outcome
        assert outcome.ours <= 2 * outcome.eager
    else:
        assert outcome.kind is corpus.Kind.BITWISE, outcome


def test_every_torchvision_classification_model_is_in_the_corpus_or_skipped_with_a_reason():
    entries = {m.name: m for m in corpus.corpus() if m.family == "torchvision"}
    assert set(entries) == set(torchvision.models.list_models(module=torchvision.models))
    skipped = {n for n, m in entries.items() if m.skip}
    assert all(entries[n].skip.startswith("memory:") for n in skipped)
    assert "resnet18" not in skipped and "vit_h_14" in skipped


def test_the_table_flags_a_step_worse_than_eager_and_lists_reasons_once():
    rows = [corpus.Row(corpus.model("resnet18"), {
        "a": corpus.Outcome(corpus.Kind.WORSE, 3e-6, 1e-7),
        "b": corpus.Outcome(corpus.Kind.REFUSED, reason="TypeError: no"),
        "c": corpus.Outcome(corpus.Kind.REFUSED, reason="TypeError: no"),
    })]
    text = corpus.table(rows, ["a", "b", "c"])
    assert "3.0e-06 (eager 1.0e-07) **WORSE**" in text
    assert "| refused [1] | refused [1] |" in text and text.count("TypeError: no") == 1
    assert not rows[0].outcomes["a"].ok and rows[0].outcomes["b"].ok


def test_unknown_names_are_refused_with_the_choices():
    with pytest.raises(ValueError, match="no corpus model 'resnet19'; choose among .*resnet18"):
        corpus.model("resnet19")
    with pytest.raises(ValueError, match="no corpus method 'approxdp'; choose among approxdp-tc"):
        corpus.method("approxdp")


class _HalveInputGradient(torch.autograd.Function):
    """The identity whose backward halves the gradient: a step wrong in its input gradient only."""

    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return grad / 2


def test_the_float64_yardstick_compares_the_inputs_gradients():
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    x = torch.randn(2, 4, requires_grad=True)
    ours, eager = float64_distance(model, lambda t: model(_HalveInputGradient.apply(t)), (x,))
    assert eager < 1e-6 and ours > 0.4


class _ChannelShuffle(torch.nn.Module):
    def forward(self, x):
        return torch.nn.functional.channel_shuffle(x, 2)


@pytest.mark.parametrize("layer", [torch.nn.SiLU(), torch.nn.SiLU(inplace=True), torch.nn.Mish(),
                                   torch.nn.RMSNorm([8, 6, 6]), _ChannelShuffle()], ids=type)
def test_ops_eager_runs_fused_are_traced_fused_so_the_step_is_bitwise(layer):
    # export decomposes composite ops that have a fused kernel (SiLU's backward into sigmoid
    # arithmetic, which rounds differently): EfficientNet's step was not bitwise
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), layer, torch.nn.Conv2d(8, 4, 3), torch.nn.Flatten(),
                                torch.nn.Linear(64, 3))
    x = torch.randn(2, 3, 8, 8, requires_grad=True)
    for method in ("chen", "approxdp"):
        assert compare(model, recompute.optimize(model, (x,), method=method), (x,)).bitwise, method


def test_the_float64_yardstick_measures_a_vanishing_gradient_against_float32_resolution():
    # a convolution's bias before BatchNorm has a true gradient of 0: float64 gives ~1e-17, float32
    # ~1e-9; relative to its own size that read as 1e8 for eager itself
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
                                torch.nn.Flatten(), torch.nn.Linear(8 * 36, 3))
    x = torch.randn(4, 3, 8, 8, requires_grad=True)
    ours, eager = float64_distance(model, model, (x,))
    assert ours == eager and eager < 1
