//! Who has arrived at start-up, from the launcher's process registry
//! (PMIx: Open MPI's `mpirun`, Slurm's `srun --mpi=pmix`).
//!
//! `MPI_Init` returns only once every rank of the job has called it, so while
//! a rank is missing MPI cannot say which one. The launcher can: each rank
//! puts an arrival mark into PMIx before `MPI_Init`, and a rank whose
//! start-up runs out of time asks PMIx, rank by rank, whose mark is missing
//! and on which host the launcher placed it. The library is loaded at run
//! time (`libpmix.so.2`, the one the MPI library itself uses); without it the
//! start-up watch still ends the job, saying the ranks could not be named.
//!
//! The layouts below are PMIx 4's (`pmix_common.h`: `pmix_proc_t`,
//! `pmix_value_t`, `pmix_info_t`); a unit test compiles C against the
//! installed header (`pkg-config pmix`) to hold them, the constants and the
//! entry points' types to it.

use libloading::Library;
use std::ffi::{c_char, c_int, CStr};
use std::time::{Duration, Instant};

/// `PMIX_MAX_NSLEN + 1`.
pub(crate) const NSPACE_BYTES: usize = 256;
/// `PMIX_MAX_KEYLEN + 1`.
pub(crate) const KEY_BYTES: usize = 512;
/// `PMIX_STRING`.
pub(crate) const PMIX_STRING: u16 = 3;
/// `PMIX_INT`.
pub(crate) const PMIX_INT: u16 = 6;
/// `PMIX_UINT32`.
pub(crate) const PMIX_UINT32: u16 = 14;
/// `PMIX_GLOBAL` (a `pmix_scope_t`).
pub(crate) const PMIX_GLOBAL: u8 = 3;
/// `PMIX_RANK_WILDCARD`.
pub(crate) const PMIX_RANK_WILDCARD: u32 = u32::MAX - 1;

/// rankmesh's arrival mark: the rank's host name.
const ARRIVED: &CStr = c"rankmesh.arrived";
const JOB_SIZE: &CStr = c"pmix.job.size";
const HOSTNAME: &CStr = c"pmix.hname";
const TIMEOUT: &CStr = c"pmix.timeout";

/// `pmix_proc_t`.
#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct Proc {
    pub nspace: [c_char; NSPACE_BYTES],
    pub rank: u32,
}

/// `pmix_value_t`: a type tag and a 24-byte union (the largest member,
/// `pmix_envar_t`, is two pointers and a char).
#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct Value {
    pub kind: u16,
    pub data: [u64; 3],
}

/// `pmix_info_t`.
#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct Info {
    pub key: [c_char; KEY_BYTES],
    pub flags: u32,
    pub value: Value,
}

type InitFn = unsafe extern "C" fn(*mut Proc, *mut Info, usize) -> c_int;
type PutFn = unsafe extern "C" fn(u8, *const c_char, *mut Value) -> c_int;
type CommitFn = unsafe extern "C" fn() -> c_int;
type GetFn =
    unsafe extern "C" fn(*const Proc, *const c_char, *const Info, usize, *mut *mut Value) -> c_int;
type FinalizeFn = unsafe extern "C" fn(*const Info, usize) -> c_int;

/// This process's link to the launcher's registry, with its mark put.
pub(crate) struct Registry {
    get: GetFn,
    finalize: FinalizeFn,
    me: Proc,
    _lib: Library,
}

/// What the registry says about the ranks that have not arrived.
#[derive(Debug, Default)]
pub(crate) struct Absent {
    /// Ranks without a mark, each with the host the launcher placed it on.
    pub ranks: Vec<(usize, Option<String>)>,
    /// Ranks not asked about before the budget ran out.
    pub unasked: usize,
}

/// Whether arrival marks may go into the launcher's PMIx before `MPI_Init`
/// under the MPI library `version` says it is.
fn marks_tolerated(version: &str) -> bool {
    version.starts_with("Open MPI v4.")
}

