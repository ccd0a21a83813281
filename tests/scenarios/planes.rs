//! Scenarios written once against the `Collectives` trait: each collective
//! against the serial reference, on whichever data plane runs them — the
//! host group here (mpi_ranks), the device group in tests/gpu.rs (the
//! emulators in CI, a real GPU with scripts/gpu-check.sh).

use super::reference::{concat, input, random_f32, reduced, slice, values};
use rankmesh::{
    op::CheckMode, Collectives, DType, DeviceGroup, DeviceTensor, GroupCoordinator, P2p, ReduceOp,
    Tensor,
};

/// A data plane as the scenarios drive it: its collectives plus moving
/// tensors between the host and the plane.
pub trait Plane<'rt>: Collectives<'rt> {
    /// A plane tensor holding `t`.
    fn put(&self, t: &Tensor) -> Result<Self::Tensor, String>;
    /// `t` on the host, once the plane's work is done.
    fn get(&self, t: &Self::Tensor) -> Result<Tensor, String>;
}

impl<'rt> Plane<'rt> for GroupCoordinator<'rt> {
    fn put(&self, t: &Tensor) -> Result<Tensor, String> {
        Ok(t.clone())
    }

    fn get(&self, t: &Tensor) -> Result<Tensor, String> {
        Ok(t.clone())
    }
}

impl<'rt> Plane<'rt> for DeviceGroup<'_, 'rt> {
    fn put(&self, t: &Tensor) -> Result<DeviceTensor, String> {
        self.gpu().upload(t).map_err(|e| e.to_string())
    }

    fn get(&self, t: &DeviceTensor) -> Result<Tensor, String> {
        self.gpu().download(t).map_err(|e| e.to_string())
    }
}

fn e(x: rankmesh::Error) -> String {
    x.to_string()
}

/// `got` against the reference `want` of `shape`: exact for integers, one
/// rounding of the dtype for floats (relative to max(|want|, 1) for `avg`,
/// which NCCL computes by scaling before summing).
fn close(got: &Tensor, shape: &[usize], want: &[f64], avg: bool, ctx: &str) -> Result<(), String> {
    if got.shape() != shape {
        return Err(format!(
            "{ctx}: shape {:?}, expected {shape:?}",
            got.shape()
        ));
    }
    let tol = match got.dtype() {
        DType::F16 => 1e-3,
        DType::BF16 => 8e-3,
        DType::F32 => 1e-6,
        DType::F64 => 1e-12,
        _ => 0.0,
    };
    for (i, (g, w)) in got.to_f64_vec().iter().zip(want).enumerate() {
        let scale = if avg { w.abs().max(1.0) } else { w.abs() };
        if (g - w).abs() > tol * scale {
            return Err(format!("{ctx}: element {i} is {g}, expected {w}"));
        }
    }
    Ok(())
}

