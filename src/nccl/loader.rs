//! Finding and opening `libnccl`.

use super::sys::Api;
use crate::error::{Error, Result};
use std::os::raw::c_int;
use std::path::{Path, PathBuf};

/// Oldest NCCL the device plane drives: bf16 and `ncclAvg` arrived in 2.10.
pub const MIN_VERSION: i32 = 21000;

/// A loaded NCCL library.
pub struct Nccl {
    path: String,
    version: i32,
    /// Leaked on purpose: the library is never unloaded (below), so its
    /// entry points live as long as the process, and communicators the
    /// runtime keeps (the world's, the parent of every split) can hold them.
    api: std::result::Result<&'static Api, String>,
    // Never unloaded: NCCL's own threads (proxies, and the emulator's stream
    // workers) may still run its code after the last communicator is gone,
    // and an unloaded library under a running thread is a crash at exit.
    _lib: std::mem::ManuallyDrop<libloading::Library>,
}

impl std::fmt::Debug for Nccl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Nccl")
            .field("path", &self.path)
            .field("version", &self.version)
            .finish()
    }
}

impl Nccl {
    /// Where it was loaded from (a path, or a name the loader resolved).
    pub fn path(&self) -> &str {
        &self.path
    }

    /// `ncclGetVersion`'s code (e.g. 22005 for 2.20.5).
    pub fn version_code(&self) -> i32 {
        self.version
    }

    /// `major.minor.patch`, decoded as NCCL's `NCCL_VERSION` macro encodes it.
    pub fn version(&self) -> String {
        decode_version(self.version)
    }

    /// The entry points, or why this library cannot drive the device plane
    /// (too old, or a symbol missing).
    pub fn api(&self) -> Result<&'static Api> {
        self.api
            .as_ref()
            .copied()
            .map_err(|m| Error::Gpu(format!("NCCL {} at {}: {m}", self.version(), self.path)))
    }
}

pub(crate) fn decode_version(v: i32) -> String {
    if v >= 10000 {
        format!("{}.{}.{}", v / 10000, v % 10000 / 100, v % 100)
    } else {
        format!("{}.{}.{}", v / 1000, v % 1000 / 100, v % 100)
    }
}

/// The candidates, in search order: `explicit` (a file: `RANKMESH_NCCL_LIB`,
/// through [`Options`](crate::Options)), the loader
/// path (`libnccl.so.2`, `libnccl.so`), `$NCCL_HOME/lib`, `$CUDA_HOME/lib64`,
/// and the `nvidia/nccl/lib` directory of Python wheels in the site-packages
/// of virtual environments (`$VIRTUAL_ENV`, the `python3` on `PATH`), conda,
/// `~/.local` and the system prefixes.
pub fn candidates(explicit: Option<&str>, env: &dyn Fn(&str) -> Option<String>) -> Vec<String> {
    let mut out: Vec<String> = explicit.map(str::to_string).into_iter().collect();
    out.push("libnccl.so.2".into());
    out.push("libnccl.so".into());
    let mut dirs: Vec<PathBuf> = Vec::new();
    if let Some(h) = env("NCCL_HOME") {
        dirs.push(Path::new(&h).join("lib"));
    }
    if let Some(h) = env("CUDA_HOME") {
        dirs.push(Path::new(&h).join("lib64"));
    }
    for d in dirs {
        for name in ["libnccl.so.2", "libnccl.so"] {
            out.push(d.join(name).display().to_string());
        }
    }
    let mut roots: Vec<PathBuf> = Vec::new();
    for var in ["VIRTUAL_ENV", "CONDA_PREFIX"] {
        if let Some(v) = env(var) {
            roots.push(PathBuf::from(v).join("lib"));
        }
    }
    if let Some(home) = env("HOME") {
        roots.push(Path::new(&home).join(".local/lib"));
    }
    // The Python on PATH (often a virtual environment holding PyTorch and
    // its NCCL wheel, e.g. /opt/torch/.venv/bin/python3).
    if let Some(path) = env("PATH") {
        for dir in std::env::split_paths(&path) {
            if dir.join("python3").exists() {
                if let Some(prefix) = dir.parent() {
                    roots.push(prefix.join("lib"));
                }
            }
        }
    }
    roots.extend(["/usr/local/lib", "/usr/lib", "/opt/conda/lib"].map(PathBuf::from));
    let mut seen = std::collections::HashSet::new();
    roots.retain(|r| seen.insert(r.clone()));
    for root in roots {
        let Ok(entries) = std::fs::read_dir(&root) else {
            continue;
        };
        let mut pythons: Vec<PathBuf> = entries
            .flatten()
            .map(|e| e.path())
            .filter(|p| {
                p.file_name()
                    .is_some_and(|n| n.to_string_lossy().starts_with("python3"))
            })
            .collect();
        pythons.sort();
        for py in pythons {
            for sub in ["site-packages", "dist-packages"] {
                let lib = py.join(sub).join("nvidia/nccl/lib/libnccl.so.2");
                if lib.exists() {
                    out.push(lib.display().to_string());
                }
            }
        }
    }
    out
}

