"""FastVideo's layout through the Python API: TP/SP/DP groups, and the same
groups as rankmesh's own `topo --json` (written by scripts/python-test.sh
into RANKMESH_TOPO_DIR for every layout of this world size)."""

import json
import os

import numpy as np
import pytest

import rankmesh as dist


def layouts(w):
    return [(tp, sp) for tp in range(1, w + 1) for sp in range(1, w + 1) if w % tp == 0 and w % sp == 0]


def each_layout():
    w = dist.get_world_size()
    for tp, sp in layouts(w):
        dist.destroy_model_parallel()
        dist.initialize_model_parallel(tensor_model_parallel_size=tp, sequence_model_parallel_size=sp)
        yield w, tp, sp
    dist.destroy_model_parallel()


def test_groups_are_fastvideos_and_reduce_over_their_members():
    for w, tp, sp in each_layout():
        assert dist.model_parallel_is_initialized()
        assert dist.get_tp_world_size() == tp and dist.get_sp_world_size() == sp
        assert dist.get_dp_world_size() == w // sp
        r = dist.get_world_rank()
        assert dist.get_tp_group().ranks == [r // tp * tp + i for i in range(tp)]
        assert dist.get_sp_group().ranks == [r // sp * sp + i for i in range(sp)]
        assert dist.get_dp_group().ranks == [r % sp + i * sp for i in range(w // sp)]
        assert dist.get_tp_rank() == dist.get_tp_group().ranks.index(r)
        x = np.full(3, float(r) + 0.25, np.float32)
        dist.tensor_model_parallel_all_reduce(x)
        assert np.all(x == sum(dist.get_tp_group().ranks) + 0.25 * tp)


def test_groups_equal_rust_topo_json():
    where = os.environ.get("RANKMESH_TOPO_DIR")
    if not where:
        pytest.skip("RANKMESH_TOPO_DIR not set (scripts/python-test.sh sets it)")
    for w, tp, sp in each_layout():
        with open(os.path.join(where, f"topo-{w}-{tp}-{sp}.json")) as f:
            topo = json.load(f)
        mine = topo["ranks"][dist.get_world_rank()]["groups"]
        assert mine["tp"] == dist.get_tp_group().ranks, (w, tp, sp)
        assert mine["sp"] == dist.get_sp_group().ranks, (w, tp, sp)
        assert mine["dp"] == dist.get_dp_group().ranks, (w, tp, sp)


def test_a_layout_that_does_not_divide_is_an_error_on_every_rank():
    w = dist.get_world_size()
    with pytest.raises(dist.Error):
        dist.initialize_model_parallel(tensor_model_parallel_size=w + 1)
    assert not dist.model_parallel_is_initialized()
