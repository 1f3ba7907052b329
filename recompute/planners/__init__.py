"""Planners, one module each; importing this package registers them with :func:`recompute.plan`."""

from recompute.planners import chen, dp, exhaustive, milp, multirecompute, reforward, vanilla  # noqa: F401
