"""Structured-config schemas of the experiment app, registered with Hydra's ConfigStore.

The YAML files under ``conf/`` are merged into these dataclasses, so OmegaConf checks every value's
type while Hydra composes: an unknown key fails with ``Key '...' is not in struct`` and a value
outside a closed set (a net, a planner, a device, ...) with ``Invalid value '...', expected one of
[...]`` and its ``full_key``. :func:`to_experiment` adds what types cannot express (ranges, a CUDA
device that exists, planner options the planner takes, a writable results store) and raises one
:class:`ConfigError` that lists every such mistake, before any work.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from typing import Any, Optional

import torch
from hydra.core.config_store import ConfigStore
from hydra.errors import CompactHydraException
from omegaconf import MISSING, DictConfig, OmegaConf

import recompute
from recompute import nets
from recompute.memory_model import MemoryModel
from recompute.validate import check_method

from .results import StoreError, check_writable

__all__ = [
    "Device", "TimeBackend", "CostModel", "MemoryModel", "Strategy", "WandbMode", "NetName", "Planner",
    "NetConfig", "MethodConfig", "LoggerConfig", "TimingConfig", "AppConfig",
    "register_configs", "to_experiment", "plan_options", "ConfigError", "experiment_dict", "experiment_key", "GIB",
]

GIB = 2**30  # budget_gb and device_memory_gb are in GiB


class Device(StrEnum):
    """Where peak memory is measured; ``auto`` is cuda when available, else the ``fake`` backend."""

    auto = "auto"
    cuda = "cuda"
    cpu = "cpu"
    fake = "fake"


class TimeBackend(StrEnum):
    """Where time is measured; ``auto`` times on the memory backend when it really runs (cpu/cuda)."""

    auto = "auto"
    none = "none"
    cpu = "cpu"
    cuda = "cuda"


class CostModel(StrEnum):
    paper = "paper"
    flops = "flops"
    measured = "measured"


MEMORY_MODEL_PLANNERS = ("exactdp", "approxdp", "exhaustive")  # the planners that take memory_model


class Strategy(StrEnum):
    tc = "tc"
    mc = "mc"


class WandbMode(StrEnum):
    """``disabled`` (the ``logger=none`` preset) never imports wandb."""

    offline = "offline"
    online = "online"
    disabled = "disabled"


# The closed sets the library defines, as enums, so OmegaConf lists them when a value is wrong.
# ``module`` makes them picklable for the joblib and submitit launchers.
NetName = StrEnum("NetName", {n: n for n in nets.names()}, module=__name__)
Planner = StrEnum("Planner", {m: m for m in recompute.methods()}, module=__name__)


@dataclass
class NetConfig:
    """A network of :mod:`recompute.nets`: registry name and its default batch and input size."""

    name: NetName = MISSING
    batch_size: int = MISSING
    input_size: int = MISSING


@dataclass
class MethodConfig:
    """A planning method: config name (``approxdp_tc``), planner, DP strategy, extra planner options."""

    name: str = MISSING
    planner: Planner = MISSING
    strategy: Optional[Strategy] = None
    options: dict[str, Any] = field(default_factory=dict)


@dataclass
class LoggerConfig:
    """Weights & Biases settings; runs land under ``dir`` (the Hydra output dir by default)."""

    mode: WandbMode = WandbMode.offline
    project: str = "recompute"
    entity: Optional[str] = None
    group: Optional[str] = None  # None: the sweep dir of a multirun, no group for a single run
    tags: list[str] = field(default_factory=list)
    dir: str = "${hydra:runtime.output_dir}"


@dataclass
class TimingConfig:
    """Time measurement; ``batch_size``/``input_size`` (None: the run's) allow a reduced-size CPU timing."""

    backend: TimeBackend = TimeBackend.auto
    batch_size: Optional[int] = None
    input_size: Optional[int] = None


@dataclass
class AppConfig:
    """One experiment: net at (batch_size, input_size), method, where to measure, what to record."""

    net: NetConfig = field(default_factory=NetConfig)
    method: MethodConfig = field(default_factory=MethodConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    timing: TimingConfig = field(default_factory=TimingConfig)
    batch_size: int = "${net.batch_size}"  # type: ignore[assignment]  # interpolations are typed on resolve
    input_size: int = "${net.input_size}"  # type: ignore[assignment]
    device: Device = Device.auto
    cost_model: CostModel = CostModel.paper
    memory_model: MemoryModel = MemoryModel.simulator  # used by the DP planners (exactdp, approxdp, exhaustive)
    budget_gb: Optional[float] = None  # None: the planner's smallest feasible budget
    device_memory_gb: Optional[float] = None  # a cap: runs predicted/measured above it are status=oom
    iterations: int = 3
    warmup: int = 1
    seed: int = 0
    results_dir: str = "${hydra:runtime.cwd}/results"
    skip_existing: bool = True


def register_configs() -> None:
    """Register the schema as ``app_schema`` (first in ``conf/config.yaml``'s defaults list) and one
    ``net`` group option per network of :mod:`recompute.nets`, with its default batch and input size:
    the registry is the only list of networks and their sizes (no YAML copy to drift from it)."""
    store = ConfigStore.instance()
    store.store(name="app_schema", node=AppConfig)
    for name, spec in nets.NETS.items():
        store.store(group="net", name=name, node=NetConfig(NetName(name), spec.batch_size, spec.input_size[0]))


register_configs()


class ConfigError(CompactHydraException, ValueError):
    """A config the app cannot run; the message lists every bad key with its value and what is allowed.

    A ``CompactHydraException``, so that Hydra prints the message alone (no stack trace) and exits 1.
    """


def to_experiment(cfg: DictConfig) -> AppConfig:
    """The composed config as a checked :class:`AppConfig` (resolves interpolations); :class:`ConfigError`
    otherwise, before anything is built, traced or measured."""
    exp: AppConfig = OmegaConf.to_object(cfg)  # type: ignore[assignment]
    problems = [*_range_problems(exp), *_device_problems(exp), *_method_problems(exp), *_store_problems(exp)]
    if problems:
        raise ConfigError("invalid config, nothing was run:\n" + "\n".join(f"  {p}" for p in problems))
    return exp


def _range_problems(exp: AppConfig) -> list[str]:
    """Numbers outside the range their type allows (sizes and counts positive, warmup at least 0)."""
    positive = {
        "net.batch_size": exp.net.batch_size, "net.input_size": exp.net.input_size,
        "batch_size": exp.batch_size, "input_size": exp.input_size, "iterations": exp.iterations,
        "timing.batch_size": exp.timing.batch_size, "timing.input_size": exp.timing.input_size,
        "budget_gb": exp.budget_gb, "device_memory_gb": exp.device_memory_gb,
    }
    problems = [f"{key}={value}: must be positive" for key, value in positive.items() if value is not None and value <= 0]
    if exp.warmup < 0:
        problems.append(f"warmup={exp.warmup}: must be 0 or more")
    return problems


def _device_problems(exp: AppConfig) -> list[str]:
    """``cuda`` asked for on a machine without one (``auto`` would pick what exists)."""
    if torch.cuda.is_available():
        return []
    asked = {"device": (exp.device, [d.value for d in Device if d != Device.cuda]),
             "timing.backend": (exp.timing.backend, [b.value for b in TimeBackend if b != TimeBackend.cuda])}
    return [f"{key}=cuda: no CUDA device here (torch.cuda.is_available() is False); allowed here: {', '.join(allowed)}"
            for key, (value, allowed) in asked.items() if value.value == "cuda"]


def plan_options(exp: AppConfig) -> dict[str, Any]:
    """The keyword options ``recompute.plan`` gets: ``method.options`` plus the DP planners' memory model."""
    options = dict(exp.method.options)
    if exp.method.planner.value in MEMORY_MODEL_PLANNERS:
        options.setdefault("memory_model", exp.memory_model.value)
    return options


def _method_problems(exp: AppConfig) -> list[str]:
    """Planner options the planner does not take, or of the wrong type (``+method.options.<name>=...``)."""
    try:
        check_method(exp.method.planner.value, None, plan_options(exp))
    except (TypeError, ValueError) as e:
        return [f"method.options ({exp.method.name}): {e}"]
    return []


def _store_problems(exp: AppConfig) -> list[str]:
    """A results store that cannot take the record: found now, not after the run."""
    try:
        check_writable(exp.results_dir)
    except StoreError as e:
        return [str(e)]
    return []


def memory_backend(device: Device) -> str:
    """The ``recompute.measure`` backend for peak memory: auto → cuda if available, else fake."""
    if device == Device.auto:
        return "cuda" if torch.cuda.is_available() else "fake"
    return device.value


def time_backend(exp: AppConfig) -> str | None:
    """The backend for time, or None when the run is not timed (``fake`` has no clock)."""
    if exp.timing.backend == TimeBackend.auto:
        mem = memory_backend(exp.device)
        return mem if mem != "fake" else None
    return None if exp.timing.backend == TimeBackend.none else exp.timing.backend.value


def _plain(value: Any) -> Any:
    return value.value if isinstance(value, StrEnum) else value


def experiment_dict(exp: AppConfig) -> dict[str, Any]:
    """What defines the experiment (the record key): everything but logging and bookkeeping,
    with ``auto`` devices resolved, since auto means a different experiment on a GPU machine."""
    d = asdict(exp, dict_factory=lambda items: {k: _plain(v) for k, v in items})
    for key in ("logger", "results_dir", "skip_existing"):
        d.pop(key)
    d["net"] = d["net"]["name"]  # its default sizes are already resolved into batch_size/input_size
    if exp.method.planner.value not in MEMORY_MODEL_PLANNERS:
        d.pop("memory_model")  # vanilla and Chen plan the same under either model: one record, not two
    d["device"] = memory_backend(exp.device)
    d["timing"]["backend"] = time_backend(exp)
    return d


def experiment_key(exp: AppConfig) -> str:
    """A stable short hash of :func:`experiment_dict`."""
    text = json.dumps(experiment_dict(exp), sort_keys=True)
    return hashlib.sha1(text.encode()).hexdigest()[:16]
