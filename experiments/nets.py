"""The network zoo: the seven networks of Kusumoto et al. (2019), Table 1, and small test networks.

    model, inputs = nets.build("resnet50")                        # paper batch (96) and size (224²)
    model, inputs = nets.build("pspnet", batch_size=1, input_size=64)
    loss = model(*inputs).sum()

Every builder returns the model in train mode; inputs are ``torch.randn`` float32 CPU tensors.
Nothing is ever downloaded (``weights=None`` / ``encoder_weights=None``).

smp models that check their input (``model.requires_divisible_input_shape``; PSPNet, not U-Net in
smp 0.6) need H and W divisible by the encoder's output stride (32 at depth 5, even once dilated).
Policy: :func:`build` rounds such a size *up* to the next multiple and emits a :class:`UserWarning`
(PSPNet's 713 becomes 736). U-Net takes any size, so it runs at the paper's 572.
"""

from __future__ import annotations

import contextlib
import functools
import math
import warnings
from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode

from recompute.doors.baselines import register_block

__all__ = ["NetSpec", "NETS", "names", "spec", "build", "Decoder", "DecoderBlock"]

Size = tuple[int, int]


@dataclass(frozen=True)
class NetSpec:
    """One entry of the zoo.

    Attributes:
        name: registry key.
        builder: ``builder(**kwargs) -> nn.Module`` (weights are always random).
        batch_size: default batch size (the paper's, for paper networks).
        input_size: default (H, W) actually used.
        paper_nodes: #V reported in Kusumoto et al. Table 1 (``None`` for test networks).
        description: one line on what the network is.
        note: caveats, e.g. why ``input_size`` differs from the paper's.
        paper_input_size: the paper's (H, W) when it differs from ``input_size``.
        num_inputs: how many image tensors ``forward`` takes.
        in_channels: channels of each input tensor.
        tokens: the vocabulary size where the input is a sequence of token ids (``batch × length``,
            ``input_size``'s first side the length) instead of images; ``None`` for images.
        sized: the builder takes the input size (``image_size``, ``length``): the model is made for it.
    """

    name: str
    builder: Callable[..., nn.Module]
    batch_size: int
    input_size: Size
    paper_nodes: int | None
    description: str
    note: str = ""
    paper_input_size: Size | None = None
    num_inputs: int = 1
    in_channels: int = 3
    tokens: int | None = None
    sized: bool = False

    @property
    def is_paper_net(self) -> bool:
        return self.paper_nodes is not None

    def __post_init__(self) -> None:
        if self.paper_input_size is None:
            object.__setattr__(self, "paper_input_size", self.input_size)


# --------------------------------------------------------------------------- paper networks


def _torchvision(arch: str, **defaults: Any) -> Callable[..., nn.Module]:
    """A builder for a torchvision classifier with random weights; kwargs override ``defaults``."""

    def make(**kwargs: Any) -> nn.Module:
        import torchvision.models as tvm

        return getattr(tvm, arch)(**{"weights": None, **defaults, **kwargs})

    make.__name__ = f"build_{arch}"
    return make


class _ConvReLU(nn.Module):
    """torchvision's ``BasicConv2d`` without BatchNorm (the original GoogLeNet had none)."""

    def __init__(self, cin: int, cout: int, **conv: Any) -> None:
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, **conv)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.conv(x))


def _googlenet(batch_norm: bool = True, **kwargs: Any) -> nn.Module:
    """torchvision GoogLeNet without aux heads; ``batch_norm=False`` swaps in BN-free convs
    (Szegedy et al. 2015, as the paper's #V=134 suggests) through torchvision's ``blocks`` hook."""
    # a from-import: ``torchvision.models.googlenet`` the attribute is the function, not the module
    from torchvision.models.googlenet import Inception, InceptionAux, googlenet

    opts: dict[str, Any] = dict(weights=None, aux_logits=False, init_weights=False)
    if not batch_norm:
        # GoogLeNet does not forward its conv block to the Inception blocks, so bind it here.
        opts["blocks"] = [
            _ConvReLU,
            functools.partial(Inception, conv_block=_ConvReLU),
            functools.partial(InceptionAux, conv_block=_ConvReLU),
        ]
    opts.update(kwargs)
    return googlenet(**opts)


