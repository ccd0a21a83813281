"""Every torch.distributed op on CPU tensors, against a serial reference
and against gloo in the same job."""

import functools
import os

import pytest
import torch
import torch.distributed as dist

import rankmesh as rm
from conftest import close, make


def R():
    return dist.get_rank()


def W():
    return dist.get_world_size()


FLOATS = [torch.float32, torch.float64, torch.float16, torch.bfloat16]
INTS = [torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64]
SHAPES = [(), (7,), (3, 5)]


def fold(op, xs):
    return functools.reduce(op, xs)


REFERENCE = {
    dist.ReduceOp.SUM: lambda xs: fold(torch.add, xs),
    dist.ReduceOp.PRODUCT: lambda xs: fold(torch.mul, xs),
    dist.ReduceOp.MIN: lambda xs: fold(torch.minimum, xs),
    dist.ReduceOp.MAX: lambda xs: fold(torch.maximum, xs),
    dist.ReduceOp.BAND: lambda xs: fold(torch.bitwise_and, xs),
    dist.ReduceOp.BOR: lambda xs: fold(torch.bitwise_or, xs),
    dist.ReduceOp.BXOR: lambda xs: fold(torch.bitwise_xor, xs),
}


def reference(op, shape, dtype, seed):
    """The reduction of every rank's input, in float64 for floats (the
    order-free reference), cast back."""
    xs = [make(r, shape, dtype, seed) for r in range(W())]
    wide = [x.double() if dtype.is_floating_point else x for x in xs]
    if op == dist.ReduceOp.AVG:
        return (fold(torch.add, wide) / W()).to(dtype)
    return REFERENCE[op](wide).to(dtype)


def test_the_world_is_mpis_and_torchrun_variables_are_set():
    assert dist.get_backend() == "rankmesh"
    assert (R(), W()) == (rm.get_world_rank(), rm.get_world_size())
    assert int(os.environ["RANK"]) == R() and int(os.environ["WORLD_SIZE"]) == W()
    assert int(os.environ["LOCAL_RANK"]) == rm.get_local_rank()


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("op", [dist.ReduceOp.SUM, dist.ReduceOp.PRODUCT, dist.ReduceOp.MIN,
                                dist.ReduceOp.MAX, dist.ReduceOp.AVG])
def test_all_reduce_floats(op, dtype, shape, gloo):
    x = make(R(), shape, dtype, seed=1)
    dist.all_reduce(x, op=op)
    close(x, reference(op, shape, dtype, 1))
    if op != dist.ReduceOp.AVG and dtype in (torch.float32, torch.float64):
        y = make(R(), shape, dtype, seed=1)
        dist.all_reduce(y, op=op, group=gloo)
        close(x, y)


@pytest.mark.parametrize("dtype", INTS + [torch.bool])
@pytest.mark.parametrize("op", [dist.ReduceOp.SUM, dist.ReduceOp.MIN, dist.ReduceOp.MAX,
                                dist.ReduceOp.BAND, dist.ReduceOp.BOR, dist.ReduceOp.BXOR])
def test_all_reduce_integers_and_bitwise(op, dtype, gloo):
    if dtype == torch.bool and op == dist.ReduceOp.SUM:
        op = dist.ReduceOp.MAX  # gloo's and torch's bool sum is an or
    x = make(R(), (11,), dtype, seed=2)
    dist.all_reduce(x, op=op)
    close(x, reference(op, (11,), dtype, 2))
    if dtype != torch.int16:  # gloo has no int16
        y = make(R(), (11,), dtype, seed=2)
        dist.all_reduce(y, op=op, group=gloo)
        close(x, y)


def test_premul_sum_scales_before_summing():
    x = make(R(), (6,), torch.float32, seed=3)
    dist.all_reduce(x, op=dist._make_nccl_premul_sum(0.25))
    want = sum(make(r, (6,), torch.float32, seed=3).double() * 0.25 for r in range(W()))
    close(x, want.float())


def test_complex_sum_and_avg_travel_as_real_pairs():
    x = make(R(), (5,), torch.complex64, seed=4)
    dist.all_reduce(x)
    close(x, sum(make(r, (5,), torch.complex64, seed=4) for r in range(W())))


@pytest.mark.parametrize("src", [0, -1])
def test_broadcast_from_each_end(src, gloo):
    src = src % W()
    x = make(R(), (3, 4), torch.float32, seed=5)
    dist.broadcast(x, src)
    close(x, make(src, (3, 4), torch.float32, seed=5))


@pytest.mark.parametrize("dst", [0, -1])
@pytest.mark.parametrize("op", [dist.ReduceOp.SUM, dist.ReduceOp.MAX, dist.ReduceOp.BOR])
def test_reduce_leaves_the_result_on_dst_and_inputs_elsewhere(dst, op):
    dst = dst % W()
    dtype = torch.int32 if op == dist.ReduceOp.BOR else torch.float64
    x = make(R(), (9,), dtype, seed=6)
    dist.reduce(x, dst, op=op)
    want = reference(op, (9,), dtype, 6) if R() == dst else make(R(), (9,), dtype, seed=6)
    close(x, want)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64, torch.bool])
