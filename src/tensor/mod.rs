//! Host tensors: a dtype, a shape and typed storage, owned or the caller's.
//!
//! Owned storage is one typed `Vec` per dtype (never a `Vec<u8>`), so views
//! as `&[f64]` are always aligned; the byte view used by the data plane is a
//! zero-copy cast. Borrowed storage ([`HostView`], [`HostViewMut`],
//! [`Tensor::from_raw_parts`]) is the caller's memory, checked for
//! alignment when the view is made, so collectives read and write a
//! caller's buffer (a `Vec`, a NumPy array) in place.

pub(crate) mod split;

use crate::error::{Error, Result};
use bytemuck::Pod;
pub use float8::{F8E4M3, F8E5M2};
use half::{bf16, f16};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use crate::dtype::DType;

/// Typed host storage of a tensor.
#[derive(Clone, Debug, PartialEq)]
#[allow(missing_docs)]
pub enum HostData {
    F32(Vec<f32>),
    F64(Vec<f64>),
    F16(Vec<f16>),
    BF16(Vec<bf16>),
    I8(Vec<i8>),
    U8(Vec<u8>),
    I32(Vec<i32>),
    U32(Vec<u32>),
    I64(Vec<i64>),
    U64(Vec<u64>),
    F8E4M3(Vec<F8E4M3>),
    F8E5M2(Vec<F8E5M2>),
    Bool(Vec<Bool>),
    I16(Vec<i16>),
    U16(Vec<u16>),
}

/// Runs `$body` with `$v` bound to the typed vector inside a [`HostData`].
macro_rules! with_host_data {
    ($data:expr, $v:ident => $body:expr) => {
        match $data {
            HostData::F32($v) => $body,
            HostData::F64($v) => $body,
            HostData::F16($v) => $body,
            HostData::BF16($v) => $body,
            HostData::I8($v) => $body,
            HostData::U8($v) => $body,
            HostData::I32($v) => $body,
            HostData::U32($v) => $body,
            HostData::I64($v) => $body,
            HostData::U64($v) => $body,
            HostData::F8E4M3($v) => $body,
            HostData::F8E5M2($v) => $body,
            HostData::Bool($v) => $body,
            HostData::I16($v) => $body,
            HostData::U16($v) => $body,
        }
    };
}

/// Declares an enum of one typed slice per dtype, and a macro binding the
/// slice inside it.
macro_rules! slice_enum {
    ($(#[$doc:meta])* $name:ident, $with:ident, $($r:tt)*) => {
        $(#[$doc])*
        #[derive(Debug, PartialEq)]
        #[allow(missing_docs)]
        pub enum $name<'a> {
            F32($($r)* [f32]),
            F64($($r)* [f64]),
            F16($($r)* [f16]),
            BF16($($r)* [bf16]),
            I8($($r)* [i8]),
            U8($($r)* [u8]),
            I32($($r)* [i32]),
            U32($($r)* [u32]),
            I64($($r)* [i64]),
            U64($($r)* [u64]),
            F8E4M3($($r)* [F8E4M3]),
            F8E5M2($($r)* [F8E5M2]),
            Bool($($r)* [Bool]),
            I16($($r)* [i16]),
            U16($($r)* [u16]),
        }

        macro_rules! $with {
            ($data:expr, $v:ident => $body:expr) => {
                match $data {
                    $name::F32($v) => $body,
                    $name::F64($v) => $body,
                    $name::F16($v) => $body,
                    $name::BF16($v) => $body,
                    $name::I8($v) => $body,
                    $name::U8($v) => $body,
                    $name::I32($v) => $body,
                    $name::U32($v) => $body,
                    $name::I64($v) => $body,
                    $name::U64($v) => $body,
                    $name::F8E4M3($v) => $body,
                    $name::F8E5M2($v) => $body,
                    $name::Bool($v) => $body,
                    $name::I16($v) => $body,
                    $name::U16($v) => $body,
                }
            };
        }
    };
}

slice_enum!(
    /// A tensor's elements, typed: what [`Tensor::data`] gives, whoever owns
    /// the storage.
    HostSlice, with_slice, &'a
);
slice_enum!(
    /// A tensor's elements, typed and writable.
    HostSliceMut, with_slice_mut, &'a mut
);

/// Casts `$bytes` (aligned for `$dtype`, by construction) to the typed slice
/// enum `$name` using `$cast`.
macro_rules! typed_bytes {
    ($name:ident, $cast:path, $dtype:expr, $bytes:expr) => {
        match $dtype {
            DType::F32 => $name::F32($cast($bytes)),
            DType::F64 => $name::F64($cast($bytes)),
            DType::F16 => $name::F16($cast($bytes)),
            DType::BF16 => $name::BF16($cast($bytes)),
            DType::I8 => $name::I8($cast($bytes)),
            DType::U8 => $name::U8($cast($bytes)),
            DType::I32 => $name::I32($cast($bytes)),
            DType::U32 => $name::U32($cast($bytes)),
            DType::I64 => $name::I64($cast($bytes)),
            DType::U64 => $name::U64($cast($bytes)),
            DType::F8E4M3 => $name::F8E4M3($cast($bytes)),
            DType::F8E5M2 => $name::F8E5M2($cast($bytes)),
            DType::Bool => $name::Bool($cast($bytes)),
            DType::I16 => $name::I16($cast($bytes)),
            DType::U16 => $name::U16($cast($bytes)),
        }
    };
}

impl HostSlice<'_> {
    /// Element type.
    pub fn dtype(&self) -> DType {
        with_slice!(self, v => element_dtype(v))
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        with_slice!(self, v => v.len())
    }

    /// Whether there are no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn to_owned(&self) -> HostData {
        with_slice!(self, v => Element::into_data(v.to_vec()))
    }
}

