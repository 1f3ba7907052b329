"""An optimized module used the ways users hold it: inside a larger model, after eval()/train(), at a
new input shape, as a recurrent network — each step compared with plain training of a twin model."""

from __future__ import annotations

import copy
import dataclasses
import pickle
import re
import types
import warnings
from typing import Any

import pytest
import torch
import torch.nn as nn

import recompute
from recompute.doors.exactness import float64_distance, train_step
from recompute.doors.optimize import MAX_PLANS, CaptureWarning, _what_changed


def _net(seed: int = 0) -> nn.Sequential:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Dropout(0.3),
                         nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 4))


class Outer(nn.Module):
    """A trainable stem, a body (optimized or not) and a head: the body is what users optimize."""

    def __init__(self, body: nn.Module, twice: bool = False):
        super().__init__()
        torch.manual_seed(1)
        self.stem, self.body, self.head, self.twice = nn.Linear(8, 8), body, nn.Linear(4, 2), twice

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.body(self.stem(x))
        if self.twice:  # the same optimized module again, on a value that depends on its first output
            h = self.body(self.stem(h.repeat(1, 2)))
        return self.head(h)


def _same_step(plain: nn.Module, ours: nn.Module, inputs: tuple, seed: int = 3, bitwise: bool = True) -> None:
    """One step of each from the same generator state: loss, every gradient (inputs' too) and every
    buffer bitwise equal (the same ops run on the same values); with ``bitwise`` false, the loss and the
    generator's state bitwise (the same dropout masks) and the rest within float32's tolerance."""
    ref = {k: v.clone() for k, v in train_step(plain, plain, inputs, seed).items()}
    # the wrapper holds the model as ``model``: name entries as in the plain model
    got = {re.sub(r"(?<=[:.])model\.", "", k): v for k, v in train_step(ours, ours, inputs, seed).items()}
    assert ref.keys() == got.keys(), set(ref) ^ set(got)
    for key in ref:
        if bitwise or key in ("loss", "rng"):
            assert torch.equal(ref[key], got[key]), key
        else:
            torch.testing.assert_close(got[key], ref[key], msg=key)


def test_layers_before_an_optimized_module_get_their_gradients():
    plain = Outer(_net())
    ours = copy.deepcopy(plain)
    x = torch.randn(6, 8)
    ours.body = recompute.optimize(ours.body, (torch.randn(6, 8),))
    _same_step(plain, ours, (x,))
    assert ours.stem.weight.grad is not None and ours.stem.weight.grad.norm() > 0


def test_an_optimized_backbone_inside_a_compiled_model_runs_its_plan_between_the_compiled_graphs():
    """``torch.compile`` of a model holding an optimized module: dynamo traced into the tracing and the
    planner (numba) and failed, or advised making forward free of control flow; it now compiles around
    the module, which runs its plan."""
    torch._dynamo.reset()
    plain, ours = Outer(_net()), Outer(recompute.optimize(_net()))
    compiled = torch.compile(ours, backend="aot_eager")
    for seed in (3, 4):
        x = torch.randn(6, 8)
        ref = train_step(plain, plain, (x,), seed=seed)
        got = {re.sub(r"(?<=[:.])model\.", "", k): v for k, v in train_step(ours, compiled, (x,), seed=seed).items()}
        assert ref.keys() == got.keys()
        for key in ref:
            torch.testing.assert_close(got[key], ref[key], msg=key)
        plain.zero_grad(set_to_none=True), ours.zero_grad(set_to_none=True)
    assert len(ours.body._executors) == 1
    torch._dynamo.reset()


def test_an_input_that_requires_grad_gets_its_gradient():
    plain = _net()
    ours = recompute.optimize(copy.deepcopy(plain), (torch.randn(6, 8),))
    x = torch.randn(6, 8, requires_grad=True)
    _same_step(plain, ours, (x,))


def test_an_optimized_module_used_twice_in_one_step():
    plain = Outer(_net(), twice=True)
    ours = copy.deepcopy(plain)
    ours.body = recompute.optimize(ours.body, (torch.randn(6, 8),))
    _same_step(plain, ours, (torch.randn(6, 8),))


def test_planned_in_eval_then_trained():
    plain = _net()
    ours = copy.deepcopy(plain)
    x = torch.randn(6, 8)
    plain.eval(), ours.eval()
    wrapped = recompute.optimize(ours, (x,))
    plain.train(), wrapped.train()
    _same_step(plain, wrapped, (x,))


