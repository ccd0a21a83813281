//! The shared workspace: round trip, privacy, isolation between runs, and
//! truncated, corrupt and stale files.

use super::reference::input;
use rankmesh::Collectives as _;
use rankmesh::{DType, ReduceOp, Runtime, Tensor, Workspace};
use serde_json::json;
use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;

fn tensors_of(rank: usize) -> BTreeMap<String, Tensor> {
    BTreeMap::from([
        (
            "w".to_string(),
            input(rank, &[4, 3], DType::BF16, ReduceOp::Sum),
        ),
        (
            "b".to_string(),
            input(rank, &[3], DType::F64, ReduceOp::Sum),
        ),
        ("empty".to_string(), Tensor::zeros([0], DType::U8).unwrap()),
    ])
}

pub fn run(rt: &Runtime) {
    let g = rt.world_group().unwrap();
    let (p, me) = (g.size(), g.rank_in_group());
    let root = std::env::temp_dir().join(format!(
        "rankmesh-ws-test-{}",
        std::env::var("RANKMESH_TEST_TAG").unwrap_or_default()
    ));
    let ws = Workspace::create(&root, &g).unwrap();
    let mode = std::fs::metadata(ws.path()).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o700, "run directory is private");

    let cfg = (me != 1).then(|| json!({"rank": me, "dims": [me, 2]}));
    ws.write(cfg.as_ref(), &tensors_of(me)).unwrap();
    g.barrier().unwrap();
    for r in 0..p {
        let s = ws.read(r).unwrap().expect("every rank wrote");
        assert_eq!(
            s.config,
            (r != 1).then(|| json!({"rank": r, "dims": [r, 2]}))
        );
        assert_eq!(s.tensors, tensors_of(r));
    }
    assert!(ws.read(p + 5).unwrap().is_none(), "missing file is None");

    // A second run in the same root never sees the first run's files.
    let ws2 = Workspace::create(&root, &g).unwrap();
    assert_ne!(ws2.path(), ws.path());
    assert!(ws2.read(me).unwrap().is_none());
    g.barrier().unwrap();

    if me == 0 {
        // A file copied from the earlier run is stale, not fresh.
        std::fs::copy(ws.file_of(0), ws2.file_of(0)).unwrap();
        let e = ws2.read(0).unwrap_err().to_string();
        assert!(e.contains("stale: written by another run"), "{e}");
        // Truncated and corrupted copies of a good file.
        let good = std::fs::read(ws.file_of(0)).unwrap();
        std::fs::write(ws.file_of(0), &good[..good.len() - 3]).unwrap();
        assert!(ws
            .read(0)
            .unwrap_err()
            .to_string()
            .contains("truncated: payload has"));
        std::fs::write(ws.file_of(0), &good[..20]).unwrap();
        assert!(ws
            .read(0)
            .unwrap_err()
            .to_string()
            .contains("truncated: 20 bytes"));
        let mut bad = good.clone();
        let last = bad.len() - 1;
        bad[last] ^= 0x40;
        std::fs::write(ws.file_of(0), &bad).unwrap();
        assert!(ws
            .read(0)
            .unwrap_err()
            .to_string()
            .contains("corrupt: checksum mismatch"));
        std::fs::write(
            ws.file_of(0),
            b"not a workspace file at all, but long enough for a header......",
        )
        .unwrap();
        assert!(ws.read(0).unwrap_err().to_string().contains("bad magic"));
        // A file under another rank's name.
        std::fs::write(ws.file_of(0), &good).unwrap();
        if p > 1 {
            std::fs::copy(ws.file_of(1), ws.file_of(0)).unwrap();
            assert!(ws
                .read(0)
                .unwrap_err()
                .to_string()
                .contains("written by group rank 1, expected 0"));
        }
    }
    let (d1, d2) = (ws.path().to_path_buf(), ws2.path().to_path_buf());
    ws.remove(&g).unwrap();
    ws2.remove(&g).unwrap();
    assert!(!d1.exists() && !d2.exists());
    g.barrier().unwrap();
    if me == 0 {
        let _ = std::fs::remove_dir(&root);
    }
}