impl HostSliceMut<'_> {
    /// Element type.
    pub fn dtype(&self) -> DType {
        with_slice_mut!(self, v => element_dtype(v))
    }
}

fn element_dtype<T: Element>(_: &[T]) -> DType {
    T::DTYPE
}

/// A Rust type that can be a tensor element.
pub trait Element: Pod + PartialEq + std::fmt::Debug + Send + Sync + 'static {
    /// The dtype this type stands for.
    const DTYPE: DType;
    /// Wraps a vector as storage.
    fn into_data(v: Vec<Self>) -> HostData;
    /// Lossy conversion used by references and reductions of 16-bit floats.
    fn to_f64(self) -> f64;
    /// Lossy conversion (round to nearest, saturating for integers).
    fn from_f64(v: f64) -> Self;
}

macro_rules! element {
    ($t:ty, $variant:ident, $to:expr, $from:expr) => {
        impl Element for $t {
            const DTYPE: DType = DType::$variant;
            fn into_data(v: Vec<Self>) -> HostData {
                HostData::$variant(v)
            }
            fn to_f64(self) -> f64 {
                let f: fn($t) -> f64 = $to;
                f(self)
            }
            fn from_f64(v: f64) -> Self {
                let f: fn(f64) -> $t = $from;
                f(v)
            }
        }
    };
}

element!(f32, F32, |x| x as f64, |v| v as f32);
element!(f64, F64, |x| x, |v| v);
element!(f16, F16, |x| x.to_f64(), f16::from_f64);
element!(bf16, BF16, |x| x.to_f64(), bf16::from_f64);
element!(i8, I8, |x| x as f64, |v| v.round() as i8);
element!(u8, U8, |x| x as f64, |v| v.round() as u8);
element!(i32, I32, |x| x as f64, |v| v.round() as i32);
element!(u32, U32, |x| x as f64, |v| v.round() as u32);
element!(i64, I64, |x| x as f64, |v| v.round() as i64);
element!(u64, U64, |x| x as f64, |v| v.round() as u64);
element!(F8E4M3, F8E4M3, |x| x.to_f64(), F8E4M3::from_f64);
element!(F8E5M2, F8E5M2, |x| x.to_f64(), F8E5M2::from_f64);
element!(Bool, Bool, |x| x.get() as u8 as f64, |v| Bool::from(
    v != 0.0
));
element!(i16, I16, |x| x as f64, |v| v.round() as i16);
element!(u16, U16, |x| x as f64, |v| v.round() as u16);

/// A `bool` tensor element: one byte, zero is false and anything else true
/// (how torch and NCCL read a bool buffer). Any byte is a valid `Bool`, so
/// bytes received from a peer never make an invalid value, as they would
/// in a `[bool]`.
#[derive(Clone, Copy, Default, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(transparent)]
pub struct Bool(pub u8);

impl Bool {
    /// `true`.
    pub const TRUE: Bool = Bool(1);
    /// `false`.
    pub const FALSE: Bool = Bool(0);

    /// The truth value (any non-zero byte is true).
    pub fn get(self) -> bool {
        self.0 != 0
    }
}

impl From<bool> for Bool {
    fn from(b: bool) -> Bool {
        Bool(b as u8)
    }
}

impl From<Bool> for bool {
    fn from(b: Bool) -> bool {
        b.get()
    }
}

/// Equal truth values are equal, whatever non-zero byte says `true`.
impl PartialEq for Bool {
    fn eq(&self, other: &Bool) -> bool {
        self.get() == other.get()
    }
}

impl Eq for Bool {}

impl std::fmt::Debug for Bool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Debug::fmt(&self.get(), f)
    }
}

impl HostData {
    /// `n` zeros, `None` when the memory cannot be reserved.
    fn try_zeros(dtype: DType, n: usize) -> Option<HostData> {
        fn filled<T: Clone>(zero: T, n: usize) -> Option<Vec<T>> {
            let mut v = Vec::new();
            v.try_reserve_exact(n).ok()?;
            v.resize(n, zero);
            Some(v)
        }
        Some(match dtype {
            DType::F32 => HostData::F32(filled(0.0, n)?),
            DType::F64 => HostData::F64(filled(0.0, n)?),
            DType::F16 => HostData::F16(filled(f16::ZERO, n)?),
            DType::BF16 => HostData::BF16(filled(bf16::ZERO, n)?),
            DType::I8 => HostData::I8(filled(0, n)?),
            DType::U8 => HostData::U8(filled(0, n)?),
            DType::I32 => HostData::I32(filled(0, n)?),
            DType::U32 => HostData::U32(filled(0, n)?),
            DType::I64 => HostData::I64(filled(0, n)?),
            DType::U64 => HostData::U64(filled(0, n)?),
            DType::F8E4M3 => HostData::F8E4M3(filled(F8E4M3::from_bits(0), n)?),
            DType::F8E5M2 => HostData::F8E5M2(filled(F8E5M2::from_bits(0), n)?),
            DType::Bool => HostData::Bool(filled(Bool::FALSE, n)?),
            DType::I16 => HostData::I16(filled(0, n)?),
            DType::U16 => HostData::U16(filled(0, n)?),
        })
    }

