"""Every test runs on every rank of an mpirun job (scripts/python-test.sh
launches pytest under mpirun at np 1-4): tests run in the same order on each
rank, and each compares its results with a serial NumPy reference every
rank can compute."""

import numpy as np
import pytest

import rankmesh as dist

try:
    import ml_dtypes
except ImportError:  # bf16 and fp8 need ml_dtypes (or torch)
    ml_dtypes = None


@pytest.fixture(scope="session", autouse=True)
def world():
    dist.init_distributed_environment()
    yield
    dist.destroy_model_parallel()


def make(rank: int, shape, dtype, seed: int = 0):
    """Rank ``rank``'s input: random non-integer values (0/1 for bool),
    the same on every rank that asks."""
    rng = np.random.default_rng(1000 * seed + rank)
    if np.dtype(dtype) == np.bool_:
        return rng.integers(0, 2, size=shape).astype(np.bool_)
    if np.dtype(dtype).kind in "iu":
        return rng.integers(-50, 50, size=shape).astype(dtype)
    return rng.uniform(-1, 1, size=shape).astype(np.float32).astype(dtype)


DTYPES = [np.float32, np.float16, np.int32, np.bool_] + ([ml_dtypes.bfloat16] if ml_dtypes else [])


def tol(dtype):
    name = np.dtype(dtype).name
    return {"float32": 1e-5, "float16": 4e-3, "bfloat16": 3e-2}.get(name, 0.0)
