import numpy as np
import pytest
from conftest import make

import rankmesh as dist


def world():
    return dist.get_world_group()


def test_mismatched_shapes_and_dtypes_fail_on_every_rank():
    g = world()
    p, me = g.world_size, g.rank_in_group
    if p == 1:
        pytest.skip("needs two members")
    shape = (4,) if me == 0 else (5,)
    with pytest.raises(dist.MismatchError):
        g.all_reduce(np.ones(shape, np.float32))
    dtype = np.float32 if me == 0 else np.float64
    with pytest.raises(dist.MismatchError):
        g.all_reduce(np.ones(4, dtype))
    g.barrier()


def test_bad_dims_fail_on_every_rank():
    g = world()
    with pytest.raises(dist.InvalidArgumentError, match="dim 5 out of range"):
        g.all_gather(np.ones((2, 3), np.float32), 5)
    if g.world_size > 1:
        with pytest.raises(dist.InvalidArgumentError):
            g.all_to_all_4D(np.ones((1, 2, g.world_size + 1, 2), np.float32), 2, 1)


def test_a_local_refusal_is_an_error_on_every_rank():
    g = world()
    p, me = g.world_size, g.rank_in_group
    if p == 1:
        pytest.skip("needs two members")
    x = np.ones(3, np.complex64) if me == 0 else np.ones(3, np.float32)
    with pytest.raises((TypeError, dist.Error)):
        g.all_reduce(x)
    g.barrier()


class _CapsuleOnly:
    """A DLPack producer that claims memory on DLPack device type `kind`
    (2: CUDA, 10: ROCm) at a made-up address, never touched: each test's
    rank refuses it before any device call."""

    shape = (4,)

    def __init__(self, kind):
        self.kind = kind

    def __dlpack_device__(self):
        return (self.kind, 0)

    def __dlpack__(self, stream=None):
        from emulated_cuda import dltensor_capsule

        self._keep = []
        return dltensor_capsule(
            0x10000, 0, self.shape, np.float32, self._keep, device_type=self.kind
        )


def test_a_cuda_tensor_without_a_gpu_stack_is_an_error_on_every_rank():
    import os

    if os.environ.get("RANKMESH_TEST_CUDA"):
        pytest.skip("this run has a GPU stack")
    g = world()
    me = g.rank_in_group
    # Rank 0 passes CUDA memory; the others pass host arrays and call in.
    x = _CapsuleOnly(2) if me == 0 else np.ones(4, np.float32)
    with pytest.raises(dist.Error) as e:
        g.all_reduce(x)
    if me == 0:
        assert isinstance(e.value, dist.GpuError), e.value
    g.barrier()


def test_memory_of_another_device_kind_is_an_error_on_every_rank():
    g = world()
    me = g.rank_in_group
    x = _CapsuleOnly(10) if me == 0 else np.ones(4, np.float32)  # ROCm
    with pytest.raises(dist.Error) as e:
        g.all_reduce(x)
    if me == 0:
        assert isinstance(e.value, dist.TensorError), e.value
        assert "DLPack device type 10" in str(e.value), e.value
    g.barrier()


OBJECTS = [
    None, True, 3, -(2 ** 70), 2.5, "héllo", b"\x00\xff",
    [1, [2, (3, None)]], {"lr": 1e-4, "steps": [1, 2], 7: "seven", (1, 2): False},
]


@pytest.mark.parametrize("obj", OBJECTS, ids=range(len(OBJECTS)))
def test_objects_cross_as_data(obj):
    g = world()
    src = g.world_size - 1
    got = g.broadcast_object(obj if g.rank_in_group == src else None, src)
    assert got == obj and type(got) is type(obj)
    assert g.all_gather_object(obj) == [obj] * g.world_size


def test_arrays_inside_objects():
    g = world()
    a = make(0, (2, 3), np.float16, seed=9)
    got = g.broadcast_object({"a": a, "i": np.int64(5)} if g.rank_in_group == 0 else None, 0)
    np.testing.assert_array_equal(got["a"], a)
    assert got["a"].dtype == np.float16 and got["i"] == 5


class Config:
    lr = 0.1


def test_an_arbitrary_class_is_refused_not_pickled():
    g = world()
    me = g.rank_in_group
    with pytest.raises((TypeError, dist.Error)) as e:
        g.broadcast_object(Config() if me == 0 else None, 0)
    if me == 0:
        assert e.type is TypeError and "never pickled" in str(e.value)
    import pickle

    # Pickled bytes are just bytes: they arrive as bytes, never unpickled.
    blob = pickle.dumps(Config)
    assert g.broadcast_object(blob if me == 0 else None, 0) == blob


def test_broadcast_tensor_dict():
    g = world()
    me = g.rank_in_group
    d = {"x": make(0, (3, 2), np.float32, seed=10), "step": 4, "name": "run"}
    got = g.broadcast_tensor_dict(d if me == 0 else None, 0)
    np.testing.assert_array_equal(got["x"], d["x"])
    assert got["step"] == 4 and got["name"] == "run"


def test_helpers():
    assert dist.is_main_process() == (dist.get_world_rank() == 0)
    got = dist.gather_scalar_from_all_ranks(lambda: dist.get_world_rank() * 1.5, dist.get_world_size())
    if dist.get_world_rank() == 0:
        assert got == [r * 1.5 for r in range(dist.get_world_size())]
    else:
        assert got is None
    assert dist.compute_and_broadcast(lambda: dist.get_world_rank() + 10) == 10
    with dist.zero_first():
        pass
    with pytest.raises(ValueError):
        dist.divide(7, 2)


HOSTILE = [
    b"",  # nothing
    b"\x63",  # an unknown tag
    b"\x08\xff\xff\xff\xff",  # a list of 4 billion items in 5 bytes
    b"\x06\x05\x00\x00\x00ab",  # a string longer than the bytes left
    b"\x06\x02\x00\x00\x00\xff\xfe",  # text that is not UTF-8
    b"\x04\x02\x00\x00\x00x1",  # a big int that is not digits
    b"\x08\x01\x00\x00\x00" * 100 + b"\x00",  # nested past the limit
    b"\x0a\x01\x00\x00\x00\x08\x00\x00\x00\x00\x00",  # a dict keyed by a list
    b"\x00\x00",  # bytes after the value
    b"\x0b\x02\x00\x00\x00|O\x01\x00\x00\x00" + (1).to_bytes(8, "little") * 2 + b"\x00" * 8,  # object dtype
    b"\x0b\x03\x00\x00\x00<f4\x01\x00\x00\x00" + (3).to_bytes(8, "little") + (4).to_bytes(8, "little") + b"\x00" * 4,
]


@pytest.mark.parametrize("blob", HOSTILE, ids=range(len(HOSTILE)))
def test_hostile_bytes_are_an_object_error_never_a_crash(blob):
    from rankmesh import _native

    with pytest.raises(dist.ObjectError):
        _native._decode(blob)


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # NumPy's, for odd dtype aliases a mutation makes
def test_random_bytes_decode_or_raise_object_error():
    from rankmesh import _native

    rng = np.random.default_rng(5)
    good = _native._encode({"a": [1, 2.5, "x", None, (b"y", True)], "n": np.arange(6, dtype=np.int16).reshape(2, 3)})
    for i in range(3000):
        blob = bytearray(good)
        for _ in range(rng.integers(1, 4)):
            blob[rng.integers(0, len(blob))] = rng.integers(0, 256)
        try:
            _native._decode(bytes(blob))
        except dist.ObjectError:
            pass
