"""CUDA tensors through DLPack on the device plane, against the NumPy
reference, at every np scripts/python-test.sh runs them (1-3), on the CUDA
and NCCL emulators (RANKMESH_TEST_CUDA=emulator: tests/emulator, whose device
memory is host memory run in stream order by worker threads) or, on a GPU
machine, on torch CUDA tensors (RANKMESH_TEST_CUDA=torch). Skipped otherwise."""

import os

import numpy as np
import pytest
from conftest import make, tol

import rankmesh as dist

MODE = os.environ.get("RANKMESH_TEST_CUDA")
pytestmark = pytest.mark.skipif(MODE not in ("emulator", "torch"), reason="no CUDA here (RANKMESH_TEST_CUDA)")

try:
    import ml_dtypes
except ImportError:
    ml_dtypes = None

DTYPES = [np.float32, np.float16, np.int32] + ([ml_dtypes.bfloat16] if ml_dtypes else [])


def world():
    return dist.get_world_group()


def device():
    # The device plane's default: the local rank's GPU (one node here), or
    # the one GPU of a one-GPU machine, which every rank shares under
    # RANKMESH_SHARE_GPU=1 (scripts/gpu-check.sh's multi-rank rows).
    if MODE == "torch":
        import torch

        return world().rank_in_group % torch.cuda.device_count()
    return world().rank_in_group


def to_cuda(a):
    if MODE == "torch":
        import torch

        if a.dtype.name == "bfloat16":
            return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16).to(f"cuda:{device()}")
        return torch.from_numpy(np.ascontiguousarray(a)).to(f"cuda:{device()}")
    from emulated_cuda import EmulatedCudaArray

    return EmulatedCudaArray.from_numpy(a, device())


def to_host(x, dtype):
    if MODE == "torch":
        import torch

        torch.cuda.current_stream().synchronize()
        if x.dtype == torch.bfloat16:
            return x.view(torch.int16).cpu().numpy().view(dtype)
        return x.cpu().numpy()
    return x.numpy()


def address(x):
    return x.data_ptr() if MODE == "torch" else x.ptr


def close(got, want, dtype):
    got = np.asarray(got).astype(np.float64)
    want = np.asarray(want).astype(np.float64)
    assert got.shape == want.shape, (got.shape, want.shape)
    t = tol(dtype)
    assert np.all(np.abs(got - want) <= t * np.maximum(np.abs(want), 1.0)), (got, want)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("shape", [(7,), (3, 5, 4)])
def test_all_reduce_of_a_cuda_tensor_is_in_place_on_the_device(dtype, shape):
    g = world()
    p, me = g.world_size, g.rank_in_group
    parts = [make(r, shape, dtype, seed=11) for r in range(p)]
    x = to_cuda(parts[me])
    at = address(x)
    y = g.all_reduce(x)
    assert y is x and address(x) == at, "in place, on the device"
    want = np.sum(np.stack([q.astype(np.float64) for q in parts]), axis=0)
    close(to_host(x, dtype), want, dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_broadcast_all_gather_and_reduce_scatter_of_cuda_tensors(dtype):
    g = world()
    p, me = g.world_size, g.rank_in_group
    src = p - 1
    parts = [make(r, (2 * p, 3), dtype, seed=12) for r in range(p)]
    x = to_cuda(parts[me])
    g.broadcast(x, src=src)
    close(to_host(x, dtype), parts[src], dtype)

    x = to_cuda(parts[me])
    out = g.all_gather(x, dim=-1)
    assert type(out) is type(x), "the output is allocated by the input's library, on its device"
    close(to_host(out, dtype), np.concatenate(parts, axis=-1), dtype)

    out = g.reduce_scatter(to_cuda(parts[me]), dim=0)
    total = np.sum(np.stack([q.astype(np.float64) for q in parts]), axis=0)
    close(to_host(out, dtype), np.split(total, p, axis=0)[me], dtype)


def test_all_to_all_4D_of_cuda_tensors_matches_fastvideo():
    g = world()
    p, me = g.world_size, g.rank_in_group
    b, s, h, d = 2, 3 * p, 2 * p, 4
    full = [make(r, (b, s, h, d), np.float32, seed=13) for r in range(p)]
    mine = np.split(full[me], p, axis=1)[me]  # [B, S/P, H, D], rank me's sequence shard
    x = to_cuda(np.ascontiguousarray(mine))
    out = g.all_to_all_4D(x, scatter_dim=2, gather_dim=1)
    # [B, S, H/P, D]: every rank's sequence shard of this rank's heads.
    want = np.concatenate([np.split(np.split(full[r], p, axis=1)[r], p, axis=2)[me] for r in range(p)], axis=1)
    close(to_host(out, np.float32), want, np.float32)


def test_send_and_recv_of_cuda_tensors_around_the_ring():
    g = world()
    p, me = g.world_size, g.rank_in_group
    if p == 1:
        pytest.skip("a ring of one")
    mine = make(me, (5,), np.float32, seed=14)
    prev = make((me - 1) % p, (5,), np.float32, seed=14)
    out = to_cuda(np.zeros(5, np.float32))
    if me % 2 == 0:
        g.send(to_cuda(mine), dst=(me + 1) % p)
        g.recv_into(out, src=(me - 1) % p)
    else:
        g.recv_into(out, src=(me - 1) % p)
        g.send(to_cuda(mine), dst=(me + 1) % p)
    close(to_host(out, np.float32), prev, np.float32)


def test_a_cuda_tensor_on_another_device_is_an_error_on_every_rank():
    if MODE != "emulator":
        pytest.skip("one GPU per rank on the GPU machine")
    from emulated_cuda import EmulatedCudaArray

    g = world()
    me = g.rank_in_group
    # Rank 0 passes memory of a device that is not its own; the others call in.
    dev = device() + 1 if me == 0 else device()
    x = EmulatedCudaArray.from_numpy(np.ones(4, np.float32), dev)
    with pytest.raises(dist.Error) as e:
        g.all_reduce(x)
    if me == 0:
        assert isinstance(e.value, dist.TensorError)
        assert f"a CUDA tensor on device {dev + 0}" in str(e.value)
    # The group is usable after it.
    y = to_cuda(np.full(3, 0.5, np.float32))
    g.all_reduce(y)
    close(to_host(y, np.float32), np.full(3, 0.5 * g.world_size), np.float32)


def test_the_export_is_asked_for_the_stream_the_call_runs_on():
    if MODE != "emulator":
        pytest.skip("the emulated producer records it")
    x = to_cuda(np.ones(2, np.float32))
    world().all_reduce(x)
    # A producer rankmesh does not know: the legacy default stream (1).
    assert x.exports == 1 and x.last_stream == 1
