//! The driver side of tests/gpu.rs: builds the CUDA and NCCL emulators,
//! runs the device checks on them under mpirun, and provokes the error paths.

use super::support;
use libtest_mimic::{Arguments, Failed, Trial};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

fn me() -> PathBuf {
    std::env::current_exe().expect("own path")
}

fn rankmesh_bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_rankmesh"))
}

/// The compiler wrapper of the MPI rankmesh was built against (`MPICC`,
/// as build.rs takes it): the emulated NCCL carries its calls over that MPI.
fn mpicc() -> String {
    std::env::var("MPICC").unwrap_or_else(|_| "mpicc".into())
}

/// Builds libcuda.so(.1) and libnccl.so.2 from tests/emulator into `dir`.
pub fn build(dir: &Path) -> Result<(), String> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/emulator");
    std::fs::create_dir_all(dir).map_err(|e| e.to_string())?;
    // Every driver symbol cudarc resolves must exist; the ones the device
    // plane does not call are stubs answering CUDA_ERROR_NOT_SUPPORTED (801).
    let implemented = std::fs::read_to_string(src.join("cuda.c")).map_err(|e| e.to_string())?;
    let stubs: String = std::fs::read_to_string(src.join("cuda_symbols.txt"))
        .map_err(|e| e.to_string())?
        .lines()
        .filter(|s| !s.is_empty() && !implemented.contains(&format!("CUresult {s}(")))
        .map(|s| format!("int {s}(void) {{ return 801; }}\n"))
        .collect();
    let stub_file = dir.join("cuda_stubs.c");
    std::fs::write(&stub_file, stubs).map_err(|e| e.to_string())?;
    let run = |cmd: &mut Command| -> Result<(), String> {
        let out = cmd.output().map_err(|e| format!("{cmd:?}: {e}"))?;
        if out.status.success() {
            Ok(())
        } else {
            Err(format!("{cmd:?}: {}", String::from_utf8_lossy(&out.stderr)))
        }
    };
    // Against the real nccl.h and cuda.h when their wheels are here (always
    // under CI): a definition that drifts from the header's declaration
    // does not compile.
    let includes = support::real_nccl_includes(&dir.join("headers"));
    let header = |define: &str| -> Vec<String> {
        includes.as_ref().map_or_else(Vec::new, |dirs| {
            std::iter::once(format!("-D{define}"))
                .chain(dirs.iter().map(|d| format!("-I{}", d.display())))
                .collect()
        })
    };
    run(Command::new("cc")
        .args(["-O1", "-Wall", "-Werror", "-shared", "-fPIC"])
        .args(header("RANKMESH_REAL_CUDA_H"))
        .arg("-o")
        .arg(dir.join("libcuda.so"))
        .arg(src.join("cuda.c"))
        .arg(&stub_file)
        .arg("-pthread"))?;
    let _ = std::fs::remove_file(dir.join("libcuda.so.1"));
    std::os::unix::fs::symlink("libcuda.so", dir.join("libcuda.so.1"))
        .map_err(|e| e.to_string())?;
    let nccl = |flags: &[&str], out: PathBuf| {
        run(Command::new(mpicc())
            .args(flags)
            .args(["-O1", "-Wall", "-Werror", "-shared", "-fPIC"])
            .args(header("RANKMESH_REAL_NCCL_H"))
            .arg("-o")
            .arg(out)
            .arg(src.join("nccl.c"))
            .args(["-lm", "-ldl", "-pthread"]))
    };
    nccl(&[], dir.join("libnccl.so.2"))?;
    // NCCL 2.18: configs and splits, none of the later entry points.
    std::fs::create_dir_all(dir.join("nccl-2.18")).map_err(|e| e.to_string())?;
    nccl(&["-DEMU_NCCL_2_18"], dir.join("nccl-2.18/libnccl.so.2"))?;
    // NCCL 2.18 under AddressSanitizer (its runtime preloaded, see
    // `asan_runtime`): a freed communicator is really freed, so a use after
    // abort is reported.
    std::fs::create_dir_all(dir.join("asan")).map_err(|e| e.to_string())?;
    nccl(
        &["-DEMU_NCCL_2_18", "-fsanitize=address", "-g"],
        dir.join("asan/libnccl.so.2"),
    )
}

/// gcc's AddressSanitizer runtime, to preload into a process that loads the
/// ASan build of the emulator.
fn asan_runtime() -> Result<String, String> {
    let out = Command::new("gcc")
        .arg("-print-file-name=libasan.so")
        .output()
        .map_err(|e| e.to_string())?;
    let path = String::from_utf8_lossy(&out.stdout).trim().to_string();
    Path::new(&path)
        .is_absolute()
        .then_some(path)
        .ok_or_else(|| "gcc has no libasan.so (install libasan8)".into())
}

struct Emulator {
    dir: PathBuf,
    ld_path: String,
    nccl: String,
}

impl Emulator {
    fn env<'a>(&'a self, extra: &[(&'a str, &'a str)]) -> Vec<(&'a str, &'a str)> {
        self.env_with(&self.nccl, extra)
    }

    /// As `env`, with the NCCL library at `nccl` (another build).
    fn env_with<'a>(
        &'a self,
        nccl: &'a str,
        extra: &[(&'a str, &'a str)],
    ) -> Vec<(&'a str, &'a str)> {
        let mut env = vec![
            ("LD_LIBRARY_PATH", self.ld_path.as_str()),
            ("RANKMESH_NCCL_LIB", nccl),
            ("RANKMESH_TIMEOUT", "60"),
        ];
        env.extend_from_slice(extra);
        env
    }
}

/// Whether either emulator named a misuse on stderr (a refused call, or
/// one it does not emulate), even one rankmesh's own paths let pass, as a
/// drop that ignores a failed free would.
fn emulator_objected(job: &support::Job) -> bool {
    job.stderr.contains("rankmesh NCCL emulator:") || job.stderr.contains("rankmesh CUDA emulator:")
}

/// Every rank printed its summary with zero failed checks, and neither
/// emulator objected to a call.
fn checks_passed(job: &support::Job, np: usize) -> Result<(), String> {
    let passed = job
        .stdout
        .lines()
        .filter(|l| l.contains("rankmesh CUDA emulator") && l.ends_with(", 0 checks failed"))
        .count();
    if job.ok() && passed == np && !job.stdout.contains("FAILED") && !emulator_objected(job) {
        Ok(())
    } else {
        Err(job.describe())
    }
}

