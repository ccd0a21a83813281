//! The typed object plane against locally built expectations.

use rankmesh::Collectives as _;
use rankmesh::Objects as _;
use rankmesh::Runtime;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

#[derive(Serialize, Deserialize, Debug, PartialEq, Clone)]
struct Config {
    name: String,
    layers: Vec<u32>,
    lr: f64,
    extra: Option<BTreeMap<String, i64>>,
}

fn config_of(rank: usize) -> Config {
    Config {
        name: format!("rank-{rank}-{}", "x".repeat(rank * 5)),
        layers: (0..rank as u32 * 3).collect(),
        lr: 1.0 / (rank + 1) as f64,
        extra: (rank % 2 == 1).then(|| BTreeMap::from([("k".to_string(), -(rank as i64))])),
    }
}

pub fn run(rt: &Runtime) {
    let g = rt.world_group().unwrap();
    let (p, me) = (g.size(), g.rank_in_group());

    // FastVideo's broadcast_object_list: the source's list, length included.
    for src in 0..p {
        let mut list: Vec<(usize, f64)> = if me == src {
            (0..=src).map(|i| (i, i as f64 / 3.0)).collect()
        } else {
            vec![(99, 0.5); 7]
        };
        g.broadcast_object_list(&mut list, src).unwrap();
        assert_eq!(
            list,
            (0..=src).map(|i| (i, i as f64 / 3.0)).collect::<Vec<_>>()
        );
    }

    for src in 0..p {
        let mine = (me == src).then(|| config_of(src));
        assert_eq!(
            g.broadcast_object(mine.as_ref(), src).unwrap(),
            config_of(src)
        );
        let s: String = g
            .broadcast_object(Some(&format!("hello from {me}")), src)
            .unwrap();
        assert_eq!(s, format!("hello from {src}"));
    }

    // The in-place form: every member's value becomes the source's. Bytes
    // go straight into the receivers' vectors, shorter or longer than the
    // source's; one with the capacity is received into, not reallocated.
    for src in 0..p {
        let want: Vec<u8> = (0..1000 + 37 * src).map(|i| (i * 7 + src) as u8).collect();
        let mut v: Vec<u8> = if me == src {
            want.clone()
        } else {
            vec![0xEE; (me * 911) % 2000]
        };
        g.broadcast_object_into(&mut v, src).unwrap();
        assert_eq!(v, want, "broadcast_object_into bytes from {src}");
        let mut roomy: Vec<u8> = Vec::with_capacity(4096);
        if me == src {
            roomy.extend_from_slice(&want);
        }
        let at = roomy.as_ptr();
        g.broadcast_object_into(&mut roomy, src).unwrap();
        assert_eq!(roomy, want);
        assert_eq!(roomy.as_ptr(), at, "received into the vector's own buffer");

        let mut c = if me == src {
            config_of(src)
        } else {
            config_of(p + 3)
        };
        g.broadcast_object_into(&mut c, src).unwrap();
        assert_eq!(
            c,
            config_of(src),
            "broadcast_object_into a struct from {src}"
        );
    }
    // A source outside the group is the same error on every rank, and the
    // value is left as it was.
    let mut kept = vec![5u8; 3];
    let err = g.broadcast_object_into(&mut kept, p).unwrap_err();
    assert!(
        err.to_string()
            .contains(&format!("src {p} is not a rank of this group of size {p}")),
        "{err}"
    );
    assert_eq!(kept, [5, 5, 5]);
    if p > 1 {
        // Ranks disagreeing on the type fail alike, before bytes move.
        let err = if me == 0 {
            g.broadcast_object_into(&mut vec![1u8, 2], 0).unwrap_err()
        } else {
            g.broadcast_object_into(&mut String::new(), 0).unwrap_err()
        };
        assert!(err.to_string().contains("types differ"), "{err}");
    }

    let all = g.all_gather_object(&config_of(me)).unwrap();
    assert_eq!(all, (0..p).map(config_of).collect::<Vec<_>>());
    let empties: Vec<Vec<u8>> = g.all_gather_object(&vec![7u8; me % 2]).unwrap();
    assert_eq!(
        empties,
        (0..p).map(|r| vec![7u8; r % 2]).collect::<Vec<_>>()
    );

    for dst in 0..p {
        let got = g.gather_object(&(me as u64 * 10), dst).unwrap();
        if me == dst {
            assert_eq!(got, Some((0..p as u64).map(|r| r * 10).collect()));
        } else {
            assert_eq!(got, None);
        }
    }

    // Every ordered pair exchanges an object; lower rank sends first.
    for a in 0..p {
        for b in (0..p).filter(|b| *b != a) {
            if me == a {
                g.send_object(&config_of(a), b).unwrap();
            } else if me == b {
                assert_eq!(g.recv_object::<Config>(a).unwrap(), config_of(a));
            }
        }
    }
    // Byte vectors travel raw (no per-element encoding): every object call
    // still returns the exact bytes, empty ones included, and a byte vector
    // meeting another type is still a type error on every rank.
    let bytes =
        |r: usize, n: usize| -> Vec<u8> { (0..n).map(|i| (i * 31 + r * 7) as u8).collect() };
    for n in [0usize, 1, 4099] {
        let got: Vec<u8> = g
            .broadcast_object((me == 0).then(|| bytes(0, n)).as_ref(), 0)
            .unwrap();
        assert_eq!(got, bytes(0, n), "broadcast_object bytes n={n}");
        let all: Vec<Vec<u8>> = g.all_gather_object(&bytes(me, n)).unwrap();
        assert_eq!(all, (0..p).map(|r| bytes(r, n)).collect::<Vec<_>>());
        if p > 1 {
            if me == 0 {
                g.send_object(&bytes(0, n), 1).unwrap();
            } else if me == 1 {
                assert_eq!(g.recv_object::<Vec<u8>>(0).unwrap(), bytes(0, n));
            }
        }
    }
    if p > 1 {
        let e = if me == 0 {
            g.broadcast_object(Some(&vec![1u8, 2]), 0)
                .map(|_| ())
                .unwrap_err()
        } else {
            g.broadcast_object::<Vec<u16>>(None, 0)
                .map(|_| ())
                .unwrap_err()
        };
        assert!(e.to_string().contains("types differ"), "{e}");
    }
    g.barrier().unwrap();
}
