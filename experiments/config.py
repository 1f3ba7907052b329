"""Structured-config schemas of the experiment app, registered with Hydra's ConfigStore.

The YAML files under ``conf/`` are merged into these dataclasses, so OmegaConf checks every value's
type while Hydra composes: an unknown key fails with ``Key '...' is not in struct`` and a value
outside a closed set (a net, a device, ...) with ``Invalid value '...', expected one of
[...]`` and its ``full_key``. :func:`to_experiment` adds what types cannot express (a key a ``+``
override added that no code reads, finite numbers in range, a CUDA device that exists, a planner of
the registry that serves the app with the strategy and options it takes — :mod:`recompute.planners.registry`,
read when checked, so a planner registered later is offered too —, a writable results store) and
raises one :class:`ConfigError` that lists every such mistake, before any work.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import math
from dataclasses import asdict, dataclass, field, is_dataclass
from enum import StrEnum
from typing import Any, Iterator, Mapping, Optional, Sequence, get_type_hints

import torch
from hydra.core.config_store import ConfigStore
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import CompactHydraException, HydraException
from omegaconf import MISSING, DictConfig, OmegaConf

from recompute.doors import baselines
from experiments import nets
from recompute.pricing.memory_model import MemoryModel
from recompute.planners.registry import AUTO, STRATEGIES, Door, default_cost_model, methods, spec

from .results import StoreError, check_writable

__all__ = [
    "Device", "TimeBackend", "CostModel", "MemoryModel", "Strategy", "WandbMode", "NetName",
    "NetConfig", "MethodConfig", "LoggerConfig", "TimingConfig", "AppConfig",
    "register_configs", "to_experiment", "check_command_line", "plan_options", "is_baseline", "uses_memory_model",
    "ConfigError", "experiment_dict", "experiment_key", "GIB",
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


@dataclass
class NetConfig:
    """A network of :mod:`experiments.nets`: registry name and its default batch and input size."""

    name: NetName = MISSING
    batch_size: int = MISSING
    input_size: int = MISSING


@dataclass
class MethodConfig:
    """A planning method: config name (``approxdp_tc``), planner, DP strategy, extra planner options."""

    name: str = MISSING
    planner: str = MISSING  # a registered planner or baseline: checked against the registries, not a frozen list
    strategy: Optional[Strategy] = None
    options: dict[str, Any] = field(default_factory=dict)
    # trace the step with each convolution's backward as two ops, the weight's gradient first, so that
    # its input can be freed or recomputed before the input's gradient is made (recompute.trace); ours only
    split_convolutions: Optional[bool] = None  # None: off, but for method=auto, which splits where the peak needs it
    # also compute cheap values the backward reads early and much later once more before the later
    # read, where that lowers the peak (recompute.rewrites.pipeline.with_late_recompute); ours only, not the baselines'
    recompute_late: bool = False
    # also recompute values held across the step's peak again after it, and each recomputation right
    # before its first reader, while the peak falls (recompute.rewrites.pipeline.with_peak_recompute); ours only
    recompute_at_peak: bool = False
    # free each value at its last use and run each pointwise op whose input dies there in that input's
    # storage, as eager PyTorch does (recompute.rewrites.pipeline.with_in_place); ours only
    in_place: bool = False

    def rewrites(self) -> list[str]:
        """The options asked for that change a plan's step (``split_convolutions``, ``recompute_late``,
        ``recompute_at_peak``, ``in_place``), in the order they apply."""
        return [flag for flag in SCHEDULE_REWRITES if getattr(self, flag)]


# the options that change a plan's step (the trace's split_convolutions, then the schedule rewrites in the
# order recompute.rewrites.pipeline.with_rewrites applies them) and their records' method suffixes
SCHEDULE_REWRITES = {"split_convolutions": "+split conv", "recompute_late": "+late", "recompute_at_peak": "+peak",
                     "in_place": "+in-place"}


@dataclass
class LoggerConfig:
    """Weights & Biases settings; runs land under ``dir`` (the Hydra output dir by default)."""

    mode: WandbMode = WandbMode.offline
    project: str = "recompute"
    entity: Optional[str] = None
    group: Optional[str] = None  # None: tracking.sweep_group for a multirun (one per sweep command), none for a single run
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
    cost_model: Optional[CostModel] = None  # None: measured for method=auto (its time allowance), paper otherwise
    memory_model: MemoryModel = MemoryModel.simulator  # for the planners that search under one (uses_memory_model)
    budget_gb: Optional[float] = None  # None: the planner's smallest feasible budget
    device_memory_gb: Optional[float] = None  # a cap: runs predicted/measured above it are status=oom
    iterations: int = 3
    warmup: int = 1
    seed: int = 0
    results_dir: str = "${hydra:runtime.cwd}/results"
    skip_existing: bool = True


def method_configs() -> list[MethodConfig]:
    """One ``method`` option per planner of the registry (``<planner>_tc`` and ``<planner>_mc`` for one
    that takes a strategy) and per baseline, its options at their defaults (read off its signature;
    ``memory_model`` is the app's own key)."""
    entries = [(name, spec(name).takes_strategy, spec(name).defaults) for name in methods()]
    entries += [(name, False, baselines.spec(name).defaults) for name in baselines.names()]
    return [MethodConfig(f"{name}_{s}" if s else name, name, Strategy(s) if s else None,
                         {k: v for k, v in defaults.items() if k != "memory_model"})
            for name, takes, defaults in entries for s in (STRATEGIES if takes else (None,))]


def register_configs() -> None:
    """Register the schema as ``app_schema`` (first in ``conf/config.yaml``'s defaults list), one
    ``net`` group option per network of :mod:`experiments.nets`, with its default batch and input size,
    and one ``method`` option per planner and baseline (:func:`method_configs`): the registries are the
    only lists of networks and methods (no YAML copy to drift from them)."""
    store = ConfigStore.instance()
    store.store(name="app_schema", node=AppConfig)
    for name, net in nets.NETS.items():
        store.store(group="net", name=name, node=NetConfig(NetName(name), net.batch_size, net.input_size[0]))
    for method in method_configs():
        store.store(group="method", name=method.name, node=method)


register_configs()


class ConfigError(CompactHydraException, ValueError):
    """A config the app cannot run; the message lists every bad key with its value and what is allowed.

    A ``CompactHydraException``, so that Hydra prints the message alone (no stack trace) and exits 1.
    """

    @classmethod
    def listing(cls, problems: list[str]) -> "ConfigError":
        """One error for every problem found, one a line."""
        return cls("invalid config, nothing was run:\n" + "\n".join(f"  {p}" for p in problems))


def to_experiment(cfg: DictConfig, overrides: Sequence[str] = ()) -> AppConfig:
    """The composed config as a checked :class:`AppConfig` (resolves interpolations); :class:`ConfigError`
    otherwise, before anything is built, traced or measured. ``overrides``: the command line's (Hydra's
    ``overrides.task``), for what composing loses (an on/off key given a number)."""
    added = _added_key_problems(OmegaConf.to_container(cfg, resolve=False))
    exp: AppConfig = OmegaConf.to_object(cfg)  # type: ignore[assignment]
    problems = [*added, *_flag_problems(overrides), *_range_problems(exp), *_device_problems(exp),
                *_method_problems(exp), *_store_problems(exp)]
    if problems:
        raise ConfigError.listing(problems)
    return exp


def check_command_line(args: Sequence[str]) -> None:
    """:class:`ConfigError` for an override Hydra's parser would refuse only with its lexer's words
    (``LexerNoViableAltException``): a value with non-ASCII characters, which it takes only quoted.
    Called before Hydra parses the command line; every other override is left to Hydra."""
    parser, problems = OverridesParser.create(), []
    for arg in args:
        key, _, value = arg.partition("=")
        if arg.isascii() or arg.startswith("-") or not value or not key.isascii():
            continue
        try:
            parser.parse_override(arg)
        except HydraException:
            problems.append(f"{arg}: Hydra's command line takes non-ASCII characters only in a quoted value; "
                            f"quote it: '{key}=\"{value}\"'")
    if problems:
        raise ConfigError.listing(problems)


def _schema_keys(schema: type, prefix: str = "") -> Iterator[tuple[str, Any]]:
    """Every dotted key of a structured config with its type, parents before their children."""
    for name, hint in get_type_hints(schema).items():
        yield prefix + name, hint
        if is_dataclass(hint):
            yield from _schema_keys(hint, f"{prefix}{name}.")


def _added_key_problems(container: dict[str, Any], schema: type = AppConfig, prefix: str = "") -> list[str]:
    """Keys of ``container`` that ``schema`` does not have. Struct mode refuses them, but a ``+`` override
    adds them anyway, and ``OmegaConf.to_object`` then drops them: the run would go on without the
    value the user meant to set (``+budget_g=1``: no budget). ``method.options`` is a free dict (its
    names are the planner's, checked by :func:`_method_problems`), so keys under it are not looked at."""
    known = get_type_hints(schema)
    every_key = [key for key, _ in _schema_keys(AppConfig)]
    problems = []
    for name, value in container.items():
        key = prefix + name
        if name not in known:
            close = difflib.get_close_matches(key, every_key, n=3, cutoff=0.6)
            fix = (f"did you mean {' or '.join(close)}? (without '+': {close[0]}={value})" if close
                   else f"the keys here are {', '.join(prefix + k for k in known)}")
            problems.append(f"+{key}={value}: the config has no key '{key}', so no code would read it; {fix}")
        elif is_dataclass(known[name]) and isinstance(value, dict):
            problems += _added_key_problems(value, known[name], f"{key}.")
    return problems


def _flag_problems(overrides: Sequence[str]) -> list[str]:
    """On/off keys (``method.in_place``, ``skip_existing``, ...) given anything but true or false on the
    command line: OmegaConf reads every integer but 0, and yes/on, as true, so ``method.in_place=-1``
    would run in place without a word. The composed config holds only the bool it made of the value,
    so the overrides are read."""
    flags = {key: hint for key, hint in _schema_keys(AppConfig) if hint in (bool, Optional[bool])}
    problems = []
    for o in OverridesParser.create().parse_overrides(list(overrides)):
        hint = flags.get(o.key_or_group)
        if hint is None or o.is_delete() or isinstance(o.value(), bool) or (hint is not bool and o.value() is None):
            continue
        allowed = "true, false" if hint is bool else "true, false, null"
        problems.append(f"{o.input_line}: not a boolean (OmegaConf would take it for one without a word); allowed: {allowed}")
    return problems


INT64_MAX = 2**63 - 1  # the largest tensor size
SEED_RANGE = (-(2**63), 2**64 - 1)  # what torch.manual_seed takes


def _range_problems(exp: AppConfig) -> list[str]:
    """Numbers outside the range their meaning allows: sizes and counts from 1 up to a tensor size,
    warmup from 0, GiB amounts finite and at least one byte, the seed in torch's range, and every float
    planner option finite (nan and inf pass a type check and fail only once the work has started)."""
    counts = {
        "net.batch_size": exp.net.batch_size, "net.input_size": exp.net.input_size,
        "batch_size": exp.batch_size, "input_size": exp.input_size, "iterations": exp.iterations,
        "timing.batch_size": exp.timing.batch_size, "timing.input_size": exp.timing.input_size,
    }
    problems = [f"{key}={value}: must be positive, an integer from 1 to 2**63-1"
                for key, value in counts.items() if value is not None and not 1 <= value <= INT64_MAX]
    if not 0 <= exp.warmup <= INT64_MAX:
        problems.append(f"warmup={exp.warmup}: must be 0 or more, an integer from 0 to 2**63-1")
    for key, gib in {"budget_gb": exp.budget_gb, "device_memory_gb": exp.device_memory_gb}.items():
        if gib is not None and not (math.isfinite(gib) and gib * GIB >= 1):
            problems.append(f"{key}={gib}: must be positive and finite, in GiB from 2**-30 (one byte) up, or null")
    if not SEED_RANGE[0] <= exp.seed <= SEED_RANGE[1]:
        problems.append(f"seed={exp.seed}: must be an integer from -2**63 to 2**64-1 (what torch.manual_seed takes)")
    problems += [f"method.options.{name}={value}: must be a finite number"
                 for name, value in exp.method.options.items() if isinstance(value, float) and not math.isfinite(value)]
    return problems


def _device_problems(exp: AppConfig) -> list[str]:
    """``cuda`` asked for on a machine without one (``auto`` would pick what exists)."""
    if torch.cuda.is_available():
        return []
    asked = {"device": (exp.device, [d.value for d in Device if d != Device.cuda]),
             "timing.backend": (exp.timing.backend, [b.value for b in TimeBackend if b != TimeBackend.cuda])}
    return [f"{key}=cuda: no CUDA device here (torch.cuda.is_available() is False); allowed here: {', '.join(allowed)}"
            for key, (value, allowed) in asked.items() if value.value == "cuda"]


def is_baseline(exp: AppConfig) -> bool:
    """Whether the method is one of PyTorch's own (:mod:`recompute.doors.baselines`): it wraps the model, no plan."""
    return exp.method.planner in baselines.names()


def uses_memory_model(exp: AppConfig) -> bool:
    """Whether the planner searches under a memory model (the registry's ``simulator_default``): it gets
    ``memory_model``, which is then part of the experiment; the others plan the same under any."""
    return exp.method.planner in methods() and spec(exp.method.planner).simulator_default


def cost_model(exp: AppConfig) -> str:
    """The cost model the run prices T_v by: the one given, else ``measured`` for ``auto`` (its time
    allowance is in the device's seconds) and ``paper`` for the paper's planners."""
    return exp.cost_model.value if exp.cost_model is not None else default_cost_model(exp.method.planner)


def plan_options(exp: AppConfig) -> dict[str, Any]:
    """The keyword options ``recompute.plan`` (or the baseline) gets: ``method.options``, plus the
    memory model for the planners that search under one."""
    options = dict(exp.method.options)
    if uses_memory_model(exp):
        options.setdefault("memory_model", exp.memory_model.value)
    return options


def _method_problems(exp: AppConfig) -> list[str]:
    """What the registries refuse, each under the key it comes from: a planner that is not registered
    or cannot serve the app (``method.planner``), a strategy it does not take (``method.strategy``),
    an option it does not take or of the wrong type (``+method.options.<name>=...``)."""
    name, strategy = exp.method.planner, exp.method.strategy.value if exp.method.strategy is not None else None
    if name in baselines.names() and exp.method.rewrites():
        return [f"method.{flag} ({exp.method.name}): it changes a plan's step, and {name!r} is "
                "PyTorch's own method, which runs none; allowed: false" for flag in exp.method.rewrites()]
    if name == AUTO and (chosen := [flag for flag in exp.method.rewrites() if flag != "split_convolutions"]):
        return [f"method.{flag} ({exp.method.name}): auto chooses the schedule rewrites itself, keeping each where "
                "it lowers the peak; allowed: false (or a planner, e.g. method=approxdp_mc)" for flag in chosen]
    if name in baselines.names():
        entry = baselines.spec(name)
        checks = {"method.strategy": lambda: entry.check(strategy=strategy),
                  "method.options": lambda: entry.check(options=plan_options(exp))}
    else:
        checks = {"method.planner": lambda: spec(name).check(Door.app),
                  "method.strategy": lambda: spec(name).check(Door.app, strategy=strategy),
                  "method.options": lambda: spec(name).check(Door.app, options=plan_options(exp))}
    for key, check in checks.items():
        try:
            check()
        except (TypeError, ValueError) as e:
            return [f"{key} ({exp.method.name}): {e}"]
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


def _option_defaults(planner: str) -> Mapping[str, Any]:
    if planner in baselines.names():
        return baselines.spec(planner).defaults
    return spec(planner).defaults if planner in methods() else {}


def experiment_dict(exp: AppConfig) -> dict[str, Any]:
    """What defines the experiment (the record key): everything but logging and bookkeeping,
    with ``auto`` devices resolved, since auto means a different experiment on a GPU machine."""
    d = asdict(exp, dict_factory=lambda items: {k: _plain(v) for k, v in items})
    for key in ("logger", "results_dir", "skip_existing"):
        d.pop(key)
    d["net"] = d["net"]["name"]  # its default sizes are already resolved into batch_size/input_size
    defaults = _option_defaults(exp.method.planner)
    # an option at its default is the same experiment as one left out (records made before the method
    # group carried the defaults keep their keys)
    d["method"]["options"] = {k: v for k, v in d["method"]["options"].items() if k not in defaults or v != defaults[k]}
    if not uses_memory_model(exp):
        d.pop("memory_model")  # vanilla and Chen plan the same under either model: one record, not two
    for flag in SCHEDULE_REWRITES:
        if not getattr(exp.method, flag):
            d["method"].pop(flag)  # off: the key of the records made before the option existed
    d["cost_model"] = cost_model(exp)  # resolved: a record says what priced it
    d["device"] = memory_backend(exp.device)
    d["timing"]["backend"] = time_backend(exp)
    return d


def experiment_key(exp: AppConfig) -> str:
    """A stable short hash of :func:`experiment_dict`."""
    text = json.dumps(experiment_dict(exp), sort_keys=True)
    return hashlib.sha1(text.encode()).hexdigest()[:16]
