"""Whole jobs launched under mpirun (this file runs outside mpirun, from
scripts/python-test.sh): what the other ranks see when one rank fails,
skips a call or handles its errors."""

import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import time


# `say(...)` in a job's script: a line into the rank's own file, since the
# launcher's merged stdout may cut one rank's line with another's.
# `mark(name)` and `wait_for(name)`: one rank waits for another's step
# (an empty file beside them), so that a script orders its ranks' steps
# instead of racing fixed sleeps against the runtime's timeouts.
SAY = """
import os as _os, time as _time
def say(*words):
    with open(_os.path.join(_os.environ["JOB_OUT"], "rank" + _os.environ.get("OMPI_COMM_WORLD_RANK", "0")), "a") as f:
        f.write(" ".join(str(w) for w in words) + "\\n")
def mark(name):
    open(_os.path.join(_os.environ["JOB_OUT"], "mark-" + name), "w").close()
def wait_for(name, limit=40):
    end = _time.monotonic() + limit
    while not _os.path.exists(_os.path.join(_os.environ["JOB_OUT"], "mark-" + name)):
        if _time.monotonic() > end:
            raise RuntimeError("no mark " + name + " after " + str(limit) + " s")
        _time.sleep(0.01)
"""


def run_job(np_, script, env=None, timeout=60, launch=None, rank_var="OMPI_COMM_WORLD_RANK"):
    """Runs `script` on `np_` ranks: (the finished process, every line the
    ranks said). `launch`: the launcher's command line before the program
    (Open MPI's mpirun by default); `rank_var`: where it puts the rank."""
    launcher = os.environ.get("RANKMESH_MPIEXEC", "mpirun")
    launch = launch or [launcher, "--oversubscribe", "-np", str(np_)]
    with tempfile.TemporaryDirectory() as d:
        os.chmod(d, 0o777)  # srun's tasks may run as another user
        code = SAY.replace("OMPI_COMM_WORLD_RANK", rank_var) + textwrap.dedent(script)
        cmd = [*launch, sys.executable, "-c", code]
        e = dict(os.environ, JOB_OUT=d, **(env or {}))
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=e)
        said = [l for f in sorted(os.listdir(d)) for l in open(os.path.join(d, f)).read().splitlines()]
    return out, said


def test_a_rank_that_skips_a_call_is_an_exception_on_the_ranks_waiting_for_it():
    t0 = time.monotonic()
    out, said = run_job(3, """
        import numpy as np, rankmesh as dist, time
        dist.init_distributed_environment()
        if dist.get_world_rank() != 1:
            try:
                dist.get_world_group().all_reduce(np.ones(2, np.float32))
            except dist.TimeoutError as e:
                say("TIMEOUT", dist.get_world_rank(), e)
                # Given up for good: the next call fails at once, alike.
                t = time.monotonic()
                try:
                    dist.get_world_group().barrier()
                except dist.TimeoutError:
                    say("AGAIN", dist.get_world_rank(), f"{time.monotonic() - t:.3f}")
                mark(f"gave-up{dist.get_world_rank()}")
                wait_for("late1")  # the script's own clean-up, past rank 1's call
        else:
            # The rank that skipped: its next call, once the others have
            # given up, raises too, naming a rank that gave up on it.
            try:
                wait_for("gave-up0")
                wait_for("gave-up2")
                dist.get_world_group().barrier()
            except dist.PeerError as e:
                say("LATE 1", e)
            finally:
                mark("late1")
    """, env={"RANKMESH_TIMEOUT": "2"})
    took = time.monotonic() - t0
    text = out.stdout + out.stderr
    for r in (0, 2):
        line = next((l for l in said if l.startswith(f"TIMEOUT {r} ")), None)
        assert line is not None, text[-3000:]
        assert "all_reduce on world: no progress for" in line, line
        assert "group rank 1 (world rank 1, host " in line and "has not entered this call" in line, line
        assert any(l.startswith(f"AGAIN {r} ") for l in said), text[-3000:]
    late = next((l for l in said if l.startswith("LATE 1 ")), "")
    assert "barrier on world: cannot complete: group rank " in late, text[-3000:]
    assert "left after: all_reduce on world: no progress for" in late, late
    # The runtime gave up: the job ends with the watchdog's code (75 from
    # ranks 0 and 2, or 76 from rank 1 if it ends first), even though the
    # scripts caught the errors and ended cleanly.
    assert out.returncode in (75, 76), text[-3000:]
    assert took < 25, f"took {took:.1f} s"


