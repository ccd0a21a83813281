import numpy as np
import pytest
from conftest import DTYPES, make, tol

import rankmesh as dist


def world():
    return dist.get_world_group()


def reduce_ref(parts, op):
    if parts[0].dtype == np.bool_:
        return np.logical_or.reduce(parts) if op in ("sum", "max") else np.logical_and.reduce(parts)
    wide = [p.astype(np.float64) for p in parts]
    out = {"sum": np.sum, "max": np.max, "min": np.min}[op](np.stack(wide), axis=0)
    return out


def close(got, want, dtype):
    got = np.asarray(got).astype(np.float64)
    want = np.asarray(want).astype(np.float64)
    assert got.shape == want.shape
    t = tol(dtype)
    assert np.all(np.abs(got - want) <= t * np.maximum(np.abs(want), 1.0)), (got, want)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("op", ["sum", "max", "min"])
@pytest.mark.parametrize("shape", [(7,), (3, 5, 4)])
def test_all_reduce_in_place_matches_the_reference(dtype, op, shape):
    g = world()
    p, me = g.world_size, g.rank_in_group
    parts = [make(r, shape, dtype, seed=1) for r in range(p)]
    x = parts[me].copy()
    addr = x.ctypes.data
    y = g.all_reduce(x, op)
    assert y is x and x.ctypes.data == addr, "all_reduce is in place, no copy"
    close(x, reduce_ref(parts, op), dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("dim", [0, 1, -1])
def test_all_gather_and_gather(dtype, dim):
    g = world()
    p, me = g.world_size, g.rank_in_group
    parts = [make(r, (2, 3, 4), dtype, seed=2) for r in range(p)]
    out = g.all_gather(parts[me], dim)
    assert out.dtype == parts[me].dtype
    np.testing.assert_array_equal(out, np.concatenate(parts, axis=dim))
    got = g.gather(parts[me], dst=p - 1, dim=dim)
    if me == p - 1:
        np.testing.assert_array_equal(got, np.concatenate(parts, axis=dim))
    else:
        assert got is None


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("dim", [0, 1])
def test_reduce_scatter(dtype, dim):
    g = world()
    p, me = g.world_size, g.rank_in_group
    parts = [make(r, (2 * p, 3 * p), dtype, seed=3) for r in range(p)]
    out = g.reduce_scatter(parts[me], dim=dim)
    want = np.split(np.asarray(reduce_ref(parts, "sum")), p, axis=dim)[me]
    close(out, want, dtype)


def uneven_counts(p, seed):
    """Per-member counts with zeros, the same on every rank."""
    rng = np.random.default_rng(seed)
    counts = [int(c) for c in rng.integers(0, 4, size=p)]
    counts[p - 1] = counts[p - 1] or 2
    return counts


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("op", ["sum", "max"])
@pytest.mark.parametrize("dim", [0, 1, -1])
def test_reduce_scatter_v(dtype, op, dim):
    g = world()
    p, me = g.world_size, g.rank_in_group
    counts = uneven_counts(p, seed=11 + dim)
    shape = [2, 3, 2]
    shape[dim] = sum(counts)
    parts = [make(r, tuple(shape), dtype, seed=13) for r in range(p)]
    out = g.reduce_scatter_v(parts[me], counts, dim=dim, op=op)
    cuts = np.cumsum(counts)[:-1]
    want = np.split(np.asarray(reduce_ref(parts, op)), cuts, axis=dim)[me]
    assert out.dtype == parts[me].dtype
    close(out, want, dtype)


def test_reduce_scatter_v_refusals_reach_every_member():
    g = world()
    p, me = g.world_size, g.rank_in_group
    if p >= 2:
        # Counts that differ between members (np 2-4).
        counts = [2] * p
        if me == 0:
            counts[0], counts[1] = 3, 1
        with pytest.raises(dist.MismatchError, match="ranks disagree"):
            g.reduce_scatter_v(np.ones((2 * p, 2), np.float32), counts)
    # Counts that do not add up to the input: every member refuses, naming
    # the first member with the problem, and each notes its own.
    with pytest.raises(dist.Error, match="group rank 0 passed counts that do not fit") as err:
        g.reduce_scatter_v(np.ones((p + 1, 2), np.float32), [1] * p)
    assert f"add up to {p}" in str(err.value), str(err.value)
    # And the group still works.
    out = g.reduce_scatter_v(np.ones((p, 2), np.float32), [1] * p)
    np.testing.assert_array_equal(out, np.full((1, 2), p, np.float32))


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_broadcast_in_place(dtype):
    g = world()
    p, me = g.world_size, g.rank_in_group
    src = p - 1
    x = make(me, (4, 3), dtype, seed=4)
    addr = x.ctypes.data
    assert g.broadcast(x, src) is x and x.ctypes.data == addr
    np.testing.assert_array_equal(x, make(src, (4, 3), dtype, seed=4))


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_all_to_all_4D_there_and_back(dtype):
    g = world()
    p, me = g.world_size, g.rank_in_group
    B, S, H, D = 2, 3, 2 * p, 4
    parts = [make(r, (B, S, H, D), dtype, seed=5) for r in range(p)]
    there = g.all_to_all_4D(parts[me], 2, 1)
    hp = H // p
    want = np.concatenate([q[:, :, me * hp:(me + 1) * hp, :] for q in parts], axis=1)
    np.testing.assert_array_equal(there, want)
    back = g.all_to_all_4D(there, 1, 2)
    np.testing.assert_array_equal(back, parts[me])


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_send_recv_ring(dtype):
    g = world()
    p, me = g.world_size, g.rank_in_group
    if p == 1:
        pytest.skip("a ring needs two members")
    x = make(me, (5, 2), dtype, seed=6)
    if me % 2 == 0:
        g.send(x)
        got = g.recv((5, 2), dtype)
    else:
        got = g.recv((5, 2), dtype)
        g.send(x)
    np.testing.assert_array_equal(got, make((me - 1) % p, (5, 2), dtype, seed=6))
    # Into a caller's array, from an explicit source, non-contiguous input.
    out = np.empty((5,), dtype)
    if me == 0:
        g.send(x[:, 1], dst=p - 1)
    if me == p - 1:
        assert g.recv_into(out, src=0) is out
        np.testing.assert_array_equal(out, make(0, (5, 2), dtype, seed=6)[:, 1])


def test_non_contiguous_inputs_are_copied_and_outputs_refused():
    g = world()
    p, me = g.world_size, g.rank_in_group
    parts = [make(r, (4, 6), np.float32, seed=7) for r in range(p)]
    view = parts[me][:, ::2]  # every other column: not contiguous
    assert not view.flags.c_contiguous
    out = g.all_gather(view, 0)
    np.testing.assert_array_equal(out, np.concatenate([q[:, ::2] for q in parts], axis=0))
    # Written in place, a non-contiguous array cannot be: an error on every rank.
    with pytest.raises(dist.Error):
        g.all_reduce(parts[me][:, ::2])
    x = parts[me].copy()
    g.all_reduce(x)  # the group is still usable


def test_zero_copy_all_reduce_allocates_nothing_of_the_tensors_size():
    import tracemalloc

    from rankmesh import _native

    g = world()
    x = np.ones(1 << 20, np.float32)  # 4 MiB
    g.all_reduce(x)
    # Python's heap (tracemalloc) and the library's (the extension's
    # allocator, which records each thread's largest allocation).
    _native._largest_rust_allocation()
    tracemalloc.start()
    for _ in range(3):
        g.all_reduce(x)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    largest = _native._largest_rust_allocation()
    assert peak < 64 << 10, f"peak {peak} B traced during in-place all_reduce"
    assert largest < 64 << 10, f"a {largest} B allocation on the Rust heap during in-place all_reduce"
    assert x[0] == g.world_size ** 4
    # The probe sees the library's allocations: the object plane encodes
    # 1 MiB of bytes into a buffer on the Rust heap.
    g.broadcast_object(b"x" * (1 << 20), 0)
    assert _native._largest_rust_allocation() >= 1 << 20


def test_torch_style_and_unsupported_inputs():
    g = world()
    with pytest.raises(TypeError, match="does not move complex64"):
        g.all_reduce(np.ones(3, np.complex64))
    with pytest.raises(TypeError, match="NumPy arrays and torch"):
        g.all_reduce([1.0, 2.0])
    ro = np.ones(3, np.float32)
    ro.setflags(write=False)
    with pytest.raises(dist.TensorError, match="read-only"):
        g.all_reduce(ro)
    out = g.all_gather(ro, 0)  # read-only input is fine
    assert out.shape == (3 * g.world_size,)


class DLPackOnly:
    """An object that offers its memory through DLPack alone, as torch
    tensors do (here NumPy's own `__dlpack__` export, a real producer)."""

    def __init__(self, a):
        self.a = a

    def __dlpack__(self, stream=None):
        return self.a.__dlpack__()

    def __dlpack_device__(self):
        return self.a.__dlpack_device__()


@pytest.mark.parametrize("dtype", [np.float32, np.int64, np.bool_, np.uint16], ids=lambda d: np.dtype(d).name)
def test_dlpack_producers_are_read_and_written_in_place(dtype):
    g = world()
    p, me = g.world_size, g.rank_in_group
    parts = [make(r, (3, 4), dtype, seed=11) for r in range(p)]
    x = parts[me].copy()
    g.all_reduce(DLPackOnly(x), "max")
    close(x, reduce_ref(parts, "max"), dtype)
    out = g.all_gather(DLPackOnly(parts[me]), 0)
    np.testing.assert_array_equal(out, np.concatenate(parts, axis=0))
    # A non-contiguous producer is copied as an input, refused as an output.
    strided = parts[me][:, ::2]
    out = g.all_gather(DLPackOnly(strided), 0)
    np.testing.assert_array_equal(out, np.concatenate([q[:, ::2] for q in parts], axis=0))
    with pytest.raises(dist.TensorError, match="not C-contiguous"):
        g.all_reduce(DLPackOnly(x[:, ::2]))