def test_all_gather_list_and_into_tensor(dtype, gloo):
    x = make(R(), (2, 3), dtype, seed=7)
    outs = [torch.empty(2, 3, dtype=dtype) for _ in range(W())]
    dist.all_gather(outs, x)
    for r in range(W()):
        close(outs[r], make(r, (2, 3), dtype, seed=7))
    flat = torch.empty(2 * W(), 3, dtype=dtype)
    dist.all_gather_into_tensor(flat, x)
    close(flat, torch.cat([make(r, (2, 3), dtype, seed=7) for r in range(W())]))
    stacked = torch.empty(W(), 2, 3, dtype=dtype)
    dist.all_gather_into_tensor(stacked, x)
    close(stacked, torch.stack([make(r, (2, 3), dtype, seed=7) for r in range(W())]))


def test_all_gather_of_uneven_tensors():
    sizes = [r + 1 for r in range(W())]
    x = make(R(), (sizes[R()],), torch.float32, seed=8)
    outs = [torch.empty(n) for n in sizes]
    dist.all_gather(outs, x)
    for r in range(W()):
        close(outs[r], make(r, (sizes[r],), torch.float32, seed=8))


@pytest.mark.parametrize("op", [dist.ReduceOp.SUM, dist.ReduceOp.MAX, dist.ReduceOp.AVG])
def test_reduce_scatter_tensor_and_list(op):
    x = make(R(), (W() * 4,), torch.float32, seed=9)
    out = torch.empty(4)
    dist.reduce_scatter_tensor(out, x, op=op)
    whole = reference(op, (W() * 4,), torch.float32, 9)
    close(out, whole[4 * R():4 * R() + 4])
    pieces = list(make(R(), (W() * 4,), torch.float32, seed=9).chunk(W()))
    out2 = torch.empty(4)
    dist.reduce_scatter(out2, pieces, op=op)
    close(out2, whole[4 * R():4 * R() + 4])


@pytest.mark.parametrize("op", [dist.ReduceOp.SUM, dist.ReduceOp.MAX, dist.ReduceOp.AVG])
@pytest.mark.parametrize("sizes", [lambda w: [r + 1 for r in range(w)],
                                   lambda w: [(2 * r + 1) % 3 for r in range(w)]],
                         ids=["growing", "with_empty"])
def test_reduce_scatter_of_uneven_pieces(op, sizes):
    sizes = sizes(W())
    total = sum(sizes)
    x = make(R(), (total,), torch.float64, seed=10)
    pieces = list(x.split(sizes))
    out = torch.empty(sizes[R()], dtype=torch.float64)
    dist.reduce_scatter(out, pieces, op=op)
    whole = reference(op, (total,), torch.float64, 10)
    start = sum(sizes[:R()])
    close(out, whole[start:start + sizes[R()]])


def test_all_to_all_single_even_and_uneven(gloo):
    x = make(R(), (W() * 2, 3), torch.float32, seed=11)
    out = torch.empty_like(x)
    dist.all_to_all_single(out, x)
    want = torch.cat([make(s, (W() * 2, 3), torch.float32, seed=11)[2 * R():2 * R() + 2]
                      for s in range(W())])
    close(out, want)
    # Rank s sends s + d + 1 rows to rank d (some ranks send none to rank 0 at W > 1).
    send = [(s + d) % 3 for s in [R()] for d in range(W())]
    recv = [(s + R()) % 3 for s in range(W())]
    x = make(R(), (sum(send), 2), torch.float64, seed=12)
    out = torch.empty(sum(recv), 2, dtype=torch.float64)
    dist.all_to_all_single(out, x, output_split_sizes=recv, input_split_sizes=send)
    want = []
    for s in range(W()):
        rows = [(s + d) % 3 for d in range(W())]
        start = sum(rows[:R()])
        want.append(make(s, (sum(rows), 2), torch.float64, seed=12)[start:start + rows[R()]])
    close(out, torch.cat(want))
    g = torch.empty_like(out)
    dist.all_to_all_single(g, x, output_split_sizes=recv, input_split_sizes=send, group=gloo)
    close(out, g)


def test_all_to_all_lists():
    ins = [make(R() * 10 + d, (d + 1,), torch.int64, seed=13) for d in range(W())]
    outs = [torch.empty(R() + 1, dtype=torch.int64) for _ in range(W())]
    dist.all_to_all(outs, ins)
    for s in range(W()):
        close(outs[s], make(s * 10 + R(), (R() + 1,), torch.int64, seed=13))