    pub(crate) fn dtype(&self) -> DType {
        match self {
            HostData::F32(_) => DType::F32,
            HostData::F64(_) => DType::F64,
            HostData::F16(_) => DType::F16,
            HostData::BF16(_) => DType::BF16,
            HostData::I8(_) => DType::I8,
            HostData::U8(_) => DType::U8,
            HostData::I32(_) => DType::I32,
            HostData::U32(_) => DType::U32,
            HostData::I64(_) => DType::I64,
            HostData::U64(_) => DType::U64,
            HostData::F8E4M3(_) => DType::F8E4M3,
            HostData::F8E5M2(_) => DType::F8E5M2,
            HostData::Bool(_) => DType::Bool,
            HostData::I16(_) => DType::I16,
            HostData::U16(_) => DType::U16,
        }
    }

    fn bytes_mut(&mut self) -> &mut [u8] {
        with_host_data!(self, v => bytemuck::cast_slice_mut(v.as_mut_slice()))
    }
}

/// A dense, row-major host tensor: rankmesh's own storage, or the caller's
/// memory borrowed without a copy ([`Tensor::view`], [`Tensor::view_mut`]).
pub struct Tensor {
    shape: Vec<usize>,
    dtype: DType,
    /// The elements: `owned`'s buffer, or the caller's memory (aligned for
    /// `dtype`). Kept here so the hot path's byte views need no dispatch
    /// on the storage (a moved `Vec` keeps its buffer where it is).
    ptr: NonNull<u8>,
    nbytes: usize,
    /// rankmesh's own storage; `None` for the caller's memory.
    owned: Option<HostData>,
    /// Present for views made safely: cleared when the view ends, and a
    /// tensor moved out of its view (`mem::replace`) then reads as an empty
    /// tensor of shape `[0]` instead of touching memory it no longer borrows.
    live: Option<Arc<AtomicBool>>,
}

// SAFETY: `ptr` is either the tensor's own buffer or stands for a caller's
// `&[T]` / `&mut [T]` of plain data, which are `Send` and `Sync`; the view
// or `from_raw_parts`'s contract keeps the memory valid while it is read.
unsafe impl Send for Tensor {}
// SAFETY: as for `Send`: shared, the memory is only read.
unsafe impl Sync for Tensor {}

impl Clone for Tensor {
    /// A borrowed tensor's clone is an owned copy.
    fn clone(&self) -> Tensor {
        Tensor::owned(self.shape().to_vec(), self.data().to_owned())
    }
}

impl PartialEq for Tensor {
    fn eq(&self, other: &Tensor) -> bool {
        self.shape() == other.shape() && self.data() == other.data()
    }
}

impl std::fmt::Debug for Tensor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tensor")
            .field("shape", &self.shape())
            .field("data", &self.data())
            .field("borrowed", &self.is_borrowed())
            .finish()
    }
}

/// Number of elements of a shape (1 for a scalar `[]`), saturating at
/// `usize::MAX` when the product overflows (no real tensor has that many).
pub fn numel(shape: &[usize]) -> usize {
    checked_numel(shape).unwrap_or(usize::MAX)
}

/// Number of elements of a shape, `None` when the product overflows (a
/// zero dim makes it 0 whatever the others are).
pub fn checked_numel(shape: &[usize]) -> Option<usize> {
    if shape.contains(&0) {
        return Some(0);
    }
    shape.iter().try_fold(1usize, |n, d| n.checked_mul(*d))
}

/// Bytes of a `dtype` tensor of `shape`, or an error naming the shape when
/// the count overflows or exceeds what one allocation can hold.
pub fn checked_nbytes(shape: &[usize], dtype: DType) -> Result<usize> {
    checked_numel(shape)
        .and_then(|n| n.checked_mul(dtype.size()))
        .filter(|b| *b <= isize::MAX as usize)
        .ok_or_else(|| {
            Error::Tensor(format!(
                "shape {shape:?} of {dtype} is too large: its byte size overflows"
            ))
        })
}

impl Tensor {
    /// Builds a tensor from a shape and row-major data; the lengths must agree.
    pub fn from_vec<T: Element>(shape: impl Into<Vec<usize>>, data: Vec<T>) -> Result<Tensor> {
        let shape = shape.into();
        checked_nbytes(&shape, T::DTYPE)?;
        if numel(&shape) != data.len() {
            return Err(Error::Tensor(format!(
                "shape {shape:?} holds {} elements but {} were given",
                numel(&shape),
                data.len()
            )));
        }
        Ok(Tensor::owned(shape, T::into_data(data)))
    }

