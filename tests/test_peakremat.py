"""Recomputation where the peak is (``recompute.peakremat``) and split convolution backwards
(``recompute.convsplit``): the step they make holds less, is the one that runs (simulated = measured)
and trains as plain training does."""

from __future__ import annotations

import collections
import dataclasses
import math

import pytest
import torch

import recompute
from recompute.capture.convsplit import SPLIT_FROM
from recompute.doors.exactness import compare
from recompute.rewrites.inplace import simulated_in_place
from recompute.doors.measure import default_loss, measure
from recompute.rewrites.peak import computed_again, needed_splits, recompute_at_peak, sunk
from recompute.pricing.schedule import recomputation_cost
from recompute.pricing.simulate import simulate

from .test_remat import _Bottlenecks
from recompute.rewrites.pipeline import with_in_place, with_peak_recompute, with_rewrites


class _FirstBlock(torch.nn.Module):
    """VGG's first block and one more: two convolutions at the input's size, a max-pool, a smaller
    convolution, a classifier. Its second convolution's backward reads the first ReLU's output, the
    largest map of the step, beside its output's gradient."""

    def __init__(self, c: int = 16):
        super().__init__()
        self.f = torch.nn.Sequential(
            torch.nn.Conv2d(3, c, 3, padding=1), torch.nn.ReLU(), torch.nn.Conv2d(c, c, 3, padding=1), torch.nn.ReLU(),
            torch.nn.MaxPool2d(2), torch.nn.Conv2d(c, 2 * c, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
            torch.nn.Flatten(), torch.nn.Linear(2 * c * 8 * 8, 10))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.f(x)


def test_the_first_block_is_recomputed_twice_where_the_split_backward_lets_the_peak_fall():
    """With the second convolution's backward split, the pass frees the first ReLU's output before
    that convolution's input gradient is made and computes it twice more, for the weight gradient and
    for the ReLU's own backward: a peak no lower-set plan reaches, bitwise plain training's step, the
    measured peak the predicted one."""
    torch.manual_seed(0)
    model, inputs = _FirstBlock(), (torch.randn(4, 3, 32, 32),)
    peaks = {}
    for split in (False, True):
        g = recompute.trace(model, inputs, loss_fn=default_loss, split_convolutions=split, workspaces=False)
        p = recompute.plan(g, "approxdp", strategy="tc")
        q = with_rewrites(p, g, recompute_at_peak=True, in_place=True)
        assert q.peak < with_in_place(p, g).peak
        runner = recompute.execute(g, q, model)
        assert measure(model, inputs, runner=runner, backend="cpu").storage_peak_bytes == q.peak
        assert measure(model, inputs, runner=runner, backend="fake").peak_bytes == q.peak
        assert compare(model, runner, inputs).bitwise
        assert q.overhead == p.overhead + q.info["recomputed at the peak"] > p.overhead
        peaks[split] = q.peak
        copies = collections.Counter(name for name, copy in q.runs(g).steps if copy > 0)
        if split:
            assert copies["convolution"] == 2  # the first convolution, run three times in all
            assert needed_splits(g.program, q.runs(g), simulated_in_place(g.program)) == {"convolution_backward_1"}
    assert peaks[True] < peaks[False]


@pytest.mark.parametrize("model, inputs", [(_Bottlenecks(), (torch.randn(2, 3, 16, 16),)),
                                           (_FirstBlock(8), (torch.randn(2, 3, 32, 32),))])
def test_the_pass_never_raises_the_peak_and_adds_at_most_its_limit(model, inputs):
    """From every plan, judged as planned and in place: the peak never rises, the recomputation added
    stays within ``limit`` (0: recomputations only moved to their readers), and each step still reads
    only what an earlier step made."""
    g = recompute.trace(model, inputs, loss_fn=default_loss)
    p = g.program
    for method, strategy in (("vanilla", None), ("chen", None), ("approxdp", "tc"), ("approxdp", "mc")):
        s = recompute.plan(g, method, strategy=strategy).runs(g)
        for judge in (None, simulated_in_place(p)):
            before = (judge or (lambda t: simulate(p, t)))(s).peak
            for limit in (0, 5, math.inf):
                found = recompute_at_peak(g, s, limit=limit, simulated=judge)
                assert (judge or (lambda t: simulate(p, t)))(found).peak <= before
                assert recomputation_cost(g, found) - recomputation_cost(g, s) <= limit
                made = set(p.joint.tangents) | {n.name for n in p.joint.gm.graph.nodes if n.op in ("placeholder", "get_attr")}
                for step, reads in zip(found.steps, found.reads):
                    assert all(r[0] in made and r[1] == 0 or r in made for r in reads), (method, step)
                    made.add(step)


@pytest.mark.parametrize("limit, error, named", [
    (math.nan, ValueError, "limit must be a non-negative number of cost units .* or math.inf for no limit; got nan"),
    (-1, ValueError, "got -1"),
    ("5", TypeError, "limit must be a number of cost units .*, got a str '5'"),
])
def test_a_limit_that_is_no_number_of_cost_units_is_refused(limit, error, named):
    """NaN fails every comparison with the cost added, so the pass would take it as no limit at all."""
    g = recompute.trace(_FirstBlock(8), (torch.randn(2, 3, 32, 32),), loss_fn=default_loss)
    with pytest.raises(error, match=named):
        with_peak_recompute(recompute.plan(g, "chen"), g, limit=limit)


def test_sinking_and_computing_again_keep_what_each_step_reads():
    """A recomputation moves right before its first reader; a value computed again before a later
    read is read as the new copy from there on, the earlier reads keep the old one."""
    torch.manual_seed(0)
    model, inputs = _FirstBlock(8), (torch.randn(2, 3, 32, 32),)
    g = recompute.trace(model, inputs, loss_fn=default_loss, workspaces=False)
    s = recompute.plan(g, "approxdp", strategy="mc").runs(g)
    moved = sunk(g.program, s)
    assert sorted(moved.steps) == sorted(s.steps) and moved.steps != s.steps
    for i, inst in enumerate(moved.steps):
        if inst[1] > 0 and i >= moved.backward_start:
            first = next(j for j in range(i + 1, len(moved)) if inst in moved.reads[j])
            between = moved.steps[i + 1:first]
            assert all(x[1] > 0 for x in between), (inst, between)  # only recomputations sunk with it
    # the first ReLU's output, computed once more right before the second convolution's backward
    at = next(i for i, (name, _) in enumerate(s.steps) if name == "convolution_backward_1")
    relu = next(r for r in s.reads[at] if r[0] == "relu")
    again = computed_again(g.program, s, relu, at)
    assert again is not None and len(again) == len(s) + 2  # the convolution of the input, then the ReLU
    new = again.steps[at + 1]
    assert new[0] == "relu" and new[1] > relu[1] and new in again.reads[at + 2]
    assert all(new not in reads for reads in again.reads[:at])
    assert computed_again(g.program, s, relu, at, max_ops=1) is None


def test_split_convolutions_trains_like_the_fused_op_and_names_what_it_splits():
    """Every convolution backward that makes both gradients is split (bitwise on these shapes), or only
    those named; the optimizer-facing door takes both options, inside a larger model."""
    torch.manual_seed(0)
    model, inputs = _FirstBlock(8), (torch.randn(2, 3, 32, 32),)
    conv_backward = torch.ops.aten.convolution_backward.default

    def transposed(g: recompute.Graph) -> int:
        return sum(1 for n in g.program.joint.backward if n.target is torch.ops.aten.convolution.default)

    every = recompute.trace(model, inputs, loss_fn=default_loss, split_convolutions=True)
    assert transposed(every) == 2  # the first convolution's input (the image) needs no gradient
    names = [n.meta[SPLIT_FROM] for n in every.program.joint.backward if SPLIT_FROM in n.meta]
    assert all(every.program.joint.node(name).target is conv_backward for name in names)
    one = recompute.trace(model, inputs, loss_fn=default_loss, split_convolutions=[names[-1]])
    assert transposed(one) == 1
    for g in (every, one):
        assert compare(model, recompute.execute(g, recompute.plan(g, "vanilla"), model), inputs).bitwise
    with pytest.raises(TypeError, match="split_convolutions must be True, False or a collection"):
        recompute.trace(model, inputs, split_convolutions="convolution_backward_1")
    # a name that is no convolution backward of this step (misspelt, another model's) would split nothing
    with pytest.raises(ValueError, match=r"split_convolutions names 'unknown', not a convolution backward of the "
                                         r"traced step; its convolution backwards: convolution_backward, "
                                         r"convolution_backward_1, convolution_backward_2 \("):
        recompute.trace(model, inputs, split_convolutions=[names[-1], "unknown"])
    outer = torch.nn.Sequential(torch.nn.Conv2d(3, 3, 1), _FirstBlock(8))
    twin = torch.nn.Sequential(torch.nn.Conv2d(3, 3, 1), _FirstBlock(8))
    twin.load_state_dict(outer.state_dict())
    outer[1] = recompute.optimize(outer[1], method="approxdp", recompute_at_peak=True, in_place=True,
                                  split_convolutions=True)
    for m in (outer, twin):
        default_loss(m(inputs[0])).backward()
    for (name, a), b in zip(outer.named_parameters(), twin.parameters()):
        assert torch.equal(a.grad, b.grad), name
    with pytest.raises(ValueError, match="recompute_at_peak rewrites a plan's schedule; 'torch_sac'"):
        recompute.optimize(model, method="torch_sac", recompute_at_peak=True)


def test_values_whose_new_copy_cannot_change_the_score_are_not_judged(monkeypatch):
    """The search judges (simulates) only the candidates that might lower the peak: not a view of a
    parameter (``t(weight)`` of every Linear without bias, which frees nothing), nor a value that an
    alias holds through the last step at the peak. On a Llama-style decoder it judges under a quarter as many
    schedules and finds the same one."""
    from recompute.rewrites import peak

    g = recompute.trace(_llama(), (torch.randint(0, 256, (2, 64)),))
    s = recompute.plan(g, "approxdp", strategy="tc").runs(g)
    judged = collections.Counter()
    with_chain = peak._with_chain

    def counted(*args):
        judged[screened] += 1
        return with_chain(*args)

    monkeypatch.setattr(peak, "_with_chain", counted)
    found = {}
    for screened in (True, False):
        if not screened:
            monkeypatch.setattr(peak, "_unchanged_score", lambda *a: lambda inst, at: False)
        found[screened] = recompute_at_peak(g, s, simulated=simulated_in_place(g.program))
    assert found[True] == found[False]
    assert judged[True] * 4 < judged[False]


def _llama(layers: int = 3) -> torch.nn.Module:
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(
        hidden_size=64, intermediate_size=176, num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
        vocab_size=256, max_position_embeddings=512, use_cache=False)).train()


