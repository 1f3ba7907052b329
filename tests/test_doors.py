"""Every registered planner through every door, generated from the registry (``recompute.planners.registry.spec``).

The doors (:class:`recompute.planners.registry.Door`): ``recompute.plan`` + ``recompute.execute``,
``recompute.optimize``, ``torch.compile(backend=recompute.backend(m))`` and the app (``python run.py
method=...``, run in-process). Each planner is taken through each door it serves on a tiny two-input
join network (11 nodes: small enough for ``exhaustive``, a join for ``join_dp``), and one training
step is compared with plain training: loss and parameter gradients bitwise. A door a planner refuses
in the registry refuses it by name. A planner registered here, in the test, is offered by every door
without any other edit: the registry is the only list.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import sys
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest
import torch
from hydra import compose, initialize_config_dir
from hydra.core.config_store import ConfigStore

import recompute
from experiments import config, runner
from experiments.record import Status
from experiments import nets
from recompute.doors import baselines
from recompute.doors.exactness import compare
from recompute.core.graph import Graph
from recompute.doors.measure import default_loss
from recompute.planners.registry import Door, Plan, Unserved, register, spec

ROOT = Path(__file__).resolve().parents[1]
REGISTRY = sys.modules["recompute.planners.registry"]  # the module (``recompute.plan`` is the function)
NET = "siamese"
TINY = dict(lengths=(1, 2), width=4)  # 11 nodes
PLANNERS = recompute.methods()


def _tiny() -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    return nets.build(NET, batch_size=2, input_size=8, seed=0, **TINY)


def _assert_bitwise(model: torch.nn.Module, forward: Callable[..., Any], inputs: tuple, what: str) -> None:
    result = compare(model, forward, inputs)
    assert result.bitwise, f"{what}: {result.summary()} ({', '.join(result.unequal)})"


def _refused(name: str, door: Door, call: Callable[[], Any]) -> None:
    """The door refuses a planner that says it cannot serve it, naming the planner, the door and why."""
    with pytest.raises(Unserved) as info:
        call()
    why = spec(name).refuses.get(door) or spec(name).refuses[Door.plan]
    assert f"planner {name!r}" in str(info.value) and door.value in str(info.value) and why in str(info.value)


def through_plan(name: str, *_: Any) -> None:
    model, xs = _tiny()
    graph = recompute.trace(model, xs, loss_fn=default_loss, workspaces=False)
    if not spec(name).serves(Door.plan):
        return _refused(name, Door.plan, lambda: recompute.plan(graph, name))
    p = recompute.plan(graph, name)
    ex = recompute.execute(graph, p)
    _assert_bitwise(model, ex, xs, f"{name} through plan + execute")
    # the plan's peak is the simulated peak of what runs, and that is what the meter measures
    assert recompute.measure(model, xs, runner=ex, backend="fake").peak_bytes == p.peak


def through_optimize(name: str, *_: Any) -> None:
    model, xs = _tiny()
    if not spec(name).serves(Door.optimize):
        return _refused(name, Door.optimize, lambda: recompute.optimize(model, xs, method=name))
    m = recompute.optimize(model, xs, method=name)
    assert m.plan.method == name
    _assert_bitwise(model, m, xs, f"{name} through optimize")


def through_backend(name: str, *_: Any) -> None:
    model, xs = _tiny()
    if not spec(name).serves(Door.backend):
        return _refused(name, Door.backend, lambda: recompute.backend(name))
    backend = recompute.backend(name)
    torch._dynamo.reset()
    _assert_bitwise(model, torch.compile(model, backend=backend), xs, f"{name} through torch.compile")
    assert backend.partitions and all(part.plan.method == name for part in backend.partitions)


def _app_config(tmp_path: Path, name: str) -> list[str]:
    """The overrides that run planner ``name`` in the app: its option of the method group if it has
    one, else (a planner registered after the group was) the method spelled out."""
    stored = {n.removesuffix(".yaml") for n in ConfigStore.instance().list("method")}
    own = sorted(m.name for m in config.method_configs() if m.planner == name and m.name in stored)
    method = [f"method={own[0]}"] if own else ["method=vanilla", f"method.name={name}", f"method.planner={name}"]
    return [*method, f"net={NET}", "device=cpu", "batch_size=2", "input_size=8", "iterations=1", "warmup=0",
            f"results_dir={tmp_path / 'results'}", f"logger.dir={tmp_path}", "logger=none"]


def _experiment(tmp_path: Path, name: str) -> config.AppConfig:
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        return config.to_experiment(compose("config", overrides=_app_config(tmp_path, name)))


def through_app(name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # the app builds its nets by name: the join net, at the tiny size of the other doors
    tiny = functools.partial(nets.NETS[NET].builder, **TINY)
    monkeypatch.setitem(nets.NETS, NET, dataclasses.replace(nets.NETS[NET], builder=tiny))
    if not spec(name).serves(Door.app):
        with pytest.raises(config.ConfigError, match=f"method.planner .*planner {name!r} cannot serve the app door"):
            _experiment(tmp_path, name)
        return
    rec = runner.measure_experiment(_experiment(tmp_path, name))
    assert rec.status == Status.ok, rec.error
    assert rec.planner == name and rec.measured_peak_bytes == rec.predicted_total_bytes
    assert rec.exactness in (None, "bitwise")  # None: the plan recomputes nothing, its step is plain training's
    assert rec.exactness == "bitwise" or rec.recomputations in (None, 0)


THROUGH: dict[Door, Callable[[str, Path, pytest.MonkeyPatch], None]] = {
    Door.plan: through_plan, Door.optimize: through_optimize, Door.backend: through_backend, Door.app: through_app}


@pytest.mark.parametrize("door", list(Door))
@pytest.mark.parametrize("name", PLANNERS)
def test_every_planner_through_every_door(name, door, tmp_path, monkeypatch):
    THROUGH[door](name, tmp_path, monkeypatch)


def test_the_method_group_is_the_registries():
    """Adding a planner is its module: the app offers it by ``method=<name>`` (``<name>_tc`` and
    ``<name>_mc`` where it takes a strategy), its options at their defaults."""
    stored = {n.removesuffix(".yaml") for n in ConfigStore.instance().list("method")}
    assert stored == {m.name for m in config.method_configs()}
    assert {m.planner for m in config.method_configs()} == {*PLANNERS, *baselines.names()}
    milp = next(m for m in config.method_configs() if m.name == "milp")
    assert milp.options["time_limit"] == spec("milp").defaults["time_limit"]


# --------------------------------------------------------------------------- a planner added in the test


@pytest.fixture
def registry(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """A copy of the registry for the test to add to; the real one is left as it was."""
    monkeypatch.setattr(REGISTRY, "_REGISTRY", dict(REGISTRY._REGISTRY))
    yield


def _halves(g: Graph, *, budget: int | None = None, fraction: float = 0.5) -> Plan:
    """Two blocks: the first ``fraction`` of the topological order, then the rest."""
    cut = frozenset(g.topo_order[: max(1, int(fraction * g.n))])
    return Plan.from_sequence(g, [cut, g.nodes], method="halves", budget=budget)


def test_a_planner_added_here_is_served_by_every_door(registry, tmp_path, monkeypatch):
    register("halves")(_halves)
    assert "halves" in recompute.methods() and spec("halves").options == ("fraction",)
    for door in Door:
        THROUGH[door]("halves", tmp_path, monkeypatch)
    # and every door refuses what it does not take, naming the planner, the argument and what it takes
    model, xs = _tiny()
    for call in (lambda: recompute.optimize(model, xs, method="halves", strategy="mc"),
                 lambda: recompute.backend("halves", strategy="mc"),
                 lambda: recompute.plan(recompute.trace(model, xs), "halves", strategy="mc")):
        with pytest.raises(TypeError, match=r"planner 'halves' has no option 'strategy' .*; its options: budget, fraction"):
            call()
    with pytest.raises(TypeError, match="planner 'halves' has no option 'fractoin'; its options: budget, fraction"):
        recompute.optimize(model, xs, method="halves", fractoin=0.3)


@pytest.mark.parametrize("door", [Door.optimize, Door.backend, Door.app])
def test_a_door_a_planner_refuses_refuses_it_by_name(registry, tmp_path, monkeypatch, door):
    register("halves", refuses={door: "it needs the loss in the traced step"})(_halves)
    assert [d for d in Door if not spec("halves").serves(d)] == [door]
    THROUGH[door]("halves", tmp_path, monkeypatch)  # refused, by name, with the reason


def test_a_planner_that_refuses_plan_refuses_every_door(registry):
    register("halves", refuses={"plan": "it is a stub"})(_halves)
    assert not any(spec("halves").serves(d) for d in Door)
    model, xs = _tiny()
    for door, call in ((Door.plan, lambda: recompute.plan(recompute.trace(model, xs), "halves")),
                       (Door.optimize, lambda: recompute.optimize(model, xs, method="halves")),
                       (Door.backend, lambda: recompute.backend("halves"))):
        with pytest.raises(Unserved, match=f"planner 'halves' cannot serve the {door.value} door: it is a stub"):
            call()


def test_the_defaults_are_the_planners_for_every_door():
    """No door has defaults of its own: optimize and the compile backend leave ``strategy`` and every
    option to the planner, so the same call plans the same through each."""
    model, xs = _tiny()
    graph = recompute.trace(model, xs)
    direct = recompute.plan(graph, "approxdp")
    assert direct.memory_model == "simulator" and direct.strategy == "tc"
    through = recompute.optimize(copy.deepcopy(model), xs, method="approxdp", cost_model="paper").plan
    assert (through.lower_sets, through.peak, through.strategy) == (direct.lower_sets, direct.peak, direct.strategy)
    backend = recompute.backend("approxdp")
    assert (backend.method, backend.strategy, backend.plan_options) == ("approxdp", None, {})
    # the doors that wrap a model plan what a user should run unless told otherwise; plan() the paper's
    auto = recompute.optimize(copy.deepcopy(model), xs)
    assert auto.plan.method == "auto" and auto.graph.cost_model == "measured"
    assert (recompute.backend().method, recompute.backend().cost_model) == ("auto", "measured")


def test_the_planners_table_in_the_docs_is_the_registry():
    # written by experiments.docs from the registry: a planner registered is a row, nothing typed by hand
    from experiments import docs
    table = docs.method_table()
    assert table in (ROOT / "docs" / "planners.md").read_text(), "run python -m experiments.docs"
    assert all(f"| `{name}` |" in table for name in PLANNERS)
