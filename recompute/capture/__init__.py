"""Capture: the training step as one joint graph and what each of its ops costs — the export
(``joint``), V condensed from it (``trace``), T_v (``costs``), seconds (``timing``), the scratch an op
allocates inside itself (``workspace``, metered by ``allocator``), a convolution's backward split
(``convsplit``), and the checks of the front doors' arguments (``validate``). Imports the core only."""