/// Every collective of the trait on `c` against the serial reference.
pub fn check_all<'rt, C: Plane<'rt>>(c: &C) -> Result<(), String> {
    let g = c.group();
    let (p, me) = (g.size(), g.rank_in_group());
    let sum = ReduceOp::Sum;
    for dtype in [DType::F32, DType::BF16, DType::I32] {
        let shape = [2usize, 3];
        let n = 6;
        for op in [ReduceOp::Sum, ReduceOp::Max, ReduceOp::Avg] {
            let x = c.put(&input(me, &shape, dtype, op))?;
            let want = reduced(p, n, dtype, op);
            let avg = op == ReduceOp::Avg;
            let ctx = format!("all_reduce {op:?} {dtype} np{p} on {}", g.name());
            close(
                &c.get(&c.all_reduce(&x, op).map_err(e)?)?,
                &shape,
                &want,
                avg,
                &ctx,
            )?;
            let mut y = c.put(&input(me, &shape, dtype, op))?;
            c.all_reduce_in_place(&mut y, op).map_err(e)?;
            close(&c.get(&y)?, &shape, &want, avg, &format!("in-place {ctx}"))?;
        }

        let parts: Vec<Vec<f64>> = (0..p).map(|r| values(r, n, dtype, sum)).collect();
        let x = c.put(&input(me, &shape, dtype, sum))?;
        for dim in [0usize, 1] {
            let (want_shape, want) = concat(&parts, &shape, dim);
            let ctx = format!("all_gather dim {dim} {dtype} np{p}");
            let got = c.get(&c.all_gather(&x, dim as isize - 2).map_err(e)?)?;
            close(&got, &want_shape, &want, false, &ctx)?;
            for root in 0..p {
                let got = c.gather(&x, root, dim as isize).map_err(e)?;
                match got {
                    Some(t) if me == root => close(
                        &c.get(&t)?,
                        &want_shape,
                        &want,
                        false,
                        &format!("gather {ctx}"),
                    )?,
                    None if me != root => {}
                    _ => return Err(format!("gather to {root}: result on the wrong rank")),
                }
            }
            // scatter and reduce_scatter split `dim` of a p-times bigger tensor.
            let mut big = shape.to_vec();
            big[dim] *= p;
            let xb = c.put(&input(me, &big, dtype, sum))?;
            for root in 0..p {
                let full = values(root, n * p, dtype, sum);
                let (s, want) = slice(&full, &big, dim, me, p);
                let got = c.get(&c.scatter(&xb, root, dim as isize).map_err(e)?)?;
                close(
                    &got,
                    &s,
                    &want,
                    false,
                    &format!("scatter from {root} dim {dim} {dtype} np{p}"),
                )?;
            }
            let (s, want) = slice(&reduced(p, n * p, dtype, sum), &big, dim, me, p);
            let got = c.get(&c.reduce_scatter(&xb, dim as isize, sum).map_err(e)?)?;
            close(
                &got,
                &s,
                &want,
                false,
                &format!("reduce_scatter dim {dim} {dtype} np{p}"),
            )?;
        }

        for root in 0..p {
            let mut t = c.put(&input(me, &shape, dtype, sum))?;
            c.broadcast(&mut t, root).map_err(e)?;
            let ctx = format!("broadcast from {root} {dtype} np{p}");
            close(
                &c.get(&t)?,
                &shape,
                &values(root, n, dtype, sum),
                false,
                &ctx,
            )?;
        }

        // all_to_all: block r of the output is block `me` of rank r's input.
        let a2a = [2 * p, 3];
        let x = c.put(&input(me, &a2a, dtype, sum))?;
        let want: Vec<f64> = (0..p)
            .flat_map(|r| values(r, 6 * p, dtype, sum)[me * 6..(me + 1) * 6].to_vec())
            .collect();
        let got = c.get(&c.all_to_all(&x).map_err(e)?)?;
        close(
            &got,
            &a2a,
            &want,
            false,
            &format!("all_to_all {dtype} np{p}"),
        )?;
    }
    check_batch(c)?;
    check_uneven(c)
}

