//! `rankmesh._native`: the Rust side of the Python package. The package's
//! `__init__.py` holds the module-level state (FastVideo's
//! `parallel_state`) and the names; this module borrows arrays, runs the
//! library's collectives with the GIL released, and turns its errors into
//! exceptions.

// No function over 80 lines of code (clippy.toml; see src/lib.rs).
#![warn(clippy::too_many_lines)]
#![cfg_attr(test, allow(clippy::too_many_lines))]

mod alloc_probe;
mod arrays;
mod errors;
mod handles;
mod mesh;
mod objects;
mod torch_abi;

use arrays::{Borrowed, Cuda, Here, Out, Plane};
use errors::to_py;
use handles::Handle;
use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use pyo3::types::PyTuple;
use rankmesh::MeshLayout;
use rankmesh::{
    op::Args, Collectives, DeviceGroup, DeviceTensor, GroupCoordinator, Objects, ParallelState,
    ReduceOp, Tensor,
};
use serde_bytes::ByteBuf;

/// One op body for both planes: compiled for the host (`GroupCoordinator`,
/// host tensors) and for the device (`DeviceGroup`, CUDA tensors), whose
/// `Collectives` methods have the same names.
macro_rules! both {
    (|$g:ident, $t:ident| $body:expr) => {
        (
            move |$g: &GroupCoordinator<'static>, $t: &mut Tensor| $body,
            move |$g: &DeviceGroup<'_, 'static>, $t: &mut DeviceTensor| $body,
        )
    };
    (|$g:ident, $t:ident, $o:ident| $body:expr) => {
        (
            move |$g: &GroupCoordinator<'static>, $t: &Tensor, $o: &mut Tensor| $body,
            move |$g: &DeviceGroup<'_, 'static>, $t: &DeviceTensor, $o: &mut DeviceTensor| $body,
        )
    };
}

/// The job's runtime and its parallel state: one per process, made by
/// `init_distributed_environment` and finalized at exit.
#[pyclass(unsendable)]
struct Runtime {
    /// Leaked at init and reclaimed by `finalize`, after every group.
    rt: Option<&'static rankmesh::Runtime>,
    state: Option<ParallelState<'static>>,
}

impl Runtime {
    fn rt(&self) -> PyResult<&'static rankmesh::Runtime> {
        self.rt
            .ok_or_else(|| PyRuntimeError::new_err("rankmesh has been finalized"))
    }

    /// The runtime back from its leak (`None` once finalized), with every
    /// group handle released and the state dropped first: nothing borrows
    /// it after.
    fn take_runtime(&mut self) -> Option<Box<rankmesh::Runtime>> {
        handles::release_all();
        self.state.take();
        let rt = self.rt.take()?;
        // SAFETY: `rt` came from `Box::leak` (`new`, `shrink`), and nothing
        // that borrows it is left: the groups and the state were dropped above.
        Some(unsafe { Box::from_raw(rt as *const rankmesh::Runtime as *mut rankmesh::Runtime) })
    }

    fn state(&self) -> PyResult<&ParallelState<'static>> {
        self.state
            .as_ref()
            .ok_or_else(|| PyRuntimeError::new_err("rankmesh has been finalized"))
    }
}

