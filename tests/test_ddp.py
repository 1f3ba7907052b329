"""DistributedDataParallel: a ``recompute.optimize``d model inside DDP trains like plain DDP.

Two CPU processes over gloo, each with its own half of the batch; after every step the gradients
(averaged by DDP's all-reduce), the parameters and the BatchNorm statistics equal plain DDP's.
"""

from __future__ import annotations

import multiprocessing
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel as DDP

import recompute
from experiments import nets
from recompute.doors.measure import default_loss

WORLD = 2
STEPS = 2


def _train(rank: int, store: str, out: str, method: str) -> None:
    """``STEPS`` SGD steps of plain DDP, then of DDP around the model optimized by ``method``, on rank
    ``rank``; the gradients of each step and the final state of both to ``out``."""
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=WORLD)
    try:
        for name in ("plain", method):
            model, (x,) = nets.build("resblock", batch_size=2 * WORLD, input_size=8, seed=0)  # the same weights everywhere
            shard = x.chunk(WORLD)[rank]
            ddp = DDP(model if name == "plain" else recompute.optimize(model, (shard,), method=method))
            opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
            grads = []
            for _ in range(STEPS):
                opt.zero_grad(set_to_none=True)
                default_loss(ddp(shard)).backward()
                grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
                opt.step()
            torch.save({"grads": grads, "state": model.state_dict()}, Path(out) / f"{name}-{rank}.pt")
    finally:
        dist.destroy_process_group()


def _run(tmp_path: Path, method: str) -> tuple[list[dict], list[dict]]:
    """Plain DDP's and ours, per rank."""
    # forked from a server that imported this module once (torch, recompute: seconds); not forked from
    # the test process, whose autograd threads a forked child cannot use
    multiprocessing.set_forkserver_preload([__name__])
    mp.start_processes(_train, args=(str(tmp_path / "store"), str(tmp_path), method), nprocs=WORLD,
                       start_method="forkserver")
    return tuple([torch.load(tmp_path / f"{name}-{rank}.pt") for rank in range(WORLD)] for name in ("plain", method))


def test_optimized_model_in_ddp_trains_like_plain_ddp(tmp_path):
    plain, ours = _run(tmp_path, "chen")
    for rank in range(WORLD):
        for step in range(STEPS):
            for name, g in plain[rank]["grads"][step].items():
                torch.testing.assert_close(ours[rank]["grads"][step][name], g, rtol=0, atol=0,
                                           msg=lambda m: f"rank {rank} step {step} grad {name}: {m}")
        for name, t in plain[rank]["state"].items():  # parameters and BatchNorm statistics
            torch.testing.assert_close(ours[rank]["state"][name], t, rtol=0, atol=0, msg=lambda m: f"{name}: {m}")
    # the all-reduce made the replicas' gradients equal, though each saw a different half of the batch
    torch.testing.assert_close(ours[0]["grads"][0], ours[1]["grads"][0], rtol=0, atol=0)