/// `batch_send_recv`: a ring (two tensors each way, receives posted first on
/// odd members), a pipeline step (activations forward, gradients back), and
/// a pair whose sizes differ: an error on both ends naming both, while the
/// batch's other pair still moves. Random non-integer data.
fn check_batch<'rt, C: Plane<'rt>>(c: &C) -> Result<(), String> {
    let g = c.group();
    let (p, me) = (g.size(), g.rank_in_group());
    if p < 2 {
        return Ok(());
    }
    let sum = ReduceOp::Sum;
    let (next, prev) = ((me + 1) % p, (me + p - 1) % p);
    for dtype in [DType::F32, DType::BF16] {
        let a = c.put(&input(me, &[3, 5], dtype, sum))?;
        let b = c.put(&input(me + p, &[7], dtype, sum))?;
        let mut ra = c.put(&Tensor::zeros([3, 5], dtype).map_err(e)?)?;
        let mut rb = c.put(&Tensor::zeros([7], dtype).map_err(e)?)?;
        let mut ops = if me % 2 == 0 {
            vec![
                P2p::Send(&a, next),
                P2p::Send(&b, next),
                P2p::Recv(&mut ra, prev),
                P2p::Recv(&mut rb, prev),
            ]
        } else {
            vec![
                P2p::Recv(&mut ra, prev),
                P2p::Recv(&mut rb, prev),
                P2p::Send(&a, next),
                P2p::Send(&b, next),
            ]
        };
        c.batch_send_recv(&mut ops).map_err(e)?;
        drop(ops);
        let ctx = format!("batch ring {dtype} np{p}");
        close(
            &c.get(&ra)?,
            &[3, 5],
            &values(prev, 15, dtype, sum),
            false,
            &ctx,
        )?;
        close(
            &c.get(&rb)?,
            &[7],
            &values(prev + p, 7, dtype, sum),
            false,
            &ctx,
        )?;
    }
    // A pipeline step: stage `me` sends its activation to the next stage and
    // its gradient to the previous one.
    let act = c.put(&input(me, &[4, 2], DType::F32, sum))?;
    let grad = c.put(&input(me + 2 * p, &[6], DType::F32, sum))?;
    let mut act_in = c.put(&Tensor::zeros([4, 2], DType::F32).map_err(e)?)?;
    let mut grad_in = c.put(&Tensor::zeros([6], DType::F32).map_err(e)?)?;
    let mut ops = Vec::new();
    if me + 1 < p {
        ops.push(P2p::Send(&act, me + 1));
        ops.push(P2p::Recv(&mut grad_in, me + 1));
    }
    if me > 0 {
        ops.push(P2p::Recv(&mut act_in, me - 1));
        ops.push(P2p::Send(&grad, me - 1));
    }
    c.batch_send_recv(&mut ops).map_err(e)?;
    drop(ops);
    if me > 0 {
        let want = values(me - 1, 8, DType::F32, sum);
        close(
            &c.get(&act_in)?,
            &[4, 2],
            &want,
            false,
            "pipeline activation",
        )?;
    }
    if me + 1 < p {
        let want = values(me + 1 + 2 * p, 6, DType::F32, sum);
        close(&c.get(&grad_in)?, &[6], &want, false, "pipeline gradient")?;
    }
    // Members 0 and 1: the first pair's sizes differ, the second agrees.
    if me < 2 {
        let x = c.put(&input(me, &[4], DType::F32, sum))?;
        let y = c.put(&input(me, &[2], DType::F32, sum))?;
        let mut rx = c.put(&Tensor::zeros([5], DType::F32).map_err(e)?)?;
        let mut ry = c.put(&Tensor::zeros([2], DType::F32).map_err(e)?)?;
        let mut ops = if me == 0 {
            vec![P2p::Send(&x, 1), P2p::Send(&y, 1)]
        } else {
            vec![P2p::Recv(&mut rx, 0), P2p::Recv(&mut ry, 0)]
        };
        let got = c.batch_send_recv(&mut ops);
        drop(ops);
        match got {
            Err(err)
                if err
                    .to_string()
                    .contains("group rank 0 sends batch_send_recv(")
                    && err
                        .to_string()
                        .contains("shape [4] f32) but group rank 1 expects batch_send_recv(")
                    && err.to_string().contains("shape [5] f32)") => {}
            other => return Err(format!("a batch pair of different sizes: {other:?}")),
        }
        if me == 1 {
            let want = values(0, 2, DType::F32, sum);
            close(
                &c.get(&ry)?,
                &[2],
                &want,
                false,
                "the agreed pair of a refused batch",
            )?;
        }
    }
    Ok(())
}

/// Rows of dim 0 that group rank `s` sends to group rank `r` in round
/// `seed`: 0 to 3, a zero on about a third of the links (the same on every
/// rank, so each can compute every rank's counts).
fn link_rows(seed: u64, s: usize, r: usize) -> usize {
    let h =
        (seed ^ (s as u64 * 0x9E37) ^ (r as u64 * 0x85EB_CA6B)).wrapping_mul(0x2545_F491_4F6C_DD1D);
    let v = (h >> 33) % 6;
    if v < 2 {
        0
    } else {
        (v - 2) as usize
    }
}

