//! `rankmesh doctor` under real mpirun, at the settings a user gets: a
//! healthy job passes; on fake nodes with their own network namespaces, a
//! node whose link is rate-limited (`tc` tbf), to half the healthy rate or
//! far below it, is named alone and the run exits non-zero.
//!
//! This machine runs up to five ranks on two cores: pairs measured in the
//! same round share its cores and fall to 0.5–0.75 of the median, which is
//! what the doctor's retakes alone are for.

mod support;

use std::path::Path;

fn exe() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_rankmesh"))
}

fn temp(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("rankmesh-doctor-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

#[test]
fn a_healthy_single_node_job_passes_and_reports_every_pair() {
    let json = temp("local.json");
    let job = support::mpirun(3, exe(), &["doctor", "-J", json.to_str().unwrap()], &[]);
    assert!(job.ok(), "{}", job.describe());
    assert!(job.stdout.contains("3 ranks on 1 nodes"), "{}", job.stdout);
    assert!(job
        .stdout
        .contains("reach: every rank answered every other"));
    assert!(job.stdout.contains("verdict: OK"));
    let doc: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let m = &doc["measurements"];
    assert_eq!(m["reach"].as_array().unwrap().len(), 3, "pairs of 3 ranks");
    assert_eq!(m["intra_node"].as_array().unwrap().len(), 3);
    assert!(m["nodes"][0]["all_reduce_busbw"].as_f64().unwrap() > 0.0);
    assert!(m["intra_node"]
        .as_array()
        .unwrap()
        .iter()
        .all(|p| p["bandwidth_gbs"].as_f64().unwrap() > 0.0));
    assert_eq!(doc["verdict"], "OK");
}

#[test]
fn bad_arguments_are_refused_on_every_rank() {
    for (args, msg) in [
        (
            &["doctor", "--threshold", "2"][..],
            "--threshold 2: a fraction",
        ),
        (
            &["doctor", "--bytes", "0"][..],
            "--bytes \"0\": a size from 1 to 1G",
        ),
        (&["doctor", "--reps", "0"][..], "--reps must be at least 1"),
        (
            &["doctor", "--deadline", "0"][..],
            "--deadline 0: seconds in (0, 86400]",
        ),
    ] {
        let job = support::mpirun(2, exe(), args, &[]);
        assert!(!job.ok(), "{args:?}: {}", job.describe());
        assert_eq!(
            job.stderr.matches(msg).count(),
            2,
            "{args:?}: {}",
            job.describe()
        );
    }
}

#[test]
fn a_rate_limited_node_is_named_and_fails_the_run() {
    if !support::network_namespaces_available() {
        support::skip(
            "a_rate_limited_node_is_named_and_fails_the_run",
            "network namespaces are not permitted here",
        );
        return;
    }
    let doctor = |svg: &Path, json: &Path, slow: Option<&str>| {
        let mut env = vec![("RANKMESH_FAKE_NET", "1")];
        if let Some(s) = slow {
            env.push(("RANKMESH_FAKE_SLOW", s));
        }
        let args = [
            "doctor",
            "--svg",
            svg.to_str().unwrap(),
            "-J",
            json.to_str().unwrap(),
        ];
        support::fake_nodes("1,2,1,1", exe(), &args, &env)
    };
    let json = temp("healthy.json");
    let healthy = doctor(&temp("healthy.svg"), &json, None);
    assert!(healthy.ok(), "{}", healthy.describe());
    assert!(
        healthy.stdout.contains("5 ranks on 4 nodes"),
        "{}",
        healthy.stdout
    );
    assert!(healthy.stdout.contains("verdict: OK"));
    let doc: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let mut links: Vec<f64> = doc["measurements"]["inter_node"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["bandwidth_gbs"].as_f64().unwrap())
        .collect();
    assert_eq!(links.len(), 6, "{doc}");
    links.sort_by(f64::total_cmp);
    let healthy_mbit = (links[2] + links[3]) / 2.0 * 8e3;

    // Half the healthy rate, then far below it: node 2 alone, both times.
    let half = format!("2:{}mbit", (healthy_mbit / 2.0) as u64);
    for slow in [half.as_str(), "2:100mbit"] {
        let svg = temp("slow.svg");
        let run = doctor(&svg, &temp("slow.json"), Some(slow));
        assert!(!run.ok(), "{slow}: {}", run.describe());
        assert!(
            run.stdout.contains("verdict: FAILED"),
            "{slow}: {}",
            run.stdout
        );
        let findings: Vec<&str> = run
            .stdout
            .lines()
            .skip_while(|l| !l.starts_with("verdict"))
            .skip(1)
            .collect();
        assert_eq!(
            findings.len(),
            1,
            "{slow}: only the slow node: {}",
            run.stdout
        );
        assert!(
            findings[0].contains("node 2 (rankmesh-node2)") && findings[0].contains("alone"),
            "{slow}: {}",
            run.stdout
        );
        assert!(
            run.stderr
                .contains("doctor on world: 1 finding(s): node 2 (rankmesh-node2)"),
            "{slow}: {}",
            run.describe()
        );
        let text = std::fs::read_to_string(&svg).unwrap();
        let doc = roxmltree::Document::parse(&text).expect("well-formed SVG");
        let red = doc
            .descendants()
            .filter(|n| n.attribute("fill") == Some("#e06666"))
            .count();
        assert_eq!(red, 6, "{slow}: node 2's row and column: 3 links each way");
    }
}

/// With the real NCCL and no GPU: one line that says so and names the
/// library found, and nothing flagged.
#[test]
fn without_gpus_the_device_check_is_one_line_naming_the_real_library() {
    let Some(lib) = support::real_nccl() else {
        return;
    };
    let lib = lib.to_str().unwrap();
    let job = support::mpirun(2, exe(), &["doctor"], &[("RANKMESH_NCCL_LIB", lib)]);
    assert!(job.ok(), "{}", job.describe());
    let lines: Vec<&str> = job
        .stdout
        .lines()
        .filter(|l| l.starts_with("devices"))
        .collect();
    assert_eq!(lines.len(), 1, "{}", job.stdout);
    assert!(
        lines[0].starts_with("devices: no GPU on any rank (rank 0: ")
            && lines[0].ends_with(&format!("; NCCL 2.32.3 ({lib})")),
        "{}",
        job.stdout
    );
    assert!(job.stdout.contains("verdict: OK"), "{}", job.stdout);
}
