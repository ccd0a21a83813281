"""torch.distributed on the "rankmesh" backend with CUDA tensors, under
mpirun on a GPU machine: scripts/gpu-check.sh runs it at np 2 on the one GPU
(RANKMESH_SHARE_GPU=1). Every op torch users call most, on random float32
data, against a float64 reference each rank computes from every rank's seed;
then a few DDP steps whose parameters must end bit-identical on every rank.
Prints `TORCH-RANKMESH-OK rank R: N checks` on success; any failure raises
(a traceback, exit 1). Without CUDA it runs the same checks on CPU tensors,
which is how the script itself is tried where there is no GPU."""
import torch
import torch.distributed as dist

import rankmesh.torch  # noqa: F401  (registers "rankmesh"; starts MPI)

dist.init_process_group("rankmesh")
rank, size = dist.get_rank(), dist.get_world_size()
if torch.cuda.is_available():
    gpu = torch.device("cuda", rank % torch.cuda.device_count())
    torch.cuda.set_device(gpu)
else:  # without CUDA the same checks run on CPU tensors (the host plane): the script's own test
    gpu = torch.device("cpu")


def data(r, n, seed):
    g = torch.Generator().manual_seed(1000 * seed + r)
    return torch.rand(n, generator=g, dtype=torch.float64) * 2 - 1


def close(got, want, what):
    err = (got.double().cpu() - want).abs().max().item() if want.numel() else 0.0
    if not err <= 1e-5 * max(1.0, want.abs().max().item() if want.numel() else 1.0):
        raise AssertionError(f"rank {rank}: {what}: max error {err}")


checks = 0
n = 4096 * size
parts = [data(r, n, 1) for r in range(size)]
mine = parts[rank].float().to(gpu)

x = mine.clone()
dist.all_reduce(x)
close(x, sum(parts), "all_reduce sum")
x = mine.clone()
dist.all_reduce(x, op=dist.ReduceOp.MAX)
close(x, torch.stack(parts).max(0).values, "all_reduce max")
x = mine.clone()
dist.broadcast(x, src=size - 1)
close(x, parts[size - 1], "broadcast")
out = torch.empty(n * size, device=gpu)
dist.all_gather_into_tensor(out, mine)
close(out, torch.cat(parts), "all_gather_into_tensor")
out = torch.empty(n // size, device=gpu)
dist.reduce_scatter_tensor(out, mine)
close(out, sum(parts).chunk(size)[rank], "reduce_scatter_tensor")
out = torch.empty(n, device=gpu)
dist.all_to_all_single(out, mine)
close(out, torch.cat([p.chunk(size)[rank] for p in parts]), "all_to_all_single")
work = dist.all_reduce(mine.clone(), async_op=True)
work.wait()
checks += 7

# DDP with its defaults, on the GPU: gradients all-reduced from autograd's
# thread on the device's stream.
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4)).to(gpu)
ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=[gpu.index] if gpu.type == "cuda" else None)
opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
g = torch.Generator().manual_seed(rank)
for _ in range(3):
    opt.zero_grad()
    loss = ddp(torch.randn(16, 32, generator=g).to(gpu)).square().mean()
    loss.backward()
    opt.step()
flat = torch.cat([p.detach().flatten() for p in model.parameters()])
every = torch.empty(flat.numel() * size, device=gpu)
dist.all_gather_into_tensor(every, flat)
for r, p in enumerate(every.chunk(size)):
    if not torch.equal(p, flat):
        raise AssertionError(f"rank {rank}: DDP parameters differ from rank {r}'s")
checks += 1
if gpu.type == "cuda":
    torch.cuda.synchronize()
dist.destroy_process_group()
print(f"TORCH-RANKMESH-OK rank {rank}: {checks} checks", flush=True)