#[pymethods]
impl Runtime {
    /// Starts MPI (if the launcher has not) and rankmesh on this rank.
    #[new]
    fn new(py: Python<'_>) -> PyResult<Runtime> {
        // A call that cannot complete is an exception, not the end of the
        // process: Python code handles it (`except`, `finally`) before the
        // job ends. RANKMESH_ON_HANG=abort still chooses the other way.
        let on_hang = match std::env::var_os("RANKMESH_ON_HANG") {
            None => Some(rankmesh::OnHang::Error),
            Some(_) => None,
        };
        // CUDA tensors' calls agree before they are enqueued, so that a bad
        // call is an exception at the call on every rank (the library's
        // default agrees later, at a synchronisation Python code does not
        // make through rankmesh). RANKMESH_CHECK still chooses.
        let strict = std::env::var_os("RANKMESH_CHECK").is_none();
        let rt = py
            .detach(move || {
                rankmesh::Runtime::init_adjusted(|o| {
                    // torch's autograd threads call the torch backend; the
                    // package's lock (handles::serial) takes their turns.
                    o.serialized = true;
                    if let Some(h) = on_hang {
                        o.on_hang = h;
                    }
                    if strict {
                        o.check = rankmesh::op::CheckMode::Strict;
                    }
                })
                .map(Here::new)
                .map_err(Here::new)
            })
            .map_err(|e| to_py(e.get()))?
            .get();
        errors::note_python_thread();
        rt.set_interrupt_check(Some(errors::interrupted));
        let rt: &'static rankmesh::Runtime = Box::leak(Box::new(rt));
        let state = match ParallelState::new(rt) {
            Ok(s) => s,
            Err(e) => {
                // SAFETY: leaked just above; nothing borrows it yet.
                drop(unsafe {
                    Box::from_raw(rt as *const rankmesh::Runtime as *mut rankmesh::Runtime)
                });
                return Err(to_py(e));
            }
        };
        Ok(Runtime {
            rt: Some(rt),
            state: Some(state),
        })
    }

    /// World rank.
    #[getter]
    fn rank(&self) -> PyResult<usize> {
        Ok(self.rt()?.rank())
    }

    /// World size.
    #[getter]
    fn size(&self) -> PyResult<usize> {
        Ok(self.rt()?.size())
    }

    /// Rank among the processes of this node.
    #[getter]
    fn local_rank(&self) -> PyResult<usize> {
        Ok(self.rt()?.world().me().local_rank)
    }

    /// Processes on this node.
    #[getter]
    fn local_size(&self) -> PyResult<usize> {
        Ok(self.rt()?.world().me().local_size)
    }

    /// FastVideo's `initialize_model_parallel` (collective over the world).
    fn initialize_model_parallel(&mut self, py: Python<'_>, tp: usize, sp: usize) -> PyResult<()> {
        let _turn = handles::serial();
        let state = self
            .state
            .as_mut()
            .ok_or_else(|| PyRuntimeError::new_err("rankmesh has been finalized"))?;
        let state = Here::new(state);
        py.detach(move || state.get().initialize_model_parallel(tp, sp, None))
            .map_err(to_py)
    }

    fn model_parallel_is_initialized(&self) -> PyResult<bool> {
        Ok(self.state()?.model_parallel_is_initialized())
    }

    fn destroy_model_parallel(&mut self) -> PyResult<()> {
        let _turn = handles::serial();
        if let Some(s) = self.state.as_mut() {
            s.destroy_model_parallel();
        }
        Ok(())
    }

    /// The world group.
    fn world_group(&mut self) -> PyResult<Group> {
        let _turn = handles::serial();
        let g = self.state()?.world().clone();
        Ok(Group::new(g))
    }

    /// The group in force of `kind` ("tp", "sp" or "dp").
    fn group(&mut self, kind: &str) -> PyResult<Group> {
        let _turn = handles::serial();
        let state = self.state()?;
        let g = match kind {
            "tp" => state.tp(),
            "sp" => state.sp(),
            "dp" => state.dp(),
            _ => return Err(PyRuntimeError::new_err(format!("no group kind {kind:?}"))),
        }
        .map_err(to_py)?;
        Ok(Group::new(g))
    }

    /// A group of the world ranks `ranks` (collective over the world: every
    /// rank calls it with the same list).
    fn subgroup(&mut self, py: Python<'_>, name: &str, ranks: Vec<usize>) -> PyResult<Group> {
        let _turn = handles::serial();
        let rt = Here::new(self.rt()?);
        let g = py
            .detach(move || rt.get().subgroup(name, &ranks).map(Here::new))
            .map_err(to_py)?
            .get();
        Ok(Group::new(g))
    }

