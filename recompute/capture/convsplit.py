"""A convolution's backward as two ops, so that its input can be freed before its input's gradient is made.

:func:`split_convolution_backwards` rewrites a backward module (``recompute.backend``'s partitions) or a
joint graph (``recompute.trace(..., split_convolutions=...)``, the executor's steps);
:func:`recompute.rewrites.peak.needed_splits` says which splits of a schedule its peak needs, so that the
others can run fused (they cost time).
"""

from __future__ import annotations

import operator
from typing import Collection

import torch
import torch.fx as fx

from recompute.core.storage import is_alias

__all__ = ["split_convolution_backwards", "SPLIT_FROM"]

SPLIT_FROM = "split_from"  # meta key of an input's gradient op: the convolution backward it was split from


def split_convolution_backwards(gm: fx.GraphModule, where_input_dies: bool = True,
                                only: Collection[str] | None = None) -> fx.GraphModule:
    """Split each ``convolution_backward`` of the backward module ``gm`` that returns both the input's
    and the weight's gradient and is the last reader of the convolution's input into two ops: the
    weight's (and bias's) gradient first, from the output's gradient and the input, then the input's
    gradient as a transposed convolution of the output's gradient, which reads no input. The input is
    then freed once the first has run, so that it, the output's gradient and the input's gradient are
    never held at once (VGG-19 b64 224² and U-Net b8 572², whose smallest compiled plans peak at a
    convolution's backward). The peak never rises; the time does: the two ops are slower than the fused
    one on large maps. On the CPU they give the fused op's values bitwise (oneDNN's
    backward-data kernel serves both; on a few shapes another kernel, within float32 rounding:
    U-Net's 64 → 2-channel head). ``where_input_dies=False`` splits every one (a joint graph, whose
    schedule is not made yet; the ops a split makes, to time them); ``only``: the names of the
    ``convolution_backward`` nodes that may be split (None: any). The input's gradient op records the
    name it was split from in its ``meta[SPLIT_FROM]``. Rewrites ``gm`` and returns it."""
    conv_backward = torch.ops.aten.convolution_backward.default
    position = {n: i for i, n in enumerate(gm.graph.nodes)}
    for n in list(gm.graph.find_nodes(op="call_function", target=conv_backward)):
        grad, x, w, _, stride, padding, dilation, transposed, _, groups, mask = n.args
        users = {u.args[1]: u for u in n.users if u.target is operator.getitem}
        # a view of the input, or a later reader of it, would keep its storage: nothing to gain
        last_read = not where_input_dies or (not is_alias(x) and all(position[u] <= position[n] for u in x.users))
        if (transposed or not (mask[0] and mask[1]) or 0 not in users or not last_read
                or (only is not None and n.name not in only)):
            continue
        gi_val, (h_out, h_in, k) = users[0].meta["val"], (grad.meta["val"].shape[2:], x.meta["val"].shape[2:], w.meta["val"].shape[2:])
        # the output padding that makes the transposed convolution's output the input's size
        output_padding = [i - ((o - 1) * s - 2 * p + d * (kk - 1) + 1)
                          for i, o, kk, s, p, d in zip(h_in, h_out, k, stride, padding, dilation)]
        n.args = (*n.args[:-1], [False, *mask[1:]])
        n.meta["val"] = (None, *n.meta["val"][1:])
        with gm.graph.inserting_after(users[0]):
            gi = gm.graph.call_function(torch.ops.aten.convolution.default,
                                        (grad, w, None, stride, padding, dilation, True, output_padding, groups))
        gi.meta = {**n.meta, "val": gi_val, SPLIT_FROM: n.name}
        users[0].replace_all_uses_with(gi)
        gm.graph.erase_node(users[0])
    gm.recompile()
    return gm

