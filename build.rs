//! Links rankmesh's programs (the CLI, tests, examples) to the MPI library
//! whose headers the `mpi` crate compiled against: the library directories
//! the MPI's compiler wrapper names (`$MPICC -show`, `mpicc` by default)
//! go into the programs' run path. Without it, a build against one MPI
//! (a module, a wheel, Cray's or Intel's) on a machine with another
//! installed ran the other one's `libmpi.so` (Intel MPI's headers with Open
//! MPI's library crashed in `PMPI_Comm_dup`). `LD_LIBRARY_PATH` still comes
//! first, as a run path allows.

use std::process::Command;

fn main() {
    println!("cargo:rerun-if-env-changed=MPICC");
    println!("cargo:rerun-if-changed=build.rs");
    let wrapper = std::env::var("MPICC").unwrap_or_else(|_| "mpicc".into());
    let line = match Command::new(&wrapper).arg("-show").output() {
        Ok(out) if out.status.success() => String::from_utf8_lossy(&out.stdout).into_owned(),
        _ => String::new(),
    };
    let (mpi, header) = header_mpi(&line);
    println!("cargo:rustc-env=RANKMESH_MPI_HEADER={mpi}");
    println!("cargo:rustc-env=RANKMESH_MPI_HEADER_PATH={header}");
    if !header.is_empty() {
        println!("cargo:rerun-if-changed={header}");
    }
    let mut dirs: Vec<&str> = Vec::new();
    for word in line.split_whitespace() {
        if let Some(dir) = word.strip_prefix("-L") {
            if !dir.is_empty() && !dirs.contains(&dir) {
                dirs.push(dir);
            }
        }
    }
    for dir in dirs {
        println!("cargo:rustc-link-arg=-Wl,-rpath,{dir}");
    }
}

/// The MPI whose `mpi.h` the wrapper's include directories hold
/// (`Open MPI 4.1.4`, `MPICH 4.0.2`, `Intel MPI 2021.19.0`), and that
/// header's path; empty where none is found or it names no known MPI.
/// src/mpi_abi.rs compares it with the library that loads.
fn header_mpi(show: &str) -> (String, String) {
    let dirs = show
        .split_whitespace()
        .filter_map(|w| w.strip_prefix("-I"))
        .filter(|d| !d.is_empty());
    for dir in dirs {
        let path = std::path::Path::new(dir).join("mpi.h");
        let Ok(text) = std::fs::read_to_string(&path) else {
            continue;
        };
        let define = |name: &str| {
            text.lines().find_map(|l| {
                let mut w = l.split_whitespace();
                (w.next() == Some("#define") && w.next() == Some(name))
                    .then(|| w.next().unwrap_or("").trim_matches('"').to_string())
            })
        };
        let found = if let Some(major) = define("OMPI_MAJOR_VERSION") {
            let minor = define("OMPI_MINOR_VERSION").unwrap_or_default();
            let release = define("OMPI_RELEASE_VERSION").unwrap_or_default();
            Some(format!("Open MPI {major}.{minor}.{release}"))
        } else if let Some(v) = define("I_MPI_VERSION") {
            Some(format!("Intel MPI {v}"))
        } else if let Some(v) = define("MVAPICH2_VERSION") {
            Some(format!("MVAPICH2 {v}"))
        } else {
            define("MPICH_VERSION").map(|v| format!("MPICH {v}"))
        };
        if let Some(mpi) = found {
            return (mpi, path.display().to_string());
        }
    }
    (String::new(), String::new())
}