    /// torch's `init_device_mesh` order: the last dimension fastest.
    #[pyo3(signature = (dims, intra_node = Vec::new()))]
    fn mesh_row_major(
        &self,
        py: Python<'_>,
        dims: Vec<(String, usize)>,
        intra_node: Vec<String>,
    ) -> PyResult<mesh::Mesh> {
        let _turn = handles::serial();
        let rt = self.rt()?;
        let dims: Vec<(&str, usize)> = dims.iter().map(|(n, s)| (n.as_str(), *s)).collect();
        mesh::Mesh::build(py, rt, MeshLayout::row_major(rt.size(), &dims), intra_node)
    }

    /// A Megatron order string (`tp-dp-pp`: the first name fastest).
    #[pyo3(signature = (order, sizes, intra_node = Vec::new()))]
    fn mesh_ordered(
        &self,
        py: Python<'_>,
        order: &str,
        sizes: Vec<(String, usize)>,
        intra_node: Vec<String>,
    ) -> PyResult<mesh::Mesh> {
        let _turn = handles::serial();
        let rt = self.rt()?;
        let sizes: Vec<(&str, usize)> = sizes.iter().map(|(n, s)| (n.as_str(), *s)).collect();
        mesh::Mesh::build(
            py,
            rt,
            MeshLayout::ordered(rt.size(), order, &sizes),
            intra_node,
        )
    }

    /// Megatron's dense and expert meshes (`tp`, `cp`, `ep`, `dp`, `pp`).
    #[pyo3(signature = (order, tp = 1, pp = 1, cp = 1, ep = 1, etp = None, intra_node = Vec::new()))]
    #[allow(clippy::too_many_arguments)] // Megatron's own parameters
    fn mesh_megatron(
        &self,
        py: Python<'_>,
        order: &str,
        tp: usize,
        pp: usize,
        cp: usize,
        ep: usize,
        etp: Option<usize>,
        intra_node: Vec<String>,
    ) -> PyResult<(mesh::Mesh, mesh::Mesh)> {
        let _turn = handles::serial();
        let rt = self.rt()?;
        let sizes = rankmesh::parallel::MegatronSizes {
            tp,
            pp,
            cp,
            ep,
            etp,
        };
        let (dense, expert) = MeshLayout::megatron(rt.size(), order, sizes).map_err(to_py)?;
        Ok((
            mesh::Mesh::build(py, rt, Ok(dense), intra_node.clone())?,
            mesh::Mesh::build(py, rt, Ok(expert), intra_node)?,
        ))
    }

    /// vLLM's layout (`ext × dp × pp × tp`, tp fastest).
    #[pyo3(signature = (dp = 1, pp = 1, tp = 1, intra_node = Vec::new()))]
    fn mesh_vllm(
        &self,
        py: Python<'_>,
        dp: usize,
        pp: usize,
        tp: usize,
        intra_node: Vec<String>,
    ) -> PyResult<mesh::Mesh> {
        let _turn = handles::serial();
        let rt = self.rt()?;
        mesh::Mesh::build(py, rt, MeshLayout::vllm(rt.size(), dp, pp, tp), intra_node)
    }

    /// After a `PeerLostError`: the survivors shrink the world to
    /// themselves and go on (ULFM: Open MPI 5 under `mpirun --with-ft
    /// ulfm`). Every group handle is released first (a call on an old one
    /// raises); the layout is to be made again. Returns the lost world
    /// ranks and each old rank's new rank (None: lost). Collective over
    /// the survivors.
    fn shrink(&mut self, py: Python<'_>) -> PyResult<(Vec<usize>, Vec<Option<usize>>)> {
        let _turn = handles::serial();
        // Refused before the runtime is taken: the job goes on without it.
        self.rt()?.can_shrink().map_err(to_py)?;
        let rt = self
            .take_runtime()
            .ok_or_else(|| PyRuntimeError::new_err("rankmesh has been finalized"))?;
        let rt = Here::new(rt);
        let shrunk = py
            .detach(move || rt.get().shrink().map(Here::new).map_err(Here::new))
            .map_err(|e| to_py(e.get()))?
            .get();
        let rankmesh::group::Shrunk {
            runtime,
            lost,
            new_rank,
        } = shrunk;
        runtime.set_interrupt_check(Some(errors::interrupted));
        let rt: &'static rankmesh::Runtime = Box::leak(Box::new(runtime));
        // Held before the state is made: `finalize` frees it if that fails.
        self.rt = Some(rt);
        self.state = Some(ParallelState::new(rt).map_err(to_py)?);
        Ok((lost, new_rank))
    }

