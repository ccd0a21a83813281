//! NumPy arrays and torch tensors as rankmesh tensors, without a copy.
//!
//! An array with the buffer protocol (NumPy's own dtypes) is borrowed
//! through `PyObject_GetBuffer`, held until the call returns; one without
//! (NumPy arrays of `ml_dtypes`' bfloat16 and fp8) through
//! `__array_interface__`, holding the object; torch tensors and any other
//! DLPack producer through `__dlpack__`, holding the capsule. A CUDA tensor
//! (DLPack device `kDLCUDA` or `kDLCUDAManaged`) becomes a device tensor for
//! the device plane, with the stream its library calls current (torch's
//! `current_stream`, CuPy's `get_current_stream`, else the legacy default
//! stream), which is the stream its export is made ready for. A
//! non-contiguous input is copied to a contiguous one first; a
//! non-contiguous or read-only output is refused, since it cannot be
//! written in place.

use crate::errors::TensorError;
use pyo3::exceptions::PyTypeError;
use pyo3::ffi;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyTuple, PyType};
use rankmesh::{DType, DeviceTensor, Tensor};

/// The dtypes rankmesh moves, by their NumPy (and torch) names.
pub const NAMES: &[(&str, DType)] = &[
    ("float32", DType::F32),
    ("float64", DType::F64),
    ("float16", DType::F16),
    ("bfloat16", DType::BF16),
    ("int8", DType::I8),
    ("uint8", DType::U8),
    ("int16", DType::I16),
    ("uint16", DType::U16),
    ("int32", DType::I32),
    ("uint32", DType::U32),
    ("int64", DType::I64),
    ("uint64", DType::U64),
    ("bool", DType::Bool),
    ("float8_e4m3fn", DType::F8E4M3),
    ("float8_e5m2", DType::F8E5M2),
];

fn by_name(name: &str) -> Option<DType> {
    let name = name.strip_prefix("torch.").unwrap_or(name);
    NAMES.iter().find(|(n, _)| *n == name).map(|(_, d)| *d)
}

/// The NumPy name of `dtype`.
pub fn name_of(dtype: DType) -> &'static str {
    NAMES
        .iter()
        .find(|(_, d)| *d == dtype)
        .map(|(n, _)| *n)
        .expect("every dtype is named")
}

/// The dtype of a buffer's struct-module format, `None` when rankmesh does
/// not move it (or it is not native-endian).
fn by_format(format: &[u8], itemsize: usize) -> Option<DType> {
    let f = match format {
        [b'@' | b'=' | b'<', rest @ ..] => rest,
        f => f,
    };
    Some(match (f, itemsize) {
        (b"f", 4) => DType::F32,
        (b"d", 8) => DType::F64,
        (b"e", 2) => DType::F16,
        (b"b", 1) => DType::I8,
        (b"B", 1) => DType::U8,
        (b"h", 2) => DType::I16,
        (b"H", 2) => DType::U16,
        (b"i" | b"l", 4) => DType::I32,
        (b"I" | b"L", 4) => DType::U32,
        (b"l" | b"q", 8) => DType::I64,
        (b"L" | b"Q", 8) => DType::U64,
        (b"?", 1) => DType::Bool,
        _ => return None,
    })
}

/// DLPack's `DLTensor` (dlpack.h), the head of a `DLManagedTensor`.
#[repr(C)]
struct DlTensor {
    data: *mut std::ffi::c_void,
    device_type: i32,
    device_id: i32,
    ndim: i32,
    code: u8,
    bits: u8,
    lanes: u16,
    shape: *const i64,
    strides: *const i64,
    byte_offset: u64,
}

const DL_CPU: i32 = 1;
const DL_CUDA: i32 = 2;
/// Pinned host memory: the CPU reads it as its own.
const DL_CUDA_HOST: i32 = 3;
const DL_CUDA_MANAGED: i32 = 13;
const DL_INT: u8 = 0;
const DL_UINT: u8 = 1;
const DL_FLOAT: u8 = 2;
const DL_BFLOAT: u8 = 4;
const DL_BOOL: u8 = 6;

