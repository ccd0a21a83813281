//! The candle example (examples/candle-tp) through scripts/candle-tp.sh on 2
//! and 4 ranks: the tensor-parallel MLP block equals the single-process block
//! within f32 tolerance. The example builds in a target directory of its own
//! (a cargo inside `cargo test` must not wait on the outer one's lock).

use std::path::Path;
use std::process::Command;

#[test]
fn tensor_parallel_mlp_matches_the_single_process_block() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let target = std::env::var("CARGO_TARGET_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|_| root.join("target"))
        .join("candle-tp");
    for np in ["2", "4"] {
        let out = Command::new("bash")
            .arg(root.join("scripts/candle-tp.sh"))
            .args([np, "4", "96", "384"])
            .env("CARGO_TARGET_DIR", &target)
            .current_dir(root)
            .output()
            .expect("bash runs");
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        let line = stdout
            .lines()
            .find(|l| l.starts_with("candle-tp:"))
            .unwrap_or_default();
        assert!(
            out.status.success() && line.contains(&format!("{np} ranks")),
            "np {np}: {}\n{stdout}\n{stderr}",
            out.status
        );
        println!("{line}");
    }
}