    /// A zero-filled tensor; an error when the shape's size overflows or
    /// the memory cannot be had (never a panic or an abort).
    pub fn zeros(shape: impl Into<Vec<usize>>, dtype: DType) -> Result<Tensor> {
        let shape = shape.into();
        let bytes = checked_nbytes(&shape, dtype)?;
        let data = HostData::try_zeros(dtype, numel(&shape)).ok_or_else(|| {
            Error::Tensor(format!(
                "cannot allocate {bytes} bytes for shape {shape:?} of {dtype}"
            ))
        })?;
        Ok(Tensor::owned(shape, data))
    }

    /// A tensor whose elements are `f(flat_index)` converted to `dtype`.
    pub fn from_fn(
        shape: impl Into<Vec<usize>>,
        dtype: DType,
        f: impl Fn(usize) -> f64,
    ) -> Result<Tensor> {
        let mut t = Tensor::zeros(shape, dtype)?;
        with_slice_mut!(t.data_mut(), v => {
            for (i, x) in v.iter_mut().enumerate() {
                *x = Element::from_f64(f(i));
            }
        });
        Ok(t)
    }

    /// A copy whose storage reserves `slack` more bytes after the data, so
    /// that buffers allocated one after another do not start at the same
    /// offset within a page (which makes copies and reductions between them
    /// suffer 4K aliasing: the benchmark harness measured 3× at 1 MiB).
    pub(crate) fn copy_with_slack(&self, slack: usize) -> Tensor {
        let data = with_slice!(self.data(), v => {
            let extra = slack / std::mem::size_of_val(&v.first().copied().unwrap_or_default()).max(1);
            let mut copy = Vec::with_capacity(v.len() + extra);
            copy.extend_from_slice(v);
            Element::into_data(copy)
        });
        Tensor::owned(self.shape().to_vec(), data)
    }

    /// Reinterprets raw bytes (native endianness) as a tensor.
    pub fn from_bytes(shape: impl Into<Vec<usize>>, dtype: DType, bytes: &[u8]) -> Result<Tensor> {
        let shape = shape.into();
        let want = checked_nbytes(&shape, dtype)?;
        if want != bytes.len() {
            return Err(Error::Tensor(format!(
                "shape {shape:?} of {dtype} needs {want} bytes but {} were given",
                bytes.len()
            )));
        }
        let mut t = Tensor::zeros(shape, dtype)?;
        t.bytes_mut().copy_from_slice(bytes);
        Ok(t)
    }

    /// Borrows `numel(shape)` elements of `dtype` at `ptr`, without a copy:
    /// for bindings that hold a foreign buffer (a NumPy array) for the
    /// length of a call. Nothing is freed when the tensor is dropped. An
    /// error when `ptr` is null or not aligned for `dtype`, or the shape's
    /// size overflows.
    ///
    /// # Safety
    /// `ptr` addresses `numel(shape) * dtype.size()` bytes that stay valid,
    /// and are not written by anyone else, for as long as the tensor is
    /// used; a tensor given to an op as `&mut` is written, so its memory
    /// must be writable.
    pub unsafe fn from_raw_parts(
        ptr: *mut u8,
        dtype: DType,
        shape: impl Into<Vec<usize>>,
    ) -> Result<Tensor> {
        Tensor::borrowing(ptr, dtype, shape.into(), None)
    }