def test_inner_model_switched_to_train_while_the_wrapper_is_in_eval_still_follows_a_plan():
    plain = _net()
    ours = copy.deepcopy(plain)
    x = torch.randn(6, 8)
    wrapped = recompute.optimize(ours, (x,))
    wrapped.eval()
    ours.train()
    wrapped.last = None
    _same_step(plain, wrapped, (x,))
    assert wrapped.last is not None  # the step ran the plan, not the bare model


def test_training_in_eval_mode_with_grad_uses_the_running_statistics():
    """Fine-tuning with frozen BatchNorm: eval() and a backward pass."""
    plain = _net()
    ours = copy.deepcopy(plain)
    wrapped = recompute.optimize(ours, (torch.randn(6, 8),))
    plain.eval(), wrapped.eval()
    wrapped.last = None
    _same_step(plain, wrapped, (torch.randn(6, 8),))
    assert wrapped.last is not None and not wrapped.last.program.module.training


def test_freezing_a_layer_retraces():
    plain = _net()
    ours = copy.deepcopy(plain)
    x = torch.randn(6, 8)
    wrapped = recompute.optimize(ours, (x,))
    for m in (plain, ours):
        m[0].requires_grad_(False)
    _same_step(plain, wrapped, (x,))
    assert len(wrapped._executors) == 2


def _swap_head(m: nn.Sequential) -> None:
    torch.manual_seed(5)
    m[6] = nn.Linear(16, 3)


def _forward_of_tanh(m: nn.Sequential) -> None:
    m[5].forward = torch.tanh  # a monkey-patched forward, held in the instance's dictionary


@pytest.mark.parametrize("change", [
    pytest.param(lambda m: m.__setitem__(2, nn.Tanh()), id="a ReLU replaced"),
    pytest.param(lambda m: setattr(m[3], "p", 0.6), id="the dropout rate"),
    pytest.param(lambda m: setattr(m[1], "momentum", 0.5), id="BatchNorm's momentum"),
    pytest.param(_swap_head, id="a new head of another width"),
    pytest.param(_forward_of_tanh, id="a patched forward"),
    pytest.param(lambda m: m[4].register_forward_hook(lambda mod, args, out: out * 2), id="a hook that scales",
                 marks=pytest.mark.filterwarnings("ignore::recompute.HookWarning")),  # warned of below
])
def test_a_model_changed_after_its_plan_retraces_and_trains_as_plain(change):
    """Whatever of the model the traced step is made of, changed between steps, plans again: the plan
    made before would run the old program, and train it silently."""
    plain = _net()
    ours = copy.deepcopy(plain)
    x = torch.randn(6, 8)
    wrapped = recompute.optimize(ours, (x,))
    _same_step(plain, wrapped, (x,))
    for m in (plain, ours):
        m.zero_grad(set_to_none=True)
        change(m)
    _same_step(plain, wrapped, (x,))
    assert len(wrapped._executors) == 2
    _same_step(plain, wrapped, (x,))
    assert len(wrapped._executors) == 2  # nothing changed since: the same plan


@pytest.mark.parametrize("inputs_too", [False, True], ids=["weights", "weights and inputs"])
def test_channels_last_retraces_and_trains_as_plain(inputs_too):
    """Planned on contiguous tensors, then trained channels-last (the memory format mixed precision
    wants on a GPU): the traced step's views would not fit the new strides."""
    torch.manual_seed(0)
    plain = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.Conv2d(8, 8, 3, padding=1),
                          nn.ReLU(), nn.Flatten(), nn.Linear(8 * 64, 5))
    ours = copy.deepcopy(plain)
    wrapped = recompute.optimize(ours, (torch.randn(4, 3, 8, 8),))
    x = torch.randn(4, 3, 8, 8)
    if inputs_too:
        x = x.to(memory_format=torch.channels_last)
    else:
        _same_step(plain, wrapped, (x.to(memory_format=torch.channels_last),))
        plain.zero_grad(set_to_none=True), ours.zero_grad(set_to_none=True)
    for m in (plain, ours):
        m.to(memory_format=torch.channels_last)
    _same_step(plain, wrapped, (x,))


