"""mpi4py's pickle bcast of the value examples/object_bench.rs broadcasts.

Run: scripts/mpirun-local.sh -np 2 python3 scripts/pickle_bcast.py [ITERS] [BATCHES]
Prints `mpi4py pickle bcast <bytes> B: <median> us` on rank 0.
"""
import os
import pickle
import statistics
import sys
import time

from mpi4py import MPI

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_value import VALUE  # noqa: E402

comm = MPI.COMM_WORLD
iters = int(sys.argv[1]) if len(sys.argv) > 1 else 2000
batches = int(sys.argv[2]) if len(sys.argv) > 2 else 5
value = VALUE
mine = value if comm.rank == 0 else None
assert comm.bcast(mine, root=0) == value
times = []
for _ in range(batches):
    comm.Barrier()
    t0 = time.perf_counter()
    for _ in range(iters):
        comm.bcast(mine, root=0)
    times.append((time.perf_counter() - t0) * 1e6 / iters)
if comm.rank == 0:
    size = len(pickle.dumps(value, pickle.HIGHEST_PROTOCOL))
    print(f"mpi4py pickle bcast {size} B: {statistics.median(times):.2f} us")