    /// Borrows `data` as a tensor of `shape`, without a copy, for as long
    /// as the returned view lives (a read-only input to any op).
    pub fn view<T: Element>(shape: impl Into<Vec<usize>>, data: &[T]) -> Result<HostView<'_>> {
        // SAFETY: `data` is borrowed for the view's lifetime; a `HostView`
        // only hands out `&Tensor`, so the memory is never written.
        let (tensor, end) = unsafe { Tensor::viewing(shape.into(), data.as_ptr(), data.len())? };
        Ok(HostView {
            tensor,
            _end: end,
            _borrow: std::marker::PhantomData,
        })
    }

    /// Borrows `data` mutably as a tensor of `shape`, without a copy: an
    /// op's output or an in-place op writes `data` itself.
    pub fn view_mut<T: Element>(
        shape: impl Into<Vec<usize>>,
        data: &mut [T],
    ) -> Result<HostViewMut<'_>> {
        // SAFETY: `data` is borrowed mutably for the view's lifetime; a
        // tensor moved out of the view reads as empty once the view ends.
        let (tensor, end) =
            unsafe { Tensor::viewing(shape.into(), data.as_mut_ptr(), data.len())? };
        Ok(HostViewMut {
            tensor,
            _end: end,
            _borrow: std::marker::PhantomData,
        })
    }

    /// A view's tensor over `len` elements at `ptr`, and what ends it.
    unsafe fn viewing<T: Element>(
        shape: Vec<usize>,
        ptr: *const T,
        len: usize,
    ) -> Result<(Tensor, ViewEnd)> {
        check_view_len(&shape, T::DTYPE, len)?;
        let live = Arc::new(AtomicBool::new(true));
        let tensor = Tensor::borrowing(ptr as *mut u8, T::DTYPE, shape, Some(live.clone()))?;
        Ok((tensor, ViewEnd(live)))
    }

    unsafe fn borrowing(
        ptr: *mut u8,
        dtype: DType,
        shape: Vec<usize>,
        live: Option<Arc<AtomicBool>>,
    ) -> Result<Tensor> {
        let nbytes = checked_nbytes(&shape, dtype)?;
        let ptr = match NonNull::new(ptr) {
            // Empty slices have a dangling, aligned pointer: fine for 0 bytes.
            Some(p) if (p.as_ptr() as usize).is_multiple_of(dtype.size()) => p,
            Some(p) => {
                return Err(Error::Tensor(format!(
                    "memory at {p:p} is not aligned for {dtype} ({} bytes)",
                    dtype.size()
                )))
            }
            None => return Err(Error::Tensor(format!("a {dtype} view of a null pointer"))),
        };
        Ok(Tensor {
            shape,
            dtype,
            ptr,
            nbytes,
            owned: None,
            live,
        })
    }

    /// rankmesh's own storage as a tensor (`data` holds `numel(shape)` elements).
    fn owned(shape: Vec<usize>, mut data: HostData) -> Tensor {
        let (dtype, bytes) = (data.dtype(), data.bytes_mut());
        let (ptr, nbytes) = (NonNull::from(&mut *bytes).cast::<u8>(), bytes.len());
        Tensor {
            shape,
            dtype,
            ptr,
            nbytes,
            owned: Some(data),
            live: None,
        }
    }

    fn live(&self) -> bool {
        self.live.as_ref().is_none_or(|l| l.load(Ordering::Acquire))
    }

    fn readable_bytes(&self) -> usize {
        if self.live() {
            self.nbytes
        } else {
            0
        }
    }

    /// Whether the elements are the caller's memory (a view), not rankmesh's.
    pub fn is_borrowed(&self) -> bool {
        self.owned.is_none()
    }

    /// Element type.
    #[inline]
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// Shape, outermost dimension first (`[0]` for a tensor moved out of a
    /// view that has ended).
    #[inline]
    pub fn shape(&self) -> &[usize] {
        if self.live() {
            &self.shape
        } else {
            &[0]
        }
    }

    /// Number of dimensions.
    pub fn ndim(&self) -> usize {
        self.shape().len()
    }

    /// Number of elements.
    pub fn numel(&self) -> usize {
        self.bytes().len() / self.dtype().size()
    }

    /// Size of the storage in bytes.
    pub fn nbytes(&self) -> usize {
        self.bytes().len()
    }

    /// The typed elements.
    pub fn data(&self) -> HostSlice<'_> {
        typed_bytes!(HostSlice, bytemuck::cast_slice, self.dtype(), self.bytes())
    }

    /// The typed elements, writable in place.
    pub(crate) fn data_mut(&mut self) -> HostSliceMut<'_> {
        // Owned storage is a Vec of the dtype's type; borrowed storage was
        // checked for its alignment when the view was made.
        let dtype = self.dtype();
        typed_bytes!(
            HostSliceMut,
            bytemuck::cast_slice_mut,
            dtype,
            self.bytes_mut()
        )
    }

    /// Runs `f` on rankmesh's own storage (`None` for a view), then takes
    /// the buffer's place and size again (`f` may have reallocated it).
    pub(crate) fn with_owned_data<R>(&mut self, f: impl FnOnce(&mut HostData) -> R) -> Option<R> {
        let data = self.owned.as_mut()?;
        let r = f(data);
        let bytes = data.bytes_mut();
        let (ptr, nbytes) = (NonNull::from(&mut *bytes).cast::<u8>(), bytes.len());
        if nbytes != self.nbytes {
            self.shape = vec![nbytes / self.dtype.size()];
        }
        (self.ptr, self.nbytes) = (ptr, nbytes);
        Some(r)
    }

    /// Typed view of the elements; an error names both dtypes when `T` is wrong.
    pub fn as_slice<T: Element>(&self) -> Result<&[T]> {
        let held = self.dtype();
        if held != T::DTYPE {
            return Err(self.not_of::<T>());
        }
        // Owned storage is a Vec of T; borrowed storage was checked for
        // T's alignment when the view was made.
        bytemuck::try_cast_slice(self.bytes()).map_err(|e| {
            Error::Tensor(format!(
                "{held} storage is not a slice of {}: {e}",
                T::DTYPE
            ))
        })
    }

    /// The error of a typed view asked for as `T` of a tensor of another dtype.
    fn not_of<T: Element>(&self) -> Error {
        Error::Tensor(format!(
            "tensor holds {} but {} was requested",
            self.dtype(),
            T::DTYPE
        ))
    }

    /// Mutable typed view of the elements, written in place; an error names
    /// both dtypes when `T` is wrong.
    pub fn as_mut_slice<T: Element>(&mut self) -> Result<&mut [T]> {
        let held = self.dtype();
        if held != T::DTYPE {
            return Err(self.not_of::<T>());
        }
        bytemuck::try_cast_slice_mut(self.bytes_mut()).map_err(|e| {
            Error::Tensor(format!(
                "{held} storage is not a slice of {}: {e}",
                T::DTYPE
            ))
        })
    }

    /// Elements converted to `f64` (exact for every dtype but 64-bit integers above 2^53).
    pub fn to_f64_vec(&self) -> Vec<f64> {
        with_slice!(self.data(), v => v.iter().map(|x| x.to_f64()).collect())
    }

    /// Byte view of the storage (native endianness).
    #[inline]
    pub fn bytes(&self) -> &[u8] {
        // SAFETY: `ptr` is the tensor's own buffer, or memory the view (or
        // `from_raw_parts`'s caller) keeps valid while it is live; an ended
        // view's slice is empty, at its aligned address, so typed casts hold.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.readable_bytes()) }
    }

    /// Mutable byte view of the storage.
    #[inline]
    pub fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as for `bytes`; `&mut self` is the only way in. Only a
        // mutable view (or a `from_raw_parts` tensor its caller hands out
        // as `&mut`) borrows memory here, and that memory is writable.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.readable_bytes()) }
    }

    /// Same data, new shape with the same number of elements.
    pub fn reshape(mut self, shape: impl Into<Vec<usize>>) -> Result<Tensor> {
        let shape = shape.into();
        if checked_numel(&shape) != Some(self.numel()) {
            return Err(Error::Tensor(format!(
                "cannot reshape {:?} ({} elements) to {shape:?}",
                self.shape(),
                self.numel()
            )));
        }
        self.shape = shape;
        Ok(self)
    }

    /// Maps every element through `f64` (used for 16-bit reductions and references).
    pub fn cast(&self, dtype: DType) -> Result<Tensor> {
        let src = self.to_f64_vec();
        Tensor::from_fn(self.shape().to_vec(), dtype, |i| src[i])
    }
}

