//! Calls longer than a data area, streamed through the shared-memory
//! executor's rings (pieces of 256 KiB or one area, whichever is smaller):
//! broadcasts, all-gathers (contiguous, strided and uneven blocks), gathers,
//! scatters and all-to-alls (even, uneven rows, FastVideo's 4-d), at sizes
//! just over one area, of the ring exactly and of several laps. The same
//! root twice in a row (its second call writes the ring while the first
//! call's readers may still be reading it), roots in turn, and calls that
//! publish only in their step headers between them. Random non-integer f32
//! values, compared bit for bit against a serial reference.

use super::reference::{assert_bits, random_f32};
use rankmesh::Collectives as _;
use rankmesh::{DType, GroupCoordinator, ReduceOp, Runtime, Tensor};

/// f32 elements: just over a data area (1 MiB, five pieces), the ring
/// exactly (2 MiB), 2.5 laps plus an odd tail.
const SIZES: [usize; 3] = [(256 << 10) + 3, (512 << 10), (1280 << 10) + 7];

pub fn run(rt: &Runtime) {
    let g = rt.world_group().unwrap();
    broadcasts(&g);
    for (call, n) in SIZES.into_iter().enumerate() {
        all_gathers(&g, call, n);
        gathers(&g, call, n);
        header_call(&g);
        scatters(&g, call, n);
        all_to_alls(&g, call, n);
    }
    uneven(&g);
    super::collectives::all_to_all_4d_shaped(&g, DType::F32, (2, 3, 2, 32 << 10));
}

/// Rank `r`'s input of call `call`: `n` random values of its own.
fn input(call: usize, r: usize, n: usize) -> Vec<f32> {
    random_f32((call as u64) << 32 | (r as u64) << 24 | n as u64, n)
}

/// A call whose data ride in the step headers.
fn header_call(g: &GroupCoordinator<'_>) {
    let one = Tensor::from_vec([1], vec![1f32]).unwrap();
    let sum = g.all_reduce(&one, ReduceOp::Sum).unwrap();
    assert_bits(
        &sum,
        &[g.size() as f32],
        "all_reduce of one f32 between streamed calls",
    );
}

fn broadcasts(g: &GroupCoordinator<'_>) {
    let (p, me) = (g.size(), g.rank_in_group());
    let roots = (0..p).flat_map(|r| [r, r]);
    for (call, root) in roots.enumerate() {
        for n in SIZES {
            let want = input(call, root, n);
            let mut t = match me == root {
                true => Tensor::from_vec([n], want.clone()).unwrap(),
                false => Tensor::from_vec([n], vec![0f32; n]).unwrap(),
            };
            g.broadcast(&mut t, root).unwrap();
            assert_bits(
                &t,
                &want,
                &format!("broadcast {call} of {n} f32 from {root}"),
            );
            if call % 2 == 1 {
                header_call(g);
            }
        }
    }
}

/// Along dim 0 (contiguous blocks of `n`) and dim 1 of `[2, n / 2]`
/// (two runs per block), twice in a row.
fn all_gathers(g: &GroupCoordinator<'_>, call: usize, n: usize) {
    let (p, me) = (g.size(), g.rank_in_group());
    let every: Vec<Vec<f32>> = (0..p).map(|r| input(call, r, n)).collect();
    for _ in 0..2 {
        let t = Tensor::from_vec([n], every[me].clone()).unwrap();
        let got = g.all_gather(&t, 0).unwrap();
        assert_bits(&got, &every.concat(), &format!("all_gather of {n} f32"));
    }
    let half = n / 2;
    let mine = every[me][..2 * half].to_vec();
    let got = g
        .all_gather(&Tensor::from_vec([2, half], mine).unwrap(), 1)
        .unwrap();
    let want: Vec<f32> = (0..2)
        .flat_map(|row| {
            (0..p)
                .flat_map(|r| &every[r][row * half..(row + 1) * half])
                .copied()
                .collect::<Vec<_>>()
        })
        .collect();
    assert_bits(
        &got,
        &want,
        &format!("all_gather along dim 1 of [2, {half}] f32"),
    );
}

