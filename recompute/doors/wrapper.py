"""A module that wraps a user's model and is saved and loaded as that model.

:class:`recompute.RecomputeModule` and :class:`recompute.doors.baselines.BaselineModule` hold the model as
``model`` and train it their way. Their ``state_dict`` is the model's own, key for key (no ``model.``
inside the keys), and ``load_state_dict`` takes the model's own, wherever the wrapper sits in a larger
model: a checkpoint of a network whose backbone is optimized loads into the plain network and back,
as ``torch.distributed``'s checkpoint wrapper does for the module it wraps. A checkpoint written with
the ``model.`` keys loads too. What a wrapper builds from the model (a traced step, PyTorch's
``checkpoint_sequential`` stages) is built again when :func:`model_signature` changes.
"""

from __future__ import annotations

import enum
import weakref
from typing import Any

import torch

__all__ = ["ModelWrapper", "model_signature"]

_INNER = "model."


class ModelWrapper(torch.nn.Module):
    """Holds ``model`` (its parameters and buffers shared) and saves and loads as it does."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model
        self.register_state_dict_post_hook(_saved_as_the_model)
        self.register_load_state_dict_pre_hook(_loaded_as_the_model)


_HOOKS = ("_forward_pre_hooks", "_forward_hooks", "_backward_pre_hooks", "_backward_hooks")
_GLOBAL_HOOKS = tuple(f"_global{h}" for h in _HOOKS)
# what every module holds (its tensors, submodules, hooks: signed apart) but the ``training`` flag
_INTERNALS = frozenset(vars(torch.nn.Module())) - {"training"}
_SCALARS = frozenset({bool, int, float, str, type(None)})  # the common settings, checked first
_PLAIN = (bool, int, float, complex, str, bytes, type(None), torch.dtype, torch.device, torch.layout,
          torch.memory_format, enum.Enum)


def _setting(value: Any, memo: dict[int, Any]) -> Any:
    """What a module attribute contributes to the traced program: a plain value (a dropout rate, a
    stride, BatchNorm's momentum) itself, a function (a monkey-patched ``forward``, an activation held
    as an attribute) its identity, a container of settings — a dict, a list, a config object (a
    dataclass, a ``SimpleNamespace``, Hugging Face's ``PretrainedConfig``, which every layer of its
    models reads as ``self.config``) — its settings, each config object once per signature
    (``memo``); ``...`` for anything else (a submodule is signed on its own, a tensor is traced)."""
    if type(value) is tuple and all(type(v) in _SCALARS for v in value):
        return value
    if isinstance(value, _PLAIN):
        return value
    if isinstance(value, (tuple, list)):
        items = tuple(_setting(v, memo) for v in value)
        return ... if ... in items else items
    if isinstance(value, (torch.nn.Module, torch.Tensor, weakref.ref)):
        # a weak reference is callable, but names a tensor (an RNN's ``_flat_weight_refs``, rebuilt by
        # each trace: signed by identity, every call would have traced again)
        return ...
    if callable(value):
        return ("callable", id(value))
    if isinstance(value, dict) or hasattr(value, "__dict__"):
        key = id(value)
        if key not in memo:
            memo[key] = ...  # a config that refers to itself signs that reference as nothing
            items = value.items() if isinstance(value, dict) else vars(value).items()
            memo[key] = (type(value), tuple((k, _setting(v, memo)) for k, v in items if not isinstance(k, torch.Tensor)))
        return memo[key]
    return ...


def model_signature(model: torch.nn.Module) -> tuple:
    """Everything of ``model`` but its tensors' values that the traced step is made of: each
    submodule's name, class, ``training`` flag and other settings, those inside its dicts and config
    objects too (:func:`_setting`), and hooks,
    its parameters' and buffers' names, shapes, strides, dtypes, devices and ``requires_grad``; the
    global module hooks. A traced step runs the program it was traced as: a ReLU replaced by an
    identity, a new momentum or a hook added after tracing would be ignored, silently, and weights
    turned channels-last would break its views, if they did not make it trace again. (One pass over
    the modules' dictionaries, made on every call: DenseNet-161's 573 modules take ~5 ms on this CPU,
    ResNet-50's 151 ~1 ms.)"""
    signed = []
    memo: dict[int, Any] = {}
    for name, m in model.named_modules(remove_duplicate=False):
        d = vars(m)
        settings = tuple([(k, v if type(v) in _SCALARS else _setting(v, memo)) for k, v in d.items() if k not in _INTERNALS])
        hooks = tuple([tuple(d[h]) for h in _HOOKS]) if any([d[h] for h in _HOOKS]) else ()
        tensors = tuple([(k, t.shape, t.stride(), t.dtype, t.device, t.requires_grad)
                         for k, t in (d["_parameters"] | d["_buffers"]).items() if t is not None]) \
            if d["_parameters"] or d["_buffers"] else ()
        signed.append((name, type(m), settings, hooks, tensors))
    return tuple(signed), tuple(tuple(getattr(torch.nn.modules.module, h)) for h in _GLOBAL_HOOKS)


def _outer(key: str, prefix: str) -> str | None:
    """The model's name for ``key``, an entry of the wrapper at ``prefix`` (None: not the model's)."""
    inner = prefix + _INNER
    if key == inner[:-1]:
        return prefix[:-1]
    return prefix + key[len(inner):] if key.startswith(inner) else None


def _saved_as_the_model(module: torch.nn.Module, state_dict: dict[str, Any], prefix: str, local_metadata: Any) -> None:
    """``<prefix>model.<key>`` → ``<prefix><key>``, in the entries and in the modules' version metadata."""
    for names in (state_dict, getattr(state_dict, "_metadata", {})):
        for key, new in [(k, n) for k in names if (n := _outer(k, prefix)) is not None]:
            names[new] = names.pop(key)


def _loaded_as_the_model(module: torch.nn.Module, state_dict: dict[str, Any], prefix: str, local_metadata: Any,
                         strict: bool, missing_keys: list[str], unexpected_keys: list[str], error_msgs: list[str]) -> None:
    """The inverse of :func:`_saved_as_the_model`: each entry under ``prefix`` that names one of the
    model's own (a model may hold a submodule called ``model`` itself) is moved under ``model.``; the
    others are left as written (a checkpoint with the wrapper's keys). The version metadata is renamed
    where ``load_state_dict`` hands it over (a wrapper at the top); nested, the inner modules load
    without theirs, which changes nothing for a checkpoint that has all their entries."""
    inner = prefix + _INNER
    own = set(module.model.state_dict(keep_vars=True))
    for key in [k for k in state_dict if k.startswith(prefix) and k[len(prefix):] in own]:
        state_dict[inner + key[len(prefix):]] = state_dict.pop(key)
    metadata = getattr(state_dict, "_metadata", None)
    if metadata is not None:
        modules = {name for name, _ in module.model.named_modules()}
        for key in [k for k in metadata if k.startswith(prefix) and k[len(prefix):] in modules]:
            metadata.setdefault(inner + key[len(prefix):], metadata[key])
        if prefix[:-1] in metadata:  # the model's own entry, under the wrapper's name
            metadata.setdefault(inner[:-1], metadata[prefix[:-1]])
