"""rankmesh as a ``torch.distributed`` backend, under ``mpirun``/``srun``.

    import torch.distributed as dist
    import rankmesh.torch                      # registers "rankmesh"
    dist.init_process_group("rankmesh")        # no MASTER_ADDR, no env://

Rank and size come from MPI. CPU tensors run on rankmesh's host plane
(shared memory within a node, MPI across nodes), CUDA tensors on NCCL, on
the tensor's current stream. Every call is checked: a mismatch between
ranks raises ``torch.distributed.DistBackendError`` with rankmesh's message
on every rank, and a rank that leaves is named.

Importing this module starts rankmesh (``MPI_Init``) and sets ``RANK``,
``WORLD_SIZE``, ``LOCAL_RANK`` and ``LOCAL_WORLD_SIZE`` where the launcher
did not, for programs written for ``torchrun``. When ``MASTER_ADDR`` is not
set, ``env://`` (``init_process_group``'s default) rendezvouses over MPI:
rank 0 opens torch's ``TCPStore`` on a free port and MPI tells the others
where, so gloo groups (``new_group(backend="gloo")``) work in the same job.

The backend is C++ (``backend.cpp``, built once per torch version into
``$RANKMESH_TORCH_CACHE``, by default ``~/.cache/rankmesh/torch``, with
the system's C++ compiler, ``$CXX``): torch 2.11 lets only a C++ backend
serve DDP, ``reduce`` and ``gather``.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import os
import shlex
import socket
import subprocess
import sys
import sysconfig
import tempfile
from datetime import timedelta
from pathlib import Path
from urllib.parse import parse_qs, urlparse

import torch
import torch.distributed as dist

import rankmesh as _rm
from rankmesh import _native

# The module (torch.distributed re-exports a function of the same name).
_rdzv = importlib.import_module("torch.distributed.rendezvous")

__all__ = ["build", "backend_module", "initialized", "BACKEND"]

BACKEND = "rankmesh"
_SOURCE = Path(__file__).with_name("backend.cpp")
_module = None
# The native groups a torch group of these world ranks runs on, when the
# group already exists on the rankmesh side (initialize_model_parallel).
_adopting: dict[tuple[int, ...], object] = {}


def _cache_dir() -> Path:
    root = os.environ.get("RANKMESH_TORCH_CACHE")
    if root:
        return Path(root)
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "rankmesh" / "torch"


def _command(out: Path, name: str) -> list[str]:
    from torch.utils import cpp_extension

    cxx = shlex.split(os.environ.get("CXX", "c++"))
    includes = [*cpp_extension.include_paths(), sysconfig.get_paths()["include"]]
    libs = cpp_extension.library_paths()
    abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
    return [
        *cxx, "-O2", "-std=c++17", "-shared", "-fPIC", "-fvisibility=hidden",
        f"-DTORCH_EXTENSION_NAME={name}", "-DTORCH_API_INCLUDE_EXTENSION_H",
        f"-D_GLIBCXX_USE_CXX11_ABI={abi}",
        *[f"-I{p}" for p in includes],
        str(_SOURCE), "-o", str(out),
        *[f"-L{p}" for p in libs], *[f"-Wl,-rpath,{p}" for p in libs],
        "-lc10", "-ltorch", "-ltorch_cpu", "-ltorch_python",
    ]


def build() -> Path:
    """Builds the C++ backend for this torch and Python (once: the result is
    cached by a digest of the source, torch's version and the compiler
    command) and returns the library's path. Ranks that start together
    wait for one build (a file lock in the cache); run ``python -m
    rankmesh.torch`` once before a large job to build it ahead."""
    digest = hashlib.sha256()
    digest.update(_SOURCE.read_bytes())
    digest.update(f"{torch.__version__}|{sys.version}|{os.environ.get('CXX', 'c++')}".encode())
    key = digest.hexdigest()[:16]
    name = f"rankmesh_torch_{key}"
    cache = _cache_dir()
    so = cache / f"{name}{sysconfig.get_config_var('EXT_SUFFIX') or '.so'}"
    if so.exists():
        return so
    cache.mkdir(parents=True, exist_ok=True)
    import fcntl

    with open(cache / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if so.exists():
            return so
        fd, tmp = tempfile.mkstemp(prefix=".build-", suffix=".so", dir=cache)
        os.close(fd)
        cmd = _command(Path(tmp), name)
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0:
            os.unlink(tmp)
            raise _rm.StartupError(
                "rankmesh.torch: building the C++ backend failed (it needs a C++17 compiler, "
                f"$CXX or c++, and torch's headers):\n$ {shlex.join(cmd)}\n{done.stderr[-4000:]}"
            )
        os.replace(tmp, so)
    return so


def backend_module():
    """The built C++ backend (building it if needed)."""
    global _module
    if _module is None:
        so = build()
        name = so.name.split(".")[0]
        spec = importlib.util.spec_from_file_location(name, so)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        _module = module
    return _module


# -- the world from MPI ---------------------------------------------------------
def _runtime():
    _rm.init_distributed_environment()
    return _rm._state()


def _agree(ok: bool, why: str) -> None:
    """Raises on every rank the first rank's reason when any rank's own
    check failed (a rank that raised alone would leave the others waiting)."""
    verdicts = _rm.get_world_group().all_gather_object([ok, why])
    for rank, (good, reason) in enumerate(verdicts):
        if not good:
            raise ValueError(reason if rank == _runtime().rank else f"rank {rank}: {reason}")


def _check_rank_and_size(rank: int, world_size: int, how: str) -> None:
    rt = _runtime()
    bad = []
    if rank not in (-1, None) and rank != rt.rank:
        bad.append(f"rank={rank}")
    if world_size not in (-1, None) and world_size != rt.size:
        bad.append(f"world_size={world_size}")
    why = (
        f"{how} was given {', '.join(bad)}, but MPI started this process as rank {rt.rank} "
        f"of {rt.size}: leave them out (rankmesh takes them from the launcher) or pass MPI's"
    )
    _agree(not bad, why)


def _store_host() -> str:
    """Where the other ranks reach rank 0: loopback when they share its node,
    else the address of rank 0's interface towards another node."""
    rt = _runtime()
    names = _rm.get_world_group().all_gather_object(socket.gethostname())
    if rt.rank != 0:
        return ""
    others = [n for n in names if n != names[0]]
    if rt.local_size == rt.size or not others:
        return "127.0.0.1"
    with contextlib.suppress(OSError), socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect((others[0], 9))
        return s.getsockname()[0]
    return names[0]


