"""All-reduce of a NumPy float32 array from Python: rankmesh (in place), or
mpi4py's Allreduce on the same buffers (in place and out of place, the
faster reported). Prints `<who> <bytes> B: <median us>` on rank 0.

Run: scripts/mpirun-bench.sh -np 2 python python/bench/allreduce.py rankmesh|mpi4py [SIZES]
"""
import statistics
import sys
import time

import numpy as np

who = sys.argv[1]
sizes = [int(s) for s in (sys.argv[2].split(",") if len(sys.argv) > 2 else ["8", "65536", "1048576", "67108864"])]

if who == "rankmesh":
    import rankmesh as dist

    dist.init_distributed_environment()
    g = dist.get_world_group()
    rank = dist.get_world_rank()
    barrier = g.barrier

    def variants(buf, out):
        return {"in place": lambda: g.all_reduce(buf)}
else:
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    rank = comm.rank
    barrier = comm.Barrier

    def variants(buf, out):
        return {
            "in place": lambda: comm.Allreduce(MPI.IN_PLACE, buf, op=MPI.SUM),
            "out of place": lambda: comm.Allreduce(buf, out, op=MPI.SUM),
        }


def iters_for(nbytes):
    return max(5, min(20000, (1 << 27) // max(nbytes, 1) // 4))


for nbytes in sizes:
    buf = np.zeros(nbytes // 4, np.float32)
    out = np.empty_like(buf)
    best = None
    for name, call in variants(buf, out).items():
        n = iters_for(nbytes)
        for _ in range(min(n, 100)):
            call()
        times = []
        for _ in range(5):
            barrier()
            t0 = time.perf_counter()
            for _ in range(n):
                call()
            times.append((time.perf_counter() - t0) * 1e6 / n)
        t = statistics.median(times)
        best = t if best is None else min(best, t)
    if rank == 0:
        print(f"{who} {nbytes} B: {best:.3f} us", flush=True)