/// Opens the first candidate that loads and exports `ncclGetVersion`; the
/// error lists every candidate and why it failed. `explicit` and `env` as
/// for [`candidates`].
pub fn load(explicit: Option<&str>, env: &dyn Fn(&str) -> Option<String>) -> Result<Nccl> {
    let mut tried = Vec::new();
    for cand in candidates(explicit, env) {
        // SAFETY: loading runs the library's initialisers; NCCL's are benign.
        match unsafe { libloading::Library::new(&cand) } {
            Ok(lib) => {
                // SAFETY: the signature is NCCL's `ncclResult_t ncclGetVersion(int*)`.
                let get: std::result::Result<
                    libloading::Symbol<unsafe extern "C" fn(*mut c_int) -> c_int>,
                    _,
                > = unsafe { lib.get(b"ncclGetVersion\0") };
                match get {
                    Ok(get) => {
                        let mut v: c_int = 0;
                        // SAFETY: `v` is a valid out-pointer.
                        let rc = unsafe { get(&mut v) };
                        if rc != 0 {
                            tried.push(format!("{cand}: ncclGetVersion returned error {rc}"));
                            continue;
                        }
                        let api = if v < MIN_VERSION {
                            Err(format!(
                                "rankmesh needs NCCL {} or newer (bf16, avg)",
                                decode_version(MIN_VERSION)
                            ))
                        } else {
                            // SAFETY: `lib` is NCCL (it answered ncclGetVersion) and
                            // outlives `api` (field order in `Nccl`).
                            unsafe { Api::load(&lib, v) }.map(|api| &*Box::leak(Box::new(api)))
                        };
                        return Ok(Nccl {
                            path: cand,
                            version: v,
                            api,
                            _lib: std::mem::ManuallyDrop::new(lib),
                        });
                    }
                    Err(e) => tried.push(format!("{cand}: not NCCL ({e})")),
                }
            }
            Err(e) => tried.push(format!("{cand}: {e}")),
        }
    }
    Err(Error::Launch(format!(
        "NCCL not found; tried (set RANKMESH_NCCL_LIB to the library file):\n  {}",
        tried.join("\n  ")
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env_of(pairs: &'static [(&'static str, &'static str)]) -> impl Fn(&str) -> Option<String> {
        move |k| {
            pairs
                .iter()
                .find(|(kk, _)| *kk == k)
                .map(|(_, v)| v.to_string())
        }
    }

    #[test]
    fn search_order_starts_with_the_explicit_file() {
        let c = candidates(
            Some("/x/libnccl.so.2"),
            &env_of(&[("NCCL_HOME", "/nccl"), ("CUDA_HOME", "/cuda")]),
        );
        assert_eq!(
            &c[..7],
            [
                "/x/libnccl.so.2",
                "libnccl.so.2",
                "libnccl.so",
                "/nccl/lib/libnccl.so.2",
                "/nccl/lib/libnccl.so",
                "/cuda/lib64/libnccl.so.2",
                "/cuda/lib64/libnccl.so",
            ]
        );
    }

    #[test]
    fn the_nccl_wheel_of_the_python_on_path_is_a_candidate() {
        let root = std::env::temp_dir().join(format!("rankmesh-venv-{}", std::process::id()));
        let lib = root.join("lib/python3.12/site-packages/nvidia/nccl/lib");
        std::fs::create_dir_all(&lib).unwrap();
        std::fs::create_dir_all(root.join("bin")).unwrap();
        std::fs::write(root.join("bin/python3"), "").unwrap();
        std::fs::write(lib.join("libnccl.so.2"), "").unwrap();
        let path = format!("/nonexistent:{}", root.join("bin").display());
        let env = move |k: &str| (k == "PATH").then(|| path.clone());
        let c = candidates(None, &env);
        let want = lib.join("libnccl.so.2").display().to_string();
        assert_eq!(c.iter().filter(|p| **p == want).count(), 1, "{c:?}");
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn missing_library_lists_what_was_tried() {
        let e = load(Some("/nonexistent/libnccl.so.2"), &env_of(&[]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("NCCL not found; tried"), "{e}");
        assert!(e.contains("/nonexistent/libnccl.so.2: "), "{e}");
        assert!(e.contains("libnccl.so.2: "), "{e}");
    }

    #[test]
    fn version_codes_decode() {
        assert_eq!(decode_version(22005), "2.20.5");
        assert_eq!(decode_version(2708), "2.7.8");
    }
}