impl Registry {
    /// Connects to the launcher's PMIx server and marks this rank arrived
    /// (with `host`); `None` where there is no PMIx library or server (a
    /// singleton, a PMI-1 launcher), or it refuses.
    pub fn arrive(host: &str) -> Option<Registry> {
        // Without a server PMIx_Init would start as a singleton tool: only
        // a launched process has one to ask.
        std::env::var_os("PMIX_NAMESPACE")?;
        // Only where the MPI's own PMIx start-up tolerates a client that
        // arrived first: Open MPI 4 (`mpirun`, `srun --mpi=pmix`). Open MPI
        // 5's MPI_Init fails after it ("local rank: Not found"); elsewhere
        // it is untested. There the start-up watch says ranks cannot be named.
        if !marks_tolerated(crate::mpi_abi::library_version()) {
            return None;
        }
        // SAFETY: loading PMIx runs no code of ours; it is the library the
        // MPI library loads too (the same soname resolves to one copy).
        let lib = unsafe { Library::new("libpmix.so.2") }.ok()?;
        // SAFETY: the symbols have PMIx 4's signatures (pmix.h).
        let (init, put, commit, get, finalize) = unsafe {
            (
                *lib.get::<InitFn>(b"PMIx_Init\0").ok()?,
                *lib.get::<PutFn>(b"PMIx_Put\0").ok()?,
                *lib.get::<CommitFn>(b"PMIx_Commit\0").ok()?,
                *lib.get::<GetFn>(b"PMIx_Get\0").ok()?,
                *lib.get::<FinalizeFn>(b"PMIx_Finalize\0").ok()?,
            )
        };
        let mut me = Proc {
            nspace: [0; NSPACE_BYTES],
            rank: 0,
        };
        // SAFETY: `me` is a writable pmix_proc_t; no info.
        if unsafe { init(&mut me, std::ptr::null_mut(), 0) } != 0 {
            return None;
        }
        let registry = Registry {
            get,
            finalize,
            me,
            _lib: lib,
        };
        let host = std::ffi::CString::new(host).unwrap_or_default();
        let mut value = Value {
            kind: PMIX_STRING,
            data: [host.as_ptr() as u64, 0, 0],
        };
        // SAFETY: PMIx_Put copies the value (the string included).
        let put_ok = unsafe { put(PMIX_GLOBAL, ARRIVED.as_ptr(), &mut value) } == 0;
        // SAFETY: no arguments.
        (put_ok && unsafe { commit() } == 0).then_some(registry)
    }

    /// This process's rank in the launcher's job.
    pub fn rank(&self) -> usize {
        self.me.rank as usize
    }

    /// Looks up `key` of `rank` (or the job's, for the wildcard), waiting
    /// up to `wait` for it to be put; the value on success.
    fn lookup(&self, rank: u32, key: &CStr, wait: Duration) -> Option<Value> {
        let proc = Proc {
            nspace: self.me.nspace,
            rank,
        };
        let mut info = Info {
            key: [0; KEY_BYTES],
            flags: 0,
            value: Value {
                kind: PMIX_INT,
                data: [wait.as_secs().max(1), 0, 0],
            },
        };
        for (d, s) in info.key.iter_mut().zip(TIMEOUT.to_bytes()) {
            *d = *s as c_char;
        }
        let mut out: *mut Value = std::ptr::null_mut();
        // SAFETY: valid proc, key, one info; `out` receives a value PMIx
        // allocated (not freed: this runs once, as the job is ending).
        let rc = unsafe { (self.get)(&proc, key.as_ptr(), &info, 1, &mut out) };
        if rc != 0 || out.is_null() {
            return None;
        }
        // SAFETY: PMIx returned a valid value.
        Some(unsafe { *out })
    }

    /// A string value as text.
    fn text(v: Value) -> Option<String> {
        (v.kind == PMIX_STRING && v.data[0] != 0).then(|| {
            // SAFETY: a PMIX_STRING's union holds a NUL-terminated string.
            unsafe { CStr::from_ptr(v.data[0] as *const c_char) }
                .to_string_lossy()
                .into_owned()
        })
    }

