"""The paper's seven networks at tiny inputs, each traced once and shared by the tests that use it.

A test takes the session fixture ``tiny_zoo`` (tests/conftest.py) parametrized with :func:`zoo_params`:
pytest runs the tests of one network together and builds the next network only after the last of
them, and ``scripts/test.sh``'s ``--dist loadgroup`` keeps each network's tests on one xdist worker,
so a worker holds one tiny network and its trace at a time and traces it once.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

import recompute
from recompute import nets

ZOO = nets.names(paper_only=True)


def tiny_build(name: str, **kwargs) -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    """Batch 2 at 32×32 (64×64 for the segmentation nets): the smallest the zoo trains at."""
    return nets.build(name, batch_size=2, input_size=64 if name in ("unet", "pspnet") else 32, **kwargs)


def zoo_params(names: list[str] = ZOO) -> list:
    """One parameter per network, tied to an xdist group of that name."""
    return [pytest.param(name, id=name, marks=pytest.mark.xdist_group(name)) for name in names]


@dataclass(eq=False)
class Traced:
    """A tiny build of a zoo network and its graph, traced without a loss."""

    name: str
    model: torch.nn.Module
    inputs: tuple[torch.Tensor, ...]
    graph: recompute.Graph


def traced(name: str) -> Traced:
    model, inputs = tiny_build(name)
    return Traced(name, model, inputs, recompute.trace(model, inputs))