/// An error unless `len` elements are exactly what `shape` holds.
fn check_view_len(shape: &[usize], dtype: DType, len: usize) -> Result<()> {
    checked_nbytes(shape, dtype)?;
    if numel(shape) != len {
        return Err(Error::Tensor(format!(
            "shape {shape:?} holds {} elements but the viewed slice has {len}",
            numel(shape)
        )));
    }
    Ok(())
}

/// Marks a view's tensor dead when the view ends.
struct ViewEnd(Arc<AtomicBool>);

impl Drop for ViewEnd {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}

/// A caller's slice borrowed as a read-only [`Tensor`], without a copy
/// ([`Tensor::view`]): pass `&view` wherever an op takes `&Tensor`.
pub struct HostView<'a> {
    tensor: Tensor,
    _end: ViewEnd,
    _borrow: std::marker::PhantomData<&'a [u8]>,
}

/// A caller's slice borrowed as a writable [`Tensor`], without a copy
/// ([`Tensor::view_mut`]): an op's output, or an in-place op's tensor,
/// written straight into the caller's memory.
pub struct HostViewMut<'a> {
    tensor: Tensor,
    _end: ViewEnd,
    _borrow: std::marker::PhantomData<&'a mut [u8]>,
}

impl std::ops::Deref for HostView<'_> {
    type Target = Tensor;
    fn deref(&self) -> &Tensor {
        &self.tensor
    }
}

impl std::ops::Deref for HostViewMut<'_> {
    type Target = Tensor;
    fn deref(&self) -> &Tensor {
        &self.tensor
    }
}

impl std::ops::DerefMut for HostViewMut<'_> {
    fn deref_mut(&mut self) -> &mut Tensor {
        &mut self.tensor
    }
}

impl std::fmt::Debug for HostView<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.tensor.fmt(f)
    }
}

impl std::fmt::Debug for HostViewMut<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.tensor.fmt(f)
    }
}

/// `numerator / denominator`, an error when it does not divide exactly.
pub fn divide(numerator: usize, denominator: usize) -> Result<usize> {
    ensure_divisibility(numerator, denominator)?;
    Ok(numerator / denominator)
}

/// An error unless `denominator` divides `numerator` (and is not zero).
pub fn ensure_divisibility(numerator: usize, denominator: usize) -> Result<()> {
    if denominator == 0 || !numerator.is_multiple_of(denominator) {
        return Err(Error::Tensor(format!(
            "{numerator} is not divisible by {denominator}"
        )));
    }
    Ok(())
}

/// Splits a tensor into `num_partitions` equal, contiguous tensors along its last dimension.
pub fn split_tensor_along_last_dim(tensor: &Tensor, num_partitions: usize) -> Result<Vec<Tensor>> {
    let Some(&last) = tensor.shape().last() else {
        return Err(Error::Tensor("cannot split a 0-d tensor".into()));
    };
    let part = divide(last, num_partitions)
        .map_err(|e| Error::Tensor(format!("split along last dim of {:?}: {e}", tensor.shape())))?;
    let packed = crate::tensor::split::split_dim(
        tensor.bytes(),
        tensor.shape(),
        tensor.ndim() - 1,
        num_partitions,
        tensor.dtype().size(),
    );
    let mut shape = tensor.shape().to_vec();
    *shape.last_mut().expect("checked non-empty") = part;
    let block = numel(&shape) * tensor.dtype().size();
    (0..num_partitions)
        .map(|p| {
            Tensor::from_bytes(
                shape.clone(),
                tensor.dtype(),
                &packed[p * block..(p + 1) * block],
            )
        })
        .collect()
}

