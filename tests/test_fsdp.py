"""FSDP2 (``torch.distributed.fsdp.fully_shard``), as LLM training wires it: each decoder block
``recompute.optimize``d, then sharded, trains like plain FSDP2. Two CPU processes over gloo; after
every step the gradients (reduce-scattered: each rank holds its shard) and the parameters equal plain
FSDP2's, bitwise. The other order (``fully_shard``, then ``optimize``) is refused before any work."""

from __future__ import annotations

import multiprocessing
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import recompute
from experiments import nets

WORLD = 2
STEPS = 2


def _model() -> torch.nn.Module:
    """A small GPT-2-style decoder, the same weights on every rank (dropout off: FSDP2 and our step
    draw the masks alike, but the ranks would draw different ones than the plain run they are compared with)."""
    model, _ = nets.build("gpt2", batch_size=2 * WORLD, input_size=16, seed=0, layers=2, width=32, heads=2, vocab=64,
                          dropout=0.0)
    return model


def _train(rank: int, store: str, out: str) -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=WORLD)
    try:
        mesh = init_device_mesh("cpu", (WORLD,))
        ids = torch.randint(0, 64, (2 * WORLD, 16), generator=torch.Generator().manual_seed(1)).chunk(WORLD)[rank]
        for name in ("plain", "ours"):
            model = _model()
            for i, block in enumerate(model.blocks):
                if name == "ours":  # planned on this rank's batch, then sharded
                    block = model.blocks[i] = recompute.optimize(block, (model.tokens(ids).detach(),), method="chen")
                fully_shard(block, mesh=mesh)
            fully_shard(model, mesh=mesh)
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            grads = []
            for _ in range(STEPS):
                opt.zero_grad(set_to_none=True)
                model(ids).float().square().mean().backward()
                grads.append({n.replace("model.", ""): p.grad.to_local().clone() for n, p in model.named_parameters()})
                opt.step()
            state = {n.replace("model.", ""): p.to_local().detach().clone() for n, p in model.named_parameters()}
            torch.save({"grads": grads, "state": state}, Path(out) / f"{name}-{rank}.pt")
        model = _model()
        fully_shard(model, mesh=mesh)
        try:
            recompute.optimize(model, (ids,))
            refused = ""
        except ValueError as e:
            refused = str(e)
        torch.save(refused, Path(out) / f"refused-{rank}.pt")
    finally:
        dist.destroy_process_group()


def test_optimized_blocks_under_fsdp2_train_like_plain_fsdp2(tmp_path):
    multiprocessing.set_forkserver_preload([__name__])
    mp.start_processes(_train, args=(str(tmp_path / "store"), str(tmp_path)), nprocs=WORLD, start_method="forkserver")
    for rank in range(WORLD):
        plain, ours = (torch.load(tmp_path / f"{name}-{rank}.pt") for name in ("plain", "ours"))
        for step in range(STEPS):
            assert plain["grads"][step].keys() == ours["grads"][step].keys()
            for name, g in plain["grads"][step].items():
                assert torch.equal(ours["grads"][step][name], g), f"rank {rank} step {step} grad {name}"
        for name, t in plain["state"].items():
            assert torch.equal(ours["state"][name], t), f"rank {rank} {name}"
        refused = torch.load(tmp_path / f"refused-{rank}.pt")
        assert "fully_shard" in refused and "before" in refused, refused
