"""``benchmarks.head_to_head_cuda``: a clear refusal without a GPU; on one, every method measured on a tiny network."""

from __future__ import annotations

import pytest
import torch

from benchmarks import head_to_head_cuda as h


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA GPU is present: nothing to refuse")
def test_refuses_without_cuda():
    with pytest.raises(SystemExit, match="needs a CUDA GPU"):
        h.main(["--nets", "resnet50"])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_every_method_runs_on_cuda():
    points = h.run_net("resblock", iterations=1, batch=4, size=16)
    assert {p.family for p in points} == {"ours", "pytorch"}
    assert any(p.method == "min_cut" for p in points) and any("+remat" in p.method for p in points)
    ran = [p for p in points if p.status == "ok"]
    assert ran and all(p.peak > 0 and p.seconds > 0 for p in ran)
    assert next(p for p in points if p.method == "vanilla").status == "ok"
    assert "vanilla" in h.net_table(points)