class _Masked(nn.Module):
    """A forward with keyword and non-tensor arguments, as transformer-style models take them."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.inner, self.drop = _net(), nn.Dropout(0.2)

    def forward(self, x, mask=None, *, scale=1.0, relu=False):
        y = self.inner(x) * scale
        if mask is not None:
            y = y.masked_fill(mask, 0.0)
        return self.drop(y.relu() if relu else y)


def test_keyword_and_non_tensor_arguments_are_constants_of_the_planned_step():
    plain = _Masked()
    ours = copy.deepcopy(plain)
    x, mask = torch.randn(6, 8), torch.rand(6, 4) > 0.5
    wrapped = recompute.optimize(ours, (x, None))
    calls = [((x,), {}), ((x, None), {"scale": 2.0}), ((x,), {"mask": mask, "relu": True}), ((x, mask), {"scale": 0.5})]
    for args, kwargs in calls:
        def call(m, args=args, kwargs=kwargs):
            return lambda *_: m(*args, **kwargs)
        ref = train_step(plain, call(plain), (), seed=3)
        got = {re.sub(r"(?<=[:.])model\.", "", k): v for k, v in train_step(ours, call(wrapped), (), seed=3).items()}
        assert ref.keys() == got.keys()
        assert all(torch.equal(ref[k], got[k]) for k in ref)
        plain.zero_grad(set_to_none=True), ours.zero_grad(set_to_none=True)
    assert len(wrapped._executors) == 4  # (x,) is (x, None): the arguments are bound to forward's signature
    with pytest.raises(TypeError, match=r"argument 'scale' is a list \[2.0\]: .*hashable constants"):
        wrapped(x, scale=[2.0])
    with pytest.raises(TypeError, match=r"argument 1 holds tensors inside a tuple"):
        wrapped(x, (mask,))


class _Gated(nn.Module):
    """A forward with an optional tensor argument (a mask), defaulting to None."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.a, self.b = nn.Linear(8, 16), nn.Linear(16, 4)

    def forward(self, x, gate=None):
        y = torch.relu(self.a(x))
        if gate is not None:
            y = y * gate
        return self.b(y)


@pytest.mark.parametrize("method, options", [("torch_sac", {}), ("torch_checkpoint_sequential", {}),
                                             ("torch_compile_budget", {"backend": "aot_eager_decomp_partition"})])
def test_pytorchs_methods_take_the_models_arguments_as_it_takes_them(method, options):
    """Keyword arguments reach the model; ``checkpoint_sequential``, whose fx trace took every argument
    for a tensor (``if gate is not None`` traced true), refuses another value: ``m(x)`` once unpacked x
    over the two placeholders, x and gate each a row of it, and trained that, silently."""
    plain = _Gated()
    ours = copy.deepcopy(plain)
    wrapped = recompute.optimize(ours, method=method, **options)
    x, gate = torch.randn(6, 8), torch.rand(16)
    calls = [((x,), {"gate": gate}), ((x, gate), {})] + ([] if method == "torch_checkpoint_sequential" else [((x,), {})])
    for args, kwargs in calls:
        def call(m, args=args, kwargs=kwargs):
            return lambda *_: m(*args, **kwargs)
        ref = train_step(plain, call(plain), (), seed=3)
        got = {k.replace(":model.", ":"): v for k, v in train_step(ours, call(wrapped), (), seed=3).items()}
        assert ref.keys() == got.keys()
        for key in ref:
            torch.testing.assert_close(got[key], ref[key], msg=key)
        plain.zero_grad(set_to_none=True), ours.zero_grad(set_to_none=True)
    if method == "torch_checkpoint_sequential":
        with pytest.raises(TypeError, match=r"argument 'gate' is NoneType: pass a tensor, or use a planner"):
            wrapped(x)


