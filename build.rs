//! Links rankmesh's programs (the CLI, tests, examples) to the MPI library
//! whose headers the `mpi` crate compiled against. The library directories
//! the MPI's compiler wrapper names (`$MPICC -show`, `mpicc` by default; or
//! `MPI_PKG_CONFIG`, `CRAY_MPICH_DIR`, as the `mpi` crate's probe takes them)
//! are searched first and go into the programs' run path. Without it, a build
//! against one MPI (a module, a wheel, Cray's or Intel's) on a machine with
//! another installed ran the other one's `libmpi.so` (Intel MPI's headers
//! with Open MPI's library crashed in `PMPI_Comm_dup`). `LD_LIBRARY_PATH`
//! still comes first, as a run path allows.

use std::process::Command;

fn main() {
    for var in ["MPICC", "MPI_PKG_CONFIG", "CRAY_MPICH_DIR"] {
        println!("cargo:rerun-if-env-changed={var}");
    }
    println!("cargo:rerun-if-changed=build.rs");
    let line = compile_line();
    let (mpi, header) = header_mpi(&line);
    println!("cargo:rustc-env=RANKMESH_MPI_HEADER={mpi}");
    println!("cargo:rustc-env=RANKMESH_MPI_HEADER_PATH={header}");
    if !header.is_empty() {
        println!("cargo:rerun-if-changed={header}");
    }
    let mut dirs: Vec<String> = Vec::new();
    for word in words(&line) {
        if let Some(dir) = word.strip_prefix("-L") {
            if !dir.is_empty() && !dirs.iter().any(|d| d == dir) {
                dirs.push(dir.to_string());
            }
        }
    }
    for dir in dirs {
        // Searched before the directories other crates add (hwloc's
        // pkg-config names /usr/lib/<triple>, where another MPI's
        // `libmpi.so` may be): `-lmpi` is this MPI's.
        println!("cargo:rustc-link-search=native={dir}");
        println!("cargo:rustc-link-arg=-Wl,-rpath,{dir}");
    }
}

/// How the `mpi` crate's probe (build-probe-mpi) found the MPI, in the
/// same order: `MPI_PKG_CONFIG` (a pkg-config name or `.pc` file), Cray's
/// `CRAY_MPICH_DIR` (whose `cc` wrapper has no `-show`), else the compiler
/// wrapper's `-show` line (`MPICC`, default `mpicc`). Empty when none answers.
fn compile_line() -> String {
    let run = |cmd: &str, args: &[&str]| match Command::new(cmd).args(args).output() {
        Ok(out) if out.status.success() => String::from_utf8_lossy(&out.stdout).into_owned(),
        _ => String::new(),
    };
    if let Ok(pc) = std::env::var("MPI_PKG_CONFIG") {
        return run("pkg-config", &["--cflags", "--libs", &pc]);
    }
    if let Ok(dir) = std::env::var("CRAY_MPICH_DIR") {
        return format!("-I{dir}/include -L{dir}/lib");
    }
    let wrapper = std::env::var("MPICC").unwrap_or_else(|_| "mpicc".into());
    run(&wrapper, &["-show"])
}

/// The MPI whose `mpi.h` the wrapper's include directories hold
/// (`Open MPI 4.1.4`, `MPICH 4.0.2`, `Intel MPI 2021.19.0`), and that
/// header's path; empty where none is found or it names no known MPI.
/// src/mpi_abi.rs compares it with the library that loads.
fn header_mpi(show: &str) -> (String, String) {
    let words = words(show);
    let dirs = words
        .iter()
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

/// The words of a wrapper's `-show` line as a shell splits them: Intel
/// MPI's quotes its directories (`-L"/opt/intel/mpi/lib"`).
fn words(line: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut word = String::new();
    let mut quote: Option<char> = None;
    let mut started = false;
    for c in line.chars() {
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (Some(_), c) => word.push(c),
            (None, '"' | '\'') => {
                quote = Some(c);
                started = true;
            }
            (None, c) if c.is_whitespace() => {
                if started {
                    out.push(std::mem::take(&mut word));
                    started = false;
                }
            }
            (None, c) => {
                word.push(c);
                started = true;
            }
        }
    }
    if started {
        out.push(word);
    }
    out
}