def test_a_value_made_again_in_the_forward_phase_leaves_the_backward_where_it_was():
    """``computed_again`` before a forward read inserts its ops in the forward phase: the backward
    starts that many steps later (else the forward's last ops, the model's outputs among them, would be
    run as backward ones), and the step trains bitwise at its simulated peak."""
    torch.manual_seed(0)
    model, inputs = _Bottlenecks(), (torch.randn(2, 3, 16, 16),)
    g = recompute.trace(model, inputs, loss_fn=default_loss, workspaces=False)
    p, s = g.program, recompute.plan(g, "vanilla").runs(g)
    reads = {}
    for step, rs in enumerate(s.reads[:s.backward_start]):
        for r in rs:
            reads.setdefault(r, []).append(step)
    inst, at = next((x, steps[1]) for x, steps in reads.items()
                    if len(steps) > 1 and x[0] in p.group and computed_again(p, s, x, steps[1]) is not None)
    t = computed_again(p, s, inst, at)
    added = len(t) - len(s)
    assert added > 0 and t.backward_start == s.backward_start + added
    assert t.steps[t.backward_start:] == s.steps[s.backward_start:]
    plan = dataclasses.replace(recompute.plan(g, "vanilla"), schedule=t, peak=simulate(p, t).peak)
    runner = recompute.execute(g, plan, model)
    assert measure(model, inputs, runner=runner, backend="fake").peak_bytes == plan.peak
    assert compare(model, runner, inputs).bitwise