class _KeepsItsOwnStatistics(nn.Module):
    """A forward that updates buffers of its own: a running mean kept by hand and a step counter."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.a, self.b, self.c = nn.Linear(8, 8), nn.Linear(8, 8), nn.Linear(8, 4)
        self.register_buffer("running", torch.zeros(8))
        self.register_buffer("count", torch.zeros((), dtype=torch.long))

    def forward(self, x):
        h = torch.relu(self.a(x))
        if self.training:
            self.running.mul_(0.9).add_(0.1 * h.detach().mean(0))
            self.count += 1
        return self.c(torch.relu(self.b(h - self.running)))


@pytest.mark.parametrize("method", ["approxdp", "chen", "revolve"])
def test_a_forward_that_updates_its_own_buffers_updates_them_once_per_step(method):
    """Recomputation must not run a buffer update again (PyTorch's checkpoint does: README)."""
    plain = _KeepsItsOwnStatistics()
    ours = recompute.optimize(copy.deepcopy(plain), method=method)
    for seed in (3, 4, 5):
        _same_step(plain, ours, (torch.randn(5, 8),), seed=seed)
        plain.zero_grad(set_to_none=True), ours.zero_grad(set_to_none=True)
    assert int(ours.model.count) == int(plain.count) == 3


class _Counting(nn.Module):
    """Counts its calls in a Python attribute: a setting that changes every step."""

    def __init__(self):
        super().__init__()
        self.lin, self.calls = nn.Linear(4, 4), 0

    def forward(self, x):
        self.calls += 1
        return self.lin(x)


def test_a_setting_that_changes_every_step_is_named_and_the_plans_kept_are_bounded():
    wrapped = recompute.optimize(_Counting())
    x = torch.randn(3, 4)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(MAX_PLANS + 3):
            wrapped(x).sum().backward()
    said = [str(w.message) for w in caught if w.category is recompute.RetraceWarning]
    assert len(said) == 3 and re.search(r"planned 9 times; this time because module `the model` \(_Counting\) "
                                        r"changed calls \d+ → \d+", said[0])
    assert len(wrapped._executors) == MAX_PLANS


def test_a_hook_is_traced_with_a_warning_that_it_runs_while_tracing_only():
    seen: list[torch.Size] = []
    model = _net()
    model[2].register_forward_hook(lambda mod, args, out: seen.append(out.shape))
    with pytest.warns(recompute.HookWarning, match=r"forward hook `.*<lambda>` on `2` \(ReLU\).*sees the tracing only"):
        wrapped = recompute.optimize(model, (torch.randn(6, 8),))
    traced = len(seen)
    wrapped(torch.randn(6, 8)).sum().backward()
    assert len(seen) == traced


def test_weight_norm_and_spectral_norm_train_as_plain_without_a_hook_warning():
    from torch.nn.utils import spectral_norm, weight_norm

    def net(norm):
        torch.manual_seed(0)
        m = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
        norm(m[2])
        return m

    for norm in (weight_norm, spectral_norm):
        plain, ours = net(norm), net(norm)  # weight_norm's modules cannot be deep-copied
        x = torch.randn(6, 8)
        with warnings.catch_warnings():
            warnings.simplefilter("error", recompute.HookWarning)
            wrapped = recompute.optimize(ours, (x,))
        for _ in range(2):  # spectral_norm's power iteration updates its buffers every step
            _same_step(plain, wrapped, (x,))
            plain.zero_grad(set_to_none=True), ours.zero_grad(set_to_none=True)
        assert len(wrapped._executors) == 1


@pytest.mark.parametrize("method", ["approxdp", "torch_checkpoint_sequential"])
def test_a_checkpoint_of_a_model_with_an_optimized_backbone_is_the_plain_models(method):
    """Saved from training with an optimized body, a state dict loads into the plain model; a plain
    one (and one written with the wrapper's ``model.`` keys) loads into the optimized model."""
    plain = Outer(_net())
    ours = copy.deepcopy(plain)
    ours.body = recompute.optimize(ours.body, (torch.randn(6, 8),), method=method)
    assert list(ours.state_dict()) == list(plain.state_dict())
    x = torch.randn(6, 8)
    ours(x).sum().backward()
    torch.optim.SGD(ours.parameters(), lr=0.1).step()
    fresh = Outer(_net(seed=4))
    fresh.load_state_dict(ours.state_dict())
    assert all(torch.equal(a, b) for a, b in zip(fresh.state_dict().values(), ours.state_dict().values()))
    again = copy.deepcopy(ours)
    again.load_state_dict(plain.state_dict())
    assert all(torch.equal(a, b) for a, b in zip(again.state_dict().values(), plain.state_dict().values()))
    old = {re.sub(r"^body\.", "body.model.", k): v for k, v in fresh.state_dict().items()}
    again.load_state_dict(old)
    assert all(torch.equal(a, b) for a, b in zip(again.state_dict().values(), fresh.state_dict().values()))
    alone = recompute.optimize(_net(seed=4), method=method)
    alone.load_state_dict(_net().state_dict())
    assert list(alone.state_dict()) == list(_net().state_dict())
    assert all(torch.equal(a, b) for a, b in zip(alone.state_dict().values(), _net().state_dict().values()))


def test_a_checkpoint_of_a_model_that_holds_a_submodule_called_model_loads_both_ways():
    """Hugging Face's models hold their body as ``model``: ``model.layers…`` is then the model's own key,
    not the wrapper's."""
    def net() -> nn.Module:
        torch.manual_seed(0)
        m = nn.Module()
        m.model, m.head = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4)), nn.Linear(4, 2)
        m.forward = lambda x: m.head(m.model(x))
        return m

    plain, wrapped = net(), recompute.optimize(net())
    assert list(wrapped.state_dict()) == list(plain.state_dict()) == ["model.0.weight", "model.0.bias", "model.1.weight",
                                                                      "model.1.bias", "model.1.running_mean",
                                                                      "model.1.running_var", "model.1.num_batches_tracked",
                                                                      "head.weight", "head.bias"]
    state = {k: torch.full_like(v, 3) for k, v in plain.state_dict().items()}
    wrapped.load_state_dict(state)
    assert all(torch.equal(v, state[k]) for k, v in wrapped.state_dict().items())
    wrapped.load_state_dict({f"model.{k}": v for k, v in plain.state_dict().items()})  # the wrapper's own keys
    assert all(torch.equal(v, plain.state_dict()[k]) for k, v in wrapped.state_dict().items())