/// Group rank `s`'s input of `rows` rows of `row` elements, random and
/// non-integer, in `dtype` (the reference rounds the same values).
fn rows_of(s: usize, seed: u64, rows: usize, row: &[usize], dtype: DType) -> Tensor {
    let n = rows * row.iter().product::<usize>();
    let v = random_f32(seed * 31 + s as u64, n);
    let shape: Vec<usize> = std::iter::once(rows).chain(row.iter().copied()).collect();
    Tensor::from_fn(shape, dtype, |i| f64::from(v[i]) * 100.0).unwrap()
}

/// `all_to_all_v` and `all_gather_v` with random counts, zeros included,
/// against serial references (each rank rebuilds every rank's input), on
/// several dtypes and row shapes; then counts that disagree: a link whose
/// ends differ is an error on both naming both (the other links still
/// move), counts that do not fit a rank's tensors and all-gather counts
/// that differ are errors on every member.
pub fn check_uneven<'rt, C: Plane<'rt>>(c: &C) -> Result<(), String> {
    let g = c.group();
    let (p, me) = (g.size(), g.rank_in_group());
    let cases: [(DType, &[usize]); 4] = [
        (DType::F32, &[3]),
        (DType::BF16, &[2, 2]),
        (DType::U8, &[5]),
        (DType::F64, &[]),
    ];
    // `RANKMESH_TEST_SCALE` widens the rows, so blocks cross pieces.
    let scale: usize = std::env::var("RANKMESH_TEST_SCALE")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1);
    for (round, (dtype, row)) in cases.into_iter().enumerate() {
        let mut row = row.to_vec();
        if let Some(last) = row.last_mut() {
            *last *= scale;
        }
        let row = &row[..];
        let seed = round as u64 + 7;
        let rows = |s: usize| (0..p).map(|r| link_rows(seed, s, r)).sum::<usize>();
        let send: Vec<usize> = (0..p).map(|r| link_rows(seed, me, r)).collect();
        let recv: Vec<usize> = (0..p).map(|s| link_rows(seed, s, me)).collect();
        let x = c.put(&rows_of(me, seed, rows(me), row, dtype))?;
        let got = c.get(&c.all_to_all_v(&x, &send, &recv).map_err(e)?)?;
        // Reference: from each source in order, its rows for this rank.
        let width = row.iter().product::<usize>();
        let mut want = Vec::new();
        for s in 0..p {
            let theirs = rows_of(s, seed, rows(s), row, dtype).to_f64_vec();
            let first: usize = (0..me).map(|r| link_rows(seed, s, r)).sum();
            want.extend_from_slice(&theirs[first * width..(first + recv[s]) * width]);
        }
        let shape: Vec<usize> = std::iter::once(recv.iter().sum())
            .chain(row.iter().copied())
            .collect();
        let ctx = format!("all_to_all_v {dtype} rows {row:?} np{p} counts {send:?}/{recv:?}");
        close(&got, &shape, &want, false, &ctx)?;

        // all_gather_v along dim 0, and along dim 1 of [2, n, row...].
        let counts: Vec<usize> = (0..p).map(|r| link_rows(seed, r, r + 1)).collect();
        let x0 = rows_of(me, seed, counts[me], row, dtype);
        let got = c.get(&c.all_gather_v(&c.put(&x0)?, &counts, 0).map_err(e)?)?;
        let mut want = Vec::new();
        for (s, n) in counts.iter().enumerate() {
            want.extend(rows_of(s, seed, *n, row, dtype).to_f64_vec());
        }
        let total: usize = counts.iter().sum();
        let shape: Vec<usize> = std::iter::once(total).chain(row.iter().copied()).collect();
        close(
            &got,
            &shape,
            &want,
            false,
            &format!("all_gather_v dim 0 {dtype} np{p} counts {counts:?}"),
        )?;
        let outer = |s: usize| {
            let t = rows_of(s, seed + 100, 2 * counts[s], row, dtype);
            let mut shape = vec![2, counts[s]];
            shape.extend_from_slice(row);
            t.reshape(shape).unwrap()
        };
        let got = c.get(&c.all_gather_v(&c.put(&outer(me))?, &counts, 1).map_err(e)?)?;
        let block = counts.iter().map(|n| n * width);
        let mut want = vec![0.0; 2 * total * width];
        let mut at = 0;
        for (s, b) in block.enumerate() {
            let theirs = outer(s).to_f64_vec();
            for o in 0..2 {
                let to = o * total * width + at;
                want[to..to + b].copy_from_slice(&theirs[o * b..(o + 1) * b]);
            }
            at += b;
        }
        let mut shape = vec![2, total];
        shape.extend_from_slice(row);
        close(
            &got,
            &shape,
            &want,
            false,
            &format!("all_gather_v dim 1 {dtype} np{p} counts {counts:?}"),
        )?;
    }
    check_long_blocks(c)?;
    check_reduce_scatter_v(c)?;
    // Refusals are immediate in strict mode (device groups default to
    // deferred, where a disagreement surfaces at a later call).
    let mode = g.check_mode();
    g.set_check_mode(CheckMode::Strict).map_err(e)?;
    check_uneven_refusals(c)?;
    check_reduce_scatter_v_refusals(c)?;
    g.set_check_mode(mode).map_err(e)
}