def test_ctrl_c_interrupts_a_waiting_collective_and_its_peers_are_told():
    with tempfile.TemporaryDirectory() as d:
        launcher = os.environ.get("RANKMESH_MPIEXEC", "mpirun")
        script = textwrap.dedent("""
            import numpy as np, os, sys, time, rankmesh as dist
            dist.init_distributed_environment()
            r = dist.get_world_rank()
            open(os.path.join(sys.argv[1], f"pid{r}.tmp"), "w").write(str(os.getpid()))
            t = time.monotonic()
            try:
                if r == 1:
                    time.sleep(30)
                # Written on the call's doorstep: the interrupt is sent a
                # second after it, into the wait.
                os.rename(os.path.join(sys.argv[1], f"pid{r}.tmp"), os.path.join(sys.argv[1], f"pid{r}"))
                dist.get_world_group().all_reduce(np.ones(2, np.float32))
            except BaseException as e:
                with open(os.path.join(sys.argv[1], f"said{r}"), "w") as f:
                    f.write(f"RAISED {r} {type(e).__name__} {time.monotonic() - t:.1f} {e}\\n")
                raise
        """)
        t0 = time.monotonic()
        job = subprocess.Popen(
            [launcher, "--oversubscribe", "-np", "3", sys.executable, "-c", script, d],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env=dict(os.environ, RANKMESH_TIMEOUT="600"))
        pid0 = os.path.join(d, "pid0")
        while not os.path.exists(pid0) and time.monotonic() - t0 < 30:
            time.sleep(0.05)
        time.sleep(1.0)  # rank 0 is waiting in the all-reduce by now
        os.kill(int(open(pid0).read()), signal.SIGINT)
        stdout, stderr = job.communicate(timeout=60)
        said = [open(os.path.join(d, f)).read().strip() for f in sorted(os.listdir(d)) if f.startswith("said")]
    text = stdout + stderr
    assert any(l.startswith("RAISED 0 KeyboardInterrupt") for l in said), (said, text[-3000:])
    line = next((l for l in said if l.startswith("RAISED 2 ")), "")
    assert line.startswith("RAISED 2 PeerError"), text[-3000:]
    assert "group rank 0 (world rank 0, host " in line and "interrupted" in line, line
    assert job.returncode in (130, 76), text[-3000:]
    assert time.monotonic() - t0 < 30


def test_an_uncaught_exception_on_one_rank_is_named_on_the_others_at_once():
    t0 = time.monotonic()
    out, _ = run_job(2, """
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
    # The rank waiting for it raises, naming it.
    assert "rankmesh.PeerError: all_reduce on world: cannot complete: group rank 1" in text, text[-2000:]
    assert took < 30, f"took {took:.1f} s"


def test_caught_errors_then_a_clean_exit_end_the_job_with_zero():
    out, said = run_job(2, """
        import numpy as np, rankmesh as dist
        dist.init_distributed_environment()
        g = dist.get_world_group()
        try:
            g.all_gather(np.ones(2, np.float32), dim=3)
        except dist.InvalidArgumentError as e:
            say("CAUGHT", dist.get_world_rank(), e)
        print("done", dist.get_world_rank())
    """)
    assert out.returncode == 0, (out.stdout + out.stderr)[-2000:]
    assert sorted(l.split()[1] for l in said if l.startswith("CAUGHT ")) == ["0", "1"], said
    assert all("dim 3 out of range" in l for l in said if l.startswith("CAUGHT ")), said
    assert "leaves after" not in out.stderr