@pytest.mark.parametrize("copy_of", [copy.deepcopy, lambda m: pickle.loads(pickle.dumps(m))], ids=["deepcopy", "pickle"])
@pytest.mark.parametrize("method", ["approxdp", "torch_checkpoint_sequential", "torch_sac"])
def test_a_copy_of_a_model_with_an_optimized_body_trains_itself_as_plain(method, copy_of):
    """``copy.deepcopy`` (an EMA twin, the best model so far) and ``pickle`` (``torch.save(model)``)
    of a model whose body is optimized and has trained: the copy trains its own parameters, as a copy
    of the plain model does, and leaves the original's alone. (PyTorch's methods update BatchNorm's
    statistics again when they recompute: their buffers are left out.)"""
    plain = Outer(_net())
    ours = copy.deepcopy(plain)
    ours.body = recompute.optimize(ours.body, (torch.randn(6, 8),), method=method)
    x = torch.randn(6, 8)
    for m in (plain, ours):
        m(x).sum().backward()
        m.zero_grad(set_to_none=True)
    twin, plain_twin = copy_of(ours), copy_of(plain)
    if method == "approxdp":
        _same_step(plain_twin, twin, (x,))
    else:
        ref = train_step(plain_twin, plain_twin, (x,), seed=3)
        got = {k.replace("body.model.", "body."): v for k, v in train_step(twin, twin, (x,), seed=3).items()}
        for key in (k for k in ref if not k.startswith("buffer:")):
            torch.testing.assert_close(got[key], ref[key], msg=key)
    assert all(p.grad is None for p in ours.parameters())


@pytest.mark.parametrize("method", ["torch_checkpoint_sequential", "torch_sac"])
def test_pytorchs_methods_follow_a_module_replaced_after_optimize(method):
    """``checkpoint_sequential``'s stages are an fx graph of the model as it was: a module replaced
    since would run its old self, silently."""
    plain = _net()
    ours = copy.deepcopy(plain)
    wrapped = recompute.optimize(ours, method=method)
    x = torch.randn(6, 8)
    for m in (plain, ours):
        m[2] = nn.Tanh()
    ref = train_step(plain, plain, (x,), seed=3)
    got = {k.replace(":model.", ":"): v for k, v in train_step(ours, wrapped, (x,), seed=3).items()}
    for key in (k for k in ref if not k.startswith("buffer:")):  # they update BatchNorm's statistics twice
        torch.testing.assert_close(got[key], ref[key], msg=key)


def test_a_gradient_penalty_is_refused_not_trained_without_gradients():
    """Double backpropagation (``create_graph=True``) through a planned step would give the parameters
    no gradient, silently: it is refused, saying what to do."""
    wrapped = recompute.optimize(nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1)), (torch.randn(5, 4),))
    x = torch.randn(5, 4, requires_grad=True)
    with pytest.raises(RuntimeError, match=r"first-order gradients only.*create_graph=True.*plain model"):
        torch.autograd.grad(wrapped(x).sum(), x, create_graph=True)
    (g,) = torch.autograd.grad(wrapped(x).sum(), x)  # first order: as plain training
    (h,) = torch.autograd.grad(wrapped.model(x).sum(), x)
    assert torch.equal(g, h)


def test_a_second_backward_through_a_retained_step_is_refused_saying_what_to_do():
    wrapped = recompute.optimize(nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2)), (torch.randn(5, 4),))
    out = wrapped(torch.randn(5, 4))
    out[:, 0].sum().backward(retain_graph=True)
    with pytest.raises(RuntimeError, match=r"already run backward.*add the losses and call backward once"):
        out[:, 1].sum().backward()


@pytest.mark.parametrize("cost_model", ["paper", "measured"])
def test_first_step_at_a_new_shape_draws_plain_trainings_masks(cost_model):
    # measured: timing the ops (inside this step) draws random inputs and runs the dropout
    plain = _net()
    wrapped = recompute.optimize(copy.deepcopy(plain), (torch.randn(2, 8),), cost_model=cost_model)
    _same_step(plain, wrapped, (torch.randn(6, 8),))  # traced inside this step, at batch 6


