//! All-to-alls whose blocks pass the shared-memory executor's single-copy
//! crossover (16 KiB with `RANKMESH_SINGLE_COPY=cma`): contiguous blocks,
//! FastVideo's strided 4-D blocks (runs of an odd number of bytes included) and uneven blocks, each
//! against the serial reference, beside gathers and broadcasts of the same
//! sizes (which keep the window). On one node the all-to-alls read each
//! peer's buffer straight into the output (`process_vm_readv`); with
//! `RANKMESH_SINGLE_COPY=none`, or where the kernel refuses, they move
//! through the window, and the results must be the same.

use super::collectives::all_to_all_4d_shaped;
use super::planes::check_long_blocks;
use super::reference::random_f32;
use rankmesh::Collectives as _;
use rankmesh::Objects as _;
use rankmesh::{DType, Runtime, Tensor};

pub fn run(rt: &Runtime) {
    let g = rt.world_group().unwrap();
    let (p, me) = (g.size(), g.rank_in_group());

    // Where single copies start: as set, and alike on every rank (it
    // decides the phases), whatever the start-up timing said.
    let from = rt.single_copy_from();
    match std::env::var("RANKMESH_SINGLE_COPY").as_deref() {
        Ok("cma") => assert_eq!(from, Some(16 << 10)),
        Ok("none") => assert_eq!(from, None),
        _ => {}
    }
    let every = g.all_gather_object(&from).unwrap();
    assert!(every.iter().all(|f| *f == from), "{every:?}");

    // Contiguous blocks of 1 MiB + 12 bytes of random f32, and of u8.
    let per = (1 << 18) + 3;
    let all: Vec<Vec<f32>> = (0..p).map(|r| random_f32(r as u64 + 7, p * per)).collect();
    let x = Tensor::from_vec([p * per], all[me].clone()).unwrap();
    let got = g.all_to_all(&x).unwrap();
    let want: Vec<f32> = (0..p)
        .flat_map(|s| all[s][me * per..(me + 1) * per].to_vec())
        .collect();
    assert!(
        got.as_slice::<f32>().unwrap() == want.as_slice(),
        "all_to_all of {per} f32 per block, np{p}: rank {me}'s output differs"
    );
    let per = (1 << 20) + 5;
    let byte = |s: usize, k: usize| ((s * 131 + k * 7 + k / 251) % 253) as u8;
    let x = Tensor::from_vec([p * per], (0..p * per).map(|k| byte(me, k)).collect()).unwrap();
    let got = g.all_to_all(&x).unwrap();
    let bad = (0..p * per).find(|&i| {
        let (s, k) = (i / per, i % per);
        got.as_slice::<u8>().unwrap()[i] != byte(s, me * per + k)
    });
    assert_eq!(bad, None, "all_to_all of {per} u8 per block, np{p}");

    // Strided 4-D blocks past 1 MiB: 2 × 64 runs of h·d elements; d odd
    // in bf16 makes every run an odd multiple of 2 bytes.
    all_to_all_4d_shaped(&g, DType::F32, (2, 64, 2, 1100));
    all_to_all_4d_shaped(&g, DType::BF16, (2, 64, 2, 2049));

    // Uneven blocks past 4 MiB, each of a different length.
    check_long_blocks(&g).unwrap();

    gathers_and_broadcasts(&g, p, me);

    // Links of every kind in one call: empty, through the window (under
    // 16 KiB), and read with one copy.
    let len = |s: usize, r: usize| match (s + 2 * r) % 3 {
        0 => 0,
        1 => 1000 + 7 * s + r,
        _ => 70_000 + 4099 * s + 13 * r,
    };
    let byte = |s: usize, k: usize| ((s * 37 + k * 11 + k / 253) % 249) as u8;
    let send: Vec<usize> = (0..p).map(|r| len(me, r)).collect();
    let recv: Vec<usize> = (0..p).map(|s| len(s, me)).collect();
    let total: usize = send.iter().sum();
    let x = Tensor::from_vec([total], (0..total).map(|k| byte(me, k)).collect()).unwrap();
    let got = g.all_to_all_v(&x, &send, &recv).unwrap();
    let mut at = 0;
    for (s, n) in recv.iter().enumerate() {
        let first: usize = (0..me).map(|r| len(s, r)).sum();
        let want = (first..first + n).map(|k| byte(s, k));
        assert!(
            got.as_slice::<u8>().unwrap()[at..at + n]
                .iter()
                .copied()
                .eq(want),
            "np{p} rank {me}: the mixed block from {s} differs"
        );
        at += n;
    }
}

/// all_gather (dims 0 and 1), gather to the last rank, broadcast from it
/// and an uneven all_gather_v, on random f32 with odd lengths.
fn gathers_and_broadcasts(g: &rankmesh::GroupCoordinator<'_>, p: usize, me: usize) {
    let per = 70_001;
    let all: Vec<Vec<f32>> = (0..p).map(|r| random_f32(r as u64 + 31, per)).collect();
    let x = Tensor::from_vec([per], all[me].clone()).unwrap();
    let got = g.all_gather(&x, 0).unwrap();
    assert!(
        got.as_slice::<f32>().unwrap() == all.concat().as_slice(),
        "all_gather of {per} f32, np{p}: rank {me}'s output differs"
    );
    let last = p - 1;
    let gathered = g.gather(&x, last, 0).unwrap();
    assert_eq!(gathered.is_some(), me == last, "np{p} rank {me}");
    if let Some(t) = gathered {
        assert!(
            t.as_slice::<f32>().unwrap() == all.concat().as_slice(),
            "gather of {per} f32 to rank {last}, np{p}: the output differs"
        );
    }

    // Along dim 1: each block is 4 runs of 4099 f32 (16 396 bytes).
    let (rows, cols) = (4, 4099);
    let x = Tensor::from_vec([rows, cols], all[me][..rows * cols].to_vec()).unwrap();
    let got = g.all_gather(&x, 1).unwrap();
    assert_eq!(got.shape(), &[rows, cols * p]);
    let want: Vec<f32> = (0..rows)
        .flat_map(|i| (0..p).flat_map(move |s| (0..cols).map(move |j| (s, i * cols + j))))
        .map(|(s, k)| all[s][k])
        .collect();
    assert!(
        got.as_slice::<f32>().unwrap() == want.as_slice(),
        "all_gather along dim 1 of [{rows}, {cols}] f32, np{p}: rank {me}'s output differs"
    );

    let n = 300_007;
    let source = random_f32(97, n);
    let mut t = match me == last {
        true => Tensor::from_vec([n], source.clone()).unwrap(),
        false => Tensor::from_vec([n], vec![f32::NAN; n]).unwrap(),
    };
    g.broadcast(&mut t, last).unwrap();
    assert!(
        t.as_slice::<f32>().unwrap() == source.as_slice(),
        "broadcast of {n} f32 from rank {last}, np{p}: rank {me}'s copy differs"
    );

    // Uneven: empty blocks, blocks under the crossover and over it.
    let count = |s: usize| match s % 3 {
        0 => 0,
        1 => 1001,
        _ => 9000 + s,
    };
    let counts: Vec<usize> = (0..p).map(count).collect();
    let x = Tensor::from_vec([count(me)], all[me][..count(me)].to_vec()).unwrap();
    let got = g.all_gather_v(&x, &counts, 0).unwrap();
    let want: Vec<f32> = (0..p).flat_map(|s| all[s][..count(s)].to_vec()).collect();
    assert!(
        got.as_slice::<f32>().unwrap() == want.as_slice(),
        "all_gather_v of {counts:?} f32, np{p}: rank {me}'s output differs"
    );
}
