"""Fixtures shared across test files."""

from __future__ import annotations

import gc

import pytest

from .zoo import Traced, traced


@pytest.fixture(scope="session")
def tiny_zoo(request: pytest.FixtureRequest) -> Traced:
    """The tiny traced zoo network named by the (indirect) parameter; see tests/zoo.py."""
    gc.collect()  # the previous network's trace: fx graphs and modules hold reference cycles
    return traced(request.param)
