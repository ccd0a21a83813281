//! Main-rank helpers, including their failure paths.

use rankmesh::Collectives as _;
use rankmesh::{
    helpers::is_distributed, helpers::is_local_main_process, helpers::is_main_process,
    helpers::zero_only,
};
use rankmesh::{helpers::MainRank as _, Objects as _};
use rankmesh::{Error, Runtime};
use std::cell::Cell;

#[track_caller]
fn expect_failed<T: std::fmt::Debug>(r: rankmesh::Result<T>, op: &str, rank: usize, msg: &str) {
    match r {
        Err(Error::Failed {
            op: o,
            rank: r,
            msg: m,
            ..
        }) => {
            assert_eq!((o, r, m.as_str()), (op, rank, msg));
        }
        other => panic!("expected {op} to fail on group rank {rank}, got {other:?}"),
    }
}

pub fn run(rt: &Runtime) {
    let g = rt.world_group().unwrap();
    let (p, me) = (g.size(), g.rank_in_group());
    assert_eq!(is_distributed(rt), p > 1);
    assert_eq!(is_main_process(rt), me == 0);
    assert_eq!(
        is_local_main_process(rt),
        me == 0,
        "one node: local main is rank 0"
    );

    // main_first: rank 0 runs before everybody else.
    let stamp = std::sync::atomic::AtomicUsize::new(0);
    let order: Vec<u64> = {
        let t = g
            .main_first(|| -> Result<u64, String> {
                let now = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap()
                    .as_nanos() as u64;
                if me == 0 {
                    std::thread::sleep(std::time::Duration::from_millis(50));
                }
                stamp.store(1, std::sync::atomic::Ordering::SeqCst);
                Ok(now)
            })
            .unwrap();
        g.all_gather_object(&t).unwrap()
    };
    assert!(
        order.iter().skip(1).all(|t| *t > order[0] + 40_000_000),
        "others start after rank 0 finished: {order:?}"
    );

    // main_first: rank 0 fails -> everyone errors and the others never run f.
    let ran = Cell::new(false);
    let r = g.main_first(|| -> Result<(), String> {
        ran.set(true);
        if me == 0 {
            Err("download failed".into())
        } else {
            Ok(())
        }
    });
    expect_failed(r, "main_first", 0, "download failed");
    assert_eq!(ran.get(), me == 0, "only rank 0 ran f");

    // main_first: a later rank fails -> everyone errors.
    if p > 1 {
        let r = g.main_first(|| {
            if me == p - 1 {
                Err("disk full")
            } else {
                Ok(me)
            }
        });
        expect_failed(r, "main_first", p - 1, "disk full");
    }

    // compute_and_broadcast keeps the exact value and type (axolotl goes through float32).
    let big = (1u64 << 53) + 1;
    for src in 0..p {
        let v: (u64, String) = g
            .compute_and_broadcast(
                || Ok::<_, String>((big + me as u64, format!("from {me}"))),
                src,
            )
            .unwrap();
        assert_eq!(v, (big + src as u64, format!("from {src}")));
    }
    assert_eq!(
        g.main_only(|| Ok::<_, String>(vec![0.1f64, 1e-300]))
            .unwrap(),
        vec![0.1, 1e-300]
    );
    expect_failed(
        g.main_only(|| if me == 0 { Err("no") } else { Ok(1u8) }),
        "compute_and_broadcast",
        0,
        "no",
    );
    assert!(g.compute_and_broadcast(|| Ok::<_, String>(1u8), p).is_err());

    // zero_only: world rank 0 only, nothing collective.
    let ran = Cell::new(false);
    assert_eq!(zero_only(rt, || ran.set(true)).is_some(), me == 0);
    assert_eq!(ran.get(), me == 0);

    // gather_from_all_ranks: positions are ranks.
    for dst in 0..p {
        let got = g
            .gather_from_all_ranks(|| Ok::<_, String>(format!("r{me}")), dst)
            .unwrap();
        assert_eq!(
            got,
            (me == dst).then(|| (0..p).map(|r| format!("r{r}")).collect())
        );
    }
    if p > 1 {
        let r = g.gather_from_all_ranks(|| if me == 1 { Err("bad shard") } else { Ok(me) }, 0);
        expect_failed(r, "gather_from_all_ranks", 1, "bad shard");
    }

    // reduce_and_broadcast.
    let total = g
        .reduce_and_broadcast(
            || Ok::<_, String>(me as u64 + 1),
            |v: Vec<u64>| v.iter().sum::<u64>(),
        )
        .unwrap();
    assert_eq!(total, (p * (p + 1) / 2) as u64);
    let _ = stamp;
}

/// axolotl's `zero_first(is_local_main_process())`: one rank per node runs
/// first, every other rank after all of them; failures reach every rank.
pub fn zero_first_per_node(rt: &Runtime) {
    let g = rt.world_group().unwrap();
    let me = g.rank_in_group();
    let node = rt.world().me().node;
    let nodes = rt.world().ranks.iter().map(|r| r.node).max().unwrap() + 1;
    let dir = std::env::temp_dir().join(format!("rankmesh-zero-first-{}", std::process::id()));
    let dir: std::path::PathBuf = g.broadcast_object(Some(&dir), 0).unwrap();
    std::fs::create_dir_all(&dir).unwrap();
    let marker = |n: usize| dir.join(format!("node{n}"));
    let is_main = is_local_main_process(rt);
    let seen = g
        .zero_first(is_main, || -> Result<usize, String> {
            if is_main {
                std::thread::sleep(std::time::Duration::from_millis(30));
                std::fs::write(marker(node), b"cache").map_err(|e| e.to_string())?;
            }
            Ok((0..nodes).filter(|n| marker(*n).exists()).count())
        })
        .unwrap();
    // Every other rank starts after every node's first rank finished.
    if !is_main {
        assert_eq!(seen, nodes, "rank {me} ran before every node's first rank");
    }
    let mains: Vec<bool> = g.all_gather_object(&is_main).unwrap();
    assert_eq!(mains.iter().filter(|m| **m).count(), nodes);

    // A first runner fails: every rank errors and the others never run f.
    let failing = mains.iter().rposition(|m| *m).unwrap();
    let ran = Cell::new(false);
    let r = g.zero_first(is_main, || {
        ran.set(true);
        if me == failing {
            Err("no space on node")
        } else {
            Ok(())
        }
    });
    expect_failed(r, "zero_first", failing, "no space on node");
    assert_eq!(ran.get(), is_main);
    // A later rank fails: every rank errors.
    if let Some(late) = mains.iter().rposition(|m| !*m) {
        let r = g.zero_first(is_main, || if me == late { Err("late") } else { Ok(()) });
        expect_failed(r, "zero_first", late, "late");
    }
    g.barrier().unwrap();
    if me == 0 {
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
