"""PyTorch's own checkpointing methods as baselines (``recompute.baselines``): they wrap the zoo's
networks, the meter measures them, and their known inexactness is reported, not hidden."""

from __future__ import annotations

import pytest
import torch
from torchvision.models.densenet import _DenseLayer
from torchvision.models.googlenet import Inception
from torchvision.models.resnet import Bottleneck

import recompute
from recompute.doors import baselines
from experiments import nets
from recompute.doors.exactness import compare, train_step

BASELINES = ["torch_checkpoint_sequential", "torch_checkpoint_blocks", "torch_sac", "torch_compile_budget"]
FAST_COMPILE = {"backend": "aot_eager_decomp_partition"}  # inductor's C++ build takes a minute here


def _options(method: str) -> dict:
    return FAST_COMPILE if method == "torch_compile_budget" else {}


def _tiny(name: str = "resblock") -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    return nets.build(name, batch_size=2, input_size=16, seed=0)


def test_baselines_are_registered_methods_with_options():
    # a registry of their own: they plan nothing, so the planners' doors do not offer them
    assert set(BASELINES) == set(baselines.names()) and not set(BASELINES) & set(recompute.methods())
    assert baselines.spec("torch_compile_budget").options == ("budget_fraction", "backend", "aggressive")
    assert baselines.spec("torch_sac").options == ("policy",)
    model, _ = _tiny()
    with pytest.raises(TypeError, match="no option 'budget_fraktion'; its options: budget_fraction, backend, aggressive"):
        recompute.optimize(model, method="torch_compile_budget", budget_fraktion=0.3)
    with pytest.raises(TypeError, match="takes no strategy"):
        recompute.optimize(model, method="torch_sac", strategy="mc")
    with pytest.raises(TypeError, match="takes no budget"):
        recompute.optimize(model, method="torch_sac", budget=2**20)
    with pytest.raises(ValueError, match="use recompute.optimize"):
        recompute.plan(recompute.trace(model, _tiny()[1]), "torch_sac")


@pytest.mark.parametrize("method", BASELINES)
def test_baseline_trains_like_plain_training_but_for_batchnorm(method):
    """Loss and gradients within assert_close; BatchNorm statistics updated again by the checkpoint
    variants' recomputation, and the comparison says so."""
    model, xs = _tiny()
    wrapped = recompute.optimize(model, xs, method=method, **_options(method))
    assert isinstance(wrapped, baselines.BaselineModule)
    result = compare(model, wrapped, xs)
    assert not [k for k in result.differs if not k.startswith("buffer:")]  # loss and grads are close
    if method == "torch_compile_budget":
        assert result.summary() in ("bitwise", "close")  # functionalised BatchNorm: updated once
    else:
        assert "buffer:layers.0.bn1.running_mean" in result.differs
        assert "buffer:layers.0.bn1.num_batches_tracked" in result.differs
        assert result.summary().startswith("differs: ") and result.summary().endswith(" buffers")


def test_twice_updated_batchnorm_statistics():
    """torch_checkpoint_blocks on a BN net: the running statistics have seen the batch twice, while the
    loss and every parameter gradient are those of plain training."""
    model, xs = _tiny()
    start = {n: b.clone() for n, b in model.named_buffers()}
    ref = {k: v.clone() for k, v in train_step(model, model, xs, seed=0).items()}
    model.zero_grad(set_to_none=True)
    with torch.no_grad():
        for n, b in model.named_buffers():
            b.copy_(start[n])
    got = train_step(model, recompute.optimize(model, method="torch_checkpoint_blocks"), xs, seed=0)
    for key in ref:
        if key.startswith(("grad:", "loss")):
            torch.testing.assert_close(got[key], ref[key])
    bn = "buffer:layers.0.bn1.num_batches_tracked"
    assert int(ref[bn] - start[bn[7:]]) == 1 and int(got[bn] - start[bn[7:]]) == 2
    assert not torch.allclose(got["buffer:layers.0.bn1.running_mean"], ref["buffer:layers.0.bn1.running_mean"])


def test_compile_and_dropout_are_reported():
    """torch.compile draws dropout masks from its own generator: the loss differs, and is reported."""
    model, xs = _tiny("dropout")
    result = compare(model, recompute.optimize(model, method="torch_compile_budget", **FAST_COMPILE), xs)
    assert "loss" in result.differs and result.summary().startswith("differs: loss")


