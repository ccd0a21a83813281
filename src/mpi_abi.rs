//! Which MPI this build speaks, checked against the library that loaded.
//!
//! MPI fixes an API, not an ABI: Open MPI's handles are pointers, the
//! MPICH family's (MPICH, Intel MPI, Cray MPICH, MVAPICH) are integers, and
//! a program built against one family's `mpi.h` but run with the other's
//! library crashes in its first call (Intel MPI's headers with Open MPI's
//! `libmpi.so.40`: SIGSEGV in `PMPI_Comm_dup`). build.rs records the
//! headers' MPI; [`check_library`] compares it with
//! `MPI_Get_library_version`, which MPI lets a process call before
//! `MPI_Init`, so a mismatch is one clear error instead.

/// The two ABI families of MPI libraries in use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Family {
    /// Open MPI 4 and 5 (`libmpi.so.40`).
    OpenMpi,
    /// MPICH and the libraries built on it, which share its ABI
    /// (`libmpi.so.12`): Intel MPI, Cray MPICH, MVAPICH.
    Mpich,
}

impl Family {
    fn name(self) -> &'static str {
        match self {
            Family::OpenMpi => "Open MPI",
            Family::Mpich => "the MPICH family (MPICH, Intel MPI, Cray MPICH, MVAPICH)",
        }
    }
}

/// The MPI whose `mpi.h` this build compiled against, as build.rs read it
/// (`Open MPI 4.1.4`, `MPICH 4.0.2`, `Intel MPI 2021.19.0`), and where;
/// empty when it could not tell.
const BUILT_FOR: &str = env!("RANKMESH_MPI_HEADER");
const BUILT_FROM: &str = env!("RANKMESH_MPI_HEADER_PATH");

/// The family of the MPI named by build.rs's description.
fn header_family(built_for: &str) -> Option<Family> {
    match built_for.split_whitespace().next()? {
        "Open" => Some(Family::OpenMpi),
        "MPICH" | "Intel" | "MVAPICH" | "MVAPICH2" => Some(Family::Mpich),
        _ => None,
    }
}

/// Slurm's `srun --mpi=` plugin for this build: PMI-2 for the MPICH
/// family (its PMI client speaks PMI-1/2), PMIx otherwise.
pub(crate) fn srun_mpi() -> &'static str {
    match header_family(BUILT_FOR) {
        Some(Family::Mpich) => "pmi2",
        _ => "pmix",
    }
}

/// The family of the library whose version line is `version`.
pub(crate) fn library_family(version: &str) -> Option<Family> {
    let v = version.to_ascii_lowercase();
    if v.starts_with("open mpi") {
        Some(Family::OpenMpi)
    } else if v.contains("mpich") || v.contains("intel(r) mpi") || v.contains("mvapich") {
        Some(Family::Mpich)
    } else {
        None
    }
}

/// The MPI library's own version line (`MPI_Get_library_version`, which
/// MPI lets a process call before `MPI_Init`), read once: the start-up
/// check and the start-up watch both ask.
pub(crate) fn library_version() -> &'static str {
    static VERSION: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    VERSION.get_or_init(read_library_version)
}

fn read_library_version() -> String {
    let mut buf = vec![0u8; mpi::ffi::MPI_MAX_LIBRARY_VERSION_STRING as usize + 1];
    let mut len: std::os::raw::c_int = 0;
    // SAFETY: `buf` holds MPI_MAX_LIBRARY_VERSION_STRING bytes and more, as
    // the call requires; `len` is an out-parameter.
    let rc = unsafe { mpi::ffi::MPI_Get_library_version(buf.as_mut_ptr().cast(), &mut len) };
    if rc != 0 {
        return String::new();
    }
    buf.truncate((len.max(0) as usize).min(buf.len()));
    String::from_utf8_lossy(&buf)
        .lines()
        .next()
        .unwrap_or("")
        .trim()
        .to_string()
}

/// `Err` naming both when the loaded MPI library is of another ABI family
/// than the headers this build compiled against; `Ok` when they agree or
/// either cannot be told.
pub(crate) fn check_library() -> Result<(), String> {
    verdict(BUILT_FOR, BUILT_FROM, library_version())
}

fn verdict(built_for: &str, built_from: &str, loaded: &str) -> Result<(), String> {
    match (header_family(built_for), library_family(loaded)) {
        (Some(built), Some(running)) if built != running => Err(format!(
            "rankmesh was built against {built_for} ({built_from}, {}), but the MPI library loaded is \"{loaded}\" ({}): their binary interfaces differ, and the first MPI call would crash. Rebuild with MPICC set to this MPI's compiler wrapper, or run with the library it was built for first on LD_LIBRARY_PATH",
            built.name(),
            running.name()
        )),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn libraries_are_told_apart_by_family() {
        let open = "Open MPI v4.1.4, package: Debian OpenMPI, ident: 4.1.4, repo rev: v4.1.4, May 26, 2022";
        assert_eq!(library_family(open), Some(Family::OpenMpi));
        assert_eq!(
            library_family("Open MPI v5.0.11, package: Open MPI"),
            Some(Family::OpenMpi)
        );
        for mpich in [
            "MPICH Version:      4.0.2",
            "Intel(R) MPI Library 2021.19 for Linux* OS",
            "MPI VERSION    : CRAY MPICH version 8.1.28.15 (ANL base 3.4a2)",
            "MVAPICH2 Version      :\t2.3.7",
        ] {
            assert_eq!(library_family(mpich), Some(Family::Mpich), "{mpich}");
        }
        assert_eq!(library_family(""), None);
        assert_eq!(header_family("Open MPI 4.1.4"), Some(Family::OpenMpi));
        assert_eq!(header_family("Intel MPI 2021.19.0"), Some(Family::Mpich));
        assert_eq!(header_family(""), None);
    }

    #[test]
    fn only_a_different_family_is_refused_naming_both() {
        let h = "/usr/include/mpi.h";
        assert!(verdict("Open MPI 4.1.4", h, "Open MPI v5.0.11, package: Open MPI").is_ok());
        assert!(verdict(
            "MPICH 4.0.2",
            h,
            "Intel(R) MPI Library 2021.19 for Linux* OS"
        )
        .is_ok());
        assert!(verdict("", h, "Intel(R) MPI Library 2021.19 for Linux* OS").is_ok());
        assert!(verdict("Open MPI 4.1.4", h, "").is_ok());
        let e = verdict("Intel MPI 2021.19.0", h, "Open MPI v4.1.4, package: Debian").unwrap_err();
        assert!(
            e.contains("built against Intel MPI 2021.19.0 (/usr/include/mpi.h"),
            "{e}"
        );
        assert!(
            e.contains("\"Open MPI v4.1.4, package: Debian\" (Open MPI)"),
            "{e}"
        );
        assert!(e.contains("MPICC"), "{e}");
    }

    #[test]
    fn this_build_knows_its_mpi() {
        // CI builds against Debian's Open MPI through mpicc.
        assert!(
            header_family(BUILT_FOR).is_some(),
            "{BUILT_FOR:?} from {BUILT_FROM:?}"
        );
        assert!(check_library().is_ok());
    }
}
