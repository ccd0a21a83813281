"""PyTorch's all_reduce on the NCCL backend, world size 1, timed as
`rankmesh bench` times (warm-up, then n calls back to back on the stream and
one synchronize; time per call = elapsed / n). Run by scripts/gpu-check.sh
beside `rankmesh bench all_reduce --backend nccl` on the same GPU: it is what a
user would pick instead. Prints `torch SIZE_BYTES US_PER_CALL` lines."""
import os
import time

import torch
import torch.distributed as dist

os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
os.environ.setdefault("MASTER_PORT", "29517")
torch.cuda.set_device(0)
dist.init_process_group("nccl", rank=0, world_size=1, device_id=torch.device("cuda", 0))
print("torch-version", torch.__version__, "nccl", ".".join(map(str, torch.cuda.nccl.version())))
small = [8, 64, 512, 4096]
large = [64 << 20, 256 << 20, 1 << 30]
for size in small + large:
    n, warm = (2000, 200) if size in small else (30, 5)
    x = torch.rand(size // 4, device="cuda", dtype=torch.float32)
    for _ in range(warm):
        dist.all_reduce(x)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        dist.all_reduce(x)
    torch.cuda.synchronize()
    us = (time.perf_counter() - t0) / n * 1e6
    print(f"torch {size} {us:.2f}", flush=True)
    del x
dist.destroy_process_group()