/// What keeps the memory alive while rankmesh uses it.
enum Held {
    /// A buffer export (released on drop, with the GIL held).
    Buffer(Box<ffi::Py_buffer>),
    /// The object itself (or a contiguous copy of the caller's).
    Object(#[allow(dead_code)] Py<PyAny>),
}

/// A CUDA array's device and the stream its library calls current.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cuda {
    /// The CUDA ordinal the producer names.
    pub device: usize,
    /// A `CUstream` (0: the legacy default stream).
    pub stream: usize,
}

/// Where a borrowed array's memory is.
enum Mem {
    Host(Tensor),
    Device(DeviceTensor, Cuda),
}

/// A borrowed array as the plane that moves it.
pub enum Plane<'a> {
    Host(Here<&'a mut Tensor>),
    Device(Here<&'a mut DeviceTensor>, Cuda),
}

/// An array borrowed as a tensor for the length of one call.
pub struct Borrowed {
    // Dropped before `held`: the tensor never outlives the memory.
    mem: Mem,
    _held: Held,
}

impl Drop for Held {
    fn drop(&mut self) {
        if let Held::Buffer(view) = self {
            // SAFETY: the view came from a successful PyObject_GetBuffer;
            // borrows are dropped where the GIL is held.
            unsafe { ffi::PyBuffer_Release(&mut **view) };
        }
    }
}

/// Moves a borrowed tensor into the closure that runs with the GIL
/// released; `Python::detach` runs it on this same thread.
pub struct Here<T>(T);

// SAFETY: `detach` runs its closure on the calling thread.
unsafe impl<T> Send for Here<T> {}

impl<T> Here<T> {
    pub fn new(t: T) -> Here<T> {
        Here(t)
    }

    /// The value (a method, so a closure captures the whole wrapper).
    pub fn get(self) -> T {
        self.0
    }
}

impl Borrowed {
    /// `x` for reading: a non-contiguous array is copied first.
    pub fn readable(x: &Bound<'_, PyAny>) -> PyResult<Borrowed> {
        Borrowed::of(x, false)
    }

    /// `x` for writing in place: C-contiguous and writable, or refused.
    pub fn writable(x: &Bound<'_, PyAny>) -> PyResult<Borrowed> {
        Borrowed::of(x, true)
    }

    pub fn shape(&self) -> &[usize] {
        match &self.mem {
            Mem::Host(t) => t.shape(),
            Mem::Device(t, _) => t.shape(),
        }
    }

    /// The element type.
    pub fn dtype(&self) -> DType {
        match &self.mem {
            Mem::Host(t) => t.dtype(),
            Mem::Device(t, _) => t.dtype(),
        }
    }

    /// The tensor, on its plane.
    pub fn plane(&mut self) -> Plane<'_> {
        match &mut self.mem {
            Mem::Host(t) => Plane::Host(Here(t)),
            Mem::Device(t, cuda) => Plane::Device(Here(t), *cuda),
        }
    }

    /// The CUDA device and stream of a device array (`None` on the host).
    pub fn cuda(&self) -> Option<Cuda> {
        match &self.mem {
            Mem::Host(_) => None,
            Mem::Device(_, cuda) => Some(*cuda),
        }
    }

    fn of(x: &Bound<'_, PyAny>, write: bool) -> PyResult<Borrowed> {
        if let Some(b) = Borrowed::from_torch_cpu(x)? {
            return Ok(b);
        }
        if let Some(b) = Borrowed::from_buffer(x, write)? {
            return Ok(b);
        }
        if x.hasattr("__array_interface__")? {
            return Borrowed::from_array_interface(x, write);
        }
        if x.hasattr("__dlpack__")? {
            return Borrowed::from_dlpack(x, write);
        }
        Err(PyTypeError::new_err(format!(
            "rankmesh moves NumPy arrays and torch CPU tensors; got {}",
            type_name(x)
        )))
    }

    /// Through the buffer protocol; `None` when `x` exports none, or one of
    /// a format the protocol cannot name (NumPy's ml_dtypes types).
    fn from_buffer(x: &Bound<'_, PyAny>, write: bool) -> PyResult<Option<Borrowed>> {
        let mut view = Box::new(std::mem::MaybeUninit::<ffi::Py_buffer>::zeroed());
        let flags = ffi::PyBUF_RECORDS_RO | if write { ffi::PyBUF_WRITABLE } else { 0 };
        // SAFETY: `x` is a live object; on success the view is filled.
        if unsafe { ffi::PyObject_GetBuffer(x.as_ptr(), view.as_mut_ptr(), flags) } != 0 {
            let err = PyErr::take(x.py());
            if write
                && x.hasattr("flags")?
                && !x
                    .getattr("flags")?
                    .getattr("writeable")?
                    .extract::<bool>()?
            {
                return Err(TensorError::new_err(format!(
                    "{} is read-only: an in-place op or an output must be writable",
                    describe(x)
                )));
            }
            drop(err);
            return Ok(None);
        }
        // SAFETY: filled by the successful call above.
        let view: Box<ffi::Py_buffer> = unsafe { Box::from_raw(Box::into_raw(view).cast()) };
        let held = Held::Buffer(view);
        let Held::Buffer(v) = &held else {
            unreachable!()
        };
        let format: &[u8] = if v.format.is_null() {
            b"B"
        } else {
            // SAFETY: a non-null format is a NUL-terminated string that
            // lives as long as the export.
            unsafe { std::ffi::CStr::from_ptr(v.format) }.to_bytes()
        };
        let Some(dtype) = by_format(format, v.itemsize as usize) else {
            let format = String::from_utf8_lossy(format);
            if x.hasattr("__array_interface__")? {
                return Ok(None);
            }
            return Err(PyTypeError::new_err(format!(
                "rankmesh does not move elements of buffer format {format:?} ({}); it moves {}",
                describe(x),
                supported()
            )));
        };
        // SAFETY: the view is live; `shape` has `ndim` entries.
        let shape: Vec<usize> = (0..v.ndim as usize)
            .map(|i| unsafe { *v.shape.add(i) } as usize)
            .collect();
        // SAFETY: the view is live.
        let contiguous = unsafe { ffi::PyBuffer_IsContiguous(&**v, b'C' as _) } != 0;
        if !contiguous {
            drop(held);
            return Borrowed::contiguous_copy(x, write).map(Some);
        }
        let ptr = v.buf.cast::<u8>();
        // SAFETY: the export holds `len` bytes at `buf` until released, and
        // is writable when asked with PyBUF_WRITABLE.
        let tensor =
            unsafe { Tensor::from_raw_parts(ptr, dtype, shape) }.map_err(crate::errors::to_py)?;
        Ok(Some(Borrowed {
            mem: Mem::Host(tensor),
            _held: held,
        }))
    }

    /// NumPy arrays whose dtype the buffer protocol cannot name.
    fn from_array_interface(x: &Bound<'_, PyAny>, write: bool) -> PyResult<Borrowed> {
        let name: String = x.getattr("dtype")?.getattr("name")?.extract()?;
        let dtype = dtype_named(&name, x)?;
        let ai = x.getattr("__array_interface__")?;
        let ai = ai.cast::<PyDict>()?;
        let data = ai
            .get_item("data")?
            .ok_or_else(|| TensorError::new_err("no data in __array_interface__"))?;
        let (ptr, readonly): (usize, bool) = data.extract()?;
        let strides = ai.get_item("strides")?;
        let c_contiguous: bool = x.getattr("flags")?.getattr("c_contiguous")?.extract()?;
        if strides.is_some_and(|s| !s.is_none()) && !c_contiguous {
            return Borrowed::contiguous_copy(x, write);
        }
        if write && readonly {
            return Err(TensorError::new_err(format!(
                "{} is read-only: an in-place op or an output must be writable",
                describe(x)
            )));
        }
        let shape: Vec<usize> = x.getattr("shape")?.extract()?;
        Borrowed::raw(x, ptr, dtype, shape)
    }

    /// A contiguous torch CPU tensor read in place, from its own attributes:
    /// `__dlpack__` costs about 20 µs a call, these under 2 µs. `None` for
    /// anything else (another type, a CUDA tensor, which needs DLPack's
    /// stream handshake, one that requires grad, which DLPack refuses to
    /// export, or a dtype or layout the DLPack path explains).
    fn from_torch_cpu(x: &Bound<'_, PyAny>) -> PyResult<Option<Borrowed>> {
        let py = x.py();
        let Some(torch) = TorchTypes::get(py)? else {
            return Ok(None);
        };
        // The C subtype test: `isinstance` would run torch's metaclass
        // `__instancecheck__` in Python on every NumPy array too.
        // SAFETY: both are live type objects.
        let is_tensor = unsafe {
            ffi::PyType_IsSubtype(
                x.get_type().as_type_ptr(),
                torch.tensor.bind(py).as_type_ptr(),
            )
        } != 0;
        if !is_tensor
            || !x.getattr(intern!(py, "is_cpu"))?.is_truthy()?
            || x.getattr(intern!(py, "requires_grad"))?.is_truthy()?
        {
            return Ok(None);
        }
        let dtype = x.getattr(intern!(py, "dtype"))?;
        let Some(dtype) = torch
            .dtypes
            .iter()
            .find(|(d, _)| d.bind(py).is(&dtype))
            .map(|(_, d)| *d)
        else {
            return Ok(None);
        };
        if !x.call_method0(intern!(py, "is_contiguous"))?.is_truthy()? {
            return Ok(None);
        }
        let shape: Vec<usize> = x.getattr(intern!(py, "shape"))?.extract()?;
        let ptr: usize = x.call_method0(intern!(py, "data_ptr"))?.extract()?;
        Borrowed::raw(x, ptr, dtype, shape).map(Some)
    }

    /// Through DLPack (torch tensors, and any other producer): the
    /// capsule is held for the call, and its own destructor returns the
    /// tensor to the producer.
    fn from_dlpack(x: &Bound<'_, PyAny>, write: bool) -> PyResult<Borrowed> {
        let (cuda, capsule) = export_dlpack(x)?;
        let managed = capsule_tensor(x, &capsule)?;
        // SAFETY: a "dltensor" capsule's pointer is a live DLManagedTensor,
        // whose first field is the DLTensor; the capsule is held meanwhile.
        let t = unsafe { &*(managed as *const DlTensor) };
        let on_device = match t.device_type {
            DL_CPU | DL_CUDA_HOST => false,
            DL_CUDA | DL_CUDA_MANAGED if cuda.is_some() => true,
            other => {
                return Err(TensorError::new_err(format!(
                    "{} lives on DLPack device type {other}: rankmesh moves host memory (CPU, \
                     pinned) and CUDA memory",
                    describe(x)
                )))
            }
        };
        let dtype = dlpack_dtype(x, t)?;
        let Some(shape) = dense_shape(t) else {
            return Borrowed::contiguous_copy(x, write);
        };
        let ptr = (t.data as usize).wrapping_add(t.byte_offset as usize);
        if let (true, Some(cuda)) = (on_device, cuda) {
            if !ptr.is_multiple_of(dtype.size()) {
                return Err(TensorError::new_err(format!(
                    "{}: its device address {ptr:#x} is not aligned for {}",
                    describe(x),
                    dtype.name()
                )));
            }
            // SAFETY: the producer exported `shape` elements of `dtype` at
            // `ptr` on device `cuda.device`, ready on `cuda.stream`; the
            // capsule (and so the memory) is held until the call returns,
            // and the call enqueues its work on that same stream, where the
            // caller's library orders any later reuse of the memory.
            let tensor = unsafe { DeviceTensor::from_raw(ptr as u64, dtype, shape) };
            return Ok(Borrowed {
                mem: Mem::Device(tensor, cuda),
                _held: Held::Object(capsule.unbind()),
            });
        }
        let mut b = Borrowed::raw(x, ptr, dtype, shape)?;
        b._held = Held::Object(capsule.unbind());
        Ok(b)
    }

    fn raw(
        x: &Bound<'_, PyAny>,
        ptr: usize,
        dtype: DType,
        shape: Vec<usize>,
    ) -> PyResult<Borrowed> {
        // A zero-size array may have no address; any aligned one will do.
        let ptr = if ptr == 0 && rankmesh::tensor::numel(&shape) == 0 {
            dtype.size()
        } else {
            ptr
        };
        // SAFETY: the object is held (so is its memory) until the call
        // returns; the interface said the memory is writable when asked.
        let tensor = unsafe { Tensor::from_raw_parts(ptr as *mut u8, dtype, shape) }
            .map_err(crate::errors::to_py)?;
        Ok(Borrowed {
            mem: Mem::Host(tensor),
            _held: Held::Object(x.clone().unbind()),
        })
    }

    /// A contiguous copy of an input; a non-contiguous output is refused.
    fn contiguous_copy(x: &Bound<'_, PyAny>, write: bool) -> PyResult<Borrowed> {
        if write {
            return Err(TensorError::new_err(format!(
                "{} is not C-contiguous: an in-place op or an output is written in place, so it must be \
                 contiguous (pass numpy.ascontiguousarray(x) and use the result)",
                describe(x)
            )));
        }
        let numpy = x.py().import("numpy")?;
        let copy = if x.hasattr("contiguous")? && x.hasattr("data_ptr")? {
            x.call_method0("contiguous")?
        } else if x.hasattr("__array_interface__")? || x.hasattr("__array__")? {
            numpy.call_method1("ascontiguousarray", (x,))?
        } else {
            let viewed = numpy.call_method1("from_dlpack", (x,))?;
            numpy.call_method1("ascontiguousarray", (viewed,))?
        };
        Borrowed::of(&copy, false)
    }
}