    /// Frees every group, then the runtime (`MPI_Finalize`). `failure`:
    /// the uncaught exception the script ends with, told to peers still in
    /// a call with this rank; `None` for a clean exit (errors the script
    /// caught are not reasons to name). Handles still held refuse further
    /// calls.
    #[pyo3(signature = (failure = None))]
    fn finalize(&mut self, failure: Option<String>) {
        let _turn = handles::serial();
        if let Some(rt) = self.take_runtime() {
            rt.finish(failure);
        }
    }
}

/// One group: FastVideo's `GroupCoordinator` methods on NumPy arrays.
#[pyclass(unsendable)]
struct Group {
    slot: Handle<GroupCoordinator<'static>>,
}

impl Group {
    fn new(g: GroupCoordinator<'static>) -> Group {
        Group {
            slot: Handle::new(g),
        }
    }

    /// Runs `f` on the group with the GIL released.
    fn run<R: Send>(
        &self,
        py: Python<'_>,
        f: impl FnOnce(&GroupCoordinator<'static>) -> rankmesh::Result<R> + Send,
    ) -> PyResult<R> {
        let slot = self.slot.borrow();
        let g = slot
            .as_ref()
            .ok_or_else(|| PyRuntimeError::new_err("rankmesh has been finalized"))?;
        let g = Here::new(g);
        py.detach(move || f(g.get())).map_err(to_py)
    }

    fn with_group<R>(&self, f: impl FnOnce(&GroupCoordinator<'static>) -> R) -> PyResult<R> {
        let slot = self.slot.borrow();
        let g = slot
            .as_ref()
            .ok_or_else(|| PyRuntimeError::new_err("rankmesh has been finalized"))?;
        Ok(f(g))
    }

    /// A local refusal still calls in (a stand-in that fails the peers'
    /// call, naming this rank), so that every member gets an error instead
    /// of waiting.
    fn refuse<T>(&self, py: Python<'_>, e: PyErr) -> PyResult<T> {
        let _ = self.run(py, |g| g.refuse_here());
        Err(e)
    }

    /// Runs `f` on the group's device plane, enqueuing on `cuda`'s stream
    /// (the caller's), with the GIL released.
    fn run_device<R: Send>(
        &self,
        py: Python<'_>,
        cuda: Cuda,
        f: impl FnOnce(&DeviceGroup<'_, 'static>) -> rankmesh::Result<R> + Send,
    ) -> PyResult<R> {
        self.run(py, move |g| {
            let gpu = g.runtime().gpu()?;
            // SAFETY: the caller's library named this stream current on the
            // device checked in `borrow`; it outlives the call, which only
            // enqueues on it.
            let stream = unsafe { gpu.wrap_stream(cuda.stream as cudarc::driver::sys::CUstream) };
            f(&g.device()?.on_stream(&stream)?)
        })
    }

    /// Runs the op `f` (host and device bodies, [`both!`]) on `x`
    /// borrowed for writing (the call writes the caller's array where it
    /// lies) and returns `x` itself.
    fn in_place<'py>(
        &self,
        py: Python<'py>,
        x: Bound<'py, PyAny>,
        f: (
            impl FnOnce(&GroupCoordinator<'static>, &mut Tensor) -> rankmesh::Result<()> + Send,
            impl FnOnce(&DeviceGroup<'_, 'static>, &mut DeviceTensor) -> rankmesh::Result<()> + Send,
        ),
    ) -> PyResult<Bound<'py, PyAny>> {
        let mut b = self.borrow(py, &x, true)?;
        match b.plane() {
            Plane::Host(t) => self.run(py, move |g| f.0(g, t.get()))?,
            Plane::Device(t, cuda) => self.run_device(py, cuda, move |d| f.1(d, t.get()))?,
        }
        Ok(x)
    }

    /// `x` borrowed for reading or for writing in place, or refused (see
    /// [`refuse`](Self::refuse)): a CUDA array must be on this rank's GPU.
    fn borrow(&self, py: Python<'_>, x: &Bound<'_, PyAny>, write: bool) -> PyResult<Borrowed> {
        let borrowed = if write {
            Borrowed::writable(x)
        } else {
            Borrowed::readable(x)
        };
        let borrowed = borrowed.and_then(|b| match b.cuda() {
            Some(cuda) => self.on_my_gpu(cuda).map(|()| b),
            None => Ok(b),
        });
        borrowed.or_else(|e| self.refuse(py, e))
    }

    /// Whether `cuda`'s device is the GPU this rank's device plane uses.
    fn on_my_gpu(&self, cuda: Cuda) -> PyResult<()> {
        self.with_group(|g| {
            let gpu = g.runtime().gpu().map_err(to_py)?;
            let mine = gpu.info().ordinal;
            if mine != cuda.device {
                return Err(errors::TensorError::new_err(format!(
                    "a CUDA tensor on device {} given to {}, whose device plane uses device {mine} \
                     on this rank (RANKMESH_DEVICE, or the local rank by default)",
                    cuda.device,
                    g.name()
                )));
            }
            Ok(())
        })?
    }
}

fn reduce_op(op: &str) -> PyResult<ReduceOp> {
    // Compared in place: this runs on every all_reduce.
    const OPS: [(&str, ReduceOp); 7] = [
        ("sum", ReduceOp::Sum),
        ("avg", ReduceOp::Avg),
        ("max", ReduceOp::Max),
        ("min", ReduceOp::Min),
        ("prod", ReduceOp::Prod),
        ("product", ReduceOp::Prod),
        ("mean", ReduceOp::Avg),
    ];
    OPS.iter()
        .find(|(name, _)| name.eq_ignore_ascii_case(op))
        .map(|(_, r)| *r)
        .ok_or_else(|| {
            pyo3::exceptions::PyValueError::new_err(format!(
                "unknown reduce op {op:?} (sum, prod, min, max, avg)"
            ))
        })
}

#[pymethods]
impl Group {
    #[getter]
    fn name(&self) -> PyResult<String> {
        self.with_group(|g| g.name().to_string())
    }

