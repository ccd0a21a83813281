//! Launching real `mpirun` jobs from tests (through scripts/mpirun-local.sh,
//! the same launcher the demo uses), bounded in time.

#![allow(dead_code)]

use std::path::Path;
use std::process::{Command, Output};

/// Stops (or kills) this process with `sig` from a helper thread after
/// `after`: a rank body's way to fail in the middle of a call.
pub fn signal_self_after(sig: i32, after: std::time::Duration) {
    std::thread::spawn(move || {
        std::thread::sleep(after);
        // SAFETY: plain kill(2) on our own pid.
        unsafe { libc::kill(libc::getpid(), sig) };
    });
}

/// Records that `test` did not run, and why. The line goes to the
/// terminal past the harness's capture (so a passing run still shows it)
/// and into `target/test-skips.log`, which scripts/test.sh tallies. Under
/// `CI` (set and not `false`) it fails the test instead, unless
/// tests/allowed-skips.txt names it with its reason: a missing install
/// step then fails CI rather than hiding.
pub fn skip(test: &str, why: &str) {
    use std::io::Write;
    let line = format!("SKIPPED {test}: {why}\n");
    let _ = std::io::stderr().write_all(line.as_bytes());
    let log = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/test-skips.log");
    if let Ok(mut f) = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
    {
        let _ = f.write_all(line.as_bytes());
    }
    let ci = std::env::var("CI").is_ok_and(|v| !v.is_empty() && v != "false");
    let allowed = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/allowed-skips.txt"),
    )
    .unwrap_or_default()
    .lines()
    .any(|l| l.split(':').next().map(str::trim) == Some(test));
    if ci && !allowed {
        panic!(
            "{test} did not run under CI: {why}. A skip fails CI unless \
             tests/allowed-skips.txt lists the test with its reason"
        );
    }
}

/// The arguments that run one rank body of this test binary under a
/// launcher. A rank body is a `#[test]` marked
/// `#[ignore = "rank body: run under mpirun by its test"]`: the tests that
/// launch it are what pass or fail, so a plain `cargo test` lists it as
/// ignored with that reason (and scripts/test.sh's tally counts it apart)
/// instead of as a test that passed without testing.
pub fn rank_body(name: &'static str) -> [&'static str; 4] {
    ["--exact", name, "--ignored", "--nocapture"]
}

/// Seconds after which a job is killed: a hang fails the test instead of the run.
pub const JOB_TIMEOUT_S: u32 = 180;

/// Whether this build's MPI is Open MPI (else the MPICH family: MPICH,
/// Intel MPI, Cray MPICH), from the header build.rs compiled against.
pub fn open_mpi_build() -> bool {
    env!("RANKMESH_MPI_HEADER").starts_with("Open MPI")
}

/// `srun --mpi=` for this build: PMIx for Open MPI, PMI-2 for the MPICH
/// family (whose PMI client speaks PMI-1/2, not PMIx).
pub fn srun_mpi() -> &'static str {
    if open_mpi_build() {
        "pmix"
    } else {
        "pmi2"
    }
}

/// A finished job.
pub struct Job {
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
}

impl Job {
    pub fn ok(&self) -> bool {
        self.code == Some(0)
    }

    pub fn describe(&self) -> String {
        format!(
            "exit {:?}\n--- stdout\n{}\n--- stderr\n{}",
            self.code, self.stdout, self.stderr
        )
    }
}

/// `bash scripts/<script>` under `timeout`, bounded by JOB_TIMEOUT_S.
fn timed_script(script: &str) -> Command {
    timed_script_under(&[], script)
}

/// `wrapper... bash scripts/<script>` under `timeout` (a wrapper such as
/// `taskset -c 0` that the launcher and the ranks inherit).
fn timed_script_under(wrapper: &[&str], script: &str) -> Command {
    let launcher = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("scripts")
        .join(script);
    let mut cmd = Command::new("timeout");
    cmd.args([
        "--signal=TERM",
        "--kill-after=10",
        &JOB_TIMEOUT_S.to_string(),
    ])
    .args(wrapper)
    .arg("bash")
    .arg(launcher);
    cmd
}

/// Runs a launcher script from scripts/ with its own arguments, then
/// `program args`, exporting `env` to the ranks; bounded by JOB_TIMEOUT_S.
fn launch(
    script: &str,
    script_args: &[String],
    program: &Path,
    args: &[&str],
    env: &[(&str, &str)],
) -> Job {
    launch_under(&[], script, script_args, program, args, env)
}

/// [`launch`] with the launcher started by `wrapper` (see [`timed_script_under`]).
fn launch_under(
    wrapper: &[&str],
    script: &str,
    script_args: &[String],
    program: &Path,
    args: &[&str],
    env: &[(&str, &str)],
) -> Job {
    let mut cmd = timed_script_under(wrapper, script);
    cmd.args(script_args);
    for (k, _) in env {
        cmd.args(["-x", k]);
    }
    cmd.arg(program).args(args);
    for (k, v) in env {
        cmd.env(k, v);
    }
    finish(cmd.output().expect("cannot start timeout and the launcher"))
}

/// Runs `program args` on `np` local ranks with extra environment `env`.
pub fn mpirun(np: usize, program: &Path, args: &[&str], env: &[(&str, &str)]) -> Job {
    launch(
        "mpirun-local.sh",
        &["-np".into(), np.to_string()],
        program,
        args,
        env,
    )
}

