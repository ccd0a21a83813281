//! The NCCL C API as loaded function pointers (the "nccl-sys" layer): types,
//! enum values and signatures from `nccl.h`, resolved once from the library
//! the [loader](super::loader) opened. No safety beyond the C contract here;
//! [`comm`](super::comm) wraps it.

use std::os::raw::{c_char, c_int, c_uint, c_void};

/// `ncclComm_t`.
pub type RawComm = *mut c_void;
/// `ncclWindow_t` (a symmetric-memory registration).
pub type RawWindow = *mut c_void;
/// `cudaStream_t` (the same handle as the driver's `CUstream`).
pub type RawStream = *mut c_void;
/// `ncclResult_t`.
pub type NcclResult = c_int;

/// `ncclSuccess`.
pub const SUCCESS: NcclResult = 0;
/// `ncclInProgress` (NCCL ≥ 2.14: a non-blocking call still running).
pub const IN_PROGRESS: NcclResult = 7;

/// `NCCL_SPLIT_NOCOLOR`: the color of a rank that joins none of a split's communicators.
pub const SPLIT_NOCOLOR: c_int = -1;
/// `NCCL_SHRINK_ABORT`: a shrink that first ends the parent's work in
/// flight (after a failure, calls may be stuck on the lost ranks).
pub const SHRINK_ABORT: c_int = 1;
/// `NCCL_CONFIG_UNDEF_INT`: a config field left to NCCL.
pub const CONFIG_UNDEF_INT: c_int = -2147483648;
/// `NCCL_API_MAGIC`: marks a config made as `NCCL_CONFIG_INITIALIZER` makes it.
pub const API_MAGIC: c_uint = 0xcafebeef;

/// `NCCL_WIN_COLL_SYMMETRIC`: a window every rank registers at the same offset.
pub const WIN_COLL_SYMMETRIC: c_int = 1;

/// `NCCL_UNIQUE_ID_BYTES`.
pub const UNIQUE_ID_BYTES: usize = 128;

/// `ncclUniqueId`. `c_char` is `i8` on x86-64 and `u8` on aarch64, so bytes
/// cross MPI through [`UniqueId::to_bytes`] / [`UniqueId::from_bytes`].
#[repr(C)]
#[derive(Clone, Copy)]
pub struct UniqueId {
    /// Opaque id bytes.
    pub internal: [c_char; UNIQUE_ID_BYTES],
}

impl UniqueId {
    /// The id as portable bytes.
    pub fn to_bytes(self) -> [u8; UNIQUE_ID_BYTES] {
        self.internal.map(|c| c as u8)
    }

    /// An id from portable bytes.
    pub fn from_bytes(bytes: &[u8; UNIQUE_ID_BYTES]) -> UniqueId {
        UniqueId {
            internal: bytes.map(|b| b as c_char),
        }
    }
}

/// `ncclDataType_t` values.
#[allow(missing_docs)]
pub mod dtype {
    use std::os::raw::c_int;
    pub const INT8: c_int = 0;
    pub const UINT8: c_int = 1;
    pub const INT32: c_int = 2;
    pub const UINT32: c_int = 3;
    pub const INT64: c_int = 4;
    pub const UINT64: c_int = 5;
    pub const FLOAT16: c_int = 6;
    pub const FLOAT32: c_int = 7;
    pub const FLOAT64: c_int = 8;
    /// NCCL ≥ 2.10.
    pub const BFLOAT16: c_int = 9;
    /// NCCL ≥ 2.24.
    pub const FLOAT8_E4M3: c_int = 10;
    /// NCCL ≥ 2.24.
    pub const FLOAT8_E5M2: c_int = 11;
}

/// `ncclRedOp_t` values.
#[allow(missing_docs)]
pub mod redop {
    use std::os::raw::c_int;
    pub const SUM: c_int = 0;
    pub const PROD: c_int = 1;
    pub const MAX: c_int = 2;
    pub const MIN: c_int = 3;
    /// NCCL ≥ 2.10.
    pub const AVG: c_int = 4;
}

