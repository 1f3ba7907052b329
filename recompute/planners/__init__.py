"""Planners, one module each; importing this package registers them with :func:`recompute.plan`."""

from . import vanilla  # noqa: F401