def test_each_layers_attention_mask_is_made_again_where_it_is_read_not_held_through_the_step():
    """Hugging Face's decoders turn one boolean causal mask into a float one per layer (``where``, batch
    × T × T), all at the start of the traced forward, from the inputs alone: ops outside V, no T_v. The
    default plan makes each again before its layer's backward reads it, through the mask's whole chain
    of cheap ops (longer than ``max_ops``, which counts only ops of V and products), as Hugging Face's
    checkpointing does by running the layer again; held, the masks would make most of the peak."""
    model, ids = _llama(3), torch.randint(0, 256, (2, 128))
    m = recompute.optimize(model, (ids,), cost_model="flops")
    again = {name for name, copy in m.plan.runs(m.graph).steps if copy > 0 and name.startswith("where")}
    assert len(again) == 3, again
    model.gradient_checkpointing_enable()
    hf = measure(model, (ids,), backend="fake").peak_bytes
    model.gradient_checkpointing_disable()
    assert measure(model, (ids,), runner=m, backend="fake").peak_bytes < 1.1 * hf
    # bitwise or within float32 rounding: at this length even the plain traced step is only close (eager's
    # attention makes the float mask inside its kernel, the traced step by ``where``); the corpus test
    # trains Llama bitwise at 16 tokens
    assert compare(model, m, (ids,)).summary() in ("bitwise", "close")