/// `reduce_scatter_v` with random counts, zeros included, along dim 0 and
/// along dim 1 (packed into blocks), sum and max, against a serial
/// reference: member `me` keeps its `counts[me]` slices of the element-wise
/// reduction of every member's input (random and non-integer, positive so
/// that a sum rounds once per add, not by cancellation).
pub fn check_reduce_scatter_v<'rt, C: Plane<'rt>>(c: &C) -> Result<(), String> {
    let g = c.group();
    let (p, me) = (g.size(), g.rank_in_group());
    for (round, dtype) in [DType::F32, DType::BF16, DType::F64, DType::I32]
        .into_iter()
        .enumerate()
    {
        let seed = round as u64 + 41;
        let counts: Vec<usize> = (0..p).map(|r| link_rows(seed, r, r + 1)).collect();
        let total: usize = counts.iter().sum();
        let first: usize = counts[..me].iter().sum();
        for (dim, shape) in [(0usize, vec![total, 3]), (1, vec![2, total, 2])] {
            let n: usize = shape.iter().product();
            let of = |s: usize| {
                let v = random_f32(seed * 131 + (s * 2 + dim) as u64, n);
                Tensor::from_fn(shape.clone(), dtype, |i| (f64::from(v[i]) + 1.5) * 10.0).unwrap()
            };
            let parts: Vec<Vec<f64>> = (0..p).map(|s| of(s).to_f64_vec()).collect();
            let outer: usize = shape[..dim].iter().product();
            let inner: usize = shape[dim + 1..].iter().product();
            let mut out_shape = shape.clone();
            out_shape[dim] = counts[me];
            let x = c.put(&of(me))?;
            for op in [ReduceOp::Sum, ReduceOp::Max] {
                let full: Vec<f64> = (0..n)
                    .map(|i| (1..p).fold(parts[0][i], |a, s| op.combine(a, parts[s][i])))
                    .collect();
                let mut want = Vec::new();
                for o in 0..outer {
                    let row = o * total * inner;
                    want.extend_from_slice(
                        &full[row + first * inner..row + (first + counts[me]) * inner],
                    );
                }
                let got = c.reduce_scatter_v(&x, &counts, dim as isize, op);
                let ctx =
                    format!("reduce_scatter_v {op:?} dim {dim} {dtype} np{p} counts {counts:?}");
                close(&c.get(&got.map_err(e)?)?, &out_shape, &want, false, &ctx)?;
            }
        }
    }
    Ok(())
}

