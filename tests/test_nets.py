"""Tests for the network zoo (experiments/nets.py): every net trains one step at a tiny size,
defaults follow Kusumoto et al. (2019) Table 1, and the registry behaves."""

from __future__ import annotations

import math
import warnings

import pytest
import torch
from torch import nn

from experiments.figures import paper_table1_wide
from experiments import nets

PAPER_SIZE = {"unet": 572, "pspnet": 713}  # §5: 224×224 for every other network
SMALL = ("chain", "skip", "siamese", "dropout", "resblock")
JOIN = ("snn", "cross_modal")  # Beaumont et al.'s join networks, tested in test_join_nets.py
MODERN = ("vit_b_16", "mobilenet_v3_large", "gpt2")  # beyond the paper's seven (benchmarks/measured.py)

# name -> (batch, size) small enough for 2 CPU cores; the big nets at batch 1.
TINY = {n: (1, 64) for n in nets.names(paper_only=True)} | {n: (2, 16) for n in SMALL}

PAPER = paper_table1_wide().to_dict("index")  # Kusumoto et al. Table 1, from experiments/reference/


def _tiny(name: str) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """A seeded tiny build. Not cached: the seven paper nets with their gradients held at once took 4.3 GB."""
    batch, size = TINY[name]
    return nets.build(name, batch_size=batch, input_size=size, seed=0)


def _expected_shape(name: str, batch: int, size: int) -> tuple[int, ...]:
    if name == "unet":
        return (batch, 2, size, size)
    if name == "pspnet":
        return (batch, 21, size, size)
    if name in ("chain", "skip"):
        return (batch, 1, size, size)
    if name in ("siamese", "dropout", "resblock"):
        return (batch, 10)
    return (batch, 1000)  # torchvision classifiers


def test_registry_lists_paper_and_test_nets() -> None:
    assert nets.names() == list(nets.NETS)
    assert set(nets.names(paper_only=True)) == set(PAPER)
    assert set(nets.names()) == set(PAPER) | set(SMALL) | set(JOIN) | set(MODERN)
    for name, s in nets.NETS.items():
        assert s.name == name and s.description and s.batch_size > 0


@pytest.mark.parametrize("name, size, shape", [("vit_b_16", 32, (2, 1000)), ("mobilenet_v3_large", 32, (2, 1000)),
                                               ("gpt2", 16, (2, 16, 8000))])
def test_the_modern_nets_build_for_their_input_and_train(name: str, size: int, shape: tuple[int, ...]) -> None:
    """ViT is made for its input size (its position embeddings); the decoder takes token ids of the
    sequence length the input size names, and ties its head to its token embedding."""
    model, (x,) = nets.build(name, batch_size=2, input_size=size, seed=0, **({"layers": 1} if name == "gpt2" else {}))
    assert x.dtype == (torch.long if name == "gpt2" else torch.float32)
    out = model(x)
    assert out.shape == shape
    out.float().square().mean().backward()
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)
    if name == "gpt2":
        assert model.head.weight is model.tokens.weight and int(x.max()) < 8000


@pytest.mark.parametrize("name", sorted(PAPER))
def test_defaults_follow_the_paper(name: str) -> None:
    s, row = nets.NETS[name], PAPER[name]
    assert s.batch_size == int(row["batch"])
    assert s.paper_nodes == int(row["num_nodes"])
    p = PAPER_SIZE.get(name, 224)
    assert s.paper_input_size == (p, p)
    if name == "pspnet":
        # the smallest multiple of 32 that holds the paper's input, and the note says why
        q = math.ceil(p / 32) * 32
        assert s.input_size == (q, q) and "32" in s.note
    else:
        assert s.input_size == (p, p)  # U-Net included: smp 0.6's Unet takes any size


@pytest.mark.parametrize("name", ["pspnet"])  # U-Net at its default is covered below (no check)
def test_smp_default_inputs_need_no_rounding(name: str) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the defaults must already be valid sizes
        model, (x,) = nets.build(name)
    s = nets.NETS[name]
    assert x.shape == (s.batch_size, 3, *s.input_size)
    if model.requires_divisible_input_shape:
        assert s.input_size[0] % model.encoder.output_stride == 0