/// One partition of a tensor's last dimension that borrows the tensor's
/// storage: FastVideo's `split_tensor_along_last_dim(x, n,
/// contiguous_split_chunks=False)`, which returns views. Its rows are
/// `len` elements at `start`, one per index of the leading dimensions;
/// [`to_tensor`](Self::to_tensor) makes the contiguous copy
/// (`contiguous_split_chunks=True`, what [`split_tensor_along_last_dim`]
/// returns).
#[derive(Clone, Copy, Debug)]
pub struct LastDimView<'a> {
    tensor: &'a Tensor,
    start: usize,
    len: usize,
}

impl<'a> LastDimView<'a> {
    /// The view's shape: the tensor's, with the last dimension cut to the partition.
    pub fn shape(&self) -> Vec<usize> {
        let mut shape = self.tensor.shape().to_vec();
        *shape
            .last_mut()
            .expect("views are of tensors with a last dim") = self.len;
        shape
    }

    /// Element type.
    pub fn dtype(&self) -> DType {
        self.tensor.dtype()
    }

    /// The rows of the partition, borrowed from the tensor (no copy).
    pub fn rows<T: Element>(&self) -> Result<impl Iterator<Item = &'a [T]> + 'a> {
        let all = self.tensor.as_slice::<T>()?;
        let last = *self.tensor.shape().last().expect("views have a last dim");
        let (start, len) = (self.start, self.len);
        Ok(all
            .chunks(last.max(1))
            .map(move |row| &row[start..start + len]))
    }

    /// A contiguous copy.
    pub fn to_tensor(&self) -> Tensor {
        let e = self.dtype().size();
        let last = *self.tensor.shape().last().expect("views have a last dim");
        let mut bytes = Vec::with_capacity(numel(&self.shape()) * e);
        for row in self.tensor.bytes().chunks((last * e).max(1)) {
            bytes.extend_from_slice(&row[self.start * e..(self.start + self.len) * e]);
        }
        Tensor::from_bytes(self.shape(), self.dtype(), &bytes).expect("sizes follow the shape")
    }
}