/// Every rank failed, and every rank's error line says `what`.
fn fails_everywhere(job: &support::Job, np: usize, what: &str) -> Result<(), String> {
    let lines = job
        .stderr
        .lines()
        .filter(|l| l.starts_with("rankmesh: error (rank") && l.contains(what))
        .count();
    if !job.ok() && lines == np {
        Ok(())
    } else {
        Err(format!(
            "want {np} error lines with {what:?}\n{}",
            job.describe()
        ))
    }
}

/// The emulated NCCL's asynchronous error (`RANKMESH_EMU_FAIL_AFTER`), as
/// rankmesh reports it.
const ASYNC_ERROR: &str =
    "NCCL asynchronous error: remote process exited or there was a network error (code 6)";

/// A job that began at `start` ended before the leaver's 30 s grace would
/// have aborted it: its ranks ended by their own errors, none waited for a
/// peer that had left.
fn before_the_grace(start: Instant, what: &str, job: &support::Job) -> Result<(), String> {
    let took = start.elapsed();
    if took < Duration::from_secs(20) {
        return Ok(());
    }
    Err(format!(
        "{what} took {took:?}: a rank waited for its peer\n{}",
        job.describe()
    ))
}

/// `s` for as long as the process runs (the trials outlive the driver's
/// frame).
fn leak(s: String) -> &'static str {
    Box::leak(s.into_boxed_str())
}

/// Adds the check `f` as the trial `name`: each can be run alone by name
/// (`cargo test --test gpu -- NAME`) and is listed by `-- --list`.
fn trial(
    name: impl Into<String>,
    trials: &mut Vec<Trial>,
    f: impl FnOnce() -> Result<(), String> + Send + 'static,
) {
    trials.push(Trial::test(name, move || f().map_err(Failed::from)));
}