    #[getter]
    fn ranks(&self) -> PyResult<Vec<usize>> {
        self.with_group(|g| g.ranks().to_vec())
    }

    #[getter]
    fn world_size(&self) -> PyResult<usize> {
        self.with_group(|g| g.size())
    }

    #[getter]
    fn rank_in_group(&self) -> PyResult<usize> {
        self.with_group(|g| g.rank_in_group())
    }

    #[getter]
    fn rank(&self) -> PyResult<usize> {
        self.with_group(|g| g.global_rank())
    }

    fn barrier(&self, py: Python<'_>) -> PyResult<()> {
        self.run(py, |g| g.barrier())
    }

    /// A handle on this group for `rankmesh.torch`'s C++ backend (an
    /// address it passes back to the [`torch_abi`] functions and releases
    /// once). Finalizing empties it with the group's other handles.
    fn _torch_handle(&self) -> usize {
        torch_abi::TorchGroup::leak(self.slot.clone())
    }

    /// Reduces `input_` across the group in place; returns `input_` itself.
    #[pyo3(signature = (input_, op = "sum"))]
    fn all_reduce<'py>(
        &self,
        py: Python<'py>,
        input_: Bound<'py, PyAny>,
        op: &str,
    ) -> PyResult<Bound<'py, PyAny>> {
        let op = reduce_op(op)?;
        self.in_place(py, input_, both!(|g, t| g.all_reduce_in_place(t, op)))
    }

    /// Copies `input_` from group rank `src` into every member's, in place.
    #[pyo3(signature = (input_, src = 0))]
    fn broadcast<'py>(
        &self,
        py: Python<'py>,
        input_: Bound<'py, PyAny>,
        src: usize,
    ) -> PyResult<Bound<'py, PyAny>> {
        self.in_place(py, input_, both!(|g, t| g.broadcast(t, src)))
    }

    /// Concatenation of every member's `input_` along `dim`.
    #[pyo3(signature = (input_, dim = -1))]
    fn all_gather<'py>(
        &self,
        py: Python<'py>,
        input_: Bound<'py, PyAny>,
        dim: isize,
    ) -> PyResult<Bound<'py, PyAny>> {
        self.with_new_output(
            py,
            &input_,
            Some(Args::all_gather(dim)),
            both!(|g, t, o| g.all_gather_into(t, o, dim)),
        )
    }

    /// Sum (or `op`) over the group, slice `rank_in_group` of `dim` kept.
    #[pyo3(signature = (input_, dim = 0, op = "sum"))]
    fn reduce_scatter<'py>(
        &self,
        py: Python<'py>,
        input_: Bound<'py, PyAny>,
        dim: isize,
        op: &str,
    ) -> PyResult<Bound<'py, PyAny>> {
        let op = reduce_op(op)?;
        self.with_new_output(
            py,
            &input_,
            Some(Args::reduce_scatter(dim, op)),
            both!(|g, t, o| g.reduce_scatter_into(t, o, dim, op)),
        )
    }

    /// Sum (or `op`) over the group, this member's `counts[rank_in_group]`
    /// slices of `dim` kept (member `r` keeps its `counts[r]`, in order;
    /// `input_` holds their sum along `dim`).
    #[pyo3(signature = (input_, counts, dim = 0, op = "sum"))]
    fn reduce_scatter_v<'py>(
        &self,
        py: Python<'py>,
        input_: Bound<'py, PyAny>,
        counts: Vec<usize>,
        dim: isize,
        op: &str,
    ) -> PyResult<Bound<'py, PyAny>> {
        let op = reduce_op(op)?;
        let me = self.rank_in_group()?;
        let counts = &counts;
        // Wrong counts or dims leave the input's shape: the call then names
        // what is wrong, on every member.
        let shape = |input: &[usize]| {
            let mut out = input.to_vec();
            let d = if dim < 0 {
                dim + out.len() as isize
            } else {
                dim
            };
            if let (Ok(d), Some(n)) = (usize::try_from(d), counts.get(me)) {
                if let Some(slot) = out.get_mut(d) {
                    *slot = *n;
                }
            }
            out
        };
        self.with_shaped_output(
            py,
            &input_,
            shape,
            both!(|g, t, o| g.reduce_scatter_v_into(t, o, counts, dim, op)),
        )
    }

    /// FastVideo's `all_to_all_4D` (`[B, S/P, H, D] ↔ [B, S, H/P, D]`).
    #[pyo3(signature = (input_, scatter_dim = 2, gather_dim = 1))]
    #[allow(non_snake_case)] // FastVideo's name
    fn all_to_all_4D<'py>(
        &self,
        py: Python<'py>,
        input_: Bound<'py, PyAny>,
        scatter_dim: usize,
        gather_dim: usize,
    ) -> PyResult<Bound<'py, PyAny>> {
        self.with_new_output(
            py,
            &input_,
            Some(Args::all_to_all_4d(scatter_dim, gather_dim)),
            both!(|g, t, o| g.all_to_all_4d_into(t, o, scatter_dim, gather_dim)),
        )
    }

    /// Concatenation along `dim` on group rank `dst` (`None` elsewhere).
    #[pyo3(signature = (input_, dst = 0, dim = -1))]
    fn gather<'py>(
        &self,
        py: Python<'py>,
        input_: Bound<'py, PyAny>,
        dst: usize,
        dim: isize,
    ) -> PyResult<Option<Bound<'py, PyAny>>> {
        let me = self.rank_in_group()?;
        // Only `dst` has an output; the others pass an empty one.
        let out = self.with_new_output(
            py,
            &input_,
            (me == dst).then(|| Args::gather(dst, dim)),
            both!(|g, t, o| g.gather_into(t, o, dst, dim)),
        )?;
        Ok((me == dst).then_some(out))
    }

    /// Sends `input_` to group rank `dst` (the next member when `None`).
    #[pyo3(signature = (input_, dst = None))]
    fn send(&self, py: Python<'_>, input_: Bound<'_, PyAny>, dst: Option<usize>) -> PyResult<()> {
        let mut t = self.borrow(py, &input_, false)?;
        match t.plane() {
            Plane::Host(t) => self.run(py, move |g| g.send(t.get(), dst)),
            Plane::Device(t, cuda) => self.run_device(py, cuda, move |d| d.send(t.get(), dst)),
        }
    }

    /// Receives into `out` from group rank `src` (the previous member when
    /// `None`); returns `out`.
    #[pyo3(signature = (out, src = None))]
    fn recv_into<'py>(
        &self,
        py: Python<'py>,
        out: Bound<'py, PyAny>,
        src: Option<usize>,
    ) -> PyResult<Bound<'py, PyAny>> {
        self.in_place(py, out, both!(|g, t| g.recv_into(t, src)))
    }

    /// `obj` from group rank `src` on every member (safe format, no pickle).
    #[pyo3(signature = (obj = None, src = 0))]
    fn broadcast_object<'py>(
        &self,
        py: Python<'py>,
        obj: Option<Bound<'py, PyAny>>,
        src: usize,
    ) -> PyResult<Bound<'py, PyAny>> {
        let mine = self.rank_in_group()? == src;
        let bytes = if mine {
            let obj = obj.unwrap_or_else(|| py.None().into_bound(py));
            match objects::encode(&obj) {
                Ok(v) => ByteBuf::from(v),
                Err(e) => return self.refuse(py, e),
            }
        } else {
            ByteBuf::new()
        };
        let got = self.run(py, move |g| g.broadcast_object(mine.then_some(&bytes), src))?;
        objects::decode(py, &got)
    }

    /// Every member's `obj`, in group-rank order.
    fn all_gather_object<'py>(
        &self,
        py: Python<'py>,
        obj: Bound<'py, PyAny>,
    ) -> PyResult<Vec<Bound<'py, PyAny>>> {
        let bytes = match objects::encode(&obj) {
            Ok(v) => ByteBuf::from(v),
            Err(e) => return self.refuse(py, e),
        };
        let all = self.run(py, move |g| g.all_gather_object(&bytes))?;
        all.iter().map(|b| objects::decode(py, b)).collect()
    }
}

