"""Hugging Face models as their users train them: ``recompute.optimize(model, (ids,))`` and then
``model(ids, labels=labels).loss.backward()``, two SGD steps against plain training's, bitwise. Built
from configs at a small size (nothing downloaded), dropout on."""

from __future__ import annotations

import copy
import warnings

import pytest
import torch

import recompute
from recompute.doors.optimize import CacheWarning

transformers = pytest.importorskip("transformers")

SMALL = dict(vocab_size=100, bos_token_id=0, eos_token_id=0, pad_token_id=0)
DECODER = dict(SMALL, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4)
MODELS = {
    "gpt2": lambda: transformers.GPT2LMHeadModel(transformers.GPT2Config(**SMALL, n_layer=2, n_embd=64, n_head=4, n_positions=64)),
    "llama": lambda: transformers.LlamaForCausalLM(transformers.LlamaConfig(**DECODER, num_key_value_heads=2)),
    "bert": lambda: transformers.BertForMaskedLM(transformers.BertConfig(**DECODER)),
    "t5": lambda: transformers.T5ForConditionalGeneration(transformers.T5Config(
        **SMALL, d_model=64, d_ff=128, d_kv=16, num_layers=2, num_heads=4, decoder_start_token_id=0)),
}


def _steps(model: torch.nn.Module, call, ids: torch.Tensor, labels: torch.Tensor) -> list[dict[str, torch.Tensor]]:
    """Two SGD steps of ``call(ids, labels=labels).loss``: each step's loss and gradients."""
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    out = []
    for step in range(2):
        torch.manual_seed(step)
        opt.zero_grad(set_to_none=True)
        loss = call(ids, labels=labels).loss
        loss.backward()
        out.append({"loss": loss.detach(), **{n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}})
        opt.step()
    return out


@pytest.mark.parametrize("name", list(MODELS))
def test_a_hugging_face_model_trains_through_optimize_like_plain_training(name):
    torch.manual_seed(0)
    plain = MODELS[name]().train()
    model = copy.deepcopy(plain)
    ids, labels = torch.randint(0, 100, (2, 16)), torch.randint(0, 100, (2, 16))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CacheWarning)  # said once per call site; the training loop is the user's
        # T5 needs its decoder's input (labels=) too: it plans at its first call
        m = recompute.optimize(model) if name == "t5" else recompute.optimize(model, (ids,))
        got = _steps(model, m, ids, labels)
    want = _steps(plain, plain, ids, labels)
    assert m.plan.method == "auto" and len(m._executors) >= 1
    for step, (a, b) in enumerate(zip(want, got)):
        assert a.keys() == b.keys()
        for key in a:
            assert torch.equal(a[key], b[key]), f"step {step}: {key}"


def test_a_training_call_gets_use_cache_false_and_says_so():
    """A planned step returns tensors: as Hugging Face's gradient checkpointing, the call is made with
    use_cache=False; a cache the model returns anyway (a wrapper that does not pass it on) is None."""
    torch.manual_seed(0)
    model = MODELS["gpt2"]().train()
    ids = torch.randint(0, 100, (2, 16))
    m = recompute.optimize(model, method="approxdp")
    with pytest.warns(CacheWarning, match="use_cache=False"):
        out = m(ids)
    assert out.past_key_values is None and out.logits.shape == (2, 16, 100)

    class Wrapper(torch.nn.Module):
        def __init__(self, inner: torch.nn.Module) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, x: torch.Tensor):
            return self.inner(x)  # the inner model's default: use_cache=True

    from recompute.capture.joint import CacheDropped

    with pytest.warns(CacheDropped, match="DynamicCache"):
        out = recompute.optimize(Wrapper(model), method="approxdp")(ids)
    assert out.past_key_values is None


class _OwnCheckpoint(torch.nn.Module):
    """A model that checkpoints a region itself, as a Hugging Face model does after
    ``gradient_checkpointing_enable()``."""

    def __init__(self, reentrant: bool) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.inner = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.BatchNorm1d(16), torch.nn.ReLU())
        self.head, self.reentrant = torch.nn.Linear(16, 1), reentrant

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.utils.checkpoint.checkpoint(self.inner, x, use_reentrant=self.reentrant))