def test_sequential_and_sac_are_exact_without_batchnorm():
    model, xs = _tiny("chain")
    for method in ("torch_checkpoint_sequential", "torch_sac"):
        assert compare(model, recompute.optimize(model, method=method), xs).bitwise, method


class _FunctionalInPlace(torch.nn.Module):
    """torchvision's GoogLeNet's pattern: a functional ReLU that writes into its input."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.a, self.b, self.c = torch.nn.Linear(4, 8), torch.nn.Linear(8, 8), torch.nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.nn.functional.relu(self.a(x), inplace=True)
        return self.c(torch.nn.functional.relu(self.b(x), inplace=True))


def test_sequential_cuts_before_a_functional_in_place_op_train_as_plain():
    # a segment per stage: each ReLU starts a segment whose checkpoint keeps its input; written in
    # place, autograd raised (GoogLeNet at 8 segments, on the CPU and on an H200)
    model, x = _FunctionalInPlace(), (torch.randn(3, 4),)
    assert compare(model, recompute.optimize(model, method="torch_checkpoint_sequential", segments=5), x).bitwise


def test_blocks_of_the_zoo():
    def found(name: str, **kw) -> list[type]:
        model, _ = nets.build(name, batch_size=1, input_size=32, **kw)
        return [type(m) for _, m in baselines.blocks(model)]

    assert found("resnet50") == [Bottleneck] * 16
    assert found("densenet161") == [_DenseLayer] * (6 + 12 + 36 + 24)
    assert found("googlenet") == [Inception] * 9
    assert found("vgg19") == [torch.nn.Sequential]  # features, checkpointed stage by stage
    assert len(found("unet")) == 6  # smp's centre block and five decoder blocks
    model, _ = _tiny("chain")
    with pytest.raises(baselines.NoBlocks, match="no block in Chain.*torch_checkpoint_sequential"):
        recompute.optimize(model, method="torch_checkpoint_blocks")


def test_blocks_leave_the_model_as_it_was():
    model, xs = _tiny()
    wrapped = recompute.optimize(model, method="torch_checkpoint_blocks")
    wrapped(*xs).sum().backward()
    assert all("forward" not in vars(m) for m in model.modules())
    wrapped.eval()
    with torch.no_grad():
        torch.testing.assert_close(wrapped(*xs), model(*xs))  # evaluation is the model's own forward


@pytest.mark.parametrize("method", ["torch_checkpoint_sequential", "torch_checkpoint_blocks", "torch_sac"])
def test_fake_backend_measures_what_cpu_measures(method):
    model, xs = _tiny()
    wrapped = recompute.optimize(model, method=method)
    cpu = recompute.measure(model, xs, runner=wrapped, backend="cpu", iterations=1, warmup=0)
    fake = recompute.measure(model, xs, runner=wrapped, backend="fake")
    assert fake.peak_bytes == cpu.storage_peak_bytes > 0 and fake.grad_bytes == cpu.grad_bytes
    assert cpu.peak_bytes >= cpu.storage_peak_bytes  # the allocator also sees what ops allocate inside


def test_compile_is_not_measurable_on_fake():
    model, xs = _tiny()
    wrapped = recompute.optimize(model, method="torch_compile_budget", **FAST_COMPILE)
    with pytest.raises(baselines.UnsupportedBackend, match="torch_compile_budget.*'fake' backend.*cpu, cuda"):
        recompute.measure(model, xs, runner=wrapped, backend="fake")


def test_compile_compiles_under_the_meter():
    """Dynamo compiles nothing under a dispatch mode unless it ignores compile internals: the meter does,
    so that the compiled code, not the eager model, is what runs and is measured."""
    from torch._dynamo.utils import counters

    model, xs = _tiny()
    torch._dynamo.reset()
    counters.clear()
    wrapped = recompute.optimize(model, method="torch_compile_budget", **FAST_COMPILE)
    r = recompute.measure(model, xs, runner=wrapped, backend="cpu", iterations=1, warmup=0)
    assert counters["stats"]["unique_graphs"] == 1 and r.peak_bytes > 0