impl Group {
    /// Allocates the output (`numpy.empty` of the shape the op's own rule
    /// gives for `args`, in `x`'s dtype, or `x.new_empty` for a torch
    /// tensor; `[0]` for `None`, a member without an output) and runs `f`
    /// into it. Arguments that name no shape leave it empty, as the
    /// library's allocating forms do: the call then fails on every rank
    /// with the op's own message.
    fn with_new_output<'py>(
        &self,
        py: Python<'py>,
        x: &Bound<'py, PyAny>,
        args: Option<Args>,
        f: (
            impl FnOnce(&GroupCoordinator<'static>, &Tensor, &mut Tensor) -> rankmesh::Result<()> + Send,
            impl FnOnce(
                    &DeviceGroup<'_, 'static>,
                    &DeviceTensor,
                    &mut DeviceTensor,
                ) -> rankmesh::Result<()>
                + Send,
        ),
    ) -> PyResult<Bound<'py, PyAny>> {
        let size = self.world_size()?;
        let shape = |input: &[usize]| match args {
            Some(args) => args.output_shape(input, size).unwrap_or_default(),
            None => vec![0],
        };
        self.with_shaped_output(py, x, shape, f)
    }

    /// [`with_new_output`](Self::with_new_output) with the output's shape
    /// from `shape` of the input's.
    fn with_shaped_output<'py>(
        &self,
        py: Python<'py>,
        x: &Bound<'py, PyAny>,
        shape: impl FnOnce(&[usize]) -> Vec<usize>,
        f: (
            impl FnOnce(&GroupCoordinator<'static>, &Tensor, &mut Tensor) -> rankmesh::Result<()> + Send,
            impl FnOnce(
                    &DeviceGroup<'_, 'static>,
                    &DeviceTensor,
                    &mut DeviceTensor,
                ) -> rankmesh::Result<()>
                + Send,
        ),
    ) -> PyResult<Bound<'py, PyAny>> {
        let mut t = self.borrow(py, x, false)?;
        let shape = shape(t.shape());
        let out = match Out::empty_like(x, &shape, t.cuda().is_some()) {
            Ok(out) => out,
            Err(e) => return self.refuse(py, e),
        };
        let mut o = Borrowed::writable(&out)?;
        match (t.plane(), o.plane()) {
            (Plane::Host(t), Plane::Host(o)) => {
                self.run(py, move |g| f.0(g, &*t.get(), o.get()))?
            }
            (Plane::Device(t, cuda), Plane::Device(o, _)) => {
                self.run_device(py, cuda, move |d| f.1(d, &*t.get(), o.get()))?
            }
            _ => {
                return self.refuse(
                    py,
                    errors::TensorError::new_err(
                        "the output was allocated on the other plane than the input (host/CUDA)",
                    ),
                )
            }
        }
        Ok(out)
    }
}

