"""rankmesh from Python: FastVideo's ``fastvideo.distributed`` names on
rankmesh, under ``mpirun``/``srun``.

The world comes from MPI (no ``env://``, no TCPStore); groups are MPI
sub-communicators; NumPy arrays (and torch CPU tensors) are read and written
in place, with the GIL released while a collective runs; objects cross ranks
as data, never pickled. Errors are ``rankmesh.Error`` subclasses carrying
the library's message, raised on every rank of the call.

    import numpy as np, rankmesh as dist
    dist.init_distributed_environment()
    dist.initialize_model_parallel(tensor_model_parallel_size=2)
    x = np.ones(4, np.float32)
    dist.tensor_model_parallel_all_reduce(x)   # x now holds the TP sum
"""

from __future__ import annotations

import atexit
import contextlib
import sys
from typing import Any, Callable

from . import _native
from ._native import (  # noqa: F401  (re-exported)
    Error,
    GpuError,
    InvalidArgumentError,
    MismatchError,
    ObjectError,
    PeerError,
    PeerLostError,
    StartupError,
    StateError,
    TensorError,
    TimeoutError,
)

__all__ = [
    "Error", "MismatchError", "InvalidArgumentError", "TensorError", "StateError",
    "TimeoutError", "PeerError", "PeerLostError", "ObjectError", "StartupError", "GpuError",
    "GroupCoordinator", "init_distributed_environment", "initialize_model_parallel",
    "model_parallel_is_initialized", "destroy_model_parallel", "destroy_distributed_environment",
    "shrink", "get_world_group", "get_tp_group", "get_sp_group", "get_dp_group",
    "get_world_rank", "get_world_size", "get_local_rank", "get_tp_rank", "get_tp_world_size",
    "get_sp_parallel_rank", "get_sp_world_size", "get_dp_rank", "get_dp_world_size",
    "tensor_model_parallel_all_reduce", "tensor_model_parallel_all_gather",
    "sequence_model_parallel_all_gather", "sequence_model_parallel_all_to_all_4D",
    "is_distributed", "is_main_process", "is_local_main_process", "barrier",
    "zero_first", "zero_only", "gather_scalar_from_all_ranks", "gather_from_all_ranks",
    "compute_and_broadcast", "divide", "ensure_divisibility", "dtypes", "Mesh", "new_group",
]

_runtime: _native.Runtime | None = None
# The uncaught exception the script ends with, if any (told to peers at exit).
_uncaught: str | None = None


def dtypes() -> tuple[str, ...]:
    """The element types rankmesh moves, by NumPy/torch name."""
    return _native.dtypes()


