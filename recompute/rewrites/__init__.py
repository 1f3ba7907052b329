"""Rewrites: how a plan's schedule runs cheaper — cheap values recomputed late or in the backward
(``remat``), values held across the peak computed again after it (``peak``), eager memory habits
(``inplace``), composed in one order from one :class:`~recompute.rewrites.pipeline.Rewrites` record
(``pipeline``). Imports the planners' registry (its ``Plan``) and the layers below."""