    /// The ranks of the job whose arrival mark is missing, each asked with
    /// `wait` to put it, within `budget` overall; `size` is the job's size
    /// as this rank knows it (the registry's own, when it says).
    pub fn absent(&self, size: usize, wait: Duration, budget: Duration) -> Absent {
        let start = Instant::now();
        let size = self
            .lookup(PMIX_RANK_WILDCARD, JOB_SIZE, wait)
            .filter(|v| v.kind == PMIX_UINT32)
            .map_or(size, |v| v.data[0] as u32 as usize);
        let mut out = Absent::default();
        for r in (0..size).filter(|r| *r != self.rank()) {
            if start.elapsed() > budget {
                out.unasked = size - r;
                break;
            }
            if self.lookup(r as u32, ARRIVED, wait).is_none() {
                let host = self.lookup(r as u32, HOSTNAME, wait).and_then(Self::text);
                out.ranks.push((r, host));
            }
        }
        out
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        // SAFETY: balances this process's PMIx_Init (PMIx counts them; the
        // MPI library's own stays).
        unsafe { (self.finalize)(std::ptr::null(), 0) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn marks_go_only_where_the_mpi_tolerates_them() {
        let here = crate::mpi_abi::library_version();
        // Built against Open MPI 4 (CI's main build), the marks must be
        // made: the machine runs the MPI whose start-up tolerates them.
        if env!("RANKMESH_MPI_HEADER").starts_with("Open MPI 4.") {
            assert!(
                here.starts_with("Open MPI v4."),
                "this machine's MPI: {here}"
            );
            assert!(marks_tolerated(here));
        } else {
            assert!(!marks_tolerated(here), "{here}");
        }
        for other in [
            "Open MPI v5.0.11, package: Open MPI wheel",
            "MPICH Version:      4.0.2",
            "Intel(R) MPI Library 2021.19 for Linux* OS",
            "",
        ] {
            assert!(!marks_tolerated(other), "{other}");
        }
    }
    use std::mem::{offset_of, size_of};
    use std::process::Command;

    /// The layouts, constants and prototypes against the real pmix.h: C
    /// that prints them, and assigns each entry point to a pointer of the
    /// type declared here (a mismatch fails to compile).
    #[test]
    fn layouts_and_prototypes_match_pmix_h() {
        let Ok(flags) = Command::new("pkg-config")
            .args(["--cflags", "--libs", "pmix"])
            .output()
        else {
            assert!(
                std::env::var("CI").is_err(),
                "pkg-config is missing under CI"
            );
            // Past the harness's capture, so that a passing run shows it.
            let _ = std::io::Write::write_all(
                &mut std::io::stderr(),
                b"SKIPPED layouts_and_prototypes_match_pmix_h: no pkg-config\n",
            );
            return;
        };
        if !flags.status.success() {
            assert!(std::env::var("CI").is_err(), "pmix.pc is missing under CI");
            let _ = std::io::Write::write_all(
                &mut std::io::stderr(),
                b"SKIPPED layouts_and_prototypes_match_pmix_h: no PMIx headers (libpmix-dev)\n",
            );
            return;
        }
        let dir = std::env::temp_dir().join(format!("rankmesh-pmix-abi-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let src = dir.join("abi.c");
        std::fs::write(
            &src,
            r#"#include <pmix.h>
#include <stdio.h>
#include <stddef.h>
pmix_status_t (*init)(pmix_proc_t *, pmix_info_t *, size_t) = PMIx_Init;
pmix_status_t (*put)(pmix_scope_t, const char *, pmix_value_t *) = PMIx_Put;
pmix_status_t (*commit)(void) = PMIx_Commit;
pmix_status_t (*get)(const pmix_proc_t *, const char *, const pmix_info_t *, size_t, pmix_value_t **) = PMIx_Get;
pmix_status_t (*fin)(const pmix_info_t *, size_t) = PMIx_Finalize;
int main(void) {
    printf("%zu %zu %zu %zu %zu %zu %zu %zu %d %d %d %d %d %s %s %s\n",
        sizeof(pmix_proc_t), offsetof(pmix_proc_t, rank),
        sizeof(pmix_value_t), offsetof(pmix_value_t, data),
        sizeof(pmix_info_t), offsetof(pmix_info_t, flags), offsetof(pmix_info_t, value),
        sizeof(pmix_scope_t), PMIX_STRING, PMIX_INT, PMIX_UINT32, PMIX_GLOBAL,
        PMIX_RANK_WILDCARD == (pmix_rank_t)0xfffffffe, PMIX_JOB_SIZE, PMIX_HOSTNAME, PMIX_TIMEOUT);
    return 0;
}
"#,
        )
        .unwrap();
        let exe = dir.join("abi");
        let cflags = String::from_utf8_lossy(&flags.stdout).into_owned();
        let cc = Command::new("cc")
            .arg("-Werror=incompatible-pointer-types")
            .arg(&src)
            .arg("-o")
            .arg(&exe)
            .args(cflags.split_whitespace())
            .output()
            .expect("cc");
        assert!(
            cc.status.success(),
            "C against pmix.h: {}",
            String::from_utf8_lossy(&cc.stderr)
        );
        let out = Command::new(&exe).output().expect("the ABI probe");
        let text = String::from_utf8_lossy(&out.stdout).trim().to_string();
        let ours = format!(
            "{} {} {} {} {} {} {} {} {} {} {} {} {} {} {} {}",
            size_of::<Proc>(),
            offset_of!(Proc, rank),
            size_of::<Value>(),
            offset_of!(Value, data),
            size_of::<Info>(),
            offset_of!(Info, flags),
            offset_of!(Info, value),
            size_of::<u8>(),
            PMIX_STRING,
            PMIX_INT,
            PMIX_UINT32,
            PMIX_GLOBAL,
            i32::from(PMIX_RANK_WILDCARD == 0xffff_fffe),
            JOB_SIZE.to_str().unwrap(),
            HOSTNAME.to_str().unwrap(),
            TIMEOUT.to_str().unwrap(),
        );
        assert_eq!(ours, text, "rankmesh's PMIx layout against pmix.h");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