/// The value a peer's encoded object stands for: the decoder the object
/// plane runs on received bytes, exposed so tests can hand it hostile ones.
#[pyfunction]
fn _decode<'py>(py: Python<'py>, bytes: &[u8]) -> PyResult<Bound<'py, PyAny>> {
    objects::decode(py, bytes)
}

/// A value's encoding on the object plane (for tests, with `_decode`).
#[pyfunction]
fn _encode<'py>(
    py: Python<'py>,
    obj: Bound<'py, PyAny>,
) -> PyResult<Bound<'py, pyo3::types::PyBytes>> {
    Ok(pyo3::types::PyBytes::new(py, &objects::encode(&obj)?))
}

/// The largest allocation (bytes) the calling thread made on the Rust heap
/// since the last call (tests of the zero-copy claims).
#[pyfunction]
fn _largest_rust_allocation() -> usize {
    alloc_probe::largest_since_last()
}

/// The C entry points of the torch backend, as a capsule named
/// `rankmesh._native.torch_api` holding the address of their table.
#[pyfunction]
fn _torch_api(py: Python<'_>) -> PyResult<Bound<'_, PyAny>> {
    let table = &torch_abi::API as *const torch_abi::Api as *mut std::ffi::c_void;
    // SAFETY: the table and the name are `static`s: they outlive the
    // capsule, which has no destructor.
    unsafe {
        let capsule = pyo3::ffi::PyCapsule_New(table, c"rankmesh._native.torch_api".as_ptr(), None);
        Bound::from_owned_ptr_or_err(py, capsule)
    }
}

/// A tuple of the library's dtypes this module moves, by NumPy name.
#[pyfunction]
fn dtypes(py: Python<'_>) -> PyResult<Bound<'_, PyTuple>> {
    PyTuple::new(py, arrays::NAMES.iter().map(|(n, _)| *n))
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Runtime>()?;
    m.add_class::<Group>()?;
    m.add_class::<mesh::Mesh>()?;
    m.add_function(wrap_pyfunction!(dtypes, m)?)?;
    m.add_function(wrap_pyfunction!(_decode, m)?)?;
    m.add_function(wrap_pyfunction!(_encode, m)?)?;
    m.add_function(wrap_pyfunction!(_torch_api, m)?)?;
    m.add_function(wrap_pyfunction!(_largest_rust_allocation, m)?)?;
    errors::register(m)?;
    Ok(())
}