fn gathers(g: &GroupCoordinator<'_>, call: usize, n: usize) {
    let (p, me) = (g.size(), g.rank_in_group());
    let every: Vec<Vec<f32>> = (0..p).map(|r| input(call + 7, r, n)).collect();
    for root in 0..p {
        let t = Tensor::from_vec([n], every[me].clone()).unwrap();
        let got = g.gather(&t, root, 0).unwrap();
        match got {
            Some(got) => assert_bits(
                &got,
                &every.concat(),
                &format!("gather of {n} f32 to {root}"),
            ),
            None => assert_ne!(me, root, "gather's root gets the result"),
        }
    }
}

fn scatters(g: &GroupCoordinator<'_>, call: usize, n: usize) {
    let (p, me) = (g.size(), g.rank_in_group());
    for root in 0..p {
        let all = input(call + 13, root, n * p);
        let sent = match me == root {
            true => all.clone(),
            false => vec![0f32; n * p],
        };
        let got = g
            .scatter(&Tensor::from_vec([n * p], sent).unwrap(), root, 0)
            .unwrap();
        assert_bits(
            &got,
            &all[me * n..(me + 1) * n],
            &format!("scatter of {n} f32 blocks from {root}"),
        );
    }
}

fn all_to_alls(g: &GroupCoordinator<'_>, call: usize, n: usize) {
    let (p, me) = (g.size(), g.rank_in_group());
    let every: Vec<Vec<f32>> = (0..p).map(|r| input(call + 19, r, n * p)).collect();
    let want: Vec<f32> = (0..p)
        .flat_map(|s| every[s][me * n..(me + 1) * n].to_vec())
        .collect();
    for _ in 0..2 {
        let t = Tensor::from_vec([n * p], every[me].clone()).unwrap();
        let got = g.all_to_all(&t).unwrap();
        assert_bits(&got, &want, &format!("all_to_all of {n} f32 blocks"));
    }
}

/// Uneven blocks: one rank's longer than an area, others short or empty,
/// so some writers' later pieces are empty. Rows of 3 f32 (12 bytes) for
/// the all-to-all, so its pieces end inside rows.
fn uneven(g: &GroupCoordinator<'_>) {
    let (p, me) = (g.size(), g.rank_in_group());
    let counts: Vec<usize> = (0..p).map(|r| [600_000, 10, 0, 300_001][r % 4]).collect();
    let every: Vec<Vec<f32>> = (0..p).map(|r| input(41, r, counts[r])).collect();
    let t = Tensor::from_vec([counts[me]], every[me].clone()).unwrap();
    let got = g.all_gather_v(&t, &counts, 0).unwrap();
    assert_bits(
        &got,
        &every.concat(),
        &format!("all_gather_v of {counts:?} f32"),
    );

    // Rows rank `s` sends rank `r`.
    let rows = |s: usize, r: usize| [100_000, 3, 0, 70_001][(s + 2 * r) % 4];
    let sc: Vec<usize> = (0..p).map(|r| rows(me, r)).collect();
    let rc: Vec<usize> = (0..p).map(|s| rows(s, me)).collect();
    let sent: Vec<Vec<f32>> = (0..p)
        .map(|s| input(43, s, 3 * (0..p).map(|r| rows(s, r)).sum::<usize>()))
        .collect();
    let t = Tensor::from_vec([sc.iter().sum(), 3], sent[me].clone()).unwrap();
    let got = g.all_to_all_v(&t, &sc, &rc).unwrap();
    let want: Vec<f32> = (0..p)
        .flat_map(|s| {
            let start: usize = (0..me).map(|r| rows(s, r)).sum();
            sent[s][3 * start..3 * (start + rows(s, me))].to_vec()
        })
        .collect();
    assert_bits(
        &got,
        &want,
        &format!("all_to_all_v of rows {sc:?} -> {rc:?}"),
    );
}