class GroupCoordinator:
    """One group of ranks (FastVideo's ``GroupCoordinator``): collectives on
    NumPy arrays and torch CPU tensors, and the object plane."""

    def __init__(self, native: _native.Group):
        self._g = native
        # The tensor calls go straight to the native methods (no Python frame
        # per call: an 8 B all_reduce is well under a microsecond); the
        # methods below document them and serve subclasses.
        for name in ("all_reduce", "all_gather", "reduce_scatter", "reduce_scatter_v",
                     "gather", "broadcast",
                     "all_to_all_4D", "send", "recv_into", "barrier", "broadcast_object",
                     "all_gather_object"):
            if getattr(type(self), name) is getattr(GroupCoordinator, name):
                setattr(self, name, getattr(native, name))

    # -- who is in it ------------------------------------------------------
    @property
    def unique_name(self) -> str:
        return self._g.name

    @property
    def ranks(self) -> list[int]:
        """World ranks of the members, in group-rank order."""
        return self._g.ranks

    @property
    def world_size(self) -> int:
        return self._g.world_size

    @property
    def rank_in_group(self) -> int:
        return self._g.rank_in_group

    @property
    def rank(self) -> int:
        """This rank's world rank."""
        return self._g.rank

    @property
    def local_rank(self) -> int:
        return _state().local_rank

    @property
    def first_rank(self) -> int:
        return self.ranks[0]

    @property
    def last_rank(self) -> int:
        return self.ranks[-1]

    @property
    def is_first_rank(self) -> bool:
        return self.rank == self.first_rank

    @property
    def is_last_rank(self) -> bool:
        return self.rank == self.last_rank

    @property
    def next_rank(self) -> int:
        return self.ranks[(self.rank_in_group + 1) % self.world_size]

    @property
    def prev_rank(self) -> int:
        return self.ranks[(self.rank_in_group - 1) % self.world_size]

    # -- tensors -----------------------------------------------------------
    def all_reduce(self, input_, op: str = "sum"):
        """Reduces ``input_`` over the group **in place** and returns it (the
        same array object: no copy). ``op``: sum, prod, min, max, avg."""
        return self._g.all_reduce(input_, op)

    def all_gather(self, input_, dim: int = -1):
        """Concatenation of every member's ``input_`` along ``dim`` (a new array)."""
        return self._g.all_gather(input_, dim)

    def reduce_scatter(self, input_, dim: int = 0, op: str = "sum"):
        """Reduces over the group and keeps this member's slice of ``dim``."""
        return self._g.reduce_scatter(input_, dim, op)

    def reduce_scatter_v(self, input_, counts, dim: int = 0, op: str = "sum"):
        """Reduces over the group and keeps this member's ``counts[rank_in_group]``
        slices of ``dim`` (member ``r`` keeps its ``counts[r]``, in order; the
        input holds their sum along ``dim``, zeros allowed). The counts are
        agreed: members that pass different ones all get an error."""
        return self._g.reduce_scatter_v(input_, counts, dim, op)

    def gather(self, input_, dst: int = 0, dim: int = -1):
        """``all_gather`` onto group rank ``dst`` only; ``None`` elsewhere."""
        return self._g.gather(input_, dst, dim)

    def broadcast(self, input_, src: int = 0):
        """Copies group rank ``src``'s ``input_`` into every member's, in place."""
        return self._g.broadcast(input_, src)

    def all_to_all_4D(self, input_, scatter_dim: int = 2, gather_dim: int = 1):
        """FastVideo's ``all_to_all_4D``: ``[B, S/P, H, D] -> [B, S, H/P, D]``
        with ``(2, 1)``, and back with ``(1, 2)``."""
        return self._g.all_to_all_4D(input_, scatter_dim, gather_dim)

    def send(self, tensor, dst: int | None = None) -> None:
        """Sends to group rank ``dst`` (the next member by default)."""
        self._g.send(tensor, dst)

    def recv(self, size, dtype, src: int | None = None):
        """Receives a new array of shape ``size`` and NumPy ``dtype`` from
        group rank ``src`` (the previous member by default)."""
        import numpy as np

        return self._g.recv_into(np.empty(tuple(size), dtype=dtype), src)

    def recv_into(self, out, src: int | None = None):
        """Receives into ``out`` in place (its shape and dtype are what this rank expects)."""
        return self._g.recv_into(out, src)

    def barrier(self) -> None:
        self._g.barrier()

    # -- objects (data, never pickle) --------------------------------------
    def broadcast_object(self, obj: Any = None, src: int = 0) -> Any:
        """``obj`` from group rank ``src`` on every member. Objects are None,
        bool, int, float, str, bytes, lists, tuples, dicts and NumPy arrays;
        anything else is a ``TypeError`` on the sender (and an error on every
        member), since unpickling a peer's bytes could run its code."""
        return self._g.broadcast_object(obj, src)

    def all_gather_object(self, obj: Any) -> list[Any]:
        """Every member's ``obj``, in group-rank order."""
        return self._g.all_gather_object(obj)

    def broadcast_tensor_dict(self, tensor_dict: dict | None = None, src: int = 0) -> dict:
        """FastVideo's ``broadcast_tensor_dict``: the dict's plain values go
        on the object plane; its arrays go on the data plane, received into
        new arrays on the other members."""
        me = self.rank_in_group == src
        meta = None
        if me:
            if not isinstance(tensor_dict, dict):
                meta = ("error", f"broadcast_tensor_dict needs a dict on the source, got {type(tensor_dict).__name__}")
            else:
                meta = ("dict", [_describe(k, v) for k, v in tensor_dict.items()])
        meta = self.broadcast_object(meta, src)
        if meta[0] == "error":
            raise TensorError(meta[1])
        out = {}
        import numpy as np

        for key, kind, value in meta[1]:
            if kind == "array":
                dtype, shape = value
                arr = tensor_dict[key] if me else np.empty(tuple(shape), dtype=np.dtype(dtype))
                out[key] = self.broadcast(arr, src)
            elif kind == "torch":
                import torch

                dtype, shape = value
                arr = tensor_dict[key] if me else torch.empty(tuple(shape), dtype=getattr(torch, dtype))
                out[key] = self.broadcast(arr, src)
            else:
                out[key] = value
        return out

    # -- torch.distributed (rankmesh.torch) --------------------------------
    @property
    def device_group(self):
        """This group as a torch process group (FastVideo's ``device_group``),
        on this same rankmesh group: made by ``initialize_model_parallel``
        once ``rankmesh.torch`` is imported and
        ``torch.distributed.init_process_group("rankmesh")`` has run. It
        takes CPU and CUDA tensors alike, so it is ``cpu_group`` too."""
        return _torch_group(self)

    @property
    def cpu_group(self):
        """The same torch process group as ``device_group`` (rankmesh's
        backend serves both devices)."""
        return _torch_group(self)

    def __repr__(self) -> str:
        return f"GroupCoordinator({self.unique_name!r}, ranks={self.ranks}, rank_in_group={self.rank_in_group})"


