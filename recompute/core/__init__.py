"""The core: the graph G = (V, E) (``graph``), its lower sets on plain sets (``lowerset``: δ⁺, δ⁻, ∂(L),
eq. (1)) and as the DPs' packed bitset families (``families``), which storage each value of a traced step
lives in (``storage``) and helpers on its fx nodes (``fxnodes``). The bottom layer: it imports nothing of
recompute's above it."""