def _mpi_rendezvous(url: str, timeout: timedelta = timedelta(minutes=30), **_kwargs):
    query = {k: v[-1] for k, v in parse_qs(urlparse(url).query).items()}
    rank = int(query.get("rank", -1))
    world_size = int(query.get("world_size", -1))
    _check_rank_and_size(rank, world_size, "init_process_group")
    rt = _runtime()
    world = _rm.get_world_group()
    store = None
    where = None
    if rt.rank == 0:
        host = _store_host()
        try:
            store = dist.TCPStore(host, 0, rt.size, True, timeout, wait_for_workers=False)
            where = ("ok", host, store.port)
        except Exception as e:  # noqa: BLE001  (told to every rank below)
            where = ("error", f"rank 0 could not open torch's TCPStore: {e}", 0)
    else:
        _store_host()
    kind, host, port = world.broadcast_object(where, 0)
    if kind != "ok":
        raise RuntimeError(host)
    if store is None:
        store = dist.TCPStore(host, port, rt.size, False, timeout)
    yield (store, rt.rank, rt.size)
    raise RuntimeError("rankmesh:// cannot rendezvous again: the world is MPI's")


_env_handler = _rdzv._rendezvous_handlers.get("env")


def _env_or_mpi(url: str, timeout: timedelta = timedelta(minutes=30), **kwargs):
    """``env://`` as torch has it when ``MASTER_ADDR`` is set; over MPI when
    not (under mpirun/srun there is no other source of it)."""
    if os.environ.get("MASTER_ADDR") or _env_handler is None:
        yield from _env_handler(url, timeout=timeout, **kwargs)
    else:
        yield from _mpi_rendezvous(url, timeout=timeout, **kwargs)


# -- the backend ------------------------------------------------------------------
def _create(opts, _backend_options=None):
    rt = _runtime()
    ranks = [int(r) for r in opts.global_ranks_in_group] or list(range(rt.size))
    if len(ranks) == rt.size and ranks == list(range(rt.size)):
        if not opts.global_ranks_in_group:
            # The default group: its rank and size are the caller's (a
            # store passed with rank= and world_size=), checked against MPI's.
            _check_rank_and_size(opts.group_rank, opts.group_size, "init_process_group")
        native = _adopting.get(tuple(ranks)) or _rm.get_world_group()._g
    else:
        native = _adopting.get(tuple(ranks)) or rt.subgroup("torch", ranks)
    rank_in_group = ranks.index(rt.rank)
    return backend_module().create(_native._torch_api(), native._torch_handle(), rank_in_group,
                                   len(ranks))


def _register() -> None:
    if BACKEND.upper() not in dist.Backend._plugins:
        dist.Backend.register_backend(BACKEND, _create, extended_api=True, devices=["cpu", "cuda"])
    _rdzv._rendezvous_handlers["env"] = _env_or_mpi
    _rdzv._rendezvous_handlers.setdefault("rankmesh", _mpi_rendezvous)


def _launcher_env() -> None:
    rt = _runtime()
    for var, value in (("RANK", rt.rank), ("WORLD_SIZE", rt.size), ("LOCAL_RANK", rt.local_rank),
                       ("LOCAL_WORLD_SIZE", rt.local_size)):
        os.environ.setdefault(var, str(value))


def initialized() -> bool:
    """Whether torch's default process group runs on rankmesh."""
    return dist.is_initialized() and dist.get_backend() == BACKEND


# -- FastVideo's groups as torch groups ---------------------------------------------
def _model_parallel_groups() -> dict[str, object]:
    """torch process groups on rankmesh's TP, SP and DP groups (collective over
    the world: every rank makes every group, as torch's ``new_group`` needs),
    each running on the rankmesh group itself, not on a new communicator."""
    out = {}
    world = _rm.get_world_group()
    for kind in ("tp", "sp", "dp"):
        mine = _rm._state().group(kind)
        lists = []
        for ranks in world.all_gather_object(list(mine.ranks)):
            if ranks not in lists:
                lists.append(ranks)
        _adopting[tuple(mine.ranks)] = mine
        try:
            for ranks in lists:
                pg = dist.new_group(ranks, backend=BACKEND)
                if ranks == list(mine.ranks):
                    out[mine.name] = pg
        finally:
            _adopting.clear()
    return out


backend_module()
_launcher_env()
_register()