def _describe(key, value):
    if hasattr(value, "__array_interface__"):
        dt = value.dtype
        return (key, "array", (dt.name if dt.kind == "V" else dt.str, list(value.shape)))
    if type(value).__module__.startswith("torch"):
        return (key, "torch", (str(value.dtype).removeprefix("torch."), list(value.shape)))
    return (key, "value", value)


# torch process groups on the layout's groups, by group name.
_torch_groups: dict[str, Any] = {}


def _torch_group(group: "GroupCoordinator"):
    bridge = sys.modules.get("rankmesh.torch")
    if bridge is not None and bridge.initialized():
        if group.ranks == list(range(get_world_size())) and group.unique_name == "world":
            import torch.distributed

            return torch.distributed.group.WORLD
        if group.unique_name in _torch_groups:
            return _torch_groups[group.unique_name]
    raise StateError(
        f"{group.unique_name} has no torch process group: import rankmesh.torch and call "
        "torch.distributed.init_process_group('rankmesh') before initialize_model_parallel"
    )


# -- the job's state (FastVideo's parallel_state) ----------------------------
def _state() -> _native.Runtime:
    if _runtime is None:
        raise StateError("rankmesh is not initialised: call init_distributed_environment() first")
    return _runtime


def init_distributed_environment(*_args, **_kwargs) -> None:
    """Starts rankmesh on this rank from MPI (world rank, size and nodes come
    from the launcher: ``mpirun``, ``srun``). Arguments of FastVideo's
    ``env://`` form are accepted and ignored. Idempotent."""
    global _runtime
    if _runtime is None:
        _runtime = _native.Runtime()
        atexit.register(destroy_distributed_environment)
        _note_uncaught()


def _note_uncaught() -> None:
    previous = sys.excepthook

    def hook(kind, value, tb):
        global _uncaught
        _uncaught = f"{kind.__name__}: {value}"
        previous(kind, value, tb)

    sys.excepthook = hook


def destroy_distributed_environment() -> None:
    """Frees every group and finalizes MPI (also run at exit). A script that
    ends with an uncaught exception tells peers still waiting on this rank
    why it left, so they fail at once instead of waiting for
    ``RANKMESH_TIMEOUT``; exceptions it caught are not reported."""
    global _runtime
    if _runtime is not None:
        _runtime.finalize(_uncaught)
        _runtime = None


