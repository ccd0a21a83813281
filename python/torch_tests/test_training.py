"""What torch users build on the backend: DDP at its defaults, DeviceMesh
with DTensor, FSDP2 on CPU; each against the same steps on gloo in the
same job."""

import pytest
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from conftest import make


def R():
    return dist.get_rank()


def W():
    return dist.get_world_size()


def model():
    torch.manual_seed(1234 + R())  # different per rank: DDP's broadcast must fix it
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))


def train(net, steps=4):
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    for step in range(steps):
        x = make(R(), (5, 8), torch.float32, seed=100 + step)
        loss = net(x).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    return torch.cat([p.detach().reshape(-1) for p in net.parameters()])


def test_ddp_at_its_defaults_ends_identical_everywhere_and_as_gloo(gloo):
    ours = train(DDP(model()))  # init_sync on: _verify_params_across_processes, broadcast
    theirs = train(DDP(model(), process_group=gloo))
    everyone = [torch.empty_like(ours) for _ in range(W())]
    dist.all_gather(everyone, ours)
    for r in range(W()):
        assert torch.equal(everyone[r], ours), f"rank {r}'s parameters differ from rank {R()}'s"
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-6)


def test_ddp_trains_from_another_thread_as_on_cuda(gloo):
    # DDP on CUDA all-reduces its buckets from autograd's device thread,
    # not the one that called init_process_group: the runtime runs MPI
    # SERIALIZED, and the package's lock takes the turns.
    import threading

    out, failed = [], []

    def steps():
        try:
            out.append(train(DDP(model())))
        except BaseException as e:  # re-raised on the test's thread
            failed.append(e)

    t = threading.Thread(target=steps)
    t.start()
    t.join(timeout=120)
    assert not t.is_alive(), "training on a second thread never finished"
    if failed:
        raise failed[0]
    theirs = train(DDP(model(), process_group=gloo))
    torch.testing.assert_close(out[0], theirs, rtol=1e-5, atol=1e-6)
    dist.all_reduce(torch.ones(1))  # and the first thread still calls in


def test_ddp_comm_hook_gets_a_future():
    seen = []

    def hook(state, bucket):
        seen.append(bucket.buffer().numel())
        return dist.all_reduce(bucket.buffer(), async_op=True).get_future().then(
            lambda f: f.value()[0] / W())

    net = DDP(model())
    net.register_comm_hook(None, hook)
    train(net, steps=1)
    assert seen, "the hook never ran"


def test_device_mesh_and_dtensor_redistribute():
    if W() != 4:
        pytest.skip("a (2, 2) mesh needs 4 ranks")
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Partial, Replicate, Shard

    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    assert dist.get_process_group_ranks(mesh["tp"].get_group()) == [R() // 2 * 2, R() // 2 * 2 + 1]
    assert dist.get_process_group_ranks(mesh["dp"].get_group()) == [R() % 2, R() % 2 + 2]
    full = make(0, (4, 6), torch.float32, seed=200)
    sharded = DTensor.from_local(full.chunk(2)[mesh["tp"].get_local_rank()], mesh["tp"], [Shard(0)])
    torch.testing.assert_close(sharded.redistribute(mesh["tp"], [Replicate()]).to_local(), full)
    part = DTensor.from_local(make(R(), (3,), torch.float64, seed=201), mesh["dp"], [Partial()])
    got = part.redistribute(mesh["dp"], [Replicate()]).to_local()
    members = dist.get_process_group_ranks(mesh["dp"].get_group())
    torch.testing.assert_close(got, sum(make(r, (3,), torch.float64, seed=201) for r in members))


def test_fsdp2_fully_shard_on_cpu_matches_ddp_on_gloo(gloo):
    from torch.distributed.fsdp import fully_shard

    net = model()
    # The same start everywhere (FSDP2 does not broadcast; the seed does).
    torch.manual_seed(99)
    for p in net.parameters():
        p.data.copy_(torch.randn_like(p))
    reference = model()
    reference.load_state_dict(net.state_dict())
    for layer in net:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer)
    fully_shard(net)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    ref = DDP(reference, process_group=gloo, init_sync=False)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    for step in range(3):
        x = make(R(), (5, 8), torch.float32, seed=300 + step)
        for m, o in ((net, opt), (ref, ref_opt)):
            o.zero_grad()
            m(x).square().mean().backward()
            o.step()
    full = torch.cat([p.full_tensor().reshape(-1) for p in net.parameters()])
    want = torch.cat([p.detach().reshape(-1) for p in ref.parameters()])
    torch.testing.assert_close(full, want, rtol=1e-5, atol=1e-6)