/// The errors of `reduce_scatter_v`, each on every member: counts that
/// differ between members, an input their sum does not fit (noted on each
/// member with its own problem), one member's output that is not its share;
/// then the group still works.
fn check_reduce_scatter_v_refusals<'rt, C: Plane<'rt>>(c: &C) -> Result<(), String> {
    let g = c.group();
    let (p, me) = (g.size(), g.rank_in_group());
    let (last, sum, dtype) = (p - 1, ReduceOp::Sum, DType::F32);
    let ones = |rows: usize| c.put(&Tensor::from_fn([rows, 2], dtype, |_| 1.0).unwrap());
    if p >= 2 {
        let mut counts = vec![2; p];
        if me == 0 {
            (counts[0], counts[1]) = (3, 1);
        }
        match c.reduce_scatter_v(&ones(2 * p)?, &counts, 0, sum) {
            Err(err) if err.to_string().contains("ranks disagree") => {}
            other => {
                let other = other.map(|_| ()).map_err(e);
                return Err(format!(
                    "np{p} rank {me}: reduce_scatter_v counts differ: {other:?}"
                ));
            }
        }
    }
    let named = "group rank 0 passed counts that do not fit its tensors";
    match c.reduce_scatter_v(&ones(p + 1)?, &vec![1; p], 0, sum) {
        Err(err)
            if err.to_string().contains(named)
                && err.to_string().contains(&format!("add up to {p}")) => {}
        other => {
            let other = other.map(|_| ()).map_err(e);
            return Err(format!(
                "np{p} rank {me}: an input the counts do not fit: {other:?}"
            ));
        }
    }
    let rows = if me == last { 2 } else { 1 };
    let mut out = c.put(&Tensor::zeros([rows, 2], dtype).map_err(e)?)?;
    let named = format!("group rank {last} passed counts that do not fit its tensors");
    match c.reduce_scatter_v_into(&ones(p)?, &mut out, &vec![1; p], 0, sum) {
        Err(err) if err.to_string().contains(&named) => {
            if err.to_string().contains("its share") != (me == last) {
                return Err(format!(
                    "np{p} rank {me}: the output's problem noted elsewhere: {err}"
                ));
            }
        }
        other => {
            return Err(format!(
                "np{p} rank {me}: an output that is not this share: {other:?}"
            ));
        }
    }
    let got = c.get(
        &c.reduce_scatter_v(&ones(p)?, &vec![1; p], 0, sum)
            .map_err(e)?,
    )?;
    close(
        &got,
        &[1, 2],
        &[p as f64; 2],
        false,
        "reduce_scatter_v after refusals",
    )
}

