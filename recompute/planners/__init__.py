"""Planners, one module each; importing this package registers them with :func:`recompute.plan`."""

from . import chen, dp, exhaustive, milp, reforward, vanilla  # noqa: F401
