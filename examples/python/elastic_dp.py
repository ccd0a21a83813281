"""Data-parallel steps that go on after losing a rank, from Python (issue #66).

Each rank is a replica holding the same parameters; a step all-reduces the
replicas' gradients (NumPy, float64, non-integer) and averages them. With
``--kill K@S`` rank K SIGKILLs itself inside step S: the survivors get
``rankmesh.PeerLostError``, call ``rankmesh.shrink()``, agree on the earliest
step any of them was in (one may find the loss a step before the others),
restart it from the parameters it started from, and check their parameters
against a serial replay of the steps as they ran. Each survivor prints one
line.

    mpirun --with-ft ulfm -np 4 python examples/python/elastic_dp.py --kill 1@2

(rankmesh built against Open MPI 5.)
"""

import argparse
import os
import signal
import sys

import numpy as np

import rankmesh as dist

DIM, STEPS, LR = 16, 6, 0.1


def gradient(w: np.ndarray, replica: int, step: int) -> np.ndarray:
    rng = np.random.default_rng(1000 * replica + step)
    x = rng.standard_normal((8, DIM))
    y = rng.standard_normal(8)
    return 2.0 * x.T @ (x @ w - y) / len(y)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--kill", default=None, help="RANK@STEP")
    args = parser.parse_args()
    kill = tuple(int(v) for v in args.kill.split("@")) if args.kill else None

    dist.init_distributed_environment()
    me, first_world = dist.get_world_rank(), dist.get_world_size()
    w = np.zeros(DIM)
    step, lost_all = 0, []
    replicas = list(range(first_world))
    # Per step: the parameters it started from, and the replicas that summed it.
    history = []
    while step < STEPS:
        del history[step:]
        history.append((w.copy(), list(replicas)))
        if kill == (me, step):
            print(f"elastic_dp.py: rank {me} kills itself inside step {step}", file=sys.stderr, flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        g = gradient(w, me, step)
        try:
            total = dist.get_world_group().all_reduce(g)
        except dist.PeerLostError as e:
            lost, new_rank = dist.shrink()
            lost_all.append((e.lost, lost))
            replicas = [r for i, r in enumerate(replicas) if new_rank[i] is not None]
            redo = int(dist.get_world_group().all_reduce(np.array([float(step)]), op="min")[0])
            w = history[redo][0].copy()
            print(f"elastic_dp.py: rank {me}: lost {e.lost} at step {step}; now rank "
                  f"{dist.get_world_rank()} of {dist.get_world_size()}, redoing step {redo}",
                  file=sys.stderr, flush=True)
            step = redo
            continue
        w -= LR * total / dist.get_world_size()
        step += 1

    ref = np.zeros(DIM)
    for s, (_, summed) in enumerate(history):
        ref -= LR * sum(gradient(ref, r, s) for r in summed) / len(summed)
    worst = float(np.max(np.abs(w - ref) / np.maximum(np.abs(ref), 1e-3)))
    ok = worst < 1e-9 and all(a == b for a, b in lost_all)
    print(f"elastic_dp.py: rank {me}: {STEPS} steps, {dist.get_world_size()} ranks at the end, "
          f"losses {lost_all}; parameters {'match' if ok else 'DIFFER from'} the serial replay "
          f"(worst relative difference {worst:.1e})", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