/// The errors of [`check_uneven`].
fn check_uneven_refusals<'rt, C: Plane<'rt>>(c: &C) -> Result<(), String> {
    let g = c.group();
    let (p, me) = (g.size(), g.rank_in_group());
    let dtype = DType::F32;
    // Every link carries 2 rows, but group rank 0 sends 3 to group rank
    // p - 1 (one more input row), which still expects 2.
    let last = p - 1;
    let mut send = vec![2; p];
    if me == 0 {
        send[last] = 3;
    }
    let recv = vec![2; p];
    let x = c.put(&rows_of(me, 1, send.iter().sum(), &[2], dtype))?;
    let mut out = c.put(&Tensor::zeros([2 * p, 2], dtype).map_err(e)?)?;
    let got = c.all_to_all_v_into(&x, &send, &mut out, &recv);
    let named = format!("group rank 0 sends 3 rows to group rank {last}, which expects 2");
    match got {
        Err(err) if (me == 0 || me == last) && err.to_string().contains(&named) => {}
        Ok(()) if me != 0 && me != last => {}
        other => {
            return Err(format!(
                "np{p} rank {me}: a link whose counts differ: {other:?}"
            ))
        }
    }
    // The links that agreed moved: rows from every other source are there.
    let got = c.get(&out)?.to_f64_vec();
    for s in (0..p).filter(|s| !(*s == 0 && me == last)) {
        let theirs =
            rows_of(s, 1, if s == 0 { 2 * p + 1 } else { 2 * p }, &[2], dtype).to_f64_vec();
        let first = 2 * me * 2;
        if got[s * 4..s * 4 + 4] != theirs[first..first + 4] {
            return Err(format!(
                "np{p} rank {me}: the agreed link from {s} of a refused call did not move"
            ));
        }
    }

    // Counts that do not add up to the input: every member refuses.
    let bad = if me == last { vec![1; p] } else { vec![2; p] };
    let x = c.put(&rows_of(me, 2, 2 * p, &[2], dtype))?;
    let got = c.all_to_all_v(&x, &bad, &vec![2; p]);
    let named = format!("group rank {last} passed counts that do not fit its tensors");
    match got {
        Err(err) if err.to_string().contains(&named) => {
            let local = err.to_string().contains("do not add up to the input's");
            if local != (me == last) {
                return Err(format!(
                    "np{p} rank {me}: this rank's problem noted only here: {err}"
                ));
            }
        }
        other => {
            let other = other.map(|_| ()).map_err(e);
            return Err(format!(
                "np{p} rank {me}: counts that do not fit: {other:?}"
            ));
        }
    }

    // all_gather_v counts that differ between members (group rank 0
    // moves one slice of member 1's to itself): refused everywhere.
    if p >= 2 {
        let mut counts = vec![2; p];
        if me == 0 {
            counts[0] = 3;
            counts[1] = 1;
        }
        let x = c.put(&rows_of(me, 3, counts[me], &[2], dtype))?;
        match c.all_gather_v(&x, &counts, 0) {
            Err(err) if err.to_string().contains("ranks disagree") => {}
            other => {
                let other = other.map(|_| ()).map_err(e);
                return Err(format!(
                    "np{p} rank {me}: all_gather_v counts differ: {other:?}"
                ));
            }
        }
    }
    // And the group still works after every refusal.
    let counts = vec![1; p];
    let x = c.put(&rows_of(me, 4, 1, &[2], dtype))?;
    let got = c.get(&c.all_gather_v(&x, &counts, 0).map_err(e)?)?;
    let want: Vec<f64> = (0..p)
        .flat_map(|s| rows_of(s, 4, 1, &[2], dtype).to_f64_vec())
        .collect();
    close(&got, &[p, 2], &want, false, "all_gather_v after refusals")
}

/// `all_to_all_v` with blocks past 4 MiB and of unequal lengths: the
/// shared-memory executor moves such blocks' tails with one copy, after
/// their first pieces went through the window. Bytes, compared bytewise.
pub fn check_long_blocks<'rt, C: Plane<'rt>>(c: &C) -> Result<(), String> {
    let g = c.group();
    let (p, me) = (g.size(), g.rank_in_group());
    let len = |s: usize, r: usize| (4 << 20) + 4099 * (s + 2 * r) + 1;
    let byte = |s: usize, k: usize| ((s * 31 + k * 7) % 251) as u8;
    let send: Vec<usize> = (0..p).map(|r| len(me, r)).collect();
    let recv: Vec<usize> = (0..p).map(|s| len(s, me)).collect();
    let total: usize = send.iter().sum();
    let mine: Vec<u8> = (0..total).map(|k| byte(me, k)).collect();
    let x = c.put(&Tensor::from_vec([total], mine).map_err(e)?)?;
    let got = c.get(&c.all_to_all_v(&x, &send, &recv).map_err(e)?)?;
    let mut at = 0;
    for (s, n) in recv.iter().enumerate() {
        let first: usize = (0..me).map(|r| len(s, r)).sum();
        let want = (first..first + n).map(|k| byte(s, k));
        if !got.bytes()[at..at + n].iter().copied().eq(want) {
            return Err(format!("np{p} rank {me}: the long block from {s} differs"));
        }
        at += n;
    }
    Ok(())
}
