"""DDP on rankmesh: a torch training loop written for gloo, with the
backend's name changed and launched by mpirun (no MASTER_ADDR, no torchrun).

    mpirun -np 4 python examples/python/torch_ddp.py

Each rank trains on its own shard of a synthetic regression; DDP's
gradient buckets are all-reduced by rankmesh's host plane (CUDA tensors
would go to NCCL). At the end every rank holds the same parameters, which
the script checks.
"""

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import rankmesh.torch  # noqa: F401  (registers the "rankmesh" backend)

dist.init_process_group("rankmesh")  # was: dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()

torch.manual_seed(rank)  # different starts: DDP broadcasts rank 0's
model = DDP(torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1)))
opt = torch.optim.Adam(model.parameters(), lr=1e-2)
true_w = torch.linspace(-1, 1, 16)

for step in range(50):
    x = torch.randn(64, 16)  # this rank's shard of the batch
    y = (x @ true_w).unsqueeze(1)
    loss = torch.nn.functional.mse_loss(model(x), y)
    opt.zero_grad()
    loss.backward()  # DDP all-reduces the gradients here
    opt.step()
    if step % 10 == 9:
        mean = loss.detach().clone()
        dist.all_reduce(mean, op=dist.ReduceOp.AVG)
        if rank == 0:
            print(f"step {step + 1}: loss {mean.item():.4f}")

flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
everyone = [torch.empty_like(flat) for _ in range(world)]
dist.all_gather(everyone, flat)
if not all(torch.equal(p, flat) for p in everyone):
    raise SystemExit(f"rank {rank}: the ranks' parameters differ after training")
if rank == 0:
    print(f"{world} ranks hold identical parameters ({flat.numel()} values)")
dist.destroy_process_group()
