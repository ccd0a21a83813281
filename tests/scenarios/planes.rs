//! Scenarios written once against the `Collectives` trait: each collective
//! against the serial reference, on whichever data plane runs them — the
//! host group here (mpi_ranks), the device group in tests/gpu.rs (the
//! emulators in CI, a real GPU with scripts/gpu-check.sh).

use super::reference::{concat, input, reduced, slice, values};
use rankmesh::{
    Collectives, DType, DeviceGroup, DeviceTensor, GroupCoordinator, P2p, ReduceOp, Tensor,
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
    check_batch(c)
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