def _unet(**kwargs: Any) -> nn.Module:
    """smp U-Net closest to Ronneberger et al. (2015): plain VGG-13 encoder, no BatchNorm anywhere.

    Why vgg13 (not vgg11/vgg16, nor a ``_bn`` variant): like U-Net it has two 3×3 convs per level,
    and with smp's centre block and decoder the net has exactly U-Net's 23 convolutions (#V 59 vs
    the paper's 60; vgg11 gives 55, vgg16 65). Decoder widths mirror the encoder's, as U-Net's do
    (smp's default 256..16 would make the full-resolution maps 4× thinner than U-Net's 64 channels).
    """
    import segmentation_models_pytorch as smp

    opts: dict[str, Any] = dict(
        encoder_name="vgg13",
        encoder_weights=None,
        encoder_depth=5,
        decoder_channels=(512, 512, 256, 128, 64),
        decoder_use_norm=False,  # smp 0.6 name; older smp called it decoder_use_batchnorm
        classes=2,
    )
    opts.update(kwargs)
    return smp.Unet(**opts)


def _pspnet(output_stride: int | None = 8, **kwargs: Any) -> nn.Module:
    """smp PSPNet on a dilated ResNet-101 (output stride 8), as in Zhao et al. (2017)."""
    import segmentation_models_pytorch as smp

    opts: dict[str, Any] = dict(
        encoder_name="resnet101", encoder_weights=None, encoder_depth=5, classes=21, upsampling=8
    )
    opts.update(kwargs)
    model = smp.PSPNet(**opts)
    if output_stride is not None:
        model.encoder.make_dilated(output_stride=output_stride)
    return model


# --------------------------------------------------------------------------- test networks


def _conv(cin: int, cout: int) -> nn.Conv2d:
    return nn.Conv2d(cin, cout, 3, padding=1)


class Chain(nn.Module):
    """``depth`` conv+ReLU layers in a plain chain, then a 1×1 conv head."""

    def __init__(self, depth: int = 8, width: int = 8, in_channels: int = 3) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        for i in range(depth):
            layers += [_conv(in_channels if i == 0 else width, width), nn.ReLU()]
        self.body = nn.Sequential(*layers)
        self.head = nn.Conv2d(width, 1, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x))


class Skip(nn.Module):
    """Kusumoto et al. Fig. 2: a chain whose first layer also feeds the last one.

    The long skip means no single node separates the graph, so segment-based
    checkpointing (Chen et al.) cannot cut it, while lower-set planners can.
    """

    def __init__(self, depth: int = 6, width: int = 8, in_channels: int = 3) -> None:
        super().__init__()
        self.first = _conv(in_channels, width)
        self.middle = nn.Sequential(*[m for _ in range(depth) for m in (_conv(width, width), nn.ReLU())])
        self.last = nn.Conv2d(width, 1, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.first(x))
        return self.last(self.middle(h) + h)


class Siamese(nn.Module):
    """A join network (Beaumont et al. 2020): two branches of different length, one input each,
    joined by a channel concat and a shared head. Branch weights are separate (not tied) so the
    branches are independent chains, as in the join-graph model."""

    def __init__(self, lengths: tuple[int, int] = (3, 5), width: int = 8, in_channels: int = 3) -> None:
        super().__init__()

        def branch(n: int) -> nn.Sequential:
            return nn.Sequential(*[m for i in range(n) for m in (_conv(in_channels if i == 0 else width, width), nn.ReLU())])

        self.left, self.right = branch(lengths[0]), branch(lengths[1])
        self.head = nn.Sequential(_conv(2 * width, width), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(width, 10))

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return self.head(torch.cat([self.left(a), self.right(b)], dim=1))


