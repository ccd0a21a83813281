//! The typed object plane against locally built expectations.

use rankmesh::Collectives as _;
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
    g.barrier().unwrap();
}