/// The test runner's entry point (see the module docs of tests/gpu.rs).
pub fn drive() {
    let mut args = Arguments::from_args();
    // One job at a time: each trial is an mpirun job whose waits and
    // timeouts assume the machine's cores are its own.
    args.test_threads = Some(1);
    let mut trials = Vec::new();
    match rankmesh::device::driver::driver_version() {
        Ok(_) => trial("real GPU, 1 rank", &mut trials, move || {
            let job = support::singleton(&me(), &[], &[("RANKMESH_GPU_WORKER", "1")]);
            if job.ok() && job.stdout.contains(", 0 checks failed") {
                print!("{}", job.stdout);
                Ok(())
            } else {
                Err(job.describe())
            }
        }),
        Err(why) => println!("real GPU checks skipped: {why}"),
    }

    let dir = std::env::temp_dir().join(format!("rankmesh-emulator-{}", std::process::id()));
    if let Err(m) = build(&dir) {
        println!("building the emulators failed: {m}");
        std::process::exit(1);
    }
    // Every trial borrows it until the process ends.
    let emu: &'static Emulator = Box::leak(Box::new(Emulator {
        ld_path: dir.display().to_string(),
        nccl: dir.join("libnccl.so.2").display().to_string(),
        dir,
    }));
    let worker = [("RANKMESH_GPU_WORKER", "1")];
    for np in 1..=4 {
        let gpus = np.to_string();
        trial(
            format!("emulated device checks, np {np}"),
            &mut trials,
            move || {
                let mut env = emu.env(&worker);
                env.push(("RANKMESH_EMU_GPUS", &gpus));
                checks_passed(&support::mpirun(np, &me(), &[], &env), np)
            },
        );
    }
    // The other two check modes (the runs above use the default, deferred,
    // posted into shared-memory rings), the synchronous emulator (every
    // stream operation run when enqueued), and deferred agreements posted
    // through MPI (the MPI host executor: no shared window).
    for (np, extra) in [
        (2, ("RANKMESH_CHECK", "strict")),
        (3, ("RANKMESH_CHECK", "off")),
        (3, ("RANKMESH_EMU_ASYNC", "0")),
        (2, ("RANKMESH_HOST_PLANE", "mpi")),
    ] {
        let gpus = np.to_string();
        trial(
            format!("emulated device checks, np {np}, {}={}", extra.0, extra.1),
            &mut trials,
            move || {
                let mut env = emu.env(&[worker[0], extra]);
                env.push(("RANKMESH_EMU_GPUS", &gpus));
                checks_passed(&support::mpirun(np, &me(), &[], &env), np)
            },
        );
    }
    // Deferred agreements post into shared-memory rings on a node-local
    // group ("shm") and through MPI all-gathers otherwise ("mpi").
    for (np, plane) in [(2usize, "shm"), (3, "shm"), (2, "mpi")] {
        let gpus = np.to_string();
        trial(
            format!("deferred agreement on {plane}, np {np}: a mismatch is the same error at synchronize everywhere"),
            &mut trials,
            move || {
                let mut env = emu.env(&[
                    ("RANKMESH_GPU_DEFERRED_MISMATCH", "1"),
                    ("RANKMESH_HOST_PLANE", plane),
                ]);
                env.push(("RANKMESH_EMU_GPUS", &gpus));
                let job = support::mpirun(np, &me(), &[], &env);
                let lines = |what: &str, has: &str| {
                    (0..np)
                        .filter(|r| {
                            job.stdout.lines().any(|l| {
                                l.starts_with(&format!("rank {r}: {what}")) && l.contains(has)
                            })
                        })
                        .count()
                };
                let named = "group rank 0 passed all_reduce(device shape [4, 3] f32, op sum) \
                             but group rank 1 passed all_reduce(device shape [4, 4] f32, op sum)";
                let ok = job.ok()
                    && lines("mode", &format!("deferred on {plane}")) == np
                    && lines("refused everywhere", "dim 2 out of range") == np
                    && lines("all_reduce after", "Ok(())") == np
                    && lines("400 calls", "Ok(())") == np
                    // Rank 1's own checks pass too: every rank enqueued.
                    && lines("mismatched call", "Ok(())") == np
                    && lines("synchronize", named) == np;
                ok.then_some(()).ok_or_else(|| job.describe())
            },
        );
    }
    for plane in ["shm", "mpi"] {
        trial(
        format!("deferred agreement on {plane}: a skipped call is a timeout error naming it, not a hang"),
        &mut trials,
        move || {
            let mut env = emu.env(&[
                ("RANKMESH_GPU_DEFERRED_SKIP", "1"),
                ("RANKMESH_EMU_GPUS", "2"),
                ("RANKMESH_HOST_PLANE", plane),
            ]);
            // The last value wins: a short wait for the agreement that never completes.
            env.push(("RANKMESH_TIMEOUT", "3"));
            let job = support::mpirun(2, &me(), &[], &env);
            let says = |r: usize, has: &str| {
                job.stdout
                    .lines()
                    .any(|l| l.starts_with(&format!("rank {r}: synchronize")) && l.contains(has))
            };
            let ok = says(
                0,
                "the deferred agreement of call #1 did not complete within RANKMESH_TIMEOUT",
            ) && says(1, "Ok(())");
            ok.then_some(()).ok_or_else(|| job.describe())
        },
    );
    }
    // Two separately launched jobs of `a` and `b` ranks forming one
    // stateless group, each member on its own emulated GPU unless `bus`
    // gives every GPU one bus id.
    let two_jobs =
        move |a: usize, b: usize, bus: Option<&'static str>| -> Result<Vec<support::Job>, String> {
            let addr = std::net::TcpListener::bind("127.0.0.1:0")
                .and_then(|l| l.local_addr())
                .map_err(|e| format!("a free port for the two jobs: {e}"))?
                .to_string();
            let world = (a + b).to_string();
            Ok(std::thread::scope(|s| {
                let handles: Vec<_> = [(a, 0usize), (b, a)]
                    .into_iter()
                    .map(|(np, offset)| {
                        let (addr, world, emu) = (&addr, &world, &emu);
                        s.spawn(move || {
                            let (gpus, offset) = (np.to_string(), offset.to_string());
                            let mut env = emu.env(&[
                                ("RANKMESH_2J_ROLE", "device"),
                                ("RANKMESH_2J_ADDR", addr),
                                ("RANKMESH_2J_WORLD", world),
                                ("RANKMESH_2J_OFFSET", &offset),
                            ]);
                            env.push(("RANKMESH_EMU_GPUS", &gpus));
                            if let Some(bus) = bus {
                                env.push(("RANKMESH_EMU_BUS", bus));
                            }
                            support::mpirun(np, &me(), &[], &env)
                        })
                    })
                    .collect();
                handles.into_iter().map(|h| h.join().unwrap()).collect()
            }))
        };
    let described = |jobs: &[support::Job]| {
        jobs.iter()
            .map(|j| j.describe())
            .collect::<Vec<_>>()
            .join("\n")
    };
    for (a, b) in [(1usize, 1usize), (2, 1)] {
        trial(
            format!("two separately launched jobs ({a}+{b}) share an NCCL communicator"),
            &mut trials,
            move || {
                let jobs = two_jobs(a, b, None)?;
                let oks = jobs
                    .iter()
                    .flat_map(|j| j.stdout.lines())
                    .filter(|l| l.starts_with("2J-DEV-OK rank"))
                    .count();
                if oks == a + b && jobs.iter().all(|j| j.ok()) {
                    Ok(())
                } else {
                    Err(described(&jobs))
                }
            },
        );
    }
    trial(
        "two separately launched jobs on one GPU: both members refuse before NCCL",
        &mut trials,
        move || {
            let jobs = two_jobs(1, 1, Some("0000:3B:00.0"))?;
            let refused = |me: usize| {
                jobs.iter().flat_map(|j| j.stdout.lines()).any(|l| {
                    l.starts_with(&format!("2J-DEV-FAILED rank {me}:"))
                        && l.contains("members 0 and 1 would share GPU 0000:3B:00.0 on ")
                })
            };
            (refused(0) && refused(1))
                .then_some(())
                .ok_or_else(|| described(&jobs))
        },
    );
    // A CUDA driver but no NCCL: a group of one still runs every device op
    // (as local copies); on two ranks the first op needing a communicator
    // is the same error on both, naming who lacks NCCL.
    let cuda_only: &'static Path = Box::leak(emu.dir.join("cuda-only").into_boxed_path());
    let linked = std::fs::create_dir_all(cuda_only).and_then(|()| {
        for lib in ["libcuda.so", "libcuda.so.1"] {
            let _ = std::fs::remove_file(cuda_only.join(lib));
            std::os::unix::fs::symlink(emu.dir.join("libcuda.so"), cuda_only.join(lib))?;
        }
        Ok(())
    });
    let no_nccl = move |np: usize, gpus: &str| {
        let ld = cuda_only.display().to_string();
        let env = [
            ("RANKMESH_GPU_WORKER", "1"),
            ("LD_LIBRARY_PATH", ld.as_str()),
            ("RANKMESH_NCCL_LIB", "/nonexistent/libnccl.so.2"),
            ("RANKMESH_TIMEOUT", "60"),
            ("RANKMESH_EMU_GPUS", gpus),
        ];
        support::mpirun(np, &me(), &[], &env)
    };
    trial("a group of one needs no NCCL", &mut trials, move || {
        linked.as_ref().map_err(|e| e.to_string())?;
        checks_passed(&no_nccl(1, "1"), 1)
    });
    trial(
        "without NCCL, two ranks: the same named error on both, no hang",
        &mut trials,
        move || {
            let job = no_nccl(2, "2");
            let named = (0..2).all(|r| {
                job.stdout.lines().any(|l| {
                    l.starts_with(&format!("rank {r}: FAILED"))
                        && l.contains("needs NCCL, which group rank 0 cannot use")
                        && l.contains("NCCL not found")
                })
            });
            (!job.ok() && named)
                .then_some(())
                .ok_or_else(|| job.describe())
        },
    );
    // NCCL reduces fp8 from sm 9.0 on: below, every group size refuses it by
    // name before NCCL is asked, and the communicator stays usable.
    for np in [1, 3] {
        trial(
            format!("fp8 reductions on sm 8.0 refused alike, np {np}"),
            &mut trials,
            move || {
                let mut env = emu.env(&worker);
                env.push(("RANKMESH_EMU_GPUS", "3"));
                env.push(("RANKMESH_EMU_CC", "8.0"));
                checks_passed(&support::mpirun(np, &me(), &[], &env), np)
            },
        );
    }
    trial(
        "one GPU shown per rank (--gpus-per-task)",
        &mut trials,
        move || {
            let mut env = emu.env(&worker);
            env.push(("RANKMESH_EMU_GPUS", "1"));
            checks_passed(&support::mpirun(2, &me(), &[], &env), 2)
        },
    );

    trial(
        "topo shows the CUDA device each rank would drive",
        &mut trials,
        move || {
            let job = support::mpirun(
                3,
                rankmesh_bin(),
                &["topo", "--json"],
                &emu.env(&[("RANKMESH_EMU_GPUS", "3")]),
            );
            let doc: serde_json::Value = serde_json::from_str(job.stdout.trim())
                .map_err(|e| format!("{e}\n{}", job.describe()))?;
            let ok = job.ok()
                && doc["nccl"]["version"] == "2.28.3"
                && doc["nccl"]["native_collectives"]
                    == serde_json::json!(["alltoall", "gather", "scatter"])
                && (0..3).all(|r| {
                    let d = &doc["ranks"][r]["device"];
                    d["ordinal"] == r && d["driver"] == "12.4" && d["bus_id"].as_str().is_some()
                });
            ok.then_some(()).ok_or_else(|| format!("{doc:#}"))
        },
    );
    trial(
        "doctor reports each node's GPUs, NCCL and device all_reduce",
        &mut trials,
        move || {
            let job = support::mpirun(
                3,
                rankmesh_bin(),
                &["doctor"],
                &emu.env(&[("RANKMESH_EMU_GPUS", "3")]),
            );
            let row = job
                .stdout
                .lines()
                .skip_while(|l| *l != "devices")
                .nth(2)
                .unwrap_or("");
            // node 0, 3 GPUs, the emulator's NCCL, a device all_reduce figure.
            let cells: Vec<&str> = row.split_whitespace().collect();
            let ok = job.ok()
                && cells.len() == 7
                && cells[0] == "0"
                && cells[2] == "3"
                && cells[3..5] == ["NCCL", "2.28.3"]
                && cells[5].contains("libnccl.so.2")
                && cells[6].parse::<f64>().is_ok_and(|b| b > 0.0)
                && job.stdout.contains("verdict: OK");
            ok.then_some(()).ok_or_else(|| job.describe())
        },
    );
    trial(
        "doctor names the node whose rank has no NCCL",
        &mut trials,
        move || {
            let with = emu.env(&[("RANKMESH_EMU_GPUS", "3")]);
            // Rank 2: the CUDA driver alone on its library path.
            let ld = cuda_only.display().to_string();
            let without = [
                ("LD_LIBRARY_PATH", ld.as_str()),
                ("RANKMESH_NCCL_LIB", "/nonexistent/libnccl.so.2"),
                ("RANKMESH_EMU_GPUS", "3"),
            ];
            let job = support::mpirun_each(rankmesh_bin(), &["doctor"], &[&with, &with, &without]);
            let finding = job
                .stdout
                .lines()
                .skip_while(|l| !l.starts_with("verdict: FAILED"))
                .skip(1)
                .collect::<Vec<_>>();
            let ok = !job.ok()
                && finding.len() == 1
                && finding[0].starts_with("  nccl 0 (")
                && finding[0].contains("rank 2 has no NCCL (")
                && finding[0].ends_with("where 2 of 3 ranks load NCCL 2.28.3");
            ok.then_some(()).ok_or_else(|| job.describe())
        },
    );
    // NCCL's real library (its PyPI wheel), which loads without a GPU.
    if let Some(real) = support::real_nccl() {
        let real = leak(real.display().to_string());
        trial(
            "topo --json reports the real NCCL's version",
            &mut trials,
            move || {
                let job = support::mpirun(
                    1,
                    rankmesh_bin(),
                    &["topo", "--json"],
                    &[("RANKMESH_NCCL_LIB", real)],
                );
                let doc: serde_json::Value = serde_json::from_str(job.stdout.trim())
                    .map_err(|e| format!("{e}\n{}", job.describe()))?;
                (job.ok()
                    && doc["nccl"]["version"] == "2.32.3"
                    && doc["nccl"]["path"] == real
                    && doc["nccl"]["native_collectives"]
                        == serde_json::json!(["alltoall", "gather", "scatter"])
                    && doc["nccl"]["optional_entry_points"]
                        .as_array()
                        .is_some_and(|a| a.len() == 11 && a.contains(&"ncclCommShrink".into())))
                .then_some(())
                .ok_or_else(|| format!("{doc:#}"))
            },
        );
        trial(
            "the real ncclCommInitRankConfig under the emulated driver: its reason on every rank, in seconds",
            &mut trials,
            move || {
                let env = [
                    ("LD_LIBRARY_PATH", emu.ld_path.as_str()),
                    ("RANKMESH_NCCL_LIB", real),
                    ("RANKMESH_EMU_GPUS", "2"),
                    ("RANKMESH_TIMEOUT", "60"),
                ];
                let start = std::time::Instant::now();
                let args = ["bench", "all_reduce", "--backend", "nccl", "-b", "8", "-e", "8", "-n", "1", "-w", "0"];
                let job = support::mpirun(2, rankmesh_bin(), &args, &env);
                let took = start.elapsed().as_secs_f64();
                let reason = "NCCL ncclCommInitRankConfig failed: unhandled cuda error (run with NCCL_DEBUG=INFO for details) (code 1): Cuda failure 'CUDA driver version is insufficient for CUDA runtime version'";
                let named = (0..2).all(|r| {
                    job.stderr
                        .lines()
                        .any(|l| l.starts_with(&format!("rankmesh: error (rank {r}): ")) && l.ends_with(reason))
                });
                let clean = !job.stderr.contains("panicked") && !job.stderr.contains("Signal:");
                (!job.ok() && named && clean && took < 30.0)
                    .then_some(())
                    .ok_or_else(|| format!("{took:.1} s\n{}", job.describe()))
            },
        );
    }
    let bench = move |np: usize, args: &[&str], extra: &[(&str, &str)]| {
        let mut all = vec!["bench"];
        all.extend_from_slice(args);
        support::mpirun(np, rankmesh_bin(), &all, &emu.env(extra))
    };
    // The asynchronous-error trials' job: 50 device all_reduces of 8 B on 2
    // ranks, whose NCCL fails after 5 calls (RANKMESH_EMU_FAIL_AFTER).
    let failing = move |extra: &[(&str, &str)]| {
        let mut env = vec![("RANKMESH_EMU_GPUS", "2"), ("RANKMESH_EMU_FAIL_AFTER", "5")];
        env.extend_from_slice(extra);
        let args = ["all_reduce", "-b", "8", "-e", "8", "-n", "50", "-w", "1"];
        bench(2, &[&args[..], &["--backend", "nccl"]].concat(), &env)
    };
    // Every tensor collective; the object plane has no device form.
    for op in rankmesh::tools::bench::entries::ALL
        .iter()
        .filter(|e| e.op != rankmesh::op::Op::BroadcastObject)
        .map(|e| e.name())
    {
        trial(
            format!("bench {op} --backend nccl, np 3, validated"),
            &mut trials,
            move || {
                let job = bench(
                    3,
                    &[
                        op,
                        "-b",
                        "8",
                        "-e",
                        "96K",
                        "-f",
                        "8",
                        "-n",
                        "3",
                        "-w",
                        "1",
                        "-c",
                        "1",
                        "-d",
                        "bfloat16",
                        "--backend",
                        "nccl",
                        "--baseline",
                        "nccl",
                    ],
                    &[("RANKMESH_EMU_GPUS", "3")],
                );
                let ok = job.ok()
                    && job.stdout.contains("# Out of bounds values : 0 OK")
                    && job.stdout.contains("raw NCCL")
                    && job.stdout.contains("rankmesh CUDA emulator")
                    && job.stdout.contains("nccl-library=22803");
                ok.then_some(()).ok_or_else(|| job.describe())
            },
        );
    }
    // The dtypes NCCL lacks or only names from 2.24, through the CLI.
    let small = move |op: &str, dtype: &str, extra: &[(&str, &str)]| {
        let mut env = vec![("RANKMESH_EMU_GPUS", "3")];
        env.extend_from_slice(extra);
        bench(
            3,
            &[
                op,
                "-b",
                "8",
                "-e",
                "4K",
                "-f",
                "8",
                "-n",
                "2",
                "-w",
                "1",
                "-c",
                "1",
                "-d",
                dtype,
                "--backend",
                "nccl",
            ],
            &env,
        )
    };
    for (op, dtype) in [
        ("all_reduce", "f8e4m3"),
        ("reduce_scatter", "f8e5m2"),
        ("all_reduce", "bool"),
        ("all_gather", "int16"),
        ("alltoall", "uint16"),
    ] {
        trial(
            format!("bench {op} -d {dtype} --backend nccl, np 3, validated"),
            &mut trials,
            move || {
                let job = small(op, dtype, &[]);
                let ok = job.ok() && job.stdout.contains("# Out of bounds values : 0 OK");
                ok.then_some(()).ok_or_else(|| job.describe())
            },
        );
    }
    trial(
        "fp8 on NCCL 2.19: moved as bytes, a reduction refused on every rank",
        &mut trials,
        move || {
            let old = [("RANKMESH_EMU_NCCL_VERSION", "21903")];
            let moved = small("all_gather", "f8e4m3", &old);
            if !(moved.ok() && moved.stdout.contains("# Out of bounds values : 0 OK")) {
                return Err(moved.describe());
            }
            let job = small("all_reduce", "f8e5m2", &old);
            fails_everywhere(&job, 3, "NCCL 2.19.3 cannot reduce f8e5m2")
        },
    );
    trial(
        "int16 reductions on the device plane: refused on every rank",
        &mut trials,
        move || {
            let job = small("all_reduce", "int16", &[]);
            fails_everywhere(&job, 3, "NCCL has no 16-bit integer type")
        },
    );
    trial(
        "bench -J on the device plane: GPU devices and the NCCL baseline",
        &mut trials,
        move || {
            let json = emu.dir.join("bench.json");
            let json_s = json.display().to_string();
            let job = bench(
                2,
                &[
                    "all_reduce",
                    "-b",
                    "1K",
                    "-e",
                    "1K",
                    "-n",
                    "2",
                    "-w",
                    "1",
                    "--backend",
                    "nccl",
                    "--baseline",
                    "nccl",
                    "-J",
                    &json_s,
                ],
                &[("RANKMESH_EMU_GPUS", "2")],
            );
            let doc: serde_json::Value = std::fs::read_to_string(&json)
                .ok()
                .and_then(|t| serde_json::from_str(&t).ok())
                .ok_or_else(|| job.describe())?;
            let row = &doc["results"][0];
            let ok = job.ok()
                && row["nccl_baseline"]["bw_ratio"].as_f64().is_some()
                && row.get("mpi_baseline").is_none()
                && doc["nccl_version"] == 22803
                && doc["config"]["devices"][1]["device"] == 1
                && doc["config"]["devices"][0]["device_info"]
                    .as_str()
                    .is_some_and(|s| s.contains("emulator"));
            ok.then_some(())
                .ok_or_else(|| format!("{doc:#}\n{}", job.describe()))
        },
    );
    trial(
        "bench --corrupt on the device plane fails validation",
        &mut trials,
        move || {
            let job = bench(
                2,
                &[
                    "all_reduce",
                    "-b",
                    "64",
                    "-e",
                    "64",
                    "-n",
                    "1",
                    "-w",
                    "0",
                    "-c",
                    "1",
                    "--backend",
                    "nccl",
                    "--corrupt",
                ],
                &[("RANKMESH_EMU_GPUS", "2")],
            );
            (!job.ok() && job.stdout.contains("# Out of bounds values : 1 FAILED"))
                .then_some(())
                .ok_or_else(|| job.describe())
        },
    );
    trial(
        "two ranks on one GPU: error on every rank before NCCL",
        &mut trials,
        move || {
            let job = bench(
                2,
                &["all_reduce", "-b", "8", "-e", "8", "--backend", "nccl"],
                &[
                    ("RANKMESH_EMU_GPUS", "1"),
                    ("RANKMESH_EMU_BUS", "0000:3B:00.0"),
                ],
            );
            fails_everywhere(
                &job,
                2,
                "group ranks 0 and 1 would share GPU 0000:3B:00.0 on node 0",
            )?;
            fails_everywhere(
                &job,
                2,
                "to test several ranks on one GPU, set RANKMESH_SHARE_GPU=1",
            )
        },
    );
    // The multi-rank GPU lease's mode (issue #64): every rank on device 0 of
    // one bus id, each its own NCCL host; the emulated NCCL refuses the
    // shared GPU unless their NCCL_HOSTIDs differ, as NCCL does.
    for np in [2, 4] {
        trial(
            format!(
                "several ranks on one GPU with RANKMESH_SHARE_GPU=1: every device check, np {np}"
            ),
            &mut trials,
            move || {
                let shared = [
                    ("RANKMESH_EMU_GPUS", "1"),
                    ("RANKMESH_EMU_BUS", "0000:3B:00.0"),
                    ("RANKMESH_SHARE_GPU", "1"),
                ];
                let mut env = emu.env(&worker);
                env.extend(shared);
                checks_passed(&support::mpirun(np, &me(), &[], &env), np)?;
                // The CLI, whose log shows the start-up warning: once, on rank 0.
                let args = ["all_reduce", "-b", "8", "-e", "64K", "-f", "64", "-n", "3"];
                let job = bench(
                    np,
                    &[&args[..], &["-w", "1", "-c", "1", "--backend", "nccl"]].concat(),
                    &shared,
                );
                let warned = job
                    .stderr
                    .matches("RANKMESH_SHARE_GPU=1: ranks may share a GPU")
                    .count();
                let validated = job.stdout.contains("# Out of bounds values : 0 OK");
                (job.ok() && validated && warned == 1)
                    .then_some(())
                    .ok_or_else(|| {
                        format!(
                            "want a validated bench and the warning once (got {warned})\n{}",
                            job.describe()
                        )
                    })
            },
        );
    }
    if support::fake_nodes_available() {
        trial(
            "one bus id on two fake nodes is two GPUs (the check is per node)",
            &mut trials,
            move || {
                let mut env = emu.env(&worker);
                env.extend([
                    ("RANKMESH_EMU_GPUS", "1"),
                    ("RANKMESH_EMU_BUS", "0000:3B:00.0"),
                ]);
                checks_passed(&support::fake_nodes("1,1", &me(), &[], &env), 2)
            },
        );
    } else {
        support::skip(
            "one bus id on two fake nodes is two GPUs (the check is per node)",
            "no UTS namespaces here",
        );
    }
    trial(
        "more ranks than GPUs: error naming both counts",
        &mut trials,
        move || {
            let job = bench(
                3,
                &["all_reduce", "--backend", "nccl"],
                &[("RANKMESH_EMU_GPUS", "2")],
            );
            fails_everywhere(
                &job,
                3,
                "3 ranks on this node but 2 CUDA devices are visible",
            )
        },
    );
    trial(
        "non-blocking creation failing: error on every rank, naming each",
        &mut trials,
        move || {
            let job = bench(
                2,
                &["all_reduce", "-b", "8", "-e", "8", "--backend", "nccl"],
                &[("RANKMESH_EMU_GPUS", "2"), ("RANKMESH_EMU_INIT_FAIL", "1")],
            );
            fails_everywhere(&job, 2, "connect on world: group ranks 0, 1: NCCL ncclCommInitRankConfig failed: unhandled system error")
        },
    );
    trial(
        "asynchronous NCCL error: abort and an error, not a hang",
        &mut trials,
        move || {
            // The error found while a wait polls, on every rank alike.
            let job = failing(&[("RANKMESH_EMU_IN_PROGRESS", "0")]);
            fails_everywhere(&job, 2, ASYNC_ERROR)
        },
    );
    trial(
        "asynchronous NCCL error found at enqueue on one rank: every rank named, at once",
        &mut trials,
        move || {
            // Calls answer ncclInProgress at random (the emulator's default),
            // so one rank finds the error settling an enqueue while its peer
            // posts more calls and finds it at a later poll. The first closes
            // its agreements, so the peer's wait for its posts ends: without
            // that, the job ended only at the leaver's 30 s grace, with one
            // rank's message. Pid-seeded draws: three runs posting to rings
            // in the shared window, two posting MPI all-gathers.
            for (run, plane) in ["auto", "auto", "auto", "mpi", "mpi"]
                .into_iter()
                .enumerate()
            {
                let start = Instant::now();
                let job = failing(&[("RANKMESH_HOST_PLANE", plane)]);
                let what = format!("run {run} (RANKMESH_HOST_PLANE={plane})");
                fails_everywhere(&job, 2, ASYNC_ERROR).map_err(|e| format!("{what}: {e}"))?;
                before_the_grace(start, &what, &job)?;
            }
            Ok(())
        },
    );
    trial(
        "NCCL error on one rank only: its peer's settle names it, no wait",
        &mut trials,
        move || {
            // Rank 1's communicator fails; rank 0's stays healthy and its
            // work waits for rank 1 forever. Rank 0 learns of it from rank
            // 1's closed posts, at its next look or synchronize: rings in the
            // shared window, then MPI all-gathers.
            for plane in ["auto", "mpi"] {
                let start = Instant::now();
                let job = failing(&[
                    ("RANKMESH_EMU_FAIL_RANK", "1"),
                    ("RANKMESH_HOST_PLANE", plane),
                ]);
                let named = |rank: usize, what: &str| {
                    job.stderr.lines().any(|l| {
                        l.starts_with(&format!("rankmesh: error (rank {rank}")) && l.contains(what)
                    })
                };
                let own = ASYNC_ERROR;
                let peer = "group rank 1 makes no device call from call #";
                // On rings rank 0 learns it only from rank 1's closed posts. Over
                // MPI the emulator may also fail rank 0's pending work first
                // (rank 1's abort ends its transfers), as NCCL's transports do.
                let zero_named = named(0, peer) || plane == "mpi" && named(0, own);
                if job.ok() || !named(1, own) || !zero_named {
                    return Err(format!(
                        "RANKMESH_HOST_PLANE={plane}: want rank 1's own error and rank 0 naming it\n{}",
                        job.describe()
                    ));
                }
                before_the_grace(start, &format!("RANKMESH_HOST_PLANE={plane}"), &job)?;
            }
            Ok(())
        },
    );
    lifecycle_trials(emu, &mut trials);
    let conclusion = libtest_mimic::run(&args, trials);
    let _ = std::fs::remove_dir_all(&emu.dir);
    conclusion.exit();
}

