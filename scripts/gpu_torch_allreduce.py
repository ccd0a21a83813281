"""PyTorch's all_reduce on the NCCL backend, timed as `rankmesh bench` times
(warm-up, then n calls back to back on the stream and one synchronize; time
per call = elapsed / n). Run by scripts/gpu-check.sh beside `rankmesh bench
all_reduce --backend nccl` on the same GPU: it is what a user would pick
instead. Prints `torch SIZE_BYTES US_PER_CALL` lines (rank 0).

Alone it is world size 1, with 8 B-4 KiB and 64 MiB-1 GiB. Under mpirun
(OMPI_COMM_WORLD_SIZE > 1) it is that world on the machine's one GPU, each
rank its own NCCL host (NCCL_HOSTID, the rule RANKMESH_SHARE_GPU=1 follows),
so NCCL moves the data through its network transport as between nodes, at
8 B-1 MiB; rank 0 picks the rendezvous port and MPI's own environment gives
the rest (MASTER_ADDR/MASTER_PORT must be set alike on every rank: the
script sets 127.0.0.1 and TORCH_ANCHOR_PORT, default 29517)."""
import os
import time

rank = int(os.environ.get("OMPI_COMM_WORLD_RANK", os.environ.get("PMI_RANK", "0")))
size = int(os.environ.get("OMPI_COMM_WORLD_SIZE", os.environ.get("PMI_SIZE", "1")))
if size > 1:
    os.environ.setdefault("NCCL_HOSTID", f"torch-anchor-{os.uname().nodename}-{rank}")

import torch  # noqa: E402  (NCCL_HOSTID must be set before NCCL loads)
import torch.distributed as dist  # noqa: E402

os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
os.environ.setdefault("MASTER_PORT", os.environ.get("TORCH_ANCHOR_PORT", "29517"))
gpu = rank % torch.cuda.device_count()
torch.cuda.set_device(gpu)
dist.init_process_group("nccl", rank=rank, world_size=size, device_id=torch.device("cuda", gpu))
if rank == 0:
    print("torch-version", torch.__version__, "nccl", ".".join(map(str, torch.cuda.nccl.version())), "world", size)
small = [8, 64, 512, 4096] if size == 1 else [8, 64, 512, 4096, 32768, 262144, 1 << 20]
large = [64 << 20, 256 << 20, 1 << 30] if size == 1 else []
for nbytes in small + large:
    n, warm = (2000, 200) if size == 1 and nbytes in small else (200, 20) if nbytes in small else (30, 5)
    x = torch.rand(nbytes // 4, device="cuda", dtype=torch.float32)
    for _ in range(warm):
        dist.all_reduce(x)
    torch.cuda.synchronize()
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(n):
        dist.all_reduce(x)
    torch.cuda.synchronize()
    us = (time.perf_counter() - t0) / n * 1e6
    if rank == 0:
        print(f"torch {nbytes} {us:.2f}", flush=True)
    del x
dist.destroy_process_group()
