"""The GIL while a collective waits."""

import threading
import time

import numpy as np
import pytest

import rankmesh as dist


def test_the_gil_is_released_while_a_collective_waits():
    g = dist.get_world_group()
    if g.world_size == 1:
        pytest.skip("needs a peer to wait for")
    ticks = []
    stop = threading.Event()

    def count():
        while not stop.is_set():
            ticks.append(1)
            time.sleep(0.001)

    if g.rank_in_group == 0:
        t = threading.Thread(target=count)
        t.start()
        time.sleep(0.01)
        before = len(ticks)
        g.all_reduce(np.ones(4, np.float32))  # the peers arrive 0.3 s late
        during = len(ticks) - before
        stop.set()
        t.join()
        assert during >= 50, f"another thread ran {during} times while all_reduce waited 0.3 s"
    else:
        time.sleep(0.3)
        g.all_reduce(np.ones(4, np.float32))
