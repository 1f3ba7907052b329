"""The doors: how a user calls recompute — ``optimize`` (a module that trains under a plan, ``wrapper``
saving and loading it as the model), ``backend`` (a ``torch.compile`` backend), ``execute`` (a
schedule as a training step), ``measure`` (peak and time), PyTorch's own methods as baselines
(``baselines``), one step against plain training (``exactness``) and the planner a user gets without
flags (``auto``, registered here). The top layer."""

from recompute.doors import auto  # noqa: F401  (registers the auto planner)