/// torch's `Tensor` type and its dtype objects, looked up once torch has
/// been imported (by the program: never imported here).
struct TorchTypes {
    tensor: Py<PyType>,
    dtypes: Vec<(Py<PyAny>, DType)>,
}

static TORCH: PyOnceLock<TorchTypes> = PyOnceLock::new();
static SYS_MODULES: PyOnceLock<Py<PyDict>> = PyOnceLock::new();

impl TorchTypes {
    fn get(py: Python<'_>) -> PyResult<Option<&'static TorchTypes>> {
        if let Some(t) = TORCH.get(py) {
            return Ok(Some(t));
        }
        // Asked on every call until torch is imported: one dict lookup in
        // `sys.modules`, kept (the import of `sys` costs 0.4 µs a call).
        let modules = SYS_MODULES.get_or_try_init(py, || {
            PyResult::Ok(
                py.import("sys")?
                    .getattr("modules")?
                    .cast_into::<PyDict>()?
                    .unbind(),
            )
        })?;
        let Some(torch) = modules.bind(py).get_item(intern!(py, "torch"))? else {
            return Ok(None);
        };
        let tensor = torch.getattr("Tensor")?.cast_into::<PyType>()?.unbind();
        let mut dtypes = Vec::new();
        for (name, dtype) in NAMES {
            if let Ok(d) = torch.getattr(*name) {
                dtypes.push((d.unbind(), *dtype));
            }
        }
        Ok(Some(
            TORCH.get_or_init(py, || TorchTypes { tensor, dtypes }),
        ))
    }
}

/// The stream `x`'s library calls current on CUDA device `device`: torch's
/// `current_stream`, CuPy's `get_current_stream`; 0 (the legacy default
/// stream) for any other producer.
fn caller_stream(x: &Bound<'_, PyAny>, device: usize) -> PyResult<usize> {
    let py = x.py();
    if of_library(x, "torch")? {
        let cuda = py.import("torch")?.getattr("cuda")?;
        return cuda
            .call_method1("current_stream", (device,))?
            .getattr("cuda_stream")?
            .extract();
    }
    if of_library(x, "cupy")? {
        return py
            .import("cupy")?
            .getattr("cuda")?
            .call_method0("get_current_stream")?
            .getattr("ptr")?
            .extract();
    }
    Ok(0)
}

/// Whether `x`'s type comes from the package `name` (or a module of it).
fn of_library(x: &Bound<'_, PyAny>, name: &str) -> PyResult<bool> {
    let module: String = x.get_type().module()?.extract()?;
    Ok(module
        .strip_prefix(name)
        .is_some_and(|rest| rest.is_empty() || rest.starts_with('.')))
}

fn dtype_named(name: &str, x: &Bound<'_, PyAny>) -> PyResult<DType> {
    by_name(name).ok_or_else(|| {
        PyTypeError::new_err(format!(
            "rankmesh does not move {name} ({}); it moves {}",
            describe(x),
            supported()
        ))
    })
}

fn supported() -> String {
    NAMES.iter().map(|(n, _)| *n).collect::<Vec<_>>().join(", ")
}

fn type_name(x: &Bound<'_, PyAny>) -> String {
    x.get_type()
        .name()
        .map(|n| n.to_string())
        .unwrap_or_else(|_| "an object".into())
}

/// "a numpy.ndarray of shape (2, 3)" for messages.
fn describe(x: &Bound<'_, PyAny>) -> String {
    let shape = x
        .getattr("shape")
        .and_then(|s| s.str())
        .map(|s| format!(" of shape {s}"))
        .unwrap_or_default();
    format!("a {}{shape}", type_name(x))
}

/// Where a new output array comes from.
pub struct Out;

impl Out {
    /// An uninitialised array like `x` (its dtype, its library, its
    /// device) of `shape`: `new_empty` (torch, and any producer that has
    /// it), CuPy's `empty` for a CuPy array, else NumPy's; a CUDA array
    /// (`on_device`) of another library is refused.
    pub fn empty_like<'py>(
        x: &Bound<'py, PyAny>,
        shape: &[usize],
        on_device: bool,
    ) -> PyResult<Bound<'py, PyAny>> {
        let py = x.py();
        let dims = PyTuple::new(py, shape)?;
        if x.hasattr("new_empty")? {
            return x.call_method1("new_empty", (dims,));
        }
        if of_library(x, "cupy")? {
            let dtype = x.getattr("dtype")?;
            return py.import("cupy")?.call_method1("empty", (dims, dtype));
        }
        if on_device {
            return Err(TensorError::new_err(format!(
                "{}: rankmesh allocates a CUDA output through the input's own library, torch \
                 (`new_empty`) or CuPy, and this one is neither",
                describe(x)
            )));
        }
        let numpy = py.import("numpy")?;
        let dtype = match x.getattr("dtype") {
            Ok(d) => d,
            Err(_) => {
                let t = Borrowed::readable(x)?;
                numpy.call_method1("dtype", (name_of(t.dtype()),))?
            }
        };
        numpy.call_method1("empty", (dims, dtype))
    }
}