class _Classifier(torch.nn.Module):
    """Convolutions, then a linear classifier whose weights outweigh every activation (VGG's shape)."""

    def __init__(self) -> None:
        super().__init__()
        self.features = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU(),
                                            torch.nn.Conv2d(8, 8, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2))
        self.head = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(8 * 16 * 16, 512), torch.nn.ReLU(),
                                        torch.nn.Linear(512, 10))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


def test_gradients_only_the_end_reads_are_made_after_the_peak():
    """The classifier's weight gradients, made first in the backward, wait for the convolutions' backward
    when they are made at the step's end: the peak falls to what the gradients and the ops that run with
    them hold, with nothing recomputed, measured as simulated, bitwise plain training's step."""
    from recompute.rewrites.peak import gradients_late

    torch.manual_seed(0)
    model, inputs = _Classifier(), (torch.randn(4, 3, 32, 32),)
    g = recompute.trace(model, inputs, loss_fn=default_loss, workspaces=False)
    p = recompute.plan(g, "vanilla")
    s = p.runs(g)
    t, sim = gradients_late(g.program, s, lambda x: simulate(g.program, x))
    assert sim.peak == simulate(g.program, t).peak < p.peak
    assert sorted(t.steps) == sorted(s.steps) and t.steps[-1][0] in g.program.joint.gradients
    grads = sum(q.numel() * 4 for q in model.parameters())
    assert sim.peak < grads + (p.peak - grads) / 2  # what the gradients leave: under half what eager adds to them
    q = with_rewrites(p, g, recompute_at_peak=True, in_place=True)
    assert q.peak <= with_in_place(dataclasses.replace(p, schedule=t), g).peak and q.overhead == p.overhead
    for plan in (dataclasses.replace(p, schedule=t, peak=sim.peak), q):
        runner = recompute.execute(g, plan, model)
        assert measure(model, inputs, runner=runner, backend="cpu").storage_peak_bytes == plan.peak
        assert measure(model, inputs, runner=runner, backend="fake").peak_bytes == plan.peak
        assert compare(model, runner, inputs).bitwise


@pytest.mark.parametrize("model", [_Classifier, _Bottlenecks])
def test_the_peak_of_gradients_moved_last_is_replayed_from_the_lifetimes_as_simulated(model):
    """``replay_moved_last``, which screens each move of :func:`gradients_late`, gives the simulation of
    the reordered schedule, for every op the step's end alone reads and what reads it, and for all at once."""
    from recompute.pricing.simulate import lifetimes, replay_moved_last
    from recompute.rewrites.peak import _for_the_end, _in_order

    torch.manual_seed(0)
    module = model()
    g = recompute.trace(module, (torch.randn(2, 3, 32, 32),), loss_fn=default_loss)
    for method in ("vanilla", "chen"):
        s = dataclasses.replace(recompute.plan(g, method).runs(g), release={})  # as recompute_at_peak takes it
        life, n = lifetimes(g.program, s), len(s)
        readers, end_only = _for_the_end(s, set(g.program.joint.gradients))
        closures = []
        for i in (i for i in range(n) if end_only[i]):
            moved, todo = {i}, [i]
            while todo:
                todo += [j for j in readers.get(s.steps[todo.pop()], ()) if j not in moved]
                moved.update(todo)
            closures.append(sorted(moved))
        closures.append([i for i in range(n) if end_only[i]])
        assert len(closures) > 3
        for moved in closures:
            order = [*(k for k in range(n) if k not in moved), *moved]
            want, got = simulate(g.program, _in_order(s, order)), replay_moved_last(s, life, moved)
            assert (got.peak, got.peak_step, list(got.live)) == (want.peak, want.peak_step, list(want.live))