/// `ncclConfig_t` up to `splitShare`: the fields NCCL 2.18 had. The struct
/// is versioned and append-only; NCCL reads `size` bytes and leaves the
/// fields past them at their defaults, so an older prefix is valid for every
/// newer library (tests/nccl_abi.rs holds the offsets to the real header).
#[repr(C)]
#[allow(missing_docs)]
pub struct Config {
    pub size: usize,
    pub magic: c_uint,
    pub version: c_uint,
    pub blocking: c_int,
    pub cga_cluster_size: c_int,
    pub min_ctas: c_int,
    pub max_ctas: c_int,
    pub net_name: *const c_char,
    pub split_share: c_int,
}

impl Config {
    /// `NCCL_CONFIG_INITIALIZER` with `blocking` set: the header version the
    /// prefix matches is 2.18.0.
    pub fn new(blocking: bool) -> Config {
        Config {
            size: std::mem::size_of::<Config>(),
            magic: API_MAGIC,
            version: 21800,
            blocking: c_int::from(blocking),
            cga_cluster_size: CONFIG_UNDEF_INT,
            min_ctas: CONFIG_UNDEF_INT,
            max_ctas: CONFIG_UNDEF_INT,
            net_name: std::ptr::null(),
            split_share: CONFIG_UNDEF_INT,
        }
    }
}

/// `(send, recv, count, dtype, op or root, comm, stream)`: ncclAllReduce and
/// ncclReduceScatter (an operator), ncclGather and ncclScatter (a root).
type CollFn = unsafe extern "C" fn(
    *const c_void,
    *mut c_void,
    usize,
    c_int,
    c_int,
    RawComm,
    RawStream,
) -> NcclResult;

/// The NCCL entry points rankmesh uses.
#[allow(missing_docs)]
pub struct Api {
    /// `ncclGetVersion`'s code.
    pub version: c_int,
    pub get_unique_id: unsafe extern "C" fn(*mut UniqueId) -> NcclResult,
    pub comm_init_rank: unsafe extern "C" fn(*mut RawComm, c_int, UniqueId, c_int) -> NcclResult,
    pub comm_destroy: unsafe extern "C" fn(RawComm) -> NcclResult,
    pub comm_abort: unsafe extern "C" fn(RawComm) -> NcclResult,
    pub comm_get_async_error: unsafe extern "C" fn(RawComm, *mut NcclResult) -> NcclResult,
    pub get_error_string: unsafe extern "C" fn(NcclResult) -> *const c_char,
    /// NCCL ≥ 2.13; `None` before.
    pub get_last_error: Option<unsafe extern "C" fn(RawComm) -> *const c_char>,
    pub all_reduce: CollFn,
    pub reduce_scatter: CollFn,
    pub reduce: unsafe extern "C" fn(
        *const c_void,
        *mut c_void,
        usize,
        c_int,
        c_int,
        c_int,
        RawComm,
        RawStream,
    ) -> NcclResult,
    pub broadcast: unsafe extern "C" fn(
        *const c_void,
        *mut c_void,
        usize,
        c_int,
        c_int,
        RawComm,
        RawStream,
    ) -> NcclResult,
    pub all_gather: unsafe extern "C" fn(
        *const c_void,
        *mut c_void,
        usize,
        c_int,
        RawComm,
        RawStream,
    ) -> NcclResult,
    pub send:
        unsafe extern "C" fn(*const c_void, usize, c_int, c_int, RawComm, RawStream) -> NcclResult,
    pub recv:
        unsafe extern "C" fn(*mut c_void, usize, c_int, c_int, RawComm, RawStream) -> NcclResult,
    pub group_start: unsafe extern "C" fn() -> NcclResult,
    pub group_end: unsafe extern "C" fn() -> NcclResult,
    /// NCCL ≥ 2.14: creation with a config (non-blocking, used only
    /// together with `comm_finalize`).
    pub comm_init_rank_config: Option<
        unsafe extern "C" fn(*mut RawComm, c_int, UniqueId, c_int, *mut Config) -> NcclResult,
    >,
    /// NCCL ≥ 2.14: flushes a communicator's work before it is destroyed.
    pub comm_finalize: Option<unsafe extern "C" fn(RawComm) -> NcclResult>,
    /// NCCL ≥ 2.18: a communicator per color, from a parent's bootstrap.
    pub comm_split: Option<
        unsafe extern "C" fn(RawComm, c_int, c_int, *mut RawComm, *mut Config) -> NcclResult,
    >,
    /// NCCL ≥ 2.27: the parent's survivors, renumbered densely, without the
    /// excluded ranks (`ncclCommShrink`; the list, its length, the flags).
    pub comm_shrink: Option<
        unsafe extern "C" fn(
            RawComm,
            *mut c_int,
            c_int,
            *mut RawComm,
            *mut Config,
            c_int,
        ) -> NcclResult,
    >,
    /// NCCL ≥ 2.23: creation bootstrapped from several roots.
    pub comm_init_rank_scalable: Option<
        unsafe extern "C" fn(
            *mut RawComm,
            c_int,
            c_int,
            c_int,
            *mut UniqueId,
            *mut Config,
        ) -> NcclResult,
    >,
    /// NCCL ≥ 2.28: native all-to-all.
    pub all_to_all: Option<
        unsafe extern "C" fn(
            *const c_void,
            *mut c_void,
            usize,
            c_int,
            RawComm,
            RawStream,
        ) -> NcclResult,
    >,
    /// NCCL ≥ 2.28: native gather onto a root.
    pub gather: Option<CollFn>,
    /// NCCL ≥ 2.28: native scatter from a root.
    pub scatter: Option<CollFn>,
    /// NCCL ≥ 2.19: memory NCCL can register (cuMem-backed, granularity-aligned).
    pub mem_alloc: Option<unsafe extern "C" fn(*mut *mut c_void, usize) -> NcclResult>,
    pub mem_free: Option<unsafe extern "C" fn(*mut c_void) -> NcclResult>,
    /// NCCL ≥ 2.19: buffer registration.
    pub comm_register:
        Option<unsafe extern "C" fn(RawComm, *mut c_void, usize, *mut *mut c_void) -> NcclResult>,
    pub comm_deregister: Option<unsafe extern "C" fn(RawComm, *mut c_void) -> NcclResult>,
    /// NCCL ≥ 2.27: symmetric-memory windows.
    pub comm_window_register: Option<
        unsafe extern "C" fn(RawComm, *mut c_void, usize, *mut RawWindow, c_int) -> NcclResult,
    >,
    pub comm_window_deregister: Option<unsafe extern "C" fn(RawComm, RawWindow) -> NcclResult>,
}