@pytest.mark.parametrize("root", [0, -1])
def test_gather_and_scatter(root):
    root = root % W()
    x = make(R(), (4,), torch.float16, seed=14)
    outs = [torch.empty(4, dtype=torch.float16) for _ in range(W())] if R() == root else None
    dist.gather(x, outs, dst=root)
    if R() == root:
        for r in range(W()):
            close(outs[r], make(r, (4,), torch.float16, seed=14))
    pieces = [make(100 + r, (2, 2), torch.float32, seed=14) for r in range(W())]
    out = torch.empty(2, 2)
    dist.scatter(out, pieces if R() == root else None, src=root)
    close(out, make(100 + R(), (2, 2), torch.float32, seed=14))


def test_send_recv_in_a_ring_and_isend_before_recv():
    if W() == 1:
        pytest.skip("point-to-point needs two ranks")
    nxt, prv = (R() + 1) % W(), (R() - 1) % W()
    x = make(R(), (5,), torch.float32, seed=15)
    got = torch.empty(5)
    # Every rank sends first, as gloo allows: held sends run with the receive.
    req = dist.isend(x, nxt)
    dist.recv(got, prv)
    req.wait()
    close(got, make(prv, (5,), torch.float32, seed=15))
    # Blocking calls in an order that completes (even ranks send first).
    got = torch.empty(5)
    if R() % 2 == 0:
        dist.send(x, nxt)
        dist.recv(got, prv)
    else:
        dist.recv(got, prv)
        dist.send(x, nxt)
    close(got, make(prv, (5,), torch.float32, seed=15))


def test_batch_isend_irecv_both_ways():
    if W() == 1:
        pytest.skip("point-to-point needs two ranks")
    nxt, prv = (R() + 1) % W(), (R() - 1) % W()
    a, b = torch.empty(3), torch.empty(3, dtype=torch.int32)
    ops = [dist.P2POp(dist.irecv, a, prv), dist.P2POp(dist.isend, make(R(), (3,), torch.float32, 16), nxt),
           dist.P2POp(dist.isend, make(R(), (3,), torch.int32, 16), prv),
           dist.P2POp(dist.irecv, b, nxt)]
    for w in dist.batch_isend_irecv(ops):
        w.wait()
    close(a, make(prv, (3,), torch.float32, 16))
    close(b, make(nxt, (3,), torch.int32, 16))


def test_async_work_waits_and_futures_hold_the_result():
    x = make(R(), (4,), torch.float32, seed=17)
    work = dist.all_reduce(x, async_op=True)
    assert work.wait()
    assert work.is_completed()
    fut = dist.all_reduce(make(R(), (4,), torch.float32, seed=17), async_op=True).get_future()
    (value,) = fut.wait()
    want = reference(dist.ReduceOp.SUM, (4,), torch.float32, 17)
    close(x, want)
    close(value, want)


def test_coalescing_manager_runs_every_op():
    xs = [make(R(), (n,), torch.float32, seed=18 + n) for n in (1, 3)]
    with dist._coalescing_manager(async_ops=True) as cm:
        for x in xs:
            dist.all_reduce(x)
    cm.wait()
    for n, x in zip((1, 3), xs):
        close(x, reference(dist.ReduceOp.SUM, (n,), torch.float32, 18 + n))


def test_barrier_and_objects_use_torchs_pickle():
    dist.barrier()
    objs = [{"step": 3, "name": "x"} if R() == 0 else None]
    dist.broadcast_object_list(objs, 0)
    assert objs == [{"step": 3, "name": "x"}]
    everyone = [None] * W()
    dist.all_gather_object(everyone, ("rank", R()))
    assert everyone == [("rank", r) for r in range(W())]


def test_new_group_of_a_subset_only_its_members_create():
    members = list(range(0, W(), 2))
    g = dist.new_group(members)
    if R() in members:
        x = make(R(), (3,), torch.float32, seed=19)
        dist.all_reduce(x, group=g)
        close(x, sum(make(r, (3,), torch.float64, seed=19) for r in members).float())
        assert dist.get_group_rank(g, R()) == members.index(R())
    dist.barrier()


def test_fastvideo_groups_are_torch_groups_on_the_same_rankmesh_groups():
    tp = 2 if W() % 2 == 0 else 1
    rm.initialize_model_parallel(tensor_model_parallel_size=tp)
    try:
        group = rm.get_tp_group()
        pg = group.device_group
        assert pg is group.cpu_group
        assert dist.get_process_group_ranks(pg) == group.ranks
        x = make(R(), (4,), torch.float32, seed=20)
        dist.all_reduce(x, group=pg)
        close(x, sum(make(r, (4,), torch.float64, seed=20) for r in group.ranks).float())
        assert rm.get_world_group().device_group is dist.group.WORLD
    finally:
        rm.destroy_model_parallel()
