"""broadcast_object of the ~1 KiB dict scripts/pickle_bcast.py sends with
mpi4py's pickle bcast, from Python on rankmesh (no pickle: the value
crosses as data). Prints `rankmesh python broadcast_object: <median> us`.
"""
import os
import statistics
import sys
import time

import rankmesh as dist

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts"))
from bench_value import VALUE  # noqa: E402

iters = int(sys.argv[1]) if len(sys.argv) > 1 else 2000
batches = int(sys.argv[2]) if len(sys.argv) > 2 else 5
value = VALUE
dist.init_distributed_environment()
g = dist.get_world_group()
mine = value if g.rank_in_group == 0 else None
assert g.broadcast_object(mine, 0) == value
times = []
for _ in range(batches):
    g.barrier()
    t0 = time.perf_counter()
    for _ in range(iters):
        g.broadcast_object(mine, 0)
    times.append((time.perf_counter() - t0) * 1e6 / iters)
if g.rank_in_group == 0:
    print(f"rankmesh python broadcast_object: {statistics.median(times):.2f} us")