/// Resolves one symbol as a plain function pointer.
///
/// # Safety
/// `T` must be the symbol's true C signature.
unsafe fn sym<T: Copy>(lib: &libloading::Library, name: &str) -> Result<T, String> {
    let cname = format!("{name}\0");
    lib.get::<T>(cname.as_bytes())
        .map(|s| *s)
        .map_err(|_| format!("does not export {name}"))
}

impl Api {
    /// Resolves every entry point; the error names the first one missing.
    ///
    /// # Safety
    /// `lib` must be an NCCL 2.x library whose `ncclGetVersion` said `version`; it must stay loaded while the `Api` is used.
    pub unsafe fn load(lib: &libloading::Library, version: c_int) -> Result<Api, String> {
        Ok(Api {
            version,
            get_unique_id: sym(lib, "ncclGetUniqueId")?,
            comm_init_rank: sym(lib, "ncclCommInitRank")?,
            comm_destroy: sym(lib, "ncclCommDestroy")?,
            comm_abort: sym(lib, "ncclCommAbort")?,
            comm_get_async_error: sym(lib, "ncclCommGetAsyncError")?,
            get_error_string: sym(lib, "ncclGetErrorString")?,
            get_last_error: sym(lib, "ncclGetLastError").ok(),
            all_reduce: sym(lib, "ncclAllReduce")?,
            reduce_scatter: sym(lib, "ncclReduceScatter")?,
            reduce: sym(lib, "ncclReduce")?,
            broadcast: sym(lib, "ncclBroadcast")?,
            all_gather: sym(lib, "ncclAllGather")?,
            send: sym(lib, "ncclSend")?,
            recv: sym(lib, "ncclRecv")?,
            group_start: sym(lib, "ncclGroupStart")?,
            group_end: sym(lib, "ncclGroupEnd")?,
            comm_init_rank_config: sym(lib, "ncclCommInitRankConfig").ok(),
            comm_finalize: sym(lib, "ncclCommFinalize").ok(),
            comm_split: sym(lib, "ncclCommSplit").ok(),
            comm_shrink: sym(lib, "ncclCommShrink").ok(),
            comm_init_rank_scalable: sym(lib, "ncclCommInitRankScalable").ok(),
            all_to_all: sym(lib, "ncclAlltoAll").ok(),
            gather: sym(lib, "ncclGather").ok(),
            scatter: sym(lib, "ncclScatter").ok(),
            mem_alloc: sym(lib, "ncclMemAlloc").ok(),
            mem_free: sym(lib, "ncclMemFree").ok(),
            comm_register: sym(lib, "ncclCommRegister").ok(),
            comm_deregister: sym(lib, "ncclCommDeregister").ok(),
            comm_window_register: sym(lib, "ncclCommWindowRegister").ok(),
            comm_window_deregister: sym(lib, "ncclCommWindowDeregister").ok(),
        })
    }

