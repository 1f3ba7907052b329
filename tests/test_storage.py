"""The storage table and the pricing of a (forward, backward) module pair against a real CPU step."""

from __future__ import annotations

import operator

import pytest
import torch
from functorch.compile import aot_function, default_partition, make_boxed_func, min_cut_rematerialization_partition
from torch.fx.experimental.proxy_tensor import make_fx
from torch.fx.graph import _BoxedCodeGen

from recompute.doors.measure import MemoryMeter
from recompute.pricing.simulate import simulate_partition
from recompute.core.storage import StorageTable


def _step(w1: torch.Tensor, w2: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    h = torch.nn.functional.layer_norm(torch.relu(x @ w1), (w1.shape[1],))  # a multi-output op
    return (torch.tanh(h @ w2) * 2).sum(1)


def _partition(partition_fn) -> tuple[torch.fx.GraphModule, torch.fx.GraphModule, tuple[torch.Tensor, ...]]:
    """AOTAutograd's forward and backward modules of ``_step`` and its arguments."""
    torch.manual_seed(0)
    args = (torch.randn(16, 24, requires_grad=True), torch.randn(24, 8, requires_grad=True), torch.randn(32, 16))
    graphs: dict[str, torch.fx.GraphModule] = {}

    def grab(kind: str):
        def compiler(gm: torch.fx.GraphModule, example_inputs):
            graphs[kind] = gm
            return make_boxed_func(gm.forward)
        return compiler

    aot_function(_step, fw_compiler=grab("fw"), bw_compiler=grab("bw"), partition_fn=partition_fn)(*args).sum().backward()
    return graphs["fw"], graphs["bw"], args


def test_views_and_getitems_share_their_base_storage():
    def f(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        out, mean, rstd = torch.native_layer_norm(torch.relu(x), [24], None, None, 1e-5)
        return out.t() @ x, mean * rstd

    gm = make_fx(f)(torch.randn(32, 24))
    table = StorageTable.build(gm.graph.nodes)
    norm = next(x for x in gm.graph.nodes if x.target is torch.ops.aten.native_layer_norm.default)
    relu = next(x for x in gm.graph.nodes if x.target is torch.ops.aten.relu.default)
    assert len(table.made[norm]) == 3 and table.of[norm] == table.made[norm]  # one storage per output
    items = {x.args[1]: x for x in norm.users if x.target is operator.getitem}
    for i, item in items.items():
        assert table.of[item] == (table.made[norm][i],) and item not in table.made  # one element, no allocation
    (view,) = [x for x in items[0].users if x.target is torch.ops.aten.t.default]
    assert table.of[view] == table.of[items[0]] and view not in table.made  # a view keeps its base alive
    (mm,) = view.users
    # read by the getitems (each reads the whole tuple), through the view, and by the view's reader
    expected = {*items.values(), view, mm}
    assert table.readers[table.made[norm][0]] == tuple(x for x in gm.graph.nodes if x in expected)
    assert table.reads(mm) == (*table.made[norm][:1], *table.of[next(iter(gm.graph.nodes))])
    assert table.nbytes(relu) == 32 * 24 * 4 and table.nbytes(items[0]) == table.nbytes(view) == 0


@pytest.mark.parametrize("partition_fn", [default_partition, min_cut_rematerialization_partition])
@pytest.mark.parametrize("steal", [False, True])
def test_partition_peak_equals_a_cpu_step(partition_fn, steal):
    """The simulated peak of the pair equals the metered peak of running it: saved values held through
    the backward (plain call) or freed after their last read (the backward steals its arguments)."""
    fw, bw, args = _partition(partition_fn)
    if steal:
        bw.graph.set_codegen(_BoxedCodeGen())
        bw.recompile()
    meter = MemoryMeter()
    meter.exclude(args)
    with torch.no_grad(), meter:
        outs = list(fw(*args))
        loss, saved = outs[0], outs[1:]
        del outs
        tangent = torch.ones_like(loss)  # held by the caller (autograd) until the backward returns
        if steal:
            inputs = [*saved, tangent]
            del saved
            grads = bw(inputs)
        else:
            grads = bw(*saved, tangent)
    assert all(g is None or g.shape == a.shape for g, a in zip(grads, args))
    assert simulate_partition(fw, bw, hold_saved=not steal).peak == meter.peak
    assert simulate_partition(fw, bw, hold_saved=True).peak > simulate_partition(fw, bw).peak


def test_partition_received_names_a_forward_node():
    fw, bw, _ = _partition(default_partition)
    saved = next(x.name for x in bw.graph.nodes if x.op == "placeholder")
    with pytest.raises(ValueError, match=f"received\\[{saved!r}\\] = 'nowhere'"):
        simulate_partition(fw, bw, received={saved: "nowhere"})