def shrink() -> tuple[list[int], list[int | None]]:
    """After a ``PeerLostError``: the survivors agree on the ranks lost,
    shrink the world to themselves (renumbered in their old order) and go on.
    Needs ULFM: rankmesh built against Open MPI 5 and started with
    ``mpirun --with-ft ulfm``. Every group object made before is released (a
    call on one raises); make the layout again. Collective over the
    survivors. Returns ``(lost, new_rank)``: the old world ranks lost, and
    each old rank's rank now (``None`` for a lost one)."""
    _torch_groups.clear()
    return _state().shrink()


def initialize_model_parallel(
    tensor_model_parallel_size: int = 1,
    sequence_model_parallel_size: int = 1,
    data_parallel_size: int | None = None,
    backend: str | None = None,
) -> None:
    """FastVideo's layout: TP groups of consecutive ranks, SP groups of
    consecutive ranks, DP groups of ranks ``sp`` apart. A layout that does
    not divide the world is an error on every rank, before any group is made."""
    init_distributed_environment()
    _state().initialize_model_parallel(tensor_model_parallel_size, sequence_model_parallel_size)
    if data_parallel_size is not None and data_parallel_size != get_dp_world_size():
        raise InvalidArgumentError(
            f"data_parallel_size={data_parallel_size} but the layout's DP size is {get_dp_world_size()}"
        )
    bridge = sys.modules.get("rankmesh.torch")
    if bridge is not None and bridge.initialized():
        _torch_groups.update(bridge._model_parallel_groups())


def model_parallel_is_initialized() -> bool:
    return _runtime is not None and _runtime.model_parallel_is_initialized()


def destroy_model_parallel() -> None:
    _torch_groups.clear()
    if _runtime is not None:
        _runtime.destroy_model_parallel()


def get_world_group() -> GroupCoordinator:
    return GroupCoordinator(_state().world_group())


def get_tp_group() -> GroupCoordinator:
    return GroupCoordinator(_state().group("tp"))


def get_sp_group() -> GroupCoordinator:
    return GroupCoordinator(_state().group("sp"))


def get_dp_group() -> GroupCoordinator:
    return GroupCoordinator(_state().group("dp"))


def new_group(ranks: list[int], name: str = "group") -> GroupCoordinator:
    """A group of the given world ranks (collective over the world)."""
    return GroupCoordinator(_state().subgroup(name, list(ranks)))


def get_world_rank() -> int:
    return _state().rank


def get_world_size() -> int:
    return _state().size


def get_local_rank() -> int:
    return _state().local_rank


def get_tp_rank() -> int:
    return get_tp_group().rank_in_group


def get_tp_world_size() -> int:
    return get_tp_group().world_size


def get_sp_parallel_rank() -> int:
    return get_sp_group().rank_in_group


def get_sp_world_size() -> int:
    return get_sp_group().world_size


def get_dp_rank() -> int:
    return get_dp_group().rank_in_group


def get_dp_world_size() -> int:
    return get_dp_group().world_size


def tensor_model_parallel_all_reduce(input_):
    """Sum over the TP group, in place (returns ``input_``)."""
    return get_tp_group().all_reduce(input_)


def tensor_model_parallel_all_gather(input_, dim: int = -1):
    return get_tp_group().all_gather(input_, dim)


def sequence_model_parallel_all_gather(input_, dim: int = -1):
    return get_sp_group().all_gather(input_, dim)


def sequence_model_parallel_all_to_all_4D(input_, scatter_dim: int = 2, gather_dim: int = 1):
    return get_sp_group().all_to_all_4D(input_, scatter_dim, gather_dim)


def divide(numerator: int, denominator: int) -> int:
    ensure_divisibility(numerator, denominator)
    return numerator // denominator


def ensure_divisibility(numerator: int, denominator: int) -> None:
    """A ``ValueError`` (not an assert, which ``python -O`` drops) unless it divides."""
    if denominator == 0 or numerator % denominator != 0:
        raise ValueError(f"{numerator} is not divisible by {denominator}")