/// [`mpirun`] started by `wrapper` (e.g. `taskset -c 0`: every rank
/// inherits the CPU mask).
pub fn mpirun_under(
    wrapper: &[&str],
    np: usize,
    program: &Path,
    args: &[&str],
    env: &[(&str, &str)],
) -> Job {
    launch_under(
        wrapper,
        "mpirun-local.sh",
        &["-np".into(), np.to_string()],
        program,
        args,
        env,
    )
}

/// Runs `program args` with one local rank per entry of `envs`, each with
/// its own environment (an MPMD launch: `-np 1 -x K=V PROGRAM ARGS : ...`).
pub fn mpirun_each(program: &Path, args: &[&str], envs: &[&[(&str, &str)]]) -> Job {
    let mut cmd = timed_script("mpirun-local.sh");
    for (i, env) in envs.iter().enumerate() {
        if i > 0 {
            cmd.arg(":");
        }
        cmd.args(["-np", "1"]);
        for (k, v) in env.iter() {
            cmd.arg("-x").arg(format!("{k}={v}"));
        }
        cmd.arg(program).args(args);
    }
    finish(cmd.output().expect("cannot start timeout and the launcher"))
}

/// Whether this machine can give processes their own UTS namespace (root, or
/// user namespaces allowed), which `scripts/fake-nodes.sh` needs.
pub fn fake_nodes_available() -> bool {
    Command::new("unshare")
        .args(["--uts", "true"])
        .output()
        .is_ok_and(|o| o.status.success())
}

/// Runs `program args` over fake nodes (`per_node` ranks on each, "2,3").
pub fn fake_nodes(per_node: &str, program: &Path, args: &[&str], env: &[(&str, &str)]) -> Job {
    let nodes = per_node.split(',').count();
    launch(
        "fake-nodes.sh",
        &[nodes.to_string(), per_node.to_string()],
        program,
        args,
        env,
    )
}

/// Runs `program args` as a plain process (an MPI singleton).
pub fn singleton(program: &Path, args: &[&str], env: &[(&str, &str)]) -> Job {
    let mut cmd = Command::new("timeout");
    cmd.args([
        "--signal=TERM",
        "--kill-after=10",
        &JOB_TIMEOUT_S.to_string(),
    ])
    .arg(program)
    .args(args);
    cmd.env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1");
    for (k, v) in env {
        cmd.env(k, v);
    }
    finish(cmd.output().expect("cannot start program"))
}

fn finish(out: Output) -> Job {
    Job {
        code: out.status.code(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// Whether this machine lets us create network namespaces and veth pairs
/// (root with CAP_NET_ADMIN), which `RANKMESH_FAKE_NET=1` fake nodes need.
pub fn network_namespaces_available() -> bool {
    let ns = format!("rmprobe{}", std::process::id());
    let ok = Command::new("ip")
        .args(["netns", "add", &ns])
        .output()
        .is_ok_and(|o| o.status.success());
    if ok {
        let _ = Command::new("ip").args(["netns", "del", &ns]).output();
    }
    ok && fake_nodes_available()
}

/// NCCL's real library (from its PyPI wheel, `scripts/fetch-nccl.sh`), or
/// why there is none: absent, the test is skipped, except under `CI=true`.
pub fn real_nccl() -> Option<std::path::PathBuf> {
    let lib = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join(".cache/nccl/nvidia/nccl/lib/libnccl.so.2");
    if lib.exists() {
        return Some(lib);
    }
    // libtest names a test's thread after the test.
    let test = std::thread::current()
        .name()
        .unwrap_or("real NCCL")
        .to_string();
    skip(
        &test,
        &format!("no {} (scripts/fetch-nccl.sh fetches it)", lib.display()),
    );
    None
}

/// Include directories that compile C against NCCL's real `nccl.h` and
/// CUDA's `cuda.h` (from their wheels): a scratch directory holding the
/// two-line stand-in for `cuda_runtime.h` (nccl.h needs only its stream and
/// event handle types; the real one needs nvcc's `crt/` headers) and empty
/// fp16/bf16/fp8 headers, then the wheels' include directories. `None`
/// where `real_nccl` is.
pub fn real_nccl_includes(scratch: &std::path::Path) -> Option<Vec<std::path::PathBuf>> {
    let lib = real_nccl()?;
    // .cache/nccl/nvidia/nccl/lib/libnccl.so.2 -> .cache/nccl/nvidia
    let nvidia = lib.parent()?.parent()?.parent()?.to_path_buf();
    std::fs::create_dir_all(scratch).ok()?;
    std::fs::write(
        scratch.join("cuda_runtime.h"),
        "#include <stddef.h>\ntypedef struct CUstream_st *cudaStream_t;\ntypedef struct CUevent_st *cudaEvent_t;\n",
    )
    .ok()?;
    for empty in ["cuda_fp16.h", "cuda_bf16.h", "cuda_fp8.h"] {
        std::fs::write(scratch.join(empty), "").ok()?;
    }
    Some(vec![
        scratch.to_path_buf(),
        nvidia.join("nccl/include"),
        nvidia.join("cuda_runtime/include"),
    ])
}