/// `x`'s DLPack capsule, and its CUDA device and the caller's stream when
/// it lives on a GPU (DLPack's stream argument: the consumer's stream, which
/// the producer makes the data ready on; 1: the legacy default).
fn export_dlpack<'py>(x: &Bound<'py, PyAny>) -> PyResult<(Option<Cuda>, Bound<'py, PyAny>)> {
    let device: Option<(i32, usize)> = match x.getattr("__dlpack_device__") {
        Ok(f) => Some(f.call0()?.extract()?),
        Err(_) => None,
    };
    let cuda = match device {
        Some((DL_CUDA | DL_CUDA_MANAGED, id)) => Some(Cuda {
            device: id,
            stream: caller_stream(x, id)?,
        }),
        _ => None,
    };
    let capsule = match cuda {
        Some(c) => {
            let kwargs = PyDict::new(x.py());
            kwargs.set_item("stream", if c.stream == 0 { 1 } else { c.stream })?;
            x.call_method("__dlpack__", (), Some(&kwargs))?
        }
        None => x.call_method0("__dlpack__")?,
    };
    Ok((cuda, capsule))
}

/// The DLManagedTensor a "dltensor" capsule of `x`'s holds.
fn capsule_tensor(
    x: &Bound<'_, PyAny>,
    capsule: &Bound<'_, PyAny>,
) -> PyResult<*mut std::ffi::c_void> {
    let name = c"dltensor";
    // SAFETY: a "dltensor" capsule holds a DLManagedTensor, live while the
    // capsule is (the caller holds it, unconsumed, until the call returns).
    let managed = unsafe { ffi::PyCapsule_GetPointer(capsule.as_ptr(), name.as_ptr()) };
    if managed.is_null() {
        return Err(PyErr::take(x.py()).unwrap_or_else(|| {
            TensorError::new_err(format!(
                "{}: __dlpack__ gave no dltensor capsule",
                describe(x)
            ))
        }));
    }
    Ok(managed)
}

