"""Named meshes from Python: groups equal rankmesh's `topo --json --mesh`
(written by scripts/python-test.sh) and vLLM's and Megatron's layouts, and
collectives run over them."""

import json
import os

import numpy as np
import pytest

import rankmesh as dist

# (mesh spec, Megatron order or None) per world size, as python-test.sh writes them.
MESHES = {
    1: [("tp=1", None)],
    2: [("dp=2,tp=1", None), ("tp=2,dp=1", "tp-dp")],
    3: [("pp=3,tp=1", None)],
    4: [("pp=2,tp=2", None), ("dp=2,tp=2", "tp-dp"), ("pp=2,dp=2", "dp-pp")],
}


def parse(spec):
    return {k: int(v) for k, v in (p.split("=") for p in spec.split(","))}


def test_meshes_equal_rust_topo_json():
    where = os.environ.get("RANKMESH_TOPO_DIR")
    if not where:
        pytest.skip("RANKMESH_TOPO_DIR not set (scripts/python-test.sh sets it)")
    w, r = dist.get_world_size(), dist.get_world_rank()
    for spec, order in MESHES[w]:
        sizes = parse(spec)
        mesh = dist.Mesh.ordered(order, sizes) if order else dist.Mesh.row_major(sizes)
        with open(os.path.join(where, f"mesh-{w}-{spec}-{order}.json")) as f:
            topo = json.load(f)
        for dim in sizes:
            assert mesh.group(dim).ranks == topo["ranks"][r]["groups"][dim], (spec, order, dim)


def test_vllm_and_megatron_layouts():
    w, r = dist.get_world_size(), dist.get_world_rank()
    if w != 4:
        pytest.skip("written for 4 ranks")
    v = dist.Mesh.vllm(dp=1, pp=2, tp=2)
    assert v.groups("tp") == [[0, 1], [2, 3]] and v.groups("pp") == [[0, 2], [1, 3]]
    dense, expert = dist.Mesh.megatron("tp-cp-ep-dp-pp", tp=2, pp=2)
    assert dense.groups("tp") == [[0, 1], [2, 3]] and dense.groups("pp") == [[0, 2], [1, 3]]
    assert dense.groups("dp") == [[0], [1], [2], [3]]
    assert expert.groups("pp") == dense.groups("pp")
    # A flattened group, and a collective over it.
    g = dense.group("dp", "tp")
    x = np.full(2, r + 0.5, np.float32)
    g.all_reduce(x)
    assert np.all(x == sum(m + 0.5 for m in g.ranks))
    # tp is fastest in "tp-cp-ep-dp-pp": rank r sits at tp r % 2 and pp r // 2.
    assert dense.coord("tp") == r % 2 and dense.coord("pp") == r // 2 and dense.coord("dp") == 0


def test_a_mesh_that_does_not_fit_the_world_is_an_error_on_every_rank():
    w = dist.get_world_size()
    with pytest.raises(dist.Error):
        dist.Mesh.row_major({"tp": w + 1})