def _blocks(n: int, cin: int, width: int, kernel: int = 3) -> nn.Sequential:
    """``n`` conv+ReLU blocks (``kernel``×``kernel``, same padding), ``cin`` → ``width`` channels."""
    return nn.Sequential(*[m for i in range(n)
                           for m in (nn.Conv2d(cin if i == 0 else width, width, kernel, padding=kernel // 2), nn.ReLU())])


class _Encoder(nn.Sequential):
    """A join-graph branch: ``depth`` conv+ReLU blocks, global average pooling and a linear embedding."""

    def __init__(self, depth: int, cin: int, width: int, embed: int, kernel: int = 3) -> None:
        super().__init__(_blocks(depth, cin, width, kernel), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(width, embed))


class TripletSiamese(nn.Module):
    """Beaumont et al. (2020) §4's SNN: three branches of 2L conv blocks joined by a triplet loss
    (Hoffer & Ailon 2015), so the join graph has branches (2L, 2L, 2L) and the model returns a scalar.

    ``shared=True`` (a siamese network proper) holds one encoder and runs it on the anchor, positive
    and negative images; parameters are not nodes of the graph, so the three branches stay independent
    chains (their weight gradients are summed). ``shared=False`` holds three encoders."""

    def __init__(self, L: int = 15, width: int = 64, in_channels: int = 3, embed: int = 128,
                 margin: float = 1.0, shared: bool = True) -> None:
        super().__init__()
        make = lambda: _Encoder(2 * L, in_channels, width, embed)  # noqa: E731
        self.encoders = nn.ModuleList([make()] if shared else [make(), make(), make()])
        self.margin = margin

    def forward(self, anchor: torch.Tensor, positive: torch.Tensor, negative: torch.Tensor) -> torch.Tensor:
        encoders = self.encoders if len(self.encoders) == 3 else [self.encoders[0]] * 3
        a, p, n = (enc(x) for enc, x in zip(encoders, (anchor, positive, negative)))
        return nn.functional.triplet_margin_loss(a, p, n, margin=self.margin)


class CrossModal(nn.Module):
    """Beaumont et al. (2020) §4's CM embedding: a deep image branch of 5L 3×3 conv blocks and a shallow
    second-modality branch of L position-wise (1×1) conv blocks, joined by an in-batch contrastive loss
    (each image's match is the same-index sample: −mean log-softmax of the similarity diagonal)."""

    def __init__(self, L: int = 15, width: int = 64, in_channels: int = 3, embed: int = 128,
                 temperature: float = 0.1) -> None:
        super().__init__()
        self.image = _Encoder(5 * L, in_channels, width, embed)
        self.text = _Encoder(L, in_channels, width, embed, kernel=1)
        self.temperature = temperature

    def forward(self, image: torch.Tensor, text: torch.Tensor) -> torch.Tensor:
        a = nn.functional.normalize(self.image(image), dim=1)
        b = nn.functional.normalize(self.text(text), dim=1)
        return -torch.log_softmax(a @ b.T / self.temperature, dim=1).diagonal().mean()


class DropoutNet(nn.Module):
    """Conv-BN-ReLU-Dropout blocks and a dropout MLP head: recomputation must replay the same
    dropout masks (RNG state) and BatchNorm statistics to be exact."""

    def __init__(self, width: int = 8, in_channels: int = 3, p: float = 0.5) -> None:
        super().__init__()
        self.features = nn.Sequential(
            _conv(in_channels, width), nn.BatchNorm2d(width), nn.ReLU(), nn.Dropout(p),
            _conv(width, width), nn.BatchNorm2d(width), nn.ReLU(), nn.Dropout2d(p),
            nn.AdaptiveAvgPool2d(4), nn.Flatten(),
        )
        self.head = nn.Sequential(nn.Linear(16 * width, 32), nn.ReLU(), nn.Dropout(p), nn.Linear(32, 10))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


@register_block
class _Block(nn.Module):
    """A ResNet basic block (two 3×3 conv+BN) with in-place ReLU, as torchvision writes it."""

    def __init__(self, cin: int, cout: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.relu = nn.ReLU(inplace=True)
        self.down = (
            nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))
            if stride != 1 or cin != cout
            else nn.Identity()
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + self.down(x))


class ResBlockNet(nn.Module):
    """A tiny ResNet: stem, ``blocks`` basic blocks (every other one downsamples), pool, fc."""

    def __init__(self, blocks: int = 3, width: int = 8, in_channels: int = 3, num_classes: int = 10) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(in_channels, width, 3, 1, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU(inplace=True))
        layers, c = [], width
        for i in range(blocks):
            cout = c * 2 if i % 2 == 1 else c
            layers.append(_Block(c, cout, stride=2 if i % 2 == 1 else 1))
            c = cout
        self.layers = nn.Sequential(*layers)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(c, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.flatten(self.pool(self.layers(self.stem(x))), 1))


@register_block
class DecoderBlock(nn.Module):
    """A GPT-2 decoder layer: pre-norm causal self-attention (``scaled_dot_product_attention``) and a
    GELU MLP, each with dropout on its residual branch (and on the attention weights)."""

    def __init__(self, width: int, heads: int, dropout: float) -> None:
        super().__init__()
        self.heads, self.dropout = heads, dropout
        self.ln1, self.ln2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.qkv, self.proj = nn.Linear(width, 3 * width), nn.Linear(width, width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        att = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True,
                                                         dropout_p=self.dropout if self.training else 0.0)
        x = x + self.drop(self.proj(att.transpose(1, 2).reshape(b, t, c)))
        return x + self.drop(self.mlp(self.ln2(x)))


class Decoder(nn.Module):
    """A GPT-2-style language model (Radford et al. 2019) in plain PyTorch: token and position
    embeddings, ``layers`` decoder blocks (:class:`DecoderBlock`), a final LayerNorm and the output head tied to the
    token embedding; token ids in, logits out. By default GPT-2's shape at a quarter of its depth and
    half its width (6 layers × 384, 6 heads) over an 8000-token vocabulary."""

    def __init__(self, length: int = 512, vocab: int = 8000, layers: int = 6, width: int = 384, heads: int = 6,
                 dropout: float = 0.1) -> None:
        super().__init__()
        self.tokens, self.positions = nn.Embedding(vocab, width), nn.Embedding(length, width)
        self.drop = nn.Dropout(dropout)
        self.blocks = nn.Sequential(*(DecoderBlock(width, heads, dropout) for _ in range(layers)))
        self.ln = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab, bias=False)
        self.head.weight = self.tokens.weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(ids.shape[1], device=ids.device)
        return self.head(self.ln(self.blocks(self.drop(self.tokens(ids) + self.positions(positions)))))


def _vit(image_size: int = 224, **kwargs: Any) -> nn.Module:
    """torchvision ViT-B/16 for ``image_size``² inputs (its position embedding is made for one size)."""
    import torchvision.models as tvm

    return tvm.vit_b_16(weights=None, image_size=image_size, **kwargs)


# --------------------------------------------------------------------------- registry

_SQ = lambda n: (n, n)  # noqa: E731

_SPECS: tuple[NetSpec, ...] = (
    NetSpec("pspnet", _pspnet, 2, _SQ(736), 385,
            "smp PSPNet, dilated ResNet-101 encoder (output stride 8), 21 classes",
            "smp's PSPNet needs H, W divisible by its encoder's output stride, still 32 after make_dilated: "
            "the paper's 713 rounded up to 736.",
            paper_input_size=_SQ(713)),
    NetSpec("unet", _unet, 8, _SQ(572), 60,
            "smp U-Net, plain VGG-13 encoder, no BatchNorm, 2 classes",
            "The paper's 572 as is: smp 0.6's Unet has requires_divisible_input_shape=False (its decoder "
            "resizes each upsampled map to the skip's size); older smp needed a multiple of 32 (576). "
            "smp pads its convs ('same') where the original U-Net crops, so the output is 572² not 388²."),
    NetSpec("resnet50", _torchvision("resnet50"), 96, _SQ(224), 176, "torchvision ResNet-50"),
    NetSpec("resnet152", _torchvision("resnet152"), 48, _SQ(224), 516, "torchvision ResNet-152"),
    NetSpec("vgg19", _torchvision("vgg19"), 64, _SQ(224), 46, "torchvision VGG-19 (no BatchNorm)"),
    NetSpec("densenet161", _torchvision("densenet161"), 32, _SQ(224), 568, "torchvision DenseNet-161"),
    NetSpec("googlenet", _googlenet, 256, _SQ(224), 134,
            "torchvision GoogLeNet without auxiliary heads",
            "torchvision's GoogLeNet has BatchNorm after every conv; the paper's (Caffe-style) had none, "
            "so its traced graph is larger than #V=134; build('googlenet', batch_norm=False) drops it."),
    NetSpec("vit_b_16", _vit, 32, _SQ(224), None, "torchvision ViT-B/16 (12 encoder blocks × 768)",
            "made for its input size (position embeddings): build(..., input_size=s) builds it for s²", sized=True),
    NetSpec("mobilenet_v3_large", _torchvision("mobilenet_v3_large"), 128, _SQ(224), None,
            "torchvision MobileNetV3-Large (inverted residuals, hard-swish, squeeze-excitation)"),
    NetSpec("gpt2", Decoder, 8, _SQ(512), None,
            "a GPT-2-style decoder (6 layers × 384, causal SDPA, dropout 0.1, tied head) over 8000 tokens",
            "input: token ids, batch × length (input_size is the length)", tokens=8000, sized=True),
    NetSpec("chain", Chain, 4, _SQ(16), None, "8 conv+ReLU layers in a plain chain (test net)"),
    NetSpec("skip", Skip, 4, _SQ(16), None,
            "Kusumoto Fig. 2: chain with a skip from the first layer to the last (test net)"),
    NetSpec("siamese", Siamese, 4, _SQ(16), None,
            "join network: two branches (lengths 3 and 5) from two inputs, concat, head (test net)",
            "forward takes two inputs", num_inputs=2),
    NetSpec("snn", TripletSiamese, 32, _SQ(64), None,
            "Beaumont et al. SNN: 3 weight-shared branches of 2L=30 conv blocks (64 ch), triplet loss; scalar out",
            "join graph (2L, 2L, 2L) at the paper's L = 15; build('snn', L=1, width=4) for tests", num_inputs=3),
    NetSpec("cross_modal", CrossModal, 32, _SQ(64), None,
            "Beaumont et al. CM: image branch of 5L=75 3×3 conv blocks, second branch of L=15 1×1 conv blocks, "
            "contrastive loss; scalar out",
            "join graph (L, 5L) at the paper's L = 15; build('cross_modal', L=1, width=4) for tests", num_inputs=2),
    NetSpec("dropout", DropoutNet, 4, _SQ(16), None,
            "conv/BatchNorm/Dropout net for RNG-exact recomputation (test net)"),
    NetSpec("resblock", ResBlockNet, 4, _SQ(16), None,
            "tiny ResNet: 3 basic blocks with BatchNorm and in-place ReLU (test net)"),
)

NETS: dict[str, NetSpec] = {s.name: s for s in _SPECS}


def names(paper_only: bool = False) -> list[str]:
    """Registered network names (paper networks first, in Table 1 order)."""
    return [n for n, s in NETS.items() if s.is_paper_net or not paper_only]


def spec(name: str) -> NetSpec:
    """The :class:`NetSpec` of ``name``; ValueError listing the allowed names otherwise."""
    try:
        return NETS[name]
    except KeyError:
        raise ValueError(f"unknown network {name!r}; allowed: {', '.join(NETS)}") from None


def _as_size(size: int | tuple[int, int]) -> Size:
    h, w = (size, size) if isinstance(size, int) else tuple(size)
    if h <= 0 or w <= 0:
        raise ValueError(f"input_size must be positive, got {size!r}")
    return int(h), int(w)


def _size_multiple(model: nn.Module) -> int:
    """What H and W must be divisible by: smp checks against ``encoder.output_stride``."""
    if getattr(model, "requires_divisible_input_shape", False):
        return int(model.encoder.output_stride)
    return 1


def build(
    name: str,
    batch_size: int | None = None,
    input_size: int | tuple[int, int] | None = None,
    *,
    seed: int | None = None,
    fake_inputs: bool = False,
    **kwargs: Any,
) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """Build network ``name`` (train mode) and random example inputs.

    Args:
        batch_size: defaults to the spec's (the paper's for paper networks).
        input_size: H (square) or (H, W); defaults to the spec's. For smp models a size not
            divisible by the encoder's output stride is rounded up to the next multiple, with a warning
            (only for models that check it: PSPNet; smp's U-Net accepts any size).
        seed: when given, weights and inputs are drawn from this seed without touching the global RNG.
        fake_inputs: return FakeTensor inputs (shapes only, nothing allocated) for tracing and the
            ``fake`` measurement backend at paper scale.
        kwargs: passed to the builder (e.g. ``num_classes``, ``width``, ``encoder_name``).
    """
    s = spec(name)
    batch = s.batch_size if batch_size is None else int(batch_size)
    if batch <= 0:
        raise ValueError(f"batch_size must be positive, got {batch_size!r}")
    h, w = s.input_size if input_size is None else _as_size(input_size)

    # Fork the RNG only when seeded: unseeded builds must keep advancing the global RNG.
    rng = torch.random.fork_rng(devices=[]) if seed is not None else contextlib.nullcontext()
    with rng:
        if seed is not None:
            torch.manual_seed(seed)
        if s.sized:
            kwargs = {("length" if s.tokens else "image_size"): h, **kwargs}
        model = s.builder(**kwargs).train()
        m = _size_multiple(model)
        rh, rw = math.ceil(h / m) * m, math.ceil(w / m) * m
        if (rh, rw) != (h, w):
            warnings.warn(
                f"{name}: input {h}x{w} is not divisible by {m} (smp encoder output stride); using {rh}x{rw}",
                stacklevel=2,
            )
        shape = (batch, h) if s.tokens else (batch, s.in_channels, rh, rw)

        vocab = kwargs.get("vocab", s.tokens)

        def make() -> torch.Tensor:
            return torch.randint(0, vocab, shape) if s.tokens else torch.randn(shape)

        if fake_inputs:
            with FakeTensorMode():
                inputs = tuple(torch.empty(shape, dtype=torch.long if s.tokens else torch.float32)
                               for _ in range(s.num_inputs))
        else:
            inputs = tuple(make() for _ in range(s.num_inputs))
    return model, inputs
