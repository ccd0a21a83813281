//! Stateless groups with FastVideo's usage patterns: sends and broadcasts
//! return once handed off, so "everyone sends, then everyone receives" and
//! "the source broadcasts and moves on" complete instead of deadlocking.

use rankmesh::{DType, Runtime, StatelessGroup, Tensor};

/// A message no two (sender, receiver, round) share, with non-integer floats.
fn message(from: usize, to: usize, round: usize) -> (usize, usize, Vec<f64>) {
    let x = (from * 31 + to * 7 + round) as f64;
    (from, to, vec![x / 3.0, x.sqrt(), -x / 7.0])
}

pub fn run(rt: &Runtime) {
    let (p, me) = (rt.size(), rt.rank());
    // Members in reverse order: group positions differ from world ranks.
    let ranks: Vec<usize> = (0..p).rev().collect();
    let g = StatelessGroup::create(rt, &ranks).unwrap();
    let pos = g.rank();
    assert_eq!(pos, p - 1 - me);

    // Everyone sends to everyone (itself included) twice, then receives.
    for round in 0..2 {
        for to in 0..p {
            g.send_obj(&message(pos, to, round), to).unwrap();
        }
    }
    for round in 0..2 {
        for from in (0..p).rev() {
            let got: (usize, usize, Vec<f64>) = g.recv_obj(from).unwrap();
            assert_eq!(got, message(from, pos, round));
        }
    }

    // Each source broadcasts three times in a row and moves on; the others
    // take the three in order when they get there.
    for src in 0..p {
        for k in 0..3 {
            let mine = message(src, p, k);
            let got = g.broadcast_obj((pos == src).then_some(&mine), src).unwrap();
            assert_eq!(got, mine);
        }
    }

    // Objects larger than the send buffer: one is always accepted, so
    // send-then-receive still completes.
    let mut g = g;
    g.set_send_buffer(1024);
    let big = |from: usize| vec![from as u8; 1 << 16];
    let to = (pos + 1) % p;
    let from = (pos + p - 1) % p;
    g.send_obj(&big(pos), to).unwrap();
    assert_eq!(g.recv_obj::<Vec<u8>>(from).unwrap(), big(from));

    // A receiver asking for another type or another kind of message gets an
    // error naming it, and the next message still arrives intact.
    g.send_obj(&7u32, to).unwrap();
    let e = g.recv_obj::<String>(from).unwrap_err().to_string();
    assert!(
        e.contains(&format!(
            "group rank {from} sent another type than this rank's `alloc::string::String`"
        )),
        "{e}"
    );
    g.send_obj(&8u32, to).unwrap();
    assert_eq!(g.recv_obj::<u32>(from).unwrap(), 8);
    if p > 1 {
        let src = 0;
        if pos == src {
            g.broadcast_obj(Some(&1u8), src).unwrap();
        } else {
            let e = g.recv_obj::<u8>(src).unwrap_err().to_string();
            assert!(
                e.contains("group rank 0 called broadcast_obj but this rank called send_obj"),
                "{e}"
            );
        }
        // A source without an object: an error there and on every receiver.
        let e = g.broadcast_obj::<u8>(None, src).unwrap_err().to_string();
        assert!(e.contains("no object given on the source rank"), "{e}");
    }
    // Host tensors: a ring (both send, then receive) and a broadcast; the
    // gather of everyone's object keeps group-rank order.
    let t = |r: usize| {
        Tensor::from_fn([3, 5], DType::BF16, move |i| (i * 3 + r) as f64 / 4.0 - 1.5).unwrap()
    };
    g.send_tensor(&t(pos), to).unwrap();
    assert_eq!(g.recv_tensor(from).unwrap(), t(from));
    let w = Tensor::from_fn([7], DType::F64, |i| i as f64 / 3.0).unwrap();
    let got = g
        .broadcast_tensor((pos == p - 1).then_some(&w), p - 1)
        .unwrap();
    assert_eq!(got, w);
    assert_eq!(
        g.all_gather_obj(&(pos * 10)).unwrap(),
        (0..p).map(|r| r * 10).collect::<Vec<_>>()
    );
    assert!(g.group().is_some());
    g.flush().unwrap();
    g.barrier().unwrap();
}
