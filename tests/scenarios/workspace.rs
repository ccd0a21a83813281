//! The shared workspace: round trip, privacy, isolation between runs, and
//! truncated, corrupt and stale files.

use super::reference::input;
use rankmesh::Collectives as _;
use rankmesh::Objects as _;
use rankmesh::{helpers::Workspace, DType, ReduceOp, Runtime, Tensor};
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

/// A workspace at a fixed path outlives the handle that wrote it: a later
/// opening of the same path (as by a later launch) reads every rank's file.
fn fixed_path(rt: &Runtime) {
    let g = rt.world_group().unwrap();
    let (p, me) = (g.size(), g.rank_in_group());
    // One path per job (jobs of several sizes run at once).
    let dir = std::env::temp_dir().join(format!("rankmesh-ws-fixed-{}", std::process::id()));
    let dir: std::path::PathBuf = g.broadcast_object(Some(&dir), 0).unwrap();
    let first = Workspace::at(&dir, &g).unwrap();
    assert!(first.is_initialized());
    assert_eq!(first.path(), dir.as_path());
    first.clear().unwrap();
    first
        .write(Some(&json!({"rank": me})), &tensors_of(me))
        .unwrap();
    drop(first);
    g.barrier().unwrap();
    let later = Workspace::at(&dir, &g).unwrap();
    for r in 0..p {
        let s = later.read(r).unwrap().expect("written before");
        assert_eq!(s.config, Some(json!({"rank": r})));
        assert_eq!(s.tensors, tensors_of(r));
    }
    g.barrier().unwrap();
    later.clear().unwrap();
    g.barrier().unwrap();
    assert_eq!(later.read(me).unwrap(), None, "cleared");
    let check = later.clone();
    later.remove(&g).unwrap();
    assert!(!check.is_initialized());
}

pub fn run(rt: &Runtime) {
    fixed_path(rt);
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
    let e = ws.read(p + 5).unwrap_err().to_string();
    assert!(
        e.contains(&format!("rank {} is not in the group (size {p})", p + 5)),
        "{e}"
    );

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
        let e = ws.read(0).unwrap_err().to_string();
        assert!(
            e.contains("truncated or padded: the header announces"),
            "{e}"
        );
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
    if me == 0 {
        hostile_files(&ws);
    }
    g.barrier().unwrap();
    let (d1, d2) = (ws.path().to_path_buf(), ws2.path().to_path_buf());
    ws.remove(&g).unwrap();
    ws2.remove(&g).unwrap();
    assert!(!d1.exists() && !d2.exists());
    g.barrier().unwrap();
    if me == 0 {
        let _ = std::fs::remove_dir(&root);
    }
}

/// The file format's checksum (version 2): XXH3-64 of the payload.
fn checksum(bytes: &[u8]) -> u64 {
    xxhash_rust::xxh3::xxh3_64(bytes)
}

/// A tampered workspace: links, special files, a well-formed file whose
/// shape overflows, and a temporary file left by a writer that died.
fn hostile_files(ws: &Workspace) {
    let file = ws.file_of(0);
    let good = {
        ws.write(None, &tensors_of(0)).unwrap();
        std::fs::read(&file).unwrap()
    };
    // A link to /dev/zero would be read until memory runs out.
    std::fs::remove_file(&file).unwrap();
    std::os::unix::fs::symlink("/dev/zero", &file).unwrap();
    let e = ws.read(0).unwrap_err().to_string();
    assert!(e.contains("refusing to follow a symbolic link"), "{e}");
    // A FIFO would block the reader forever.
    std::fs::remove_file(&file).unwrap();
    let c = std::ffi::CString::new(file.to_str().unwrap()).unwrap();
    // SAFETY: a valid C path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let e = ws.read(0).unwrap_err().to_string();
    assert!(e.contains("not a regular file"), "{e}");
    std::fs::remove_file(&file).unwrap();
    // Well-formed, correct checksum, but a shape of 2^124 elements.
    // The file's metadata layout: (config, [(name, dtype, shape)]).
    type Meta = (Option<String>, Vec<(String, DType, Vec<usize>)>);
    let meta: Meta = (None, vec![("x".into(), DType::F32, vec![1 << 62, 1 << 62])]);
    let payload = postcard::to_stdvec(&meta).unwrap();
    let mut forged = good[..32].to_vec(); // magic, version, rank, token
    forged.extend((payload.len() as u64).to_le_bytes());
    forged.extend((payload.len() as u64).to_le_bytes());
    forged.extend(checksum(&payload).to_le_bytes());
    forged.extend(&payload);
    std::fs::write(&file, &forged).unwrap();
    let e = ws.read(0).unwrap_err().to_string();
    assert!(
        e.contains("tensor \"x\": ") && e.contains("is too large"),
        "{e}"
    );
    // A writer killed mid-write (same host, process gone) leaves a
    // temporary file; the next write removes it, a live writer's stays.
    let host: String = mpi::environment::processor_name()
        .unwrap()
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect();
    let mut child = std::process::Command::new("true").spawn().unwrap();
    let dead = child.id();
    child.wait().unwrap();
    let stale = ws.path().join(format!(".rank-000000.{host}.{dead}.tmp"));
    let live = ws.path().join(format!(
        ".rank-000000.{host}.{}.tmp",
        std::os::unix::process::parent_id()
    ));
    std::fs::write(&stale, b"half a file").unwrap();
    std::fs::write(&live, b"in progress").unwrap();
    ws.write(None, &tensors_of(0)).unwrap();
    assert!(!stale.exists(), "a dead writer's temporary file is removed");
    assert!(live.exists(), "a live writer's temporary file is kept");
    std::fs::remove_file(&live).unwrap();
    assert_eq!(ws.read(0).unwrap().unwrap().tensors, tensors_of(0));
}