/// The communicator life cycle: one bootstrap per job (splits, scalable
/// roots), non-blocking creation that never finishes, an abort inside an
/// open group, and a drop while a quiet peer holds work.
fn lifecycle_trials(emu: &'static Emulator, trials: &mut Vec<Trial>) {
    trial(
        "the NCCL and CUDA emulators refuse what NCCL and the driver refuse (called directly, np 3)",
        trials,
        move || {
            let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/emulator/strict.c");
            let exe = emu.dir.join("strict");
            let built = Command::new(mpicc())
                .args(["-O1", "-Wall", "-o"])
                .arg(&exe)
                .arg(&src)
                .arg(format!("-L{}", emu.dir.display()))
                .args(["-l:libnccl.so.2", "-lcuda"])
                .output()
                .map_err(|e| e.to_string())?;
            if !built.status.success() {
                return Err(String::from_utf8_lossy(&built.stderr).into_owned());
            }
            // One host, then every rank its own NCCL_HOSTID: two ranks on one
            // GPU are refused, then allowed.
            for hosts in ["one", "distinct"] {
                let mut env = emu.env(&[("RANKMESH_EMU_GPUS", "2")]);
                if hosts == "distinct" {
                    env.push(("STRICT_HOSTS", "distinct"));
                }
                let job = support::mpirun(3, &exe, &[], &env);
                let ok = (0..3).all(|r| job.stdout.contains(&format!("STRICT-OK rank {r}")));
                if !(job.ok() && ok) {
                    return Err(format!("hosts: {hosts}\n{}", job.describe()));
                }
            }
            Ok(())
        },
    );
    let split_check = move |np: usize, nccl: &str, extra: &[(&str, &str)]| {
        let gpus = np.to_string();
        let mut env = emu.env_with(
            nccl,
            &[
                ("RANKMESH_GPU_SPLIT_CHECK", "1"),
                ("RANKMESH_EMU_GPUS", &gpus),
            ],
        );
        env.extend_from_slice(extra);
        let job = support::mpirun(np, &me(), &[], &env);
        let lines: Vec<&str> = job
            .stdout
            .lines()
            .filter(|l| l.starts_with("SPLIT-OK"))
            .collect();
        (job.ok() && lines.len() == np)
            .then_some(lines.iter().map(|l| l.to_string()).collect::<Vec<_>>())
            .ok_or_else(|| job.describe())
    };
    // World, TP, SP, DP, the mesh's two dimensions, and a group of ranks 0
    // and 1 only: seven splits of the one communicator bootstrapped by
    // connect_devices on ranks 0 and 1, six on the others (no color).
    let want = |roots: usize| {
        move |lines: Vec<String>| -> Result<(), String> {
            let ok = lines.iter().all(|l| {
                let splits =
                    if l.starts_with("SPLIT-OK rank 0 ") || l.starts_with("SPLIT-OK rank 1 ") {
                        7
                    } else {
                        6
                    };
                l.ends_with(&format!("inits 1 splits {splits} roots {roots}"))
            });
            ok.then_some(()).ok_or_else(|| lines.join("\n"))
        }
    };
    let nccl_2_18 = leak(emu.dir.join("nccl-2.18/libnccl.so.2").display().to_string());
    // Without ncclAlltoAll / ncclGather / ncclScatter (2.18): the same
    // device checks over grouped sends and receives.
    trial(
        "NCCL 2.18 (no native all-to-all, gather, scatter): topo says so, emulated device checks pass, np 3",
        trials,
        move || {
            let mut env = emu.env_with(nccl_2_18, &[("RANKMESH_EMU_GPUS", "3")]);
            let topo = support::mpirun(1, rankmesh_bin(), &["topo", "--json"], &env);
            let doc: serde_json::Value = serde_json::from_str(topo.stdout.trim())
                .map_err(|e| format!("{e}\n{}", topo.describe()))?;
            let want = serde_json::json!(["ncclCommInitRankConfig", "ncclCommFinalize", "ncclCommSplit"]);
            if doc["nccl"]["native_collectives"] != serde_json::json!([]) || doc["nccl"]["optional_entry_points"] != want {
                return Err(format!("{doc:#}"));
            }
            // The path is chosen by the symbols, not the version: reported
            // as 2.28.3, the fp8 reductions stay in the checks.
            env.extend([("RANKMESH_GPU_WORKER", "1"), ("RANKMESH_EMU_NCCL_VERSION", "22803")]);
            checks_passed(&support::mpirun(3, &me(), &[], &env), 3)
        },
    );
    for (np, lib, extra, roots, what) in [
        (4, emu.nccl.as_str(), vec![], 0, "NCCL 2.28"),
        (3, emu.nccl.as_str(), vec![], 0, "NCCL 2.28, odd world"),
        (3, nccl_2_18, vec![], 0, "NCCL 2.18"),
        (
            4,
            emu.nccl.as_str(),
            vec![("RANKMESH_NCCL_RANKS_PER_ROOT", "2")],
            2,
            "RANKMESH_NCCL_RANKS_PER_ROOT=2: ncclCommInitRankScalable from 2 roots",
        ),
    ] {
        trial(
            format!("one NCCL bootstrap per job, groups split from it ({what}), np {np}"),
            trials,
            move || split_check(np, lib, &extra).and_then(want(roots)),
        );
    }
    for (r, counter) in [("1", "registered"), ("2", "windows")] {
        trial(
            format!("bench -R {r}: buffers from ncclMemAlloc, registered ({counter}), validated, all released"),
            trials,
            move || {
                let job = support::mpirun(
                    2,
                    rankmesh_bin(),
                    &["bench", "all_reduce", "--backend", "nccl", "-b", "8", "-e", "64K", "-f", "4", "-R", r],
                    &emu.env(&[("RANKMESH_EMU_GPUS", "2"), ("RANKMESH_EMU_COUNTS", "1")]),
                );
                let counts: Vec<&str> = job.stdout.lines().filter(|l| l.starts_with("emulator counts:")).collect();
                let used = counts.iter().all(|l| {
                    l.split_whitespace()
                        .find_map(|w| w.strip_prefix(&format!("{counter}=")))
                        .and_then(|n| n.parse::<u32>().ok())
                        .is_some_and(|n| n >= 2 * 7)
                });
                let released = counts.iter().all(|l| l.ends_with(" live=0"));
                let valid = job.stdout.contains("# Out of bounds values : 0 OK");
                (job.ok() && counts.len() == 2 && used && released && valid && !job.stdout.contains("Option -R"))
                    .then_some(())
                    .ok_or_else(|| job.describe())
            },
        );
    }
    trial(
        "bench -R 2 on NCCL 2.18: the header says why, the run is unregistered and validated",
        trials,
        move || {
            let env = emu.env_with(nccl_2_18, &[("RANKMESH_EMU_GPUS", "2")]);
            let job = support::mpirun(
                2,
                rankmesh_bin(),
                &[
                    "bench",
                    "all_reduce",
                    "--backend",
                    "nccl",
                    "-b",
                    "8",
                    "-e",
                    "1K",
                    "-f",
                    "4",
                    "-R",
                    "2",
                ],
                &env,
            );
            let note = "# Option -R 2: NCCL 2.18.5 has no ncclMemAlloc (2.19) on rank 0; buffers are not registered";
            (job.ok()
                && job.stdout.lines().any(|l| l == note)
                && job.stdout.contains("# Out of bounds values : 0 OK"))
            .then_some(())
            .ok_or_else(|| job.describe())
        },
    );
    trial(
        "connect_devices without a CUDA driver: the same error on every rank, no hang",
        trials,
        move || {
            // The emulated NCCL, but no emulated libcuda on the loader path.
            let env = [
                ("RANKMESH_NCCL_LIB", emu.nccl.as_str()),
                ("RANKMESH_GPU_SPLIT_CHECK", "1"),
                ("RANKMESH_TIMEOUT", "60"),
            ];
            let job = support::mpirun(2, &me(), &[], &env);
            let named = (0..2).all(|r| {
                job.stdout.lines().any(|l| {
                    l.starts_with(&format!("SPLIT-FAILED rank {r}: "))
                        && l.contains("no CUDA driver on this host")
                })
            });
            (!job.ok() && named && !job.stderr.contains("panicked"))
                .then_some(())
                .ok_or_else(|| job.describe())
        },
    );
    trial(
        "non-blocking creation that never finishes: aborted at RANKMESH_TIMEOUT, every rank names the rank",
        trials,
        move || {
            let start = std::time::Instant::now();
            let job = support::mpirun(
                3,
                rankmesh_bin(),
                &["bench", "all_reduce", "--backend", "nccl", "-b", "8", "-e", "8"],
                &emu.env(&[
                    ("RANKMESH_EMU_GPUS", "3"),
                    ("RANKMESH_EMU_INIT_HANG", "1"),
                    ("RANKMESH_TIMEOUT", "3"),
                ]),
            );
            let took = start.elapsed().as_secs_f64();
            fails_everywhere(
                &job,
                3,
                "connect on world: group rank 1: ncclCommInitRankConfig did not finish within 3 s (RANKMESH_TIMEOUT); aborted",
            )?;
            (job.code != Some(rankmesh::error::TIMEOUT_EXIT) && took < 20.0)
                .then_some(())
                .ok_or_else(|| format!("{took:.1} s, not the watchdog's exit\n{}", job.describe()))
        },
    );
    // all_to_all on 3 ranks over NCCL 2.18 (grouped sends and receives: no
    // ncclAlltoAll) queues a send and a receive, then the refused second
    // send: aborting at once would free the communicator under the queued
    // calls that ncclGroupEnd then flushes.
    let asan_lib = leak(emu.dir.join("asan/libnccl.so.2").display().to_string());
    for asan in [false, true] {
        trial(
            format!(
                "a send refused inside an open NCCL group: the group closes before the abort{}",
                if asan {
                    " (AddressSanitizer build)"
                } else {
                    ""
                }
            ),
            trials,
            move || {
                let lib = if asan { &asan_lib } else { &nccl_2_18 };
                let mut env = emu.env_with(
                    lib,
                    &[("RANKMESH_EMU_GPUS", "3"), ("RANKMESH_EMU_FAIL_SEND", "2")],
                );
                let preload;
                if asan {
                    preload = asan_runtime()?;
                    env.extend([
                        ("LD_PRELOAD", preload.as_str()),
                        ("ASAN_OPTIONS", "detect_leaks=0"),
                    ]);
                }
                let job = support::mpirun(
                    3,
                    rankmesh_bin(),
                    &[
                        "bench",
                        "alltoall",
                        "--backend",
                        "nccl",
                        "-b",
                        "96",
                        "-e",
                        "96",
                        "-n",
                        "4",
                        "-w",
                        "0",
                    ],
                    &env,
                );
                let refused = job.stderr.contains("RANKMESH_EMU_FAIL_SEND=2");
                let misuse = emulator_objected(&job) || job.stderr.contains("AddressSanitizer");
                (!job.ok() && refused && !misuse && !job.stderr.contains("panicked"))
                    .then_some(())
                    .ok_or_else(|| job.describe())
            },
        );
    }
    for np in [2, 3] {
        trial(
            format!("groups, device results and the runtime dropped in every order, np {np}"),
            trials,
            move || {
                let gpus = np.to_string();
                let mut env = emu.env(&[("RANKMESH_GPU_DROP_ORDERS", "1")]);
                env.push(("RANKMESH_EMU_GPUS", &gpus));
                let job = support::mpirun(np, &me(), &[], &env);
                let done = (0..np)
                    .filter(|r| {
                        job.stdout
                            .contains(&format!("DROP-ORDERS rank {r} rounds 24"))
                    })
                    .count();
                let misuse = emulator_objected(&job);
                (job.ok() && done == np && !misuse)
                    .then_some(())
                    .ok_or_else(|| job.describe())
            },
        );
    }
    trial(
        "dropping a communicator while a quiet peer holds its work: finalize, then abort at RANKMESH_TIMEOUT",
        trials,
        move || {
            let job = support::mpirun(
                2,
                &me(),
                &[],
                &emu.env(&[
                    ("RANKMESH_GPU_DROP_CHECK", "1"),
                    ("RANKMESH_EMU_GPUS", "2"),
                    ("RANKMESH_EMU_STALL", "1"),
                    ("RANKMESH_TIMEOUT", "5"),
                ]),
            );
            // The drop waits RANKMESH_TIMEOUT (T = 5 s) for the finalize,
            // never less (printed to 0.1 s), then aborts: done before a
            // second T could pass, whatever the load does to the abort.
            let limit = 5.0;
            let took = job
                .stdout
                .lines()
                .find_map(|l| l.strip_prefix("DROP rank 0 after "))
                .and_then(|t| t.trim_end_matches(" s").parse::<f64>().ok());
            let loud = emulator_objected(&job);
            (job.ok() && took.is_some_and(|t| (limit - 0.1..2.0 * limit).contains(&t)) && !loud)
                .then_some(())
                .ok_or_else(|| format!("drop took {took:?} s\n{}", job.describe()))
        },
    );
}
