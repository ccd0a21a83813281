"""torch.distributed's ops timed on one backend (scripts/bench-torch.sh runs
it on "rankmesh" and "gloo", alternated, and tabulates).

    mpirun -np 2 python python/bench/torch_ops.py rankmesh   # or gloo
    mpirun -np 2 python python/bench/torch_ops.py fake 2      # torch's dispatch floor

Prints one JSON line per (op, size) on rank 0: the mean time of a call in
µs, the slowest rank's. Sizes are nccl-tests': all_gather's is its output,
reduce_scatter's its input, the others' the tensor's. Each size is timed
for about RANKMESH_BENCH_SECONDS (default 0.5) after a warm-up, so a busy
node's preemptions are sampled, not dodged.
"""

import json
import os
import sys
import time

import numpy as np
import torch
import torch.distributed as dist

OPS = ["all_reduce", "all_gather_into_tensor", "reduce_scatter_tensor", "all_to_all_single",
       "broadcast"]
SIZES = [8, 64 << 10, 1 << 20, 16 << 20, 64 << 20]
SECONDS = float(os.environ.get("RANKMESH_BENCH_SECONDS", "0.5"))


def call(op, w, size):
    n = max(size // 4, w)
    n -= n % w
    if op == "all_reduce":
        x = torch.rand(n)
        return lambda: dist.all_reduce(x)
    if op == "broadcast":
        x = torch.rand(n)
        return lambda: dist.broadcast(x, 0)
    if op == "all_gather_into_tensor":
        x, out = torch.rand(n // w), torch.empty(n)
        return lambda: dist.all_gather_into_tensor(out, x)
    if op == "reduce_scatter_tensor":
        x, out = torch.rand(n), torch.empty(n // w)
        return lambda: dist.reduce_scatter_tensor(out, x)
    x, out = torch.rand(n), torch.empty(n)
    return lambda: dist.all_to_all_single(out, x)


def timed(f, agree):
    for _ in range(3):
        f()
    t = time.perf_counter()
    f()
    once = max(time.perf_counter() - t, 1e-7)
    iters = agree(max(3, min(2_000_000, int(SECONDS / once))))
    for _ in range(min(iters, 100)):
        f()
    agree(0)
    t = time.perf_counter()
    for _ in range(iters):
        f()
    return (time.perf_counter() - t) / iters * 1e6


def main():
    backend = sys.argv[1]
    if backend == "fake":
        from torch.testing._internal.distributed.fake_pg import FakeStore

        # One fake process per rank, launched as the job is: at 4 ranks on
        # 2 cores, two share each core, and so does torch's dispatch.
        rank = int(os.environ.get("OMPI_COMM_WORLD_RANK", os.environ.get("PMI_RANK", "0")))
        dist.init_process_group("fake", store=FakeStore(), rank=rank,
                                world_size=int(sys.argv[2]))
    else:
        # Registers "rankmesh"; for gloo, env:// rendezvouses over MPI.
        import rankmesh.torch  # noqa: F401
        dist.init_process_group(backend)
    r, w = dist.get_rank(), dist.get_world_size()

    def agree(n):
        if backend == "fake":
            return n
        t = torch.tensor([n], dtype=torch.int64)
        dist.broadcast(t, 0)
        return int(t.item())

    def slowest(us):
        if backend == "fake":
            return us
        t = torch.tensor([us], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return t.item()

    rows = []
    for op in OPS:
        for size in SIZES if backend != "fake" else SIZES[:1]:
            us = slowest(timed(call(op, w, size), agree))
            rows.append({"backend": backend, "np": w, "op": op, "bytes": size, "us": us})
    if backend == "rankmesh":
        import rankmesh as rm

        g = rm.get_world_group()
        for kind, x in (("package_numpy", np.ones(2, np.float32)), ("package_torch", torch.ones(2))):
            us = slowest(timed(lambda: g.all_reduce(x), agree))
            rows.append({"backend": kind, "np": w, "op": "all_reduce", "bytes": 8, "us": us})
    if r == 0:
        for row in rows:
            print(json.dumps(row), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