@pytest.mark.parametrize("reentrant", [False, True])
def test_a_model_that_checkpoints_itself_is_measured_on_the_fake_backend(reentrant):
    """Its backward recomputes the region on the model's tensors: the fake backend swaps them for the
    whole step, not for the forward call alone (it had raised FakeTensor's 'convert all Tensors to
    FakeTensors first', and Hugging Face's GPT-2 at 124M was killed by the kernel at 22.7 GB instead)."""
    model, x = _OwnCheckpoint(reentrant), torch.randn(8, 16, requires_grad=True)
    fake = recompute.measure(model, (x,), backend="fake")
    cpu = recompute.measure(model, (x,), backend="cpu", iterations=1)
    assert fake.peak_bytes == cpu.storage_peak_bytes > 0
    sac = recompute.optimize(model, method="torch_sac")
    assert recompute.measure(model, (x,), runner=sac, backend="fake").peak_bytes > 0


def test_a_model_that_checkpoints_itself_is_planned_with_a_word_on_batchnorm():
    from recompute.doors.exactness import compare
    from recompute.capture.joint import OwnCheckpoints

    model, x = _OwnCheckpoint(reentrant=False), torch.randn(8, 16)
    with pytest.warns(OwnCheckpoints, match="statistics once per step"):
        m = recompute.optimize(model, (x,), method="approxdp")
    # eager's recomputation updated BatchNorm's statistics a second time; the planned step once
    assert compare(model, m, (x,)).summary() == "differs: 3 buffers"
    with pytest.raises(recompute.TraceError, match="(?s)use_reentrant=True.*use_reentrant=False"):
        recompute.optimize(_OwnCheckpoint(reentrant=True), (x.requires_grad_(),), method="approxdp")


def test_hugging_face_gradient_checkpointing_is_priced_at_scale():
    model = MODELS["gpt2"]().train()
    model.config.use_cache = False
    plain = recompute.measure(model, (torch.randint(0, 100, (4, 64)),), backend="fake")
    model.gradient_checkpointing_enable()
    ids = torch.randint(0, 100, (4, 64))
    checkpointed = recompute.measure(model, (ids,), backend="fake")
    assert checkpointed.activation_peak_bytes < plain.activation_peak_bytes


def test_the_llm_benchmark_finds_the_longest_sequence_each_method_fits(tmp_path, monkeypatch):
    from benchmarks import llm

    for peak in (lambda n: 1000 + 3 * n, lambda n: 10**6 + 50 * n + n * n // 7):  # linear, and a T × T term
        for budget in (1000 + 3 * 1000, 10**6 + 3 * 10**5, 2 * 10**7, 10**10):
            for known in ((), (1024,), (256, 4096)):
                probed = []
                found = llm._longest(lambda n: probed.append(n) or peak(n), budget, cap=2**15, known=known)
                fits = [n for n in range(128, 2**15 + 1, 128) if peak(n) <= budget]
                assert found == (fits[-1] if fits else None), (budget, known)
                assert len(set(probed)) <= 16  # interpolation, where bisection from 128 would take up to 16
    tiny = llm.LanguageModel("tiny GPT-2", 2, 128, lambda length: transformers.GPT2LMHeadModel(
        transformers.GPT2Config(**SMALL, n_layer=2, n_embd=64, n_head=4, n_positions=max(length, 128), use_cache=False)))
    methods = ["eager", "Hugging Face gradient checkpointing", "ours (default goal, time in FLOPs)"]
    plain, hf, ours = llm.run_model(tiny, methods, [2**23], commit="c", peaks=llm.Peaks(tmp_path / "peaks.json", "c"))
    assert ours.peak_with_params < plain.peak_with_params  # planned at 128 tokens, priced on the fake backend
    assert plain.time == 1 and 1 < ours.time <= 1.3  # the default goal: the least peak within 1.3× plain training
    assert 1.25 < hf.time < 1.35  # every layer's forward once more: its matrix products counted in the real step
    assert plain.longest == {"0.0078125 GiB": None} and ours.longest == {"0.0078125 GiB": 128}  # 8 MiB
    monkeypatch.setitem(llm.METHODS, "eager", None)  # a resumed run prices nothing it has stored
    again = llm.run_model(tiny, methods[:1], [2**23], commit="c", peaks=llm.Peaks(tmp_path / "peaks.json", "c"))[0]
    assert (again.peak_with_params, again.time, again.longest) == (plain.peak_with_params, plain.time, plain.longest)
    assert llm.Peaks(tmp_path / "peaks.json", "another commit").steps == {}
    with pytest.raises(SystemExit, match="holds no step 'tiny GPT-2 | eager | 256' priced at c: run without --priced-at"):
        llm.Peaks(tmp_path / "peaks.json", "c", stored_only=True).get("tiny GPT-2 | eager | 256", lambda: llm.Step(0))
