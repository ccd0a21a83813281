"""The package's own cost per call: a world of one, an 8 B float32
all_reduce in place (no data moves, no peer waits), the best of ROUNDS
rounds of CALLS calls. Prints `<kind> all_reduce 8 B: <ns> ns per call`.

Run: python python/bench/call_cost.py numpy|torch [CALLS] [ROUNDS]
(`torch`: a CPU torch tensor through the same call; `numpy` with torch
imported first when a third word `with-torch` follows.)
"""
import sys
import time

import numpy as np

kind = sys.argv[1] if len(sys.argv) > 1 else "numpy"
calls = int(sys.argv[2]) if len(sys.argv) > 2 else 200_000
rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 5
if kind == "torch" or "with-torch" in sys.argv:
    import torch

import rankmesh as dist

dist.init_distributed_environment()
g = dist.get_world_group()
assert g.world_size == 1, "a world of one: the call's own cost, no peer"
x = torch.ones(2, dtype=torch.float32) if kind == "torch" else np.ones(2, np.float32)
for _ in range(10_000):
    g.all_reduce(x)
best = float("inf")
for _ in range(rounds):
    t = time.perf_counter_ns()
    for _ in range(calls):
        g.all_reduce(x)
    best = min(best, (time.perf_counter_ns() - t) / calls)
print(f"{kind}{' (torch imported)' if kind == 'numpy' and 'torch' in sys.modules else ''} all_reduce 8 B: {best:.0f} ns per call")
