"""Whole torch jobs on the "rankmesh" backend, launched by this file (it runs
outside mpirun): the launchers, a rank/size that disagrees with MPI, a rank
that leaves, a rank that never calls in."""

import os
import shutil
import subprocess
import time

import pytest

from test_jobs import run_job

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# A torch program written for gloo, with only the backend's name changed.
PROGRAM = """
import torch, torch.distributed as dist
import rankmesh.torch
dist.init_process_group("rankmesh")
r, w = dist.get_rank(), dist.get_world_size()
x = torch.full((3,), float(r + 1))
dist.all_reduce(x)
say("SUM", r, w, x.tolist())
dist.destroy_process_group()
"""


def sums(said, w):
    want = float(w * (w + 1) // 2)
    return sorted(l for l in said if l.startswith("SUM ")) == [
        f"SUM {r} {w} {[want] * 3}" for r in range(w)]


def test_init_needs_no_env_under_mpirun():
    for var in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE"):
        assert var not in os.environ, f"{var} is set here: the test is of a job without it"
    out, said = run_job(3, PROGRAM)
    assert out.returncode == 0, (out.stdout + out.stderr)[-3000:]
    assert sums(said, 3), said


def test_under_mpich_mpiexec():
    site = os.path.join(REPO, "target", "python-mpich-site")
    launcher = shutil.which("mpiexec.mpich")
    if not os.path.isdir(site) or launcher is None:
        pytest.fail("the MPICH build of the package (scripts/python-test.sh builds it) or "
                    "mpiexec.mpich is missing")
    out, said = run_job(2, PROGRAM, env={"PYTHONPATH": site}, timeout=120,
                        launch=[launcher, "-n", "2"], rank_var="PMI_RANK")
    assert out.returncode == 0, (out.stdout + out.stderr)[-3000:]
    assert sums(said, 2), said


def test_under_srun():
    script = os.path.join(REPO, "scripts", "local-slurm.sh")
    started = subprocess.run(["bash", script, "start"], capture_output=True, text=True, timeout=120)
    assert started.returncode == 0, f"the local Slurm did not start:\n{started.stderr[-2000:]}"
    env = {}
    for line in started.stdout.splitlines():
        if line.startswith("export "):
            k, _, v = line[len("export "):].partition("=")
            env[k] = v.strip("'\"")
    mpi = "pmix" if "Open MPI" in subprocess.run(["mpirun", "--version"], capture_output=True,
                                                 text=True).stdout else "pmi2"
    try:
        out, said = run_job(2, PROGRAM, env=env, timeout=180,
                            launch=["srun", f"--mpi={mpi}", "-n", "2"], rank_var="SLURM_PROCID")
    finally:
        subprocess.run(["bash", script, "stop"], capture_output=True, timeout=60)
    assert out.returncode == 0, (out.stdout + out.stderr)[-3000:]
    assert sums(said, 2), said


def test_a_rank_and_size_that_disagree_with_mpi_are_an_error_on_every_rank():
    out, said = run_job(2, """
        import torch.distributed as dist, rankmesh.torch
        try:
            dist.init_process_group("rankmesh", rank=5, world_size=9)
        except ValueError as e:
            say("REFUSED", e)
    """)
    assert out.returncode == 0, (out.stdout + out.stderr)[-3000:]
    assert len(said) == 2, said
    for line in said:
        assert "was given rank=5, world_size=9, but MPI started this process as rank" in line, line


def test_a_rank_that_leaves_is_named_by_the_ranks_waiting_for_it():
    t0 = time.monotonic()
    out, said = run_job(3, """
        import os, torch, torch.distributed as dist, rankmesh.torch
        dist.init_process_group("rankmesh")
        dist.barrier()
        if dist.get_rank() == 1:
            raise RuntimeError("rank 1 gives up")
        try:
            dist.all_reduce(torch.ones(4))
        except dist.DistBackendError as e:
            say("LEFT", dist.get_rank(), e)
    """, env={"RANKMESH_TIMEOUT": "600"})
    took = time.monotonic() - t0
    text = out.stdout + out.stderr
    for r in (0, 2):
        line = next((l for l in said if l.startswith(f"LEFT {r} ")), None)
        assert line is not None, text[-3000:]
        assert "all_reduce on world: cannot complete: group rank 1" in line, line
        assert "RuntimeError: rank 1 gives up" in line, line
    assert took < 30, f"took {took:.1f} s"


def test_a_rank_that_never_calls_in_is_a_timeout_naming_it():
    out, said = run_job(2, """
        import time, torch, torch.distributed as dist, rankmesh.torch
        dist.init_process_group("rankmesh")
        if dist.get_rank() == 0:
            try:
                dist.all_reduce(torch.ones(4))
            except dist.DistBackendError as e:
                say("TIMEOUT", e)
        else:
            time.sleep(6)
    """, env={"RANKMESH_TIMEOUT": "2"})
    text = out.stdout + out.stderr
    line = next((l for l in said if l.startswith("TIMEOUT ")), None)
    assert line is not None, text[-3000:]
    assert "all_reduce on world: no progress for" in line and "group rank 1" in line, line