/// Splits a tensor into `num_partitions` equal views along its last
/// dimension, without copying (see [`LastDimView`]).
pub fn split_views_along_last_dim(
    tensor: &Tensor,
    num_partitions: usize,
) -> Result<Vec<LastDimView<'_>>> {
    let Some(&last) = tensor.shape().last() else {
        return Err(Error::Tensor("cannot split a 0-d tensor".into()));
    };
    let len = divide(last, num_partitions)
        .map_err(|e| Error::Tensor(format!("split along last dim of {:?}: {e}", tensor.shape())))?;
    Ok((0..num_partitions)
        .map(|p| LastDimView {
            tensor,
            start: p * len,
            len,
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_typed_mutable_view_writes_in_place_and_names_a_wrong_type() {
        let mut t = Tensor::from_vec([2, 2], vec![1.5f32, 2.5, 3.5, 4.5]).unwrap();
        t.as_mut_slice::<f32>().unwrap()[3] = -1.25;
        assert_eq!(t.as_slice::<f32>().unwrap(), [1.5, 2.5, 3.5, -1.25]);
        let e = t.as_mut_slice::<i32>().unwrap_err().to_string();
        assert!(e.contains("tensor holds f32 but i32 was requested"), "{e}");
        let mut h = Tensor::from_vec([3], vec![half::bf16::from_f32(0.5); 3]).unwrap();
        h.as_mut_slice::<half::bf16>().unwrap()[0] = half::bf16::from_f32(-2.0);
        assert_eq!(h.to_f64_vec(), [-2.0, 0.5, 0.5]);
    }

    #[test]
    fn views_borrow_the_callers_memory_and_refuse_what_does_not_fit() {
        let mut data = vec![0.5f32, 1.5, 2.5, 3.5, 4.5, 5.5];
        {
            let mut v = Tensor::view_mut([2, 3], &mut data).unwrap();
            assert!(v.is_borrowed());
            v.as_mut_slice::<f32>().unwrap()[4] = -7.25;
            // A clone is rankmesh's own copy, equal to the view.
            let c = v.clone();
            assert!(!c.is_borrowed());
            assert_eq!(c, *v);
            assert_eq!(format!("{:?}", c.data()), format!("{:?}", v.data()));
            // A tensor moved out of its view reads as empty once the view ends.
            let escaped = std::mem::replace(&mut *v, Tensor::zeros([1], DType::F32).unwrap());
            assert_eq!(escaped.shape(), [2, 3]);
            drop(v);
            assert_eq!((escaped.shape(), escaped.nbytes()), (&[0usize][..], 0));
            assert!(escaped.as_slice::<f32>().unwrap().is_empty());
        }
        assert_eq!(data[4], -7.25);
        let e = Tensor::view([4], &data).unwrap_err().to_string();
        assert!(
            e.contains("[4] holds 4 elements but the viewed slice has 6"),
            "{e}"
        );
        let e = Tensor::view([3], &data[..2]).unwrap_err().to_string();
        assert!(e.contains("has 2"), "{e}");
        // Bytes one off a 4-byte boundary are refused for f32.
        let bytes = [0u8; 12];
        let odd = bytes
            .as_ptr()
            .wrapping_add(1 + (4 - bytes.as_ptr() as usize % 4) % 4);
        // SAFETY: 8 bytes of `bytes` from `odd` on; refused before any read.
        let e = unsafe { Tensor::from_raw_parts(odd as *mut u8, DType::F32, [2]) }
            .unwrap_err()
            .to_string();
        assert!(e.contains("not aligned for f32"), "{e}");
        // SAFETY: a null pointer is refused before any read.
        let e = unsafe { Tensor::from_raw_parts(std::ptr::null_mut(), DType::U8, [0]) }
            .unwrap_err()
            .to_string();
        assert!(e.contains("null"), "{e}");
        // An empty view is fine.
        let empty: [i64; 0] = [];
        assert_eq!(Tensor::view([0, 5], &empty).unwrap().shape(), [0, 5]);
    }

    #[test]
    fn last_dim_views_borrow_and_match_the_copies() {
        let t = Tensor::from_vec([2, 3, 6], (0..36).map(|x| x as f32 * 0.5).collect()).unwrap();
        let copies = split_tensor_along_last_dim(&t, 3).unwrap();
        let views = split_views_along_last_dim(&t, 3).unwrap();
        let base = t.as_slice::<f32>().unwrap().as_ptr();
        for (p, (v, c)) in views.iter().zip(&copies).enumerate() {
            assert_eq!(v.shape(), [2, 3, 2]);
            assert_eq!(&v.to_tensor(), c);
            let rows: Vec<&[f32]> = v.rows::<f32>().unwrap().collect();
            assert_eq!(rows.len(), 6);
            // No copy: the first row starts inside the tensor's own storage.
            assert_eq!(rows[0].as_ptr(), base.wrapping_add(p * 2));
            assert_eq!(rows[1], &[3.0 + p as f32, 3.5 + p as f32]);
        }
        assert!(views[0].rows::<f64>().is_err());
        assert!(split_views_along_last_dim(&t, 4).is_err());
        let empty = Tensor::zeros([3, 0], DType::F32).unwrap();
        let v = split_views_along_last_dim(&empty, 2).unwrap();
        assert_eq!(v[1].rows::<f32>().unwrap().count(), 0);
        assert_eq!(v[1].to_tensor().shape(), [3, 0]);
    }

    #[test]
    fn dtype_codes_round_trip() {
        for d in DType::ALL {
            assert_eq!(DType::from_code(d.code()), Some(d));
        }
        assert_eq!(DType::from_code(99), None);
    }

    #[test]
    fn narrow_dtypes_convert_like_cuda_and_torch() {
        // Wire codes of the first ten never move (append only).
        assert_eq!(DType::U64.code(), 9);
        assert_eq!(DType::F8E4M3.code(), 10);
        assert_eq!(DType::U16.code(), 14);
        let t = Tensor::from_fn([4], DType::F8E4M3, |i| [300.0, 1e9, -1e9, 0.3][i]).unwrap();
        // Round to nearest even, saturate at ±448 (no infinities in E4M3FN).
        assert_eq!(t.to_f64_vec(), [288.0, 448.0, -448.0, 0.3125]);
        let t = Tensor::from_fn([2], DType::F8E5M2, |i| [1e9, 40000.0][i]).unwrap();
        assert_eq!(t.to_f64_vec(), [57344.0, 40960.0]);
        let b = Tensor::from_vec([3], vec![Bool(7), Bool::FALSE, true.into()]).unwrap();
        assert_eq!(b.to_f64_vec(), [1.0, 0.0, 1.0]);
        assert_eq!(b.as_slice::<Bool>().unwrap()[0], Bool::TRUE);
        assert_eq!(
            Tensor::from_fn([1], DType::Bool, |_| 2.5).unwrap().bytes(),
            [1]
        );
        assert_eq!(Tensor::zeros([2], DType::I16).unwrap().nbytes(), 4);
    }

    #[test]
    fn from_vec_checks_length() {
        assert!(Tensor::from_vec([2, 3], vec![0f32; 6]).is_ok());
        let e = Tensor::from_vec([2, 3], vec![0f32; 5])
            .unwrap_err()
            .to_string();
        assert!(e.contains("[2, 3] holds 6 elements but 5"), "{e}");
    }

    #[test]
    fn wrong_view_dtype_is_an_error() {
        let t = Tensor::from_vec([2], vec![1i32, 2]).unwrap();
        assert_eq!(t.as_slice::<i32>().unwrap(), &[1, 2]);
        assert!(t
            .as_slice::<f32>()
            .unwrap_err()
            .to_string()
            .contains("holds i32 but f32"));
    }

    #[test]
    fn split_last_dim_matches_manual_slices() {
        let t = Tensor::from_vec([2, 4], (0..8).map(|x| x as f32).collect()).unwrap();
        let parts = split_tensor_along_last_dim(&t, 2).unwrap();
        assert_eq!(parts[0].as_slice::<f32>().unwrap(), &[0., 1., 4., 5.]);
        assert_eq!(parts[1].as_slice::<f32>().unwrap(), &[2., 3., 6., 7.]);
        assert!(split_tensor_along_last_dim(&t, 3).is_err());
        assert!(divide(7, 0).is_err());
        assert_eq!(divide(8, 4).unwrap(), 2);
    }
}