@pytest.mark.parametrize("name", list(TINY))
def test_forward_backward_tiny(name: str) -> None:
    batch, size = TINY[name]
    model, inputs = _tiny(name)
    assert model.training
    assert len(inputs) == nets.NETS[name].num_inputs
    for x in inputs:
        assert x.shape == (batch, 3, size, size) and x.dtype == torch.float32 and x.device.type == "cpu"
    out = model(*inputs)
    assert out.shape == _expected_shape(name, batch, size)
    assert torch.isfinite(out).all()
    out.float().square().mean().backward()
    params = [p for p in model.parameters() if p.requires_grad]
    assert params, "every zoo network must have parameters"
    missing = [n for n, p in model.named_parameters() if p.requires_grad and p.grad is None]
    assert not missing, f"parameters without gradient: {missing[:5]}"


def test_unknown_name_lists_allowed_names() -> None:
    with pytest.raises(ValueError, match="allowed:.*resnet50.*chain"):
        nets.build("resnet51")


def test_smp_input_is_rounded_up_with_a_warning() -> None:
    with pytest.warns(UserWarning, match="divisible by 32"):
        model, (x,) = nets.build("pspnet", batch_size=1, input_size=(40, 70))
    assert x.shape[-2:] == (64, 96)
    # U-Net needs no rounding: it runs at odd sizes and keeps them
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        unet, (y,) = nets.build("unet", batch_size=1, input_size=(50, 70))
    with torch.no_grad():
        assert unet(y).shape == (1, 2, 50, 70)


def test_non_smp_sizes_are_kept_and_rectangles_allowed() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        model, (x,) = nets.build("chain", batch_size=3, input_size=(10, 13))
    assert x.shape == (3, 3, 10, 13)
    assert model(x).shape == (3, 1, 10, 13)
    with pytest.raises(ValueError):
        nets.build("chain", input_size=0)
    with pytest.raises(ValueError):
        nets.build("chain", batch_size=0)


def test_seed_makes_builds_reproducible_without_touching_global_rng() -> None:
    torch.manual_seed(123)
    state = torch.get_rng_state()
    m1, x1 = nets.build("resblock", seed=7)
    assert torch.equal(torch.get_rng_state(), state)
    m2, x2 = nets.build("resblock", seed=7)
    assert all(torch.equal(a, b) for a, b in zip(m1.state_dict().values(), m2.state_dict().values()))
    assert torch.equal(x1[0], x2[0])
    # unseeded builds draw from (and advance) the global RNG, so they differ
    _, y1 = nets.build("resblock")
    _, y2 = nets.build("resblock")
    assert not torch.equal(y1[0], y2[0])


def test_builder_kwargs_are_forwarded() -> None:
    model, (x,) = nets.build("resnet50", batch_size=2, input_size=32, num_classes=7)
    assert model(x).shape == (2, 7)
    model, _ = nets.build("chain", width=4, depth=3)
    assert sum(isinstance(m, nn.Conv2d) for m in model.modules()) == 4


def test_architecture_choices() -> None:
    # U-Net and GoogLeNet(batch_norm=False) have no BatchNorm, as in the originals the paper used
    unet = _tiny("unet")[0]
    assert not any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in unet.modules())
    assert sum(isinstance(m, nn.Conv2d) for m in unet.modules()) == 23  # as in Ronneberger et al.
    g, _ = nets.build("googlenet", batch_size=1, input_size=64, batch_norm=False)
    assert not any(isinstance(m, nn.BatchNorm2d) for m in g.modules())
    # PSPNet's encoder is dilated: no stride-2 conv after layer2
    psp = _tiny("pspnet")[0]
    for layer in (psp.encoder.layer3, psp.encoder.layer4):
        assert all(m.stride == (1, 1) for m in layer.modules() if isinstance(m, nn.Conv2d))
    # the test nets exercise what they are named for
    assert any(isinstance(m, nn.Dropout) for m in nets.build("dropout")[0].modules())
    assert any(getattr(m, "inplace", False) for m in nets.build("resblock")[0].modules())


def test_skip_output_depends_on_first_layer_through_the_skip() -> None:
    # Zeroing the middle chain leaves the long skip as the only path to the output.
    model, (x,) = nets.build("skip", seed=0)
    with torch.no_grad():
        for p in model.middle.parameters():
            p.zero_()
    x.requires_grad_(True)
    model(x).sum().backward()
    assert x.grad.abs().sum() > 0


@pytest.mark.parametrize("name", SMALL)
def test_small_nets_train_at_defaults(name: str) -> None:
    model, inputs = nets.build(name, seed=0)
    s = nets.NETS[name]
    assert inputs[0].shape == (s.batch_size, 3, *s.input_size)
    model(*inputs).sum().backward()
    assert all(p.grad is not None for p in model.parameters())
