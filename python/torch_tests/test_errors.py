"""Errors torch users can act on: a mismatched call raises on every rank
with rankmesh's message, a rank's own bad input raises there and is an
error on the others, and the group goes on working afterwards."""

import pytest
import torch
import torch.distributed as dist

from conftest import close


def R():
    return dist.get_rank()


def W():
    return dist.get_world_size()


def still_works():
    x = torch.ones(2)
    dist.all_reduce(x)
    close(x, torch.full((2,), float(W())))


def test_different_shapes_raise_on_every_rank():
    if W() == 1:
        pytest.skip("a mismatch needs two ranks")
    x = torch.zeros(3 if R() == 0 else 4)
    with pytest.raises(dist.DistBackendError) as e:
        dist.all_reduce(x)
    assert "all_reduce" in str(e.value)
    still_works()


def test_different_ops_raise_on_every_rank_naming_both():
    if W() == 1:
        pytest.skip("a mismatch needs two ranks")
    x = torch.zeros(4)
    with pytest.raises(dist.DistBackendError) as e:
        if R() == 0:
            dist.broadcast(x, 0)
        else:
            dist.all_reduce(x)
    assert "broadcast" in str(e.value) and "all_reduce" in str(e.value), str(e.value)
    still_works()


def test_a_non_contiguous_output_on_one_rank_is_named_there_and_an_error_elsewhere():
    out = torch.empty(4, 2 * W()).t() if R() == 0 else torch.empty(2 * W(), 4)
    with pytest.raises(dist.DistBackendError) as e:
        dist.all_gather_into_tensor(out, torch.zeros(2, 4))
    if R() == 0:
        assert "non-contiguous" in str(e.value), str(e.value)
    still_works()


def test_a_dtype_rankmesh_lacks_is_named():
    x = torch.zeros(4, dtype=torch.float8_e4m3fnuz)
    with pytest.raises(dist.DistBackendError, match="float8_e4m3fnuz|Float8_e4m3fnuz"):
        dist.all_reduce(x)
    still_works()


def test_bitwise_reduction_of_floats_is_refused_on_every_rank():
    with pytest.raises(dist.DistBackendError, match="bitwise reductions take integer"):
        dist.all_reduce(torch.ones(3), op=dist.ReduceOp.BAND)
    still_works()


def test_uneven_splits_that_do_not_add_up_are_refused():
    x = torch.zeros(W() + 1)
    out = torch.zeros(W())
    with pytest.raises(dist.DistBackendError, match="add up to"):
        dist.all_to_all_single(out, x, output_split_sizes=[1] * W(), input_split_sizes=[1] * W())
    still_works()


def test_a_rank_that_refuses_its_own_call_is_named_by_the_others():
    """Only the last rank's arguments are wrong: it raises its own reason,
    and the others' matching call fails naming it and the refusal (it used
    to read as a barrier they were not in)."""
    last = W() - 1
    mine = dist.get_rank() == last
    op = dist.ReduceOp.BAND if mine else dist.ReduceOp.SUM
    want = "bitwise reductions take integer" if mine else rf"group rank {last} refused call #\d+ on its own arguments"
    with pytest.raises(dist.DistBackendError, match=want):
        dist.all_reduce(torch.ones(3), op=op)
    still_works()
