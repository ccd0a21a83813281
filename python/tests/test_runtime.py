"""The GIL while a collective waits."""

import os
import shutil
import tempfile
import threading
import time

import numpy as np
import pytest

import rankmesh as dist


def test_the_gil_is_released_while_a_collective_waits():
    """Rank 0's second thread must run while rank 0's all_reduce waits: the
    peers call in only once that thread has ticked 50 times (or after 30 s).
    A call that held the GIL would keep the thread from ticking, and return
    before it had."""
    g = dist.get_world_group()
    if g.world_size == 1:
        pytest.skip("needs a peer to wait for")
    where = g.broadcast_object(tempfile.mkdtemp() if g.rank_in_group == 0 else None, 0)
    ticked = os.path.join(where, "ticked")
    if g.rank_in_group == 0:
        started = threading.Event()

        def count():
            started.wait()
            for _ in range(50):
                time.sleep(0.001)
            open(ticked, "w").close()

        t = threading.Thread(target=count)
        t.start()
        started.set()
        got = g.all_reduce(np.full(4, 0.5, np.float32))
        ran_during = os.path.exists(ticked)
        t.join()
        np.testing.assert_array_equal(got, np.full(4, 0.5 * g.world_size, np.float32))
        assert ran_during, "the other thread did not run while all_reduce waited for its peers"
    else:
        end = time.monotonic() + 30
        while not os.path.exists(ticked) and time.monotonic() < end:
            time.sleep(0.005)
        g.all_reduce(np.full(4, 0.5, np.float32))
    g.barrier()
    if g.rank_in_group == 0:
        shutil.rmtree(where)


def test_shrink_without_ulfm_is_refused_and_the_job_goes_on():
    """Outside a ULFM job (mpirun --with-ft ulfm under Open MPI 5) shrink()
    raises StateError on every rank, and leaves the runtime and its groups
    as they were."""
    g = dist.get_world_group()
    with pytest.raises(dist.StateError, match="shrink needs a job that survives a lost rank"):
        dist.shrink()
    got = dist.get_world_group().all_reduce(np.full(3, 0.25, np.float64))
    np.testing.assert_array_equal(got, np.full(3, 0.25 * g.world_size))
