"""torch.distributed on the "rankmesh" backend: every test runs on every rank
of an mpirun job (scripts/python-test.sh launches pytest under mpirun at
np 1-4), in the same order, and compares rankmesh's results with a serial
reference every rank computes from every rank's inputs, and with gloo's in
the same job (a gloo group over the same ranks, on the store rankmesh's
rendezvous made)."""

import pytest
import torch
import torch.distributed as dist

import rankmesh.torch  # noqa: F401  (registers the backend)


@pytest.fixture(scope="session", autouse=True)
def world():
    dist.init_process_group("rankmesh")
    yield
    dist.destroy_process_group()


@pytest.fixture(scope="session")
def gloo():
    """A gloo group over the whole world, beside rankmesh's."""
    return dist.new_group(backend="gloo")


def make(rank: int, shape, dtype, seed: int = 0) -> torch.Tensor:
    """Rank ``rank``'s input: random non-integer values (0/1 for bool, small
    integers for integer types), the same on every rank that asks."""
    g = torch.Generator().manual_seed(1000 * seed + rank)
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=g).to(torch.bool)
    if not dtype.is_floating_point and not dtype.is_complex:
        lo = 0 if dtype == torch.uint8 else -50
        return torch.randint(lo, 50, shape, generator=g).to(dtype)
    if dtype.is_complex:
        return torch.complex(torch.rand(shape, generator=g) * 2 - 1,
                             torch.rand(shape, generator=g) * 2 - 1).to(dtype)
    return (torch.rand(shape, generator=g) * 2 - 1).to(dtype)


def tol(dtype) -> float:
    return {torch.float32: 1e-5, torch.float64: 1e-12, torch.float16: 4e-3,
            torch.bfloat16: 3e-2, torch.complex64: 1e-5}.get(dtype, 0.0)


def close(got: torch.Tensor, want: torch.Tensor, dtype=None) -> None:
    dtype = dtype or got.dtype
    assert got.dtype == want.dtype, (got.dtype, want.dtype)
    assert got.shape == want.shape, (got.shape, want.shape)
    t = tol(dtype)
    if t == 0.0:
        assert torch.equal(got, want), (got, want)
    else:
        torch.testing.assert_close(got, want, rtol=t, atol=t)
