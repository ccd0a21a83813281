"""Whole jobs launched under mpirun (this file runs outside mpirun, from
scripts/python-test.sh): what the other ranks see when one rank fails,
skips a call or handles its errors."""

import os
import subprocess
import sys
import textwrap
import time


def run_job(np_, script, env=None, timeout=60):
    launcher = os.environ.get("RANKMESH_MPIEXEC", "mpirun")
    cmd = [launcher, "--oversubscribe", "-np", str(np_), sys.executable, "-c", textwrap.dedent(script)]
    e = dict(os.environ, **(env or {}))
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=e)


def test_a_rank_that_skips_a_call_ends_the_job_naming_it():
    out = run_job(2, """
        import numpy as np, rankmesh as dist
        dist.init_distributed_environment()
        if dist.get_world_rank() == 0:
            dist.get_world_group().all_reduce(np.ones(2, np.float32))
        else:
            import time; time.sleep(30)
    """, env={"RANKMESH_TIMEOUT": "2"})
    assert out.returncode != 0
    text = out.stdout + out.stderr
    assert "all_reduce" in text and "rank 1" in text, text[-2000:]


def test_an_uncaught_exception_on_one_rank_is_named_on_the_others_at_once():
    t0 = time.monotonic()
    out = run_job(2, """
        import numpy as np, rankmesh as dist
        dist.init_distributed_environment()
        if dist.get_world_rank() == 1:
            raise ValueError("bad config on rank 1")
        dist.get_world_group().all_reduce(np.ones(2, np.float32))
    """, env={"RANKMESH_TIMEOUT": "600"})
    took = time.monotonic() - t0
    assert out.returncode != 0
    text = out.stdout + out.stderr
    assert "left after: ValueError: bad config on rank 1" in text, text[-2000:]
    assert took < 30, f"took {took:.1f} s"


def test_caught_errors_then_a_clean_exit_end_the_job_with_zero():
    out = run_job(2, """
        import numpy as np, rankmesh as dist
        dist.init_distributed_environment()
        g = dist.get_world_group()
        try:
            g.all_gather(np.ones(2, np.float32), dim=3)
        except dist.InvalidArgumentError:
            pass
        print("done", dist.get_world_rank())
    """)
    assert out.returncode == 0, (out.stdout + out.stderr)[-2000:]
    assert "leaves after" not in out.stderr
