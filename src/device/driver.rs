//! Is there a usable CUDA driver? Answered without letting cudarc panic.
//!
//! cudarc's dynamic loader panics when `libcuda` is absent, and also when it
//! is present but lacks a symbol of the CUDA version rankmesh was built for
//! (it resolves every symbol eagerly). So the driver is opened here first and
//! its version checked; only then is cudarc called.

use std::os::raw::c_int;

/// The CUDA version whose driver API cudarc is built against (feature `cuda-12000`).
pub const BUILT_FOR: c_int = 12000;

const NAMES: [&str; 2] = ["libcuda.so.1", "libcuda.so"];

/// Opens the driver library and returns its CUDA version code (e.g. 12040),
/// or why the GPU plane cannot start on this host.
pub fn driver_version() -> Result<c_int, String> {
    let mut tried = Vec::new();
    for name in NAMES {
        // SAFETY: loading the NVIDIA driver library runs only its own initialisers.
        let lib = match unsafe { libloading::Library::new(name) } {
            Ok(lib) => lib,
            Err(e) => {
                // libloading 0.9 says "dlopen failed" and keeps dlerror's
                // text (which file, why) as the error's source.
                let why =
                    std::error::Error::source(&e).map_or_else(|| e.to_string(), |s| s.to_string());
                tried.push(why);
                continue;
            }
        };
        // SAFETY: `CUresult cuDriverGetVersion(int*)`, callable before cuInit.
        let get = unsafe {
            lib.get::<unsafe extern "C" fn(*mut c_int) -> c_int>(b"cuDriverGetVersion\0")
        };
        let Ok(get) = get else {
            tried.push(format!(
                "{name}: no cuDriverGetVersion (not the CUDA driver)"
            ));
            continue;
        };
        let mut v: c_int = 0;
        // SAFETY: `v` is a valid out-pointer.
        let rc = unsafe { get(&mut v) };
        if rc != 0 {
            return Err(format!(
                "{name}: cuDriverGetVersion failed with CUDA error {rc}"
            ));
        }
        if v < BUILT_FOR {
            return Err(format!(
                "the NVIDIA driver supports CUDA {}, rankmesh needs CUDA {} or newer",
                cuda_version(v),
                cuda_version(BUILT_FOR)
            ));
        }
        // cudarc loads the library by its own search; make sure it agrees.
        // SAFETY: checked above that a complete enough driver is present.
        let present =
            std::panic::catch_unwind(|| unsafe { cudarc::driver::sys::is_culib_present() });
        return match present {
            Ok(true) => Ok(v),
            Ok(false) => Err(format!(
                "{name} loads, but cudarc cannot find the CUDA driver library by its names"
            )),
            Err(_) => Err(format!(
                "{name} (CUDA {}) lacks driver API entry points rankmesh uses",
                cuda_version(v)
            )),
        };
    }
    Err(format!(
        "no CUDA driver on this host ({})",
        tried.join("; ")
    ))
}

/// `12040` → `"12.4"`.
pub fn cuda_version(v: c_int) -> String {
    format!("{}.{}", v / 1000, v % 1000 / 10)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn version_codes_read_as_cuda_versions() {
        assert_eq!(cuda_version(12040), "12.4");
        assert_eq!(cuda_version(11080), "11.8");
    }
}