/// The dtype of DLPack tensor `t` (of `x`), or why rankmesh does not move it.
fn dlpack_dtype(x: &Bound<'_, PyAny>, t: &DlTensor) -> PyResult<DType> {
    Ok(match (t.code, t.bits, t.lanes) {
        (DL_FLOAT, 32, 1) => DType::F32,
        (DL_FLOAT, 64, 1) => DType::F64,
        (DL_FLOAT, 16, 1) => DType::F16,
        (DL_BFLOAT, 16, 1) => DType::BF16,
        (DL_INT, 8, 1) => DType::I8,
        (DL_INT, 16, 1) => DType::I16,
        (DL_INT, 32, 1) => DType::I32,
        (DL_INT, 64, 1) => DType::I64,
        (DL_UINT, 8, 1) => DType::U8,
        (DL_UINT, 16, 1) => DType::U16,
        (DL_UINT, 32, 1) => DType::U32,
        (DL_UINT, 64, 1) => DType::U64,
        (DL_BOOL, 8, 1) => DType::Bool,
        (code, bits, lanes) => {
            return Err(PyTypeError::new_err(format!(
                "rankmesh does not move DLPack dtype (code {code}, {bits} bits, {lanes} lanes) ({}); it moves {}",
                describe(x),
                supported()
            )))
        }
    })
}

/// The shape of DLPack tensor `t` when its elements are dense in row-major
/// order (no strides, or strides that say so; dims of 1 take any stride);
/// `None` otherwise.
fn dense_shape(t: &DlTensor) -> Option<Vec<usize>> {
    let ndim = usize::try_from(t.ndim).unwrap_or(0);
    // SAFETY: `shape` (and `strides`, when not null) have `ndim` entries.
    let shape: Vec<usize> = (0..ndim)
        .map(|i| unsafe { *t.shape.add(i) } as usize)
        .collect();
    if !t.strides.is_null() {
        let mut want = 1i64;
        for i in (0..ndim).rev() {
            // SAFETY: `strides` is not null and has `ndim` entries.
            let (d, st) = (shape[i], unsafe { *t.strides.add(i) });
            if d != 1 && st != want {
                return None;
            }
            want *= d as i64;
        }
    }
    Some(shape)
}
