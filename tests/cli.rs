//! The `rankmesh` CLI under real mpirun: `topo` output and its failures.

mod support;

use serde_json::Value;
use std::path::Path;

fn exe() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_rankmesh"))
}

fn group(start: usize, step: usize, len: usize) -> Vec<Value> {
    (0..len).map(|i| Value::from(start + i * step)).collect()
}

#[test]
fn topo_json_describes_every_rank_and_group() {
    for (np, tp, sp) in [
        (1, 1, 1),
        (2, 2, 1),
        (3, 1, 3),
        (4, 2, 2),
        (4, 4, 1),
        (4, 1, 2),
    ] {
        let job = support::mpirun(
            np,
            exe(),
            &[
                "topo",
                "--tp",
                &tp.to_string(),
                "--sp",
                &sp.to_string(),
                "--json",
            ],
            &[],
        );
        assert!(job.ok(), "np{np} tp{tp} sp{sp}: {}", job.describe());
        let docs: Vec<&str> = job
            .stdout
            .lines()
            .filter(|l| !l.trim().is_empty())
            .collect();
        assert_eq!(docs.len(), 1, "exactly one JSON document: {}", job.stdout);
        let v: Value = serde_json::from_str(docs[0]).unwrap();
        assert_eq!(v["world_size"], np);
        assert_eq!(v["nodes"], 1);
        assert_eq!(
            (v["tp"].clone(), v["sp"].clone(), v["dp"].clone()),
            (tp.into(), sp.into(), (np / sp).into())
        );
        // Key order is part of the format (serde_json::Value sorts, so read the text).
        assert!(docs[0].starts_with(r#"{"world_size":"#), "{}", docs[0]);
        assert_eq!(
            docs[0].matches(r#","groups":{"tp":["#).count(),
            np,
            "{}",
            docs[0]
        );
        assert_eq!(docs[0].matches(r#"],"sp":["#).count(), np, "{}", docs[0]);
        assert_eq!(docs[0].matches(r#"],"dp":["#).count(), np, "{}", docs[0]);
        let ranks = v["ranks"].as_array().unwrap();
        assert_eq!(ranks.len(), np);
        for (r, e) in ranks.iter().enumerate() {
            assert_eq!(e["rank"], r);
            assert_eq!(e["node"], 0);
            assert_eq!(e["local_rank"], r);
            assert_eq!(e["local_size"], np);
            assert!(!e["host"].as_str().unwrap().is_empty());
            assert_eq!(
                e["groups"]["tp"].as_array().unwrap(),
                &group(r / tp * tp, 1, tp)
            );
            assert_eq!(
                e["groups"]["sp"].as_array().unwrap(),
                &group(r / sp * sp, 1, sp)
            );
            assert_eq!(
                e["groups"]["dp"].as_array().unwrap(),
                &group(r % sp, sp, np / sp)
            );
        }
    }
}

#[test]
fn topo_table_lists_ranks() {
    let job = support::mpirun(4, exe(), &["topo", "--tp", "2", "--sp", "2"], &[]);
    assert!(job.ok(), "{}", job.describe());
    assert!(
        job.stdout
            .starts_with("4 ranks on 1 node(s): tp=2 sp=2 dp=2; NCCL"),
        "{}",
        job.stdout
    );
    assert_eq!(job.stdout.lines().count(), 6, "{}", job.stdout);
    assert!(
        job.stdout
            .lines()
            .nth(4)
            .unwrap()
            .contains("[2, 3]  [2, 3]  [0, 2]"),
        "{}",
        job.stdout
    );
}

#[test]
fn invalid_sizes_fail_on_every_rank_with_the_reason() {
    for (np, args, msg) in [
        (
            3,
            vec!["topo", "--tp", "2"],
            "world size 3 is not divisible by tensor-parallel size 2",
        ),
        (
            4,
            vec!["topo", "--sp", "3"],
            "world size 4 is not divisible by sequence-parallel size 3",
        ),
        (
            2,
            vec!["topo", "--tp", "0"],
            "tensor-parallel size must be at least 1",
        ),
        (
            4,
            vec!["topo", "--sp", "2", "--dp", "4"],
            "data-parallel size 4 contradicts world size 4 / sequence-parallel size 2 = 2",
        ),
    ] {
        let job = support::mpirun(np, exe(), &args, &[]);
        assert!(!job.ok(), "{args:?} must fail: {}", job.describe());
        assert!(
            job.stdout.trim().is_empty(),
            "nothing on stdout: {}",
            job.stdout
        );
        let lines = job
            .stderr
            .lines()
            .filter(|l| l.contains("rankmesh: error (rank ") && l.contains(msg))
            .count();
        assert!(lines >= 1, "{args:?}: {}", job.describe());
    }
}

#[test]
fn invalid_sizes_fail_in_a_singleton_too() {
    let job = support::singleton(exe(), &["topo", "--tp", "2"], &[]);
    assert_eq!(job.code, Some(1), "{}", job.describe());
    assert!(job.stderr.contains("rankmesh: error (rank 0): invalid parallel layout: world size 1 is not divisible by tensor-parallel size 2"), "{}", job.describe());
}

#[test]
fn slurm_tasks_started_as_singletons_are_an_error() {
    let job = support::singleton(exe(), &["topo"], &[("SLURM_NTASKS", "4")]);
    assert_eq!(job.code, Some(1), "{}", job.describe());
    assert!(
        job.stderr
            .contains("SLURM_NTASKS=4 but MPI reports a world of 1"),
        "{}",
        job.describe()
    );
    let srun = format!("srun --mpi={}", support::srun_mpi());
    assert!(job.stderr.contains(&srun), "{}", job.describe());
}

#[test]
fn launcher_disagreement_is_a_warning_not_an_error() {
    let job = support::singleton(exe(), &["topo", "--json"], &[("LOCAL_RANK", "3")]);
    assert!(job.ok(), "{}", job.describe());
    assert!(
        job.stderr
            .contains("torchrun: LOCAL_RANK=3 disagrees with the MPI local rank 0"),
        "{}",
        job.describe()
    );
}

#[test]
fn bad_environment_is_an_error() {
    let job = support::singleton(exe(), &["topo"], &[("RANKMESH_MAX_MESSAGE_BYTES", "lots")]);
    assert_eq!(job.code, Some(1), "{}", job.describe());
    assert!(
        job.stderr
            .contains("RANKMESH_MAX_MESSAGE_BYTES=\"lots\" is not a byte count"),
        "{}",
        job.describe()
    );
}

/// Every RANKMESH_* value is parsed with its range, the same error on every rank.
#[test]
fn out_of_range_environment_is_the_same_error_on_every_rank() {
    for (var, value, msg) in [
        ("RANKMESH_TIMEOUT", "1e99", "RANKMESH_TIMEOUT=\"1e99\" is out of range: 0 (never time out) or 0.1 ..= 31536000 seconds"),
        ("RANKMESH_TIMEOUT", "1e-9", "RANKMESH_TIMEOUT=\"1e-9\" is out of range"),
        ("RANKMESH_TIMEOUT", "-1", "RANKMESH_TIMEOUT=\"-1\" is out of range"),
        ("RANKMESH_INIT_TIMEOUT", "soon", "RANKMESH_INIT_TIMEOUT=\"soon\" is not a number of seconds"),
        ("RANKMESH_INIT_TIMEOUT", "-5", "RANKMESH_INIT_TIMEOUT=\"-5\" is out of range: 0 (never time out) or 0.1 ..= 31536000 seconds"),
        ("RANKMESH_MAX_OBJECT_BYTES", "0", "RANKMESH_MAX_OBJECT_BYTES=\"0\" is not a byte count in 1..=1099511627776"),
        ("RANKMESH_TRACE_DIR", "", "RANKMESH_TRACE_DIR is set but empty"),
        ("RANKMESH_HOST_PLANE", "fast", "RANKMESH_HOST_PLANE=\"fast\" is not one of mpi, shm, hier, auto"),
        ("RANKMESH_SHM_CHUNK_BYTES", "100", "RANKMESH_SHM_CHUNK_BYTES=\"100\" is not a byte count in 4096..=1073741824"),
        ("RANKMESH_CHECK", "lazy", "RANKMESH_CHECK=\"lazy\": expected strict, deferred or off"),
        ("RANKMESH_NCCL_RANKS_PER_ROOT", "0", "RANKMESH_NCCL_RANKS_PER_ROOT=\"0\" is not a positive whole number"),
        ("RANKMESH_MPI_CALLS", "spin", "RANKMESH_MPI_CALLS=\"spin\" is not one of auto, blocking, nonblocking"),
        ("RANKMESH_ON_HANG", "raise", "RANKMESH_ON_HANG=\"raise\" is not one of abort, error"),
        ("RANKMESH_GATHER_SHM", "yes", "RANKMESH_GATHER_SHM=\"yes\" is not 0 or 1"),
        ("RANKMESH_NCCL_FOR_ONE", "2", "RANKMESH_NCCL_FOR_ONE=\"2\" is not 0 or 1"),
        ("RANKMESH_ALLOW_SINGLETON", "yes", "RANKMESH_ALLOW_SINGLETON=\"yes\" is not 0 or 1"),
        ("RANKMESH_STATUS_ADDRS", "10.0.0.300", "RANKMESH_STATUS_ADDRS=\"10.0.0.300\" is not 1 to 4 comma-separated IPv4 addresses"),
        ("RANKMESH_STATUS_ADDRS", "1.2.3.4,1.2.3.5,1.2.3.6,1.2.3.7,1.2.3.8", "is not 1 to 4 comma-separated IPv4 addresses"),
    ] {
        let job = support::mpirun(2, exe(), &["topo"], &[(var, value)]);
        assert!(!job.ok(), "{var}={value}: {}", job.describe());
        assert_eq!(job.stderr.matches(msg).count(), 2, "{var}={value} on both ranks: {}", job.describe());
        assert!(!job.stderr.contains("panicked"), "{}", job.describe());
    }
    let job = support::singleton(exe(), &["topo"], &[("RANKMESH_LOG", "debug=loud")]);
    assert_eq!(job.code, Some(2), "{}", job.describe());
    assert!(
        job.stderr
            .contains("rankmesh: RANKMESH_LOG=\"debug=loud\" is not a log filter"),
        "{}",
        job.describe()
    );
}

/// Settings every member of a group must share, set differently on two
/// ranks (an MPMD launch): the group's creation is refused on both, each
/// naming its own value and the other rank.
#[test]
fn settings_that_differ_among_ranks_are_an_error_on_every_rank() {
    for (var, a, b) in [
        ("RANKMESH_CHECK", "strict", "off"),
        ("RANKMESH_HOST_PLANE", "mpi", "shm"),
        ("RANKMESH_NCCL_RANKS_PER_ROOT", "64", "128"),
    ] {
        let job = support::mpirun_each(exe(), &["topo"], &[&[(var, a)], &[(var, b)]]);
        assert!(!job.ok(), "{var}: {}", job.describe());
        let says = |here: &str, other: usize| {
            job.stderr.contains(&format!(
                "{var} differs among the members of world: {here} here, another value on world rank {other}"
            ))
        };
        assert!(says(a, 1) && says(b, 0), "{var}: {}", job.describe());
        assert!(!job.stderr.contains("panicked"), "{}", job.describe());
    }
}

/// `RANKMESH_HOST_PLANE=shm` on a world spanning nodes is refused at its
/// creation, with the same message on every rank.
#[test]
fn forced_shared_memory_across_nodes_is_an_error_on_every_rank() {
    if !support::fake_nodes_available() {
        support::skip(
            "forced_shared_memory_across_nodes_is_an_error_on_every_rank",
            "`unshare --uts` is not permitted here",
        );
        return;
    }
    let job = support::fake_nodes("1,2", exe(), &["topo"], &[("RANKMESH_HOST_PLANE", "shm")]);
    assert!(!job.ok(), "{}", job.describe());
    let msg = "RANKMESH_HOST_PLANE=shm: world spans nodes, and the shared-memory executor runs within one node (use auto or mpi)";
    assert_eq!(job.stderr.matches(msg).count(), 3, "{}", job.describe());
    assert!(!job.stderr.contains("panicked"), "{}", job.describe());
}

#[test]
fn topo_sees_fake_nodes() {
    if !support::fake_nodes_available() {
        support::skip(
            "topo_sees_fake_nodes",
            "`unshare --uts` is not permitted here",
        );
        return;
    }
    let job = support::fake_nodes("2,3", exe(), &["topo", "--json"], &[]);
    assert!(job.ok(), "{}", job.describe());
    let v: Value = serde_json::from_str(job.stdout.trim()).unwrap();
    assert_eq!(v["nodes"], 2);
    let nodes: Vec<u64> = v["ranks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["node"].as_u64().unwrap())
        .collect();
    assert_eq!(nodes, [0, 0, 1, 1, 1]);
    let local: Vec<(u64, u64)> = v["ranks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["local_rank"].as_u64().unwrap(),
                r["local_size"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(local, [(0, 2), (1, 2), (0, 3), (1, 3), (2, 3)]);
    assert_eq!(v["ranks"][4]["host"], "rankmesh-node1");
}

/// A stand-in libnccl exporting `ncclGetVersion` (2.20.5), built with the C
/// compiler, proves discovery through RANKMESH_NCCL_LIB end to end.
#[test]
fn nccl_library_is_discovered_and_reported() {
    let dir = std::env::temp_dir().join(format!("rankmesh-fake-nccl-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let src = dir.join("nccl.c");
    let lib = dir.join("libnccl.so.2");
    std::fs::write(
        &src,
        "int ncclGetVersion(int *v) { *v = 22005; return 0; }\n",
    )
    .unwrap();
    let cc = std::process::Command::new("cc")
        .args(["-shared", "-fPIC", "-o"])
        .arg(&lib)
        .arg(&src)
        .status()
        .unwrap();
    assert!(cc.success());
    let lib_s = lib.to_str().unwrap();
    let job = support::singleton(exe(), &["topo", "--json"], &[("RANKMESH_NCCL_LIB", lib_s)]);
    assert!(job.ok(), "{}", job.describe());
    let v: Value = serde_json::from_str(job.stdout.trim()).unwrap();
    assert_eq!(v["nccl"]["version"], "2.20.5");
    assert_eq!(v["nccl"]["path"], lib_s);
    // A forced NCCL backend says what it found and why it cannot use it: this
    // stand-in answers ncclGetVersion but has no communicator entry points.
    let job = support::singleton(
        exe(),
        &["bench", "all_reduce", "--backend", "nccl"],
        &[("RANKMESH_NCCL_LIB", lib_s)],
    );
    assert!(!job.ok());
    assert!(
        job.stderr.contains(&format!(
            "NCCL 2.20.5 at {lib_s}: does not export ncclGetUniqueId"
        )),
        "{}",
        job.describe()
    );
    // Without a library: the error lists every file it tried.
    let job = support::singleton(
        exe(),
        &["bench", "all_reduce", "--backend", "nccl"],
        &[("RANKMESH_NCCL_LIB", "/nonexistent/libnccl.so.2")],
    );
    assert!(!job.ok());
    assert!(
        job.stderr.contains("NCCL not found; tried"),
        "{}",
        job.describe()
    );
    assert!(
        job.stderr.contains("/nonexistent/libnccl.so.2: "),
        "{}",
        job.describe()
    );
    // auto falls back to the host plane with one line on stderr.
    let job = support::singleton(
        exe(),
        &[
            "bench",
            "all_reduce",
            "-b",
            "8",
            "-e",
            "8",
            "-n",
            "1",
            "-w",
            "0",
        ],
        &[("RANKMESH_NCCL_LIB", lib_s)],
    );
    assert!(job.ok(), "{}", job.describe());
    assert_eq!(
        job.stderr
            .lines()
            .filter(
                |l| l.starts_with("rankmesh bench: --backend auto: rank 0: ")
                    && l.ends_with("; using the host plane")
            )
            .count(),
        1,
        "{}",
        job.describe()
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `topo --mesh`: one JSON line whose `ranks` hold each rank's host,
/// coordinates and groups (torch's row-major order, or a Megatron order
/// string with the first name fastest).
#[test]
fn topo_mesh_json_gives_coordinates_and_groups() {
    let job = support::mpirun(
        8,
        exe(),
        &["topo", "--mesh", "pp=2,dp=2,tp=2", "--json"],
        &[],
    );
    assert!(job.ok(), "{}", job.describe());
    assert_eq!(job.stdout.lines().count(), 1, "{}", job.describe());
    assert!(job.stdout.starts_with('{'));
    let doc: Value = serde_json::from_str(&job.stdout).unwrap();
    let ranks = doc["ranks"].as_array().unwrap();
    assert_eq!(ranks.len(), 8);
    let five = &ranks[5];
    assert_eq!(five["rank"], 5);
    assert_eq!(
        five["coords"],
        serde_json::json!({"pp": 1, "dp": 0, "tp": 1})
    );
    assert_eq!(
        five["groups"],
        serde_json::json!({"pp": [1, 5], "dp": [5, 7], "tp": [4, 5]})
    );
    for (r, entry) in ranks.iter().enumerate() {
        assert_eq!(entry["groups"]["tp"], Value::from(group(r & !1, 1, 2)));
        assert_eq!(entry["groups"]["pp"], Value::from(group(r % 4, 4, 2)));
    }
    // Megatron's order: tp fastest, then dp, then pp.
    let job = support::mpirun(
        8,
        exe(),
        &[
            "topo",
            "--mesh",
            "tp=2,dp=2,pp=2",
            "--order",
            "tp-dp-pp",
            "--json",
        ],
        &[],
    );
    assert!(job.ok(), "{}", job.describe());
    let doc: Value = serde_json::from_str(&job.stdout).unwrap();
    let six = &doc["ranks"][6];
    assert_eq!(
        six["coords"],
        serde_json::json!({"tp": 0, "dp": 1, "pp": 1})
    );
    assert_eq!(
        six["groups"],
        serde_json::json!({"tp": [6, 7], "dp": [4, 6], "pp": [2, 6]})
    );
    let table = support::mpirun(4, exe(), &["topo", "--mesh", "dp=2,tp=2"], &[]);
    assert!(table.ok(), "{}", table.describe());
    assert!(table
        .stdout
        .starts_with("4 ranks on 1 node(s): mesh dp=2 tp=2\n"));
    assert!(table.stdout.contains("node "), "{}", table.stdout);
}

/// A mesh whose sizes do not fit the world, or a malformed one, fails on
/// every rank with the reason.
#[test]
fn topo_mesh_bad_sizes_fail_on_every_rank() {
    let job = support::mpirun(4, exe(), &["topo", "--mesh", "tp=2,dp=3"], &[]);
    assert_eq!(job.code, Some(1), "{}", job.describe());
    let msg = "invalid parallel layout: mesh: tp=2 × dp=3 = 6 but the world has 4 ranks";
    assert_eq!(job.stderr.matches(msg).count(), 4, "{}", job.describe());
    let job = support::mpirun(2, exe(), &["topo", "--mesh", "tp:2"], &[]);
    let d = job.describe();
    assert_eq!(job.code, Some(1), "{d}");
    assert!(job.stderr.contains("\"tp:2\" is not NAME=SIZE"), "{d}");
}

/// On fake nodes 2,2: `--intra-node tp` refuses tp groups across nodes,
/// naming the group and the hosts; without it the crossing is reported.
#[test]
fn topo_mesh_intra_node_dimensions_on_fake_nodes() {
    if !support::fake_nodes_available() {
        return support::skip(
            "topo_mesh_intra_node_dimensions_on_fake_nodes",
            "fake nodes need unshare --uts",
        );
    }
    let job = support::fake_nodes(
        "2,2",
        exe(),
        &["topo", "--mesh", "tp=2,dp=2", "--intra-node", "tp"],
        &[],
    );
    assert_eq!(job.code, Some(1), "{}", job.describe());
    assert!(
        job.stderr
            .contains("mesh: tp group [0, 2] spans nodes rankmesh-node0 and rankmesh-node1"),
        "{}",
        job.describe()
    );
    let job = support::fake_nodes("2,2", exe(), &["topo", "--mesh", "tp=2,dp=2"], &[]);
    assert!(job.ok(), "{}", job.describe());
    assert!(
        job.stdout.contains("groups crossing nodes: tp"),
        "{}",
        job.describe()
    );
    assert!(
        job.stdout.contains("node rankmesh-node1: ranks 2 3"),
        "{}",
        job.describe()
    );
}

/// A variable one rank cannot use (here rank 1's RANKMESH_TIMEOUT) is the
/// same error on every rank at start-up, naming that rank, instead of one
/// rank leaving before MPI while the others wait inside MPI_Init.
#[test]
fn a_bad_variable_on_one_rank_is_an_error_on_every_rank() {
    let start = std::time::Instant::now();
    let job = support::mpirun_each(exe(), &["topo"], &[&[], &[("RANKMESH_TIMEOUT", "soon")]]);
    assert!(!job.ok(), "{}", job.describe());
    assert!(start.elapsed().as_secs() < 30, "{}", job.describe());
    let msg = "start-up refused on one rank: rank 1: RANKMESH_TIMEOUT=\"soon\" is not a number of seconds";
    for r in 0..2 {
        assert_eq!(
            job.stderr
                .matches(&format!("rankmesh: error (rank {r}): launch: {msg}"))
                .count(),
            1,
            "rank {r}: {}",
            job.describe()
        );
    }
}

/// A library of the other MPI family first on the path (here: a preload
/// that answers `MPI_Get_library_version` as Intel MPI does, or as Open MPI
/// does for a build against the MPICH family) is refused before any other
/// MPI call, naming both, on every rank.
#[test]
fn an_mpi_library_of_another_family_is_refused_naming_both() {
    let shim = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("other_library.so");
    let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/abi/other_library.c");
    let built_for = env!("RANKMESH_MPI_HEADER");
    let open_mpi = support::open_mpi_build();
    let built = std::process::Command::new("cc")
        .args(["-shared", "-fPIC", "-Wall", "-Werror", "-o"])
        .arg(&shim)
        .arg(&src)
        .args((!open_mpi).then_some("-DOTHER_IS_OPEN_MPI"))
        .status()
        .expect("cc runs");
    assert!(built.success(), "cc {}", src.display());
    let preload = shim.display().to_string();
    let env = [("LD_PRELOAD", preload.as_str())];
    let says = if open_mpi {
        "but the MPI library loaded is \"Intel(R) MPI Library 2021.19 for Linux* OS\" (the MPICH family"
    } else {
        "but the MPI library loaded is \"Open MPI v4.1.4, package: Debian OpenMPI\" (Open MPI)"
    };
    let job = support::singleton(exe(), &["topo"], &env);
    assert!(!job.ok(), "{}", job.describe());
    assert!(
        job.stderr
            .contains(&format!("rankmesh was built against {built_for}")),
        "{}",
        job.describe()
    );
    assert!(job.stderr.contains(says), "{}", job.describe());
    assert!(
        !job.stderr.contains("panicked") && !job.stderr.contains("SIGSEGV"),
        "{}",
        job.describe()
    );
    let job = support::mpirun(2, exe(), &["topo"], &env);
    assert!(!job.ok(), "{}", job.describe());
    assert_eq!(
        job.stderr.matches(says).count(),
        2,
        "on both ranks: {}",
        job.describe()
    );
}
