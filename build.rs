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
    let Ok(out) = Command::new(&wrapper).arg("-show").output() else {
        return;
    };
    if !out.status.success() {
        return;
    }
    let line = String::from_utf8_lossy(&out.stdout);
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