# -- any layout: named meshes -------------------------------------------------
class Mesh:
    """A named mesh of the whole world: torch's row-major ``init_device_mesh``
    (``Mesh.row_major({"pp": 2, "dp": 2, "tp": 2})``), a Megatron order string
    (``Mesh.megatron("tp-cp-ep-dp-pp", tp=2, pp=2)`` gives the dense and expert
    meshes), or vLLM's (``Mesh.vllm(dp=1, pp=2, tp=2)``). ``intra_node`` names
    dimensions whose groups must each lie on one node: one that spans nodes
    fails on every rank before any communicator exists. Collective over the
    world."""

    def __init__(self, native):
        self._m = native

    @staticmethod
    def row_major(dims: dict, intra_node=()) -> "Mesh":
        return Mesh(_state().mesh_row_major(list(dims.items()), list(intra_node)))

    @staticmethod
    def ordered(order: str, sizes: dict, intra_node=()) -> "Mesh":
        return Mesh(_state().mesh_ordered(order, list(sizes.items()), list(intra_node)))

    @staticmethod
    def megatron(order: str = "tp-cp-ep-dp-pp", tp: int = 1, pp: int = 1, cp: int = 1, ep: int = 1,
                 etp: int | None = None, intra_node=()) -> tuple["Mesh", "Mesh"]:
        dense, expert = _state().mesh_megatron(order, tp, pp, cp, ep, etp, list(intra_node))
        return Mesh(dense), Mesh(expert)

    @staticmethod
    def vllm(dp: int = 1, pp: int = 1, tp: int = 1, intra_node=()) -> "Mesh":
        return Mesh(_state().mesh_vllm(dp, pp, tp, list(intra_node)))

    def group(self, *dims: str) -> GroupCoordinator:
        """This rank's group over ``dims`` (several: flattened, collective on first use)."""
        return GroupCoordinator(self._m.group(list(dims)))

    def groups(self, *dims: str) -> list[list[int]]:
        """Every group over ``dims``, as world ranks (the layout alone)."""
        return self._m.groups(list(dims))

    def coords(self) -> dict[str, int]:
        return dict(self._m.coords())

    def coord(self, dim: str) -> int:
        return self.coords()[dim]

    @property
    def dims(self) -> dict[str, int]:
        return dict(self._m.dims())


# -- axolotl's and ModelOpt's helpers -----------------------------------------
def is_distributed() -> bool:
    return _runtime is not None and _runtime.size > 1


def is_main_process() -> bool:
    """World rank 0 (``True`` when rankmesh is not initialised)."""
    return _runtime is None or _runtime.rank == 0


def is_local_main_process() -> bool:
    return _runtime is None or _runtime.local_rank == 0


def barrier() -> None:
    if _runtime is not None:
        get_world_group().barrier()


@contextlib.contextmanager
def zero_first(is_main: bool | None = None):
    """Rank 0 runs the block first; the others wait for it, then run it."""
    main = is_main_process() if is_main is None else is_main
    if not main:
        barrier()
    yield
    if main:
        barrier()


@contextlib.contextmanager
def zero_only():
    """axolotl's ``zero_only``: yields whether this is the main rank, for
    ``with zero_only() as main: if main: ...`` (a context manager cannot
    skip its block)."""
    yield is_main_process()


def gather_from_all_ranks(fn: Callable[[], Any], world_size: int = 1, rank: int = 0):
    """``fn()`` on every rank; the list on world rank ``rank``, ``None`` elsewhere."""
    if not is_distributed():
        return [fn()]
    values = get_world_group().all_gather_object(fn())
    return values if get_world_rank() == rank else None


def gather_scalar_from_all_ranks(fn: Callable[[], Any], world_size: int = 1, rank: int = 0):
    """axolotl's name: ``fn()`` (a number) from every rank, as a list on ``rank``."""
    value = fn()
    if not isinstance(value, (int, float)) and not hasattr(value, "item"):
        raise TypeError(f"gather_scalar_from_all_ranks: fn() returned a {type(value).__name__}, not a scalar")
    if hasattr(value, "item"):
        value = value.item()
    return gather_from_all_ranks(lambda: value, world_size, rank)


def compute_and_broadcast(fn: Callable[[], Any], rank: int = 0) -> Any:
    """``fn()`` computed on ``rank`` only, its value on every rank."""
    if not is_distributed():
        return fn()
    value = fn() if get_world_rank() == rank else None
    return get_world_group().broadcast_object(value, rank)
