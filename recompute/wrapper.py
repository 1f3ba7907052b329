"""A module that wraps a user's model and is saved and loaded as that model.

:class:`recompute.RecomputeModule` and :class:`recompute.baselines.BaselineModule` hold the model as
``model`` and train it their way. Their ``state_dict`` is the model's own, key for key (no ``model.``
inside the keys), and ``load_state_dict`` takes the model's own, wherever the wrapper sits in a larger
model: a checkpoint of a network whose backbone is optimized loads into the plain network and back,
as ``torch.distributed``'s checkpoint wrapper does for the module it wraps. A checkpoint written with
the ``model.`` keys loads too.
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["ModelWrapper"]

_INNER = "model."


class ModelWrapper(torch.nn.Module):
    """Holds ``model`` (its parameters and buffers shared) and saves and loads as it does."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model
        self.register_state_dict_post_hook(_saved_as_the_model)
        self.register_load_state_dict_pre_hook(_loaded_as_the_model)


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