class _Recurrent(nn.Module):
    def __init__(self, cell: type[nn.RNNBase], dropout: float = 0.0):
        super().__init__()
        torch.manual_seed(0)
        self.rnn, self.head = cell(8, 16, num_layers=2, batch_first=True, dropout=dropout), nn.Linear(16, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y, _ = self.rnn(x)
        return self.head(y[:, -1])


@pytest.mark.parametrize("cell", [nn.LSTM, nn.GRU])
def test_recurrent_networks_are_planned_and_as_close_to_float64_as_eager(cell):
    """The traced RNN runs decomposed kernels (eager runs a fused one): not bitwise, so the yardstick
    is the float64 step."""
    model = _Recurrent(cell)
    wrapped = recompute.optimize(model, (torch.randn(4, 5, 8),))
    ours, eager = float64_distance(model, wrapped, (torch.randn(4, 5, 8, requires_grad=True),))
    assert wrapped.last is not None
    assert ours <= 2 * eager + 1e-7, (ours, eager)


@pytest.mark.parametrize("cell", [nn.LSTM, nn.GRU])
def test_a_recurrent_network_trains_on_data_without_gradient_and_is_planned_once(cell):
    """The usual case: the inputs are data, no gradient; the backward of the traced RNN got None for a
    workspace it needs. And tracing rebuilt the RNN's flat weights, a new key at every call: the step
    traced and planned again every time (~1 s against 1 ms plain), RetraceWarning from the ninth."""
    model = _Recurrent(cell)
    wrapped = recompute.optimize(model)
    x = torch.randn(4, 5, 8)
    for _ in range(3):
        ours, eager = float64_distance(model, wrapped, (x,))
        assert ours <= 2 * eager + 1e-7, (ours, eager)
    assert wrapped._traced == 1


@pytest.mark.parametrize("cell", [nn.LSTM, nn.GRU])
def test_a_recurrent_network_is_planned_under_the_compile_backend(cell):
    """Dynamo runs RNN modules outside its graphs unless ``allow_rnn``: no plan reached them, no word said."""
    torch._dynamo.reset()
    model, backend = _Recurrent(cell), recompute.backend("approxdp")
    ours, eager = float64_distance(model, torch.compile(model, backend=backend), (torch.randn(4, 5, 8),))
    torch._dynamo.reset()
    assert backend.partitions and backend.partitions[-1].plan.recomputed()
    assert ours <= 2 * eager + 1e-7, (ours, eager)


class _Branchy(nn.Module):
    """Python control flow on a tensor's value: no whole-step trace takes it."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.body, self.left, self.right = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 32)), nn.Linear(32, 1), nn.Linear(32, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.body(x)
        return self.left(h) if h.sum() > 0 else self.right(h)


@pytest.mark.parametrize("method", ["auto", "approxdp"])
def test_a_step_no_trace_takes_whole_is_captured_by_dynamo_and_trains_as_plain(method):
    torch._dynamo.reset()
    plain, x = _Branchy(), torch.randn(8, 16)
    with pytest.warns(CaptureWarning, match="captured by TorchDynamo"):
        wrapped = recompute.optimize(copy.deepcopy(plain), (x,), method=method)
    assert wrapped.capture == "dynamo"
    _same_step(plain, wrapped, (x,))
    assert wrapped.plan.method == method  # planned when dynamo compiled, at the first step
    torch._dynamo.reset()


class _Configured(nn.Module):
    """A forward that reads a setting from a config object, as Hugging Face's layers read ``self.config``."""

    def __init__(self, config: Any):
        super().__init__()
        torch.manual_seed(0)
        self.config, self.fc, self.out = config, nn.Linear(8, 8), nn.Linear(8, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scale = self.config["scale"] if isinstance(self.config, dict) else self.config.scale
        return self.out(torch.relu(self.fc(x)) * scale)


@dataclasses.dataclass
class _Config:
    scale: float = 0.5


@pytest.mark.parametrize("config", [{"scale": 0.5}, types.SimpleNamespace(scale=0.5), _Config()],
                         ids=["dict", "namespace", "dataclass"])
def test_a_setting_changed_inside_a_config_object_plans_again(config):
    """The old plan had run silently (loss 0.0220 against plain training's 0.1956)."""
    plain = _Configured(copy.deepcopy(config))
    wrapped = recompute.optimize(_Configured(config), method="approxdp")
    x = torch.randn(4, 8)
    _same_step(plain, wrapped, (x,))
    for c in (config, plain.config):
        if isinstance(c, dict):
            c["scale"] = 0.1
        else:
            c.scale = 0.1
    first = wrapped._last_key
    _same_step(plain, wrapped, (x,))
    assert wrapped._traced == 2
    assert _what_changed(first, wrapped._last_key).endswith("['scale'] 0.5 → 0.1" if isinstance(config, dict)
                                                            else ".scale 0.5 → 0.1")


def test_rnn_dropout_that_tracing_would_drop_is_refused():
    with pytest.raises(recompute.TraceError, match=r"rnn \(dropout=0.2\).*dropout=0"):
        recompute.optimize(_Recurrent(nn.LSTM, dropout=0.2), (torch.randn(4, 5, 8),))


class _Pair(nn.Module):
    def __init__(self, second):
        super().__init__()
        self.lin, self.second = nn.Linear(4, 4), second

    def forward(self, x):
        y = self.lin(x)
        return None if self.second == "none" else (y, self.second)


class _Predicts(nn.Module):
    """Returns its predictions and their confidence (no gradient) beside the logits."""

    def __init__(self, logits_too: bool = True):
        super().__init__()
        torch.manual_seed(0)
        self.body, self.logits_too = _net(), logits_too

    def forward(self, x):
        logits = self.body(x)
        with torch.no_grad():
            confidence = logits.softmax(-1).amax(-1)
        return (logits, logits.argmax(-1), confidence) if self.logits_too else logits.argmax(-1)


@pytest.mark.parametrize("method", ["approxdp", "chen", "milp"])
def test_outputs_without_gradient_beside_the_logits_are_returned_and_the_step_trains_as_plain(method):
    """They were refused ("a planned step differentiates every output"); now they are computed in the
    planned forward, returned as plain training returns them, and get no gradient."""
    plain = _Predicts()
    ours = recompute.optimize(copy.deepcopy(plain), method=method)
    x = torch.randn(6, 8)
    out = [(torch.manual_seed(2), m(x))[1] for m in (plain, ours)]  # one forward each, the same dropout masks
    ref, out = out
    assert all(torch.equal(a, b) for a, b in zip(ref, out))
    assert [t.requires_grad for t in out] == [True, False, False] and out[1].dtype == torch.int64
    for seed in (3, 4):
        _same_step(plain, ours, (x,), seed=seed)
        plain.zero_grad(set_to_none=True), ours.zero_grad(set_to_none=True)


class _TiedEmbeddings(nn.Module):
    """A language model's tied input and output embeddings: one parameter in two modules."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.emb, self.mid, self.out = nn.Embedding(20, 8), nn.Linear(8, 8), nn.Linear(8, 20, bias=False)
        self.out.weight = self.emb.weight

    def forward(self, ids):
        return self.out(torch.relu(self.mid(self.emb(ids)))).mean(1)


@pytest.mark.parametrize("method", ["approxdp", "chen", "revolve"])
def test_tied_embeddings_train_as_plain_and_are_measured_once(method):
    """They were refused ("does not support tied parameters yet"); the traced step holds the one
    tensor once, its gradient the sum of both uses. The ``fake`` backend swapped each name for a fake
    of its own (``functional_call`` refused two values for tied names) and counted the bytes twice."""
    plain = _TiedEmbeddings()
    ours = recompute.optimize(copy.deepcopy(plain), method=method)
    for seed in (3, 4):
        ids = torch.randint(0, 20, (4, 5))
        _same_step(plain, ours, (ids,), seed=seed)
        plain.zero_grad(set_to_none=True), ours.zero_grad(set_to_none=True)
    fake, cpu = (recompute.measure(ours.model, (ids,), runner=ours, backend=b) for b in ("fake", "cpu"))
    assert fake.peak_bytes == cpu.storage_peak_bytes and fake.param_bytes == sum(p.numel() * 4 for p in plain.parameters())


def test_the_fake_backend_measures_an_optimized_module_after_its_first_call_plans():
    """Its first call at new shapes traces and plans: outside the metered step, as on the cpu backend."""
    ids = torch.randint(0, 20, (4, 5))
    peaks = [recompute.measure(m.model, (ids,), runner=m, backend=b).peak_bytes
             for m, b in ((recompute.optimize(_TiedEmbeddings()), "fake"), (recompute.optimize(_TiedEmbeddings()), "cpu"))]
    assert peaks[0] == peaks[1]


class _Captures(nn.Module):
    """Reads a tensor that requires grad but is not registered: it would get no gradient."""

    def __init__(self):
        super().__init__()
        self.lin, self.__dict__["outside"] = nn.Linear(4, 4), nn.Parameter(torch.ones(4))

    def forward(self, x):
        return self.lin(x) * self.outside


@pytest.mark.parametrize("model, x, says", [
    (_Captures(), torch.randn(2, 4), "reads a tensor that is not its parameter, buffer or input"),
    (nn.ReLU(), torch.randn(2, 4), "nothing in the step of ReLU requires grad"),
    (_Pair(3), torch.randn(2, 4), "returned int 3 as output[1]"),
    (_Pair("none"), torch.randn(2, 4), "returned None"),
    (_Predicts(logits_too=False), torch.randn(2, 8), "no output of _Predicts requires grad"),
    (nn.Linear(4, 4), torch.randn(2, 4, dtype=torch.float64), "input 0 is torch.float64 while the parameters are torch.float32"),
    (nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4)), torch.randn(1, 4), "Expected more than 1 value per channel"),
    (nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4, momentum=None)), torch.randn(3, 4),
     "momentum=None (1): their cumulative average"),
])
def test_bad_models_and_inputs_say_what_is_wrong_not_control_flow(model, x, says):
    with pytest.raises(recompute.TraceError) as err:
        recompute.optimize(model, (x,))
    assert says in str(err.value)
    assert "control flow" not in str(err.value)


def test_a_parameter_free_model_trains_its_input():
    plain = nn.Sequential(nn.Tanh(), nn.Softplus())
    x = torch.randn(3, 4, requires_grad=True)
    _same_step(plain, recompute.optimize(copy.deepcopy(plain), (x,)), (x,))


def test_inference_calls_the_model_unchanged():
    wrapped = recompute.optimize(_net(), (torch.randn(6, 8),))
    with torch.no_grad():
        wrapped(torch.randn(3, 8))
    assert len(wrapped._executors) == 1


def test_autocast_retraces_and_trains_as_plain_autocast():
    plain = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    ours = copy.deepcopy(plain)
    wrapped = recompute.optimize(ours, (torch.randn(4, 8),))
    x = torch.randn(4, 8)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        a, b = plain(x), wrapped(x)
    assert b.dtype == torch.bfloat16 and torch.equal(a, b)
    a.float().pow(2).mean().backward()
    b.float().pow(2).mean().backward()
    for p, q in zip(plain.parameters(), ours.parameters()):
        assert torch.equal(p.grad, q.grad)


ON_CUDA = pytest.param("cuda", marks=[pytest.mark.cuda,
                                      pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")])


@pytest.mark.parametrize("options", [{}, {"recompute_late": True}, {"recompute_late": True, "in_place": True},
                                     {"recompute_at_peak": True, "in_place": True, "split_convolutions": True}],
                         ids=["", "late", "late, in place", "at the peak, in place, split convolutions"])
@pytest.mark.parametrize("device", ["cpu", ON_CUDA])
def test_a_dense_backbone_planned_in_eval_trains_as_plain_inside_a_larger_model_at_a_new_shape(device, options,
                                                                                              monkeypatch):
    """All of the above at once, on a convolutional backbone with dropout (torchvision's dense block), on
    the CPU and on a GPU (cuDNN asked for its deterministic kernels, as plain training would be). On the
    GPU eager BatchNorm runs cuDNN's kernels and the traced step PyTorch's own
    (``_native_batch_norm_legit_functional``), which round otherwise: the loss and the dropout masks are
    bitwise plain training's there, the gradients and statistics within float32's tolerance."""
    from torchvision.models.densenet import _DenseBlock

    monkeypatch.setattr(torch.backends.cudnn, "deterministic", True)
    monkeypatch.setattr(torch.backends.cudnn, "benchmark", False)
    torch.manual_seed(0)
    body = nn.Sequential(_DenseBlock(num_layers=4, num_input_features=8, bn_size=2, growth_rate=4, drop_rate=0.2),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(24, 4))
    plain = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), body).to(device)
    ours = copy.deepcopy(plain).eval()
    ours[1] = recompute.optimize(ours[1], (torch.randn(2, 8, 16, 16, device=device),), method="chen", **options)
    ours.train()
    _same_step(plain, ours, (torch.randn(4, 3, 16, 16, device=device, requires_grad=True),), bitwise=device == "cpu")
    assert ours[1].last is not None and ours[0].weight.grad.norm() > 0
    assert (ours[1].plan.info.get("in place", 0) > 0) == options.get("in_place", False)
