//! The `slurm/` scripts and `srun` launches under a real one-node Slurm
//! (scripts/local-slurm.sh: munged, slurmctld, slurmd on loopback). Where
//! Slurm cannot run (not root, packages missing) every trial is reported as
//! ignored with the reason, never passed silently.

mod support;

use libtest_mimic::{Arguments, Failed, Trial};
use std::path::{Path, PathBuf};
use std::process::Command;

const TIMEOUT_S: &str = "180";

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn exe() -> &'static str {
    env!("CARGO_BIN_EXE_rankmesh")
}

struct Cluster {
    conf: String,
    state: PathBuf,
    work: PathBuf,
}

impl Cluster {
    fn command(&self, program: &str) -> Command {
        let mut c = Command::new("timeout");
        c.args(["--signal=TERM", "--kill-after=10", TIMEOUT_S, program])
            .env("SLURM_CONF", &self.conf)
            // srun's --mpi, and the slurm/ scripts' (`${SLURM_MPI_TYPE:-pmix}`).
            .env("SLURM_MPI_TYPE", support::srun_mpi())
            .current_dir(&self.work);
        c
    }

    /// Submits a `slurm/` script, waits for it, returns its output file's text.
    fn sbatch(&self, script: &str, exports: &str) -> Result<String, Failed> {
        let out = self
            .command("sbatch")
            .args([
                "--wait",
                "--parsable",
                &format!("--export=ALL,RANKMESH_BIN={},{exports}", exe()),
            ])
            .arg(repo().join("slurm").join(script))
            .output()
            .map_err(|e| Failed::from(e.to_string()))?;
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        let job = stdout.trim().split(';').next().unwrap_or("").to_string();
        let prefix = script.trim_end_matches(".sbatch").replace("tp-sp-", "");
        let file = self.work.join(format!("rankmesh-{prefix}-{job}.out"));
        let text = std::fs::read_to_string(&file).unwrap_or_default();
        if !out.status.success() {
            return Err(format!(
                "sbatch {script} failed ({:?}): {stderr}\n{text}",
                out.status.code()
            )
            .into());
        }
        Ok(text)
    }
}

