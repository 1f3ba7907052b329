"""Pricing: what a schedule holds and takes — schedules of the joint graph and the canonical
strategy (``schedule``), the exact memory simulator (``simulate``), the DPs' block costs B(L, L′)
(``blockcost``), the memory models (``memory_model``) and a step's modelled time (``steptime``).
Imports capture and the core."""