    /// The collectives the library runs natively that rankmesh otherwise
    /// builds from grouped sends and receives (`ncclAlltoAll`, `ncclGather`,
    /// `ncclScatter`: NCCL 2.28), by the symbols it exports.
    pub fn native_collectives(&self) -> Vec<&'static str> {
        [
            ("alltoall", self.all_to_all.is_some()),
            ("gather", self.gather.is_some()),
            ("scatter", self.scatter.is_some()),
        ]
        .into_iter()
        .filter_map(|(name, has)| has.then_some(name))
        .collect()
    }

    /// The optional entry points the library exports, by C name.
    pub fn optional_entry_points(&self) -> Vec<&'static str> {
        [
            (
                "ncclCommInitRankConfig",
                self.comm_init_rank_config.is_some(),
            ),
            ("ncclCommFinalize", self.comm_finalize.is_some()),
            ("ncclCommSplit", self.comm_split.is_some()),
            ("ncclCommShrink", self.comm_shrink.is_some()),
            (
                "ncclCommInitRankScalable",
                self.comm_init_rank_scalable.is_some(),
            ),
            ("ncclAlltoAll", self.all_to_all.is_some()),
            ("ncclGather", self.gather.is_some()),
            ("ncclScatter", self.scatter.is_some()),
            ("ncclMemAlloc", self.mem_alloc.is_some()),
            ("ncclCommRegister", self.comm_register.is_some()),
            (
                "ncclCommWindowRegister",
                self.comm_window_register.is_some(),
            ),
        ]
        .into_iter()
        .filter_map(|(name, has)| has.then_some(name))
        .collect()
    }

    /// `ncclGetErrorString(rc)` as text.
    pub fn error_string(&self, rc: NcclResult) -> String {
        // SAFETY: NCCL returns a static NUL-terminated string for any code.
        unsafe {
            let p = (self.get_error_string)(rc);
            if p.is_null() {
                return format!("NCCL error {rc}");
            }
            std::ffi::CStr::from_ptr(p).to_string_lossy().into_owned()
        }
    }

    /// `ncclGetLastError(comm)`, when the library has it and it says something.
    pub(crate) fn last_error(&self, comm: RawComm) -> Option<String> {
        let f = self.get_last_error?;
        // SAFETY: NCCL returns a thread-local NUL-terminated string (or null).
        let text = unsafe {
            let p = f(comm);
            if p.is_null() {
                return None;
            }
            std::ffi::CStr::from_ptr(p).to_string_lossy().into_owned()
        };
        (!text.is_empty()).then_some(text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unique_id_round_trips_through_portable_bytes() {
        let bytes: [u8; UNIQUE_ID_BYTES] = std::array::from_fn(|i| (i * 37 % 256) as u8);
        let id = UniqueId::from_bytes(&bytes);
        assert_eq!(id.to_bytes(), bytes);
        // High-bit bytes survive whatever sign c_char has on this target.
        assert_eq!(
            UniqueId::from_bytes(&[0xff; UNIQUE_ID_BYTES]).to_bytes()[0],
            0xff
        );
    }
}