fn start() -> Result<Cluster, String> {
    let state = std::env::temp_dir().join(format!("rankmesh-slurm-test-{}", std::process::id()));
    let work = state.with_extension("work");
    std::fs::create_dir_all(&work).map_err(|e| e.to_string())?;
    let port = (17000 + std::process::id() % 1000 * 2).to_string();
    let out = Command::new("bash")
        .arg(repo().join("scripts/local-slurm.sh"))
        .arg("start")
        .env("RANKMESH_SLURM_DIR", &state)
        .env("RANKMESH_SLURM_PORT", &port)
        .output()
        .map_err(|e| e.to_string())?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        return Err(format!(
            "local Slurm did not start: {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    let conf = stdout
        .trim()
        .strip_prefix("export SLURM_CONF=")
        .ok_or("no SLURM_CONF printed")?
        .to_string();
    Ok(Cluster { conf, state, work })
}

fn stop(c: &Cluster) {
    let _ = Command::new("bash")
        .arg(repo().join("scripts/local-slurm.sh"))
        .arg("stop")
        .env("RANKMESH_SLURM_DIR", &c.state)
        .output();
    let _ = std::fs::remove_dir_all(&c.work);
}

fn check(ok: bool, what: &str, text: &str) -> Result<(), Failed> {
    if ok {
        Ok(())
    } else {
        Err(format!("{what}:\n{text}").into())
    }
}

fn main() {
    let args = Arguments::from_args();
    let available = Command::new("bash")
        .arg(repo().join("scripts/local-slurm.sh"))
        .arg("check")
        .output()
        .map(|o| {
            (
                o.status.success(),
                String::from_utf8_lossy(&o.stderr).into_owned(),
            )
        });
    let (cluster, why) = match available {
        Ok((true, _)) => match start() {
            Ok(c) => (Some(c), String::new()),
            Err(e) => (None, e),
        },
        Ok((false, why)) => (None, why),
        Err(e) => (None, e.to_string()),
    };
    if cluster.is_none() {
        support::skip(
            "slurm (every trial, marked ignored)",
            &format!("the local Slurm did not start: {}", why.trim()),
        );
    }
    let c = std::sync::Arc::new(cluster);
    let ignored = c.is_none();
    let trial = |name: &str, f: fn(&Cluster) -> Result<(), Failed>| {
        let c = c.clone();
        Trial::test(name, move || f(c.as_ref().as_ref().expect("cluster is up")))
            .with_ignored_flag(ignored)
    };
    let trials = vec![
        trial("srun_is_one_world", |c| {
            let out = c
                .command("srun")
                .args(["-n", "2", exe(), "topo", "--json"])
                .output()?;
            let text = String::from_utf8_lossy(&out.stdout).into_owned();
            check(
                out.status.success() && text.contains(r#""world_size":2,"nodes":1"#),
                "srun topo",
                &text,
            )
        }),
        trial("srun_reports_bad_sizes_from_every_rank", |c| {
            let out = c
                .command("srun")
                .args(["-n", "2", exe(), "topo", "--tp", "3"])
                .output()?;
            let err = String::from_utf8_lossy(&out.stderr).into_owned();
            let lines = err
                .matches("not divisible by tensor-parallel size 3")
                .count();
            check(
                !out.status.success() && lines == 2,
                "both ranks report the error",
                &err,
            )
        }),
        // A rank killed mid-call under srun without --kill-on-bad-exit (srun
        // then waits for the others): its peer names it gone within seconds,
        // not at RANKMESH_TIMEOUT (600 s by default).
        trial("srun_kill9_is_named_within_seconds", |c| {
            let script = format!(
                "if [ \"$SLURM_PROCID\" = 1 ]; then (sleep 2; kill -9 $$) & fi; \
                 exec {} bench all_reduce -b 8 -e 8 -n 100000000 -w 0 -c 0 --backend host",
                exe()
            );
            let start = std::time::Instant::now();
            let out = c
                .command("srun")
                .args(["-n", "2", "bash", "-c", &script])
                .env_remove("RANKMESH_TIMEOUT")
                .output()?;
            let took = start.elapsed().as_secs_f64();
            let err = String::from_utf8_lossy(&out.stderr).into_owned();
            check(
                !out.status.success()
                    && took < 15.0
                    && err.contains("cannot complete: group rank 1 (world rank 1, host ")
                    && err.contains("is gone: its process (pid "),
                &format!("rank 0 names the killed rank 1 (ended after {took:.1} s)"),
                &err,
            )
        }),
        trial("sbatch_topo", |c| {
            let text = c.sbatch("topo.sbatch", "TP=2")?;
            check(
                text.starts_with("2 ranks on 1 node(s): tp=2 sp=1 dp=2; NCCL")
                    && text.lines().count() == 4,
                "topo output",
                &text,
            )
        }),
        trial("sbatch_mesh", |c| {
            let text = c.sbatch("mesh.sbatch", "INTRA_NODE=tp")?;
            let header = text.lines().next();
            let ok = header == Some("2 ranks on 1 node(s): mesh pp=1 dp=1 tp=2");
            check(ok && text.contains("[0, 1]"), "mesh table", &text)
        }),
        trial("sbatch_bench", |c| {
            let text = c.sbatch(
                "bench.sbatch",
                "COLLECTIVES=all_reduce all_gather,SWEEP=-b 64 -e 4K -f 4 -n 3 -w 1",
            )?;
            let rows = text
                .lines()
                .filter(|l| l.trim_start().starts_with(|ch: char| ch.is_ascii_digit()))
                .count();
            check(
                rows == 8 && text.matches("# Out of bounds values : 0 OK").count() == 2,
                "two sweeps of 4 sizes",
                &text,
            )?;
            let json = std::fs::read_dir(&c.work)?
                .flatten()
                .filter(|e| {
                    let n = e.file_name().to_string_lossy().into_owned();
                    n.starts_with("rankmesh-bench-") && n.ends_with(".json")
                })
                .count();
            check(json == 2, "one JSON file per collective", &text)
        }),
        trial("sbatch_doctor", |c| {
            let text = c.sbatch("doctor.sbatch", "DOCTOR_FLAGS=")?;
            check(
                text.starts_with("rankmesh doctor: 2 ranks on 1 nodes")
                    && text.contains("verdict: OK"),
                "doctor report",
                &text,
            )?;
            let files: Vec<String> = std::fs::read_dir(&c.work)?
                .flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with("rankmesh-doctor-"))
                .collect();
            check(
                files.iter().any(|n| n.ends_with(".json"))
                    && files.iter().any(|n| n.ends_with(".svg")),
                "doctor JSON and heatmap",
                &files.join(" "),
            )
        }),
        trial("sbatch_tp_sp_workload", |c| {
            let text = c.sbatch("tp-sp-workload.sbatch", "TP=2,SP=2,STEPS=3,TOKENS=16")?;
            check(
                text.starts_with("workload OK: 2 ranks on 1 node(s), tp=2 sp=2, 3 steps"),
                "workload output",
                &text,
            )
        }),
    ];
    let conclusion = libtest_mimic::run(&args, trials);
    if let Some(cluster) = c.as_ref() {
        stop(cluster);
    }
    conclusion.exit();
}
