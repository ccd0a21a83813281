//! Device-plane checks: every device op against the host plane's result for
//! the same inputs, on the same group, for f32/f16/bf16 (and integer types
//! where the op allows), plus errors that must reach every rank.
//!
//! One binary, two roles. With `RANKMESH_GPU_WORKER=1` it is an MPI rank that
//! runs the checks (`scripts/gpu-check.sh` starts it that way on a CUDA
//! machine, one rank per GPU). Started by `cargo test` it is the driver:
//! 1. on a host with a usable GPU stack, the checks on the real GPU
//!    (otherwise it says why they are skipped);
//! 2. always, the same checks under `mpirun -np 1..4` against the CUDA and
//!    NCCL *emulators* in `tests/emulator/` (host memory, NCCL calls carried
//!    by MPI), plus the error paths only they can provoke on one machine
//!    (shared GPU, too few GPUs, failed init, an asynchronous peer error).
//!    The emulators exercise rankmesh's device-plane logic, not a GPU.

mod emulator;
#[path = "scenarios/planes.rs"]
mod planes;
#[allow(dead_code)]
#[path = "scenarios/reference.rs"]
mod reference;
mod support;

use cudarc::driver::{CudaContext, CudaStream, DeviceRepr, ValidAsZeroBits};
use rankmesh::object::TensorDicts as _;
use rankmesh::Collectives as _;
use rankmesh::{
    op::CheckMode, DType, DeviceGroup, DeviceTensor, Element, Error, GroupCoordinator, ReduceOp,
    Runtime, Tensor,
};
use std::sync::Arc;

type Check = Result<(), String>;
type CheckFn = fn(&GroupCoordinator<'_>, &DeviceGroup<'_, '_>) -> Check;

/// Input of group rank `r`: small integers, exact in every dtype, distinct per rank.
fn input(shape: &[usize], dtype: DType, r: usize) -> Tensor {
    Tensor::from_fn(shape.to_vec(), dtype, move |i| {
        ((i * 7 + r * 3) % 13) as f64
    })
    .unwrap()
}

/// Compares a device result with the host reference (exact except `avg`,
/// where NCCL scales before summing and the host after).
fn same(what: &str, got: &Tensor, want: &Tensor, op: Option<ReduceOp>) -> Check {
    if got.shape() != want.shape() || got.dtype() != want.dtype() {
        return Err(format!(
            "{what}: got {:?} {}, want {:?} {}",
            got.shape(),
            got.dtype(),
            want.shape(),
            want.dtype()
        ));
    }
    let tol = match (op, got.dtype()) {
        (Some(ReduceOp::Avg), DType::BF16) => 1e-2,
        (Some(ReduceOp::Avg), DType::F16) => 2e-3,
        (Some(ReduceOp::Avg), DType::F32 | DType::F64) => 1e-6,
        _ => 0.0,
    };
    for (i, (g, w)) in got.to_f64_vec().iter().zip(want.to_f64_vec()).enumerate() {
        if (g - w).abs() > tol * w.abs().max(1.0) {
            return Err(format!("{what}: element {i} is {g}, host plane says {w}"));
        }
    }
    Ok(())
}

fn e(x: Error) -> String {
    x.to_string()
}

const SHAPES: [&[usize]; 3] = [&[12], &[2, 6, 4], &[1, 3, 2]];

fn check_reductions(g: &GroupCoordinator<'_>, dg: &DeviceGroup<'_, '_>) -> Check {
    let gpu = dg.gpu();
    let me = g.rank_in_group();
    for dtype in [DType::F32, DType::F16, DType::BF16, DType::I32, DType::U8] {
        for shape in SHAPES {
            let x = input(shape, dtype, me);
            let dx = gpu.upload(&x).map_err(e)?;
            for op in ReduceOp::ALL {
                let want = g.all_reduce(&x, op).map_err(e)?;
                let got = gpu
                    .download(&dg.all_reduce(&dx, op).map_err(e)?)
                    .map_err(e)?;
                same(
                    &format!("all_reduce {op:?} {dtype} {shape:?}"),
                    &got,
                    &want,
                    Some(op),
                )?;
                let mut inplace = gpu.upload(&x).map_err(e)?;
                dg.all_reduce_in_place(&mut inplace, op).map_err(e)?;
                let got = gpu.download(&inplace).map_err(e)?;
                same(
                    &format!("in-place all_reduce {op:?} {dtype}"),
                    &got,
                    &want,
                    Some(op),
                )?;
                for dst in 0..g.size() {
                    let want = g.reduce(&x, dst, op).map_err(e)?;
                    let got = dg.reduce(&dx, dst, op).map_err(e)?;
                    let root = g.rank_in_group() == dst;
                    match (want, got) {
                        (Some(w), Some(d)) if root => {
                            let got = gpu.download(&d).map_err(e)?;
                            same(
                                &format!("reduce {op:?} to {dst} {dtype}"),
                                &got,
                                &w,
                                Some(op),
                            )?;
                        }
                        (None, None) if !root => {}
                        (w, d) => {
                            return Err(format!(
                                "reduce {op:?} to {dst} {dtype} on group rank {}: the host plane \
                                 gave a result: {}, the device plane: {} (only the root has one)",
                                g.rank_in_group(),
                                w.is_some(),
                                d.is_some()
                            ))
                        }
                    }
                }
            }
        }
    }
    Ok(())
}

/// The same bytes on both planes (bool, 16-bit and fp8 moves are bit copies).
fn same_bytes(what: &str, got: &Tensor, want: &Tensor) -> Check {
    if got.shape() == want.shape() && got.dtype() == want.dtype() && got.bytes() == want.bytes() {
        Ok(())
    } else {
        Err(format!("{what}: device {got:?}, host plane {want:?}"))
    }
}

/// The dtypes NCCL lacks (bool, i16, u16: moved as bytes) or names only
/// from 2.24 (fp8): moves are bit-exact with the host plane; bools reduce as
/// OR/AND bytes; fp8 reduces within one rounding per rank (NCCL rounds at
/// every hop, the host plane once) from sm 9.0 on, and below it is refused
/// by name before NCCL is asked; 16-bit integer and refused fp8 reductions
/// leave the communicator usable.
fn check_narrow_dtypes(g: &GroupCoordinator<'_>, dg: &DeviceGroup<'_, '_>) -> Check {
    let gpu = dg.gpu();
    let sm90 = gpu.info().compute_capability >= (9, 0);
    let (n, me) = (g.size(), g.rank_in_group());
    for dtype in [
        DType::Bool,
        DType::I16,
        DType::U16,
        DType::F8E4M3,
        DType::F8E5M2,
    ] {
        let x = input(&[2 * n, 3], dtype, me);
        let dx = gpu.upload(&x).map_err(e)?;
        let got = gpu
            .download(&dg.all_gather(&dx, 1).map_err(e)?)
            .map_err(e)?;
        same_bytes(
            &format!("all_gather {dtype}"),
            &got,
            &g.all_gather(&x, 1).map_err(e)?,
        )?;
        let got = gpu.download(&dg.all_to_all(&dx).map_err(e)?).map_err(e)?;
        let want = g.all_to_all(&x).map_err(e)?;
        same_bytes(&format!("all_to_all {dtype}"), &got, &want)?;
        let (mut dev, mut host) = (gpu.upload(&x).map_err(e)?, x.clone());
        dg.broadcast(&mut dev, n - 1).map_err(e)?;
        g.broadcast(&mut host, n - 1).map_err(e)?;
        same_bytes(
            &format!("broadcast {dtype}"),
            &gpu.download(&dev).map_err(e)?,
            &host,
        )?;
        for op in ReduceOp::ALL {
            let what = format!("all_reduce {op:?} {dtype}");
            let host = g.all_reduce(&x, op);
            let dev = dg.all_reduce(&dx, op);
            match (dtype, op, host, dev) {
                (DType::I16 | DType::U16, _, Ok(_), Err(err))
                    if err.to_string().contains("NCCL has no 16-bit integer type") => {}
                (DType::Bool, ReduceOp::Avg, Err(h), Err(d))
                    if h.to_string().contains("avg is not defined for bool")
                        && d.to_string().contains("avg is not defined for bool") => {}
                (DType::Bool, _, Ok(h), Ok(d)) => {
                    same_bytes(&what, &gpu.download(&d).map_err(e)?, &h)?
                }
                // NCCL refuses ncclAvg of fp8 (seen on NCCL 2.28.3, H100):
                // refused first, by name, the communicator still usable.
                (DType::F8E4M3 | DType::F8E5M2, ReduceOp::Avg, Ok(_), Err(err))
                    if err
                        .to_string()
                        .contains(&format!("NCCL has no average for {dtype}")) => {}
                (DType::F8E4M3 | DType::F8E5M2, _, Ok(_), Err(err))
                    if !sm90
                        && err.to_string().contains(&format!(
                            "NCCL cannot reduce {dtype} on sm {}.{}: NCCL reduces fp8 from sm 9.0",
                            gpu.info().compute_capability.0,
                            gpu.info().compute_capability.1
                        )) => {}
                (DType::F8E4M3 | DType::F8E5M2, _, Ok(h), Ok(d)) if sm90 => {
                    let u = reference::tolerance(dtype);
                    let got = gpu.download(&d).map_err(e)?.to_f64_vec();
                    for (i, (d, h)) in got.iter().zip(h.to_f64_vec()).enumerate() {
                        if (d - h).abs() > n as f64 * u * h.abs().max(1.0) {
                            return Err(format!("{what}: element {i} is {d}, host plane says {h}"));
                        }
                    }
                }
                (_, _, h, d) => return Err(format!("{what}: host {h:?}, device {d:?}")),
            }
        }
    }
    let f = input(&[4], DType::F32, me);
    let got = gpu
        .download(
            &dg.all_reduce(&gpu.upload(&f).map_err(e)?, ReduceOp::Sum)
                .map_err(e)?,
        )
        .map_err(e)?;
    same(
        "all_reduce after refused calls",
        &got,
        &g.all_reduce(&f, ReduceOp::Sum).map_err(e)?,
        None,
    )
}

/// FastVideo's module-level helpers on `ParallelState` take device tensors
/// too and follow a `with_tp_group` override as the host group does (world
/// group only: the state is built over the whole job).
fn check_helpers_follow_overrides(g: &GroupCoordinator<'_>, dg: &DeviceGroup<'_, '_>) -> Check {
    let rt = g.runtime();
    if g.size() != rt.size() {
        return Ok(());
    }
    let mut ps = rankmesh::ParallelState::new(rt).map_err(e)?;
    ps.initialize_model_parallel(1, 1, None).map_err(e)?;
    let model_tp = ps
        .new_tensor_parallel_group(rt.size(), "devtp")
        .map_err(e)?;
    let gpu = dg.gpu();
    let x = input(&[4, 3], DType::F32, g.rank_in_group());
    let dx = gpu.upload(&x).map_err(e)?;
    let alone = gpu
        .download(&ps.tensor_model_parallel_all_reduce(&dx).map_err(e)?)
        .map_err(e)?;
    same("TP of one, no override", &alone, &x, None)?;
    ps.with_tp_group(&model_tp, || -> Check {
        let got = ps.tensor_model_parallel_all_reduce(&dx).map_err(e)?;
        let want = g.all_reduce(&x, ReduceOp::Sum).map_err(e)?;
        same(
            "device all_reduce under the override",
            &gpu.download(&got).map_err(e)?,
            &want,
            None,
        )?;
        let got = ps.tensor_model_parallel_all_gather(&dx, -1).map_err(e)?;
        let want = g.all_gather(&x, -1).map_err(e)?;
        same(
            "device all_gather under the override",
            &gpu.download(&got).map_err(e)?,
            &want,
            None,
        )
    })
    .map_err(e)?
}

/// Uniform values in [-1, 1) from `seed` (xorshift64*): every rank can make
/// every rank's input.
fn random(seed: u64, len: usize, dtype: DType) -> Tensor {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let v: Vec<f64> = (0..len)
        .map(|_| {
            s ^= s >> 12;
            s ^= s << 25;
            s ^= s >> 27;
            let bits = s.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 11;
            bits as f64 / (1u64 << 52) as f64 - 1.0
        })
        .collect();
    Tensor::from_fn([len], dtype, |i| v[i]).unwrap()
}

/// Sums of random non-integer data against the exact sum `s` (in f64) and
/// `a = Σ|x|`, with `u` the dtype's unit roundoff and `f` its smallest
/// rounding step near zero (fp8 subnormals):
/// - host plane (16- and 8-bit floats summed in f32, rounded once):
///   `|host − s| ≤ u|s| + f + (n−1)·2⁻²⁴·a`; for f32 `(n−1)·u·a`;
/// - device plane (NCCL rounds to the dtype at each of n−1 hops):
///   `|device − s| ≤ (n−1)(u·a + f)`.
///
/// With 3 or more ranks f16 device and host results must differ somewhere:
/// that is per-hop rounding showing (the emulator does it too).
fn check_numerics(g: &GroupCoordinator<'_>, dg: &DeviceGroup<'_, '_>) -> Check {
    let gpu = dg.gpu();
    let (n, me) = (g.size(), g.rank_in_group());
    let len = 4096;
    let hops = (n - 1) as f64;
    // fp8 reduces from sm 9.0 on (check_narrow_dtypes checks the refusal).
    let sm90 = gpu.info().compute_capability >= (9, 0);
    for (dtype, u, f) in [
        (DType::F32, 2f64.powi(-24), 0.0),
        (DType::F16, 2f64.powi(-11), 2f64.powi(-25)),
        (DType::BF16, 2f64.powi(-8), 0.0),
        (DType::F8E4M3, 2f64.powi(-4), 2f64.powi(-10)),
        (DType::F8E5M2, 2f64.powi(-3), 2f64.powi(-17)),
    ]
    .into_iter()
    .filter(|(d, ..)| sm90 || d.size() > 1)
    {
        let inputs: Vec<Vec<f64>> = (0..n)
            .map(|r| random(1000 + r as u64, len, dtype).to_f64_vec())
            .collect();
        let x = random(1000 + me as u64, len, dtype);
        let host = g.all_reduce(&x, ReduceOp::Sum).map_err(e)?.to_f64_vec();
        let dx = gpu.upload(&x).map_err(e)?;
        let dev = gpu
            .download(&dg.all_reduce(&dx, ReduceOp::Sum).map_err(e)?)
            .map_err(e)?
            .to_f64_vec();
        let mut differ = 0;
        for i in 0..len {
            let s: f64 = inputs.iter().map(|v| v[i]).sum();
            let a: f64 = inputs.iter().map(|v| v[i].abs()).sum();
            let host_bound = if dtype == DType::F32 {
                hops * u * a
            } else {
                u * s.abs() + f + hops * 2f64.powi(-24) * a
            };
            let dev_bound = hops * (u * a + f);
            if (host[i] - s).abs() > host_bound {
                return Err(format!(
                    "host sum of {dtype} element {i}: {} vs exact {s} (bound {host_bound:e})",
                    host[i]
                ));
            }
            if (dev[i] - s).abs() > dev_bound {
                return Err(format!(
                    "device sum of {dtype} element {i}: {} vs exact {s} (bound {dev_bound:e})",
                    dev[i]
                ));
            }
            differ += usize::from(dev[i] != host[i]);
        }
        if dtype == DType::F16 && n >= 3 && differ == 0 {
            return Err("f16 sums on 3+ ranks: device equals host everywhere; \
                        per-hop rounding is not happening"
                .into());
        }
    }
    Ok(())
}

fn check_layout_ops(g: &GroupCoordinator<'_>, dg: &DeviceGroup<'_, '_>) -> Check {
    let gpu = dg.gpu();
    let (n, me) = (g.size(), g.rank_in_group());
    for dtype in [DType::F32, DType::F16, DType::BF16, DType::I64] {
        for shape in SHAPES {
            let x = input(shape, dtype, me);
            let dx = gpu.upload(&x).map_err(e)?;
            for dim in 0..shape.len() as isize {
                for d in [dim, dim - shape.len() as isize] {
                    let want = g.all_gather(&x, d).map_err(e)?;
                    let got = gpu
                        .download(&dg.all_gather(&dx, d).map_err(e)?)
                        .map_err(e)?;
                    same(
                        &format!("all_gather dim {d} {dtype} {shape:?}"),
                        &got,
                        &want,
                        None,
                    )?;
                    for dst in 0..n {
                        if let (Some(w), Some(dd)) = (
                            g.gather(&x, dst, d).map_err(e)?,
                            dg.gather(&dx, dst, d).map_err(e)?,
                        ) {
                            let got = gpu.download(&dd).map_err(e)?;
                            same(&format!("gather dim {d} to {dst} {dtype}"), &got, &w, None)?;
                        }
                    }
                }
                // reduce_scatter needs the dim divisible by the group size.
                let mut big = shape.to_vec();
                big[dim as usize] *= n;
                let xb = input(&big, dtype, me);
                let dxb = gpu.upload(&xb).map_err(e)?;
                for src in 0..n {
                    let want = g.scatter(&xb, src, dim).map_err(e)?;
                    let got = gpu
                        .download(&dg.scatter(&dxb, src, dim).map_err(e)?)
                        .map_err(e)?;
                    same(
                        &format!("scatter from {src} dim {dim} {dtype} {shape:?}"),
                        &got,
                        &want,
                        None,
                    )?;
                }
                for op in [ReduceOp::Sum, ReduceOp::Max] {
                    let want = g.reduce_scatter(&xb, dim, op).map_err(e)?;
                    let got = gpu
                        .download(&dg.reduce_scatter(&dxb, dim, op).map_err(e)?)
                        .map_err(e)?;
                    same(
                        &format!("reduce_scatter dim {dim} {op:?} {dtype}"),
                        &got,
                        &want,
                        None,
                    )?;
                }
            }
            for src in 0..n {
                let mut want = x.clone();
                g.broadcast(&mut want, src).map_err(e)?;
                let mut dd = gpu.upload(&x).map_err(e)?;
                dg.broadcast(&mut dd, src).map_err(e)?;
                same(
                    &format!("broadcast from {src} {dtype}"),
                    &gpu.download(&dd).map_err(e)?,
                    &want,
                    None,
                )?;
            }
        }
        // all_to_all on [n·2, 3] and all_to_all_4d in both of FastVideo's modes.
        let x = input(&[n * 2, 3], dtype, me);
        let want = g.all_to_all(&x).map_err(e)?;
        let got = gpu
            .download(&dg.all_to_all(&gpu.upload(&x).map_err(e)?).map_err(e)?)
            .map_err(e)?;
        same(&format!("all_to_all {dtype}"), &got, &want, None)?;
        for (shape, mode) in [([2, 3, n * 2, 4], (2, 1)), ([2, n * 3, 2, 4], (1, 2))] {
            let x = input(&shape, dtype, me);
            let want = g.all_to_all_4d(&x, mode.0, mode.1).map_err(e)?;
            let got = gpu
                .download(
                    &dg.all_to_all_4d(&gpu.upload(&x).map_err(e)?, mode.0, mode.1)
                        .map_err(e)?,
                )
                .map_err(e)?;
            same(
                &format!("all_to_all_4d {mode:?} {dtype}"),
                &got,
                &want,
                None,
            )?;
        }
    }
    Ok(())
}

/// A ring shift, then a send from group rank 0 to 1, on `d`.
fn ring_then_pair(d: &DeviceGroup<'_, '_>, what: &str) -> Check {
    let gpu = d.gpu();
    let g = d.group();
    let (n, me) = (g.size(), g.rank_in_group());
    let x = input(&[5, 3], DType::BF16, me);
    let mut out = gpu.zeros([5, 3], DType::BF16).map_err(e)?;
    d.send_recv_into(&gpu.upload(&x).map_err(e)?, &mut out, None, None)
        .map_err(e)?;
    let want = input(&[5, 3], DType::BF16, (me + n - 1) % n);
    same(
        &format!("send_recv ring on {what}"),
        &gpu.download(&out).map_err(e)?,
        &want,
        None,
    )?;
    if n > 1 {
        if me == 0 {
            d.send(&gpu.upload(&x).map_err(e)?, Some(1)).map_err(e)?;
        } else if me == 1 {
            let got = d.recv(&[5, 3], DType::BF16, Some(0)).map_err(e)?;
            same(
                &format!("send/recv on {what}"),
                &gpu.download(&got).map_err(e)?,
                &input(&[5, 3], DType::BF16, 0),
                None,
            )?;
        }
    }
    Ok(())
}

fn check_point_to_point(g: &GroupCoordinator<'_>, dg: &DeviceGroup<'_, '_>) -> Check {
    let me = g.rank_in_group();
    // A fresh group with no NCCL communicator: point-to-point needs no
    // connect() (two-member communicators, made in an order no ring can
    // deadlock on), then the group's own communicator once it exists.
    let fresh = g.runtime().subgroup("p2p", g.ranks()).map_err(e)?;
    let fdg = fresh.device().map_err(e)?;
    ring_then_pair(&fdg, "pair communicators")?;
    ring_then_pair(dg, "the group's communicator")?;
    let gpu = fdg.gpu();
    let x = input(&[4], DType::F32, me);
    let sum = fdg
        .all_reduce(&gpu.upload(&x).map_err(e)?, ReduceOp::Sum)
        .map_err(e)?;
    let want = g.all_reduce(&x, ReduceOp::Sum).map_err(e)?;
    same(
        "all_reduce after pairs",
        &gpu.download(&sum).map_err(e)?,
        &want,
        None,
    )?;
    ring_then_pair(&fdg, "a group that has both")?;
    Ok(())
}

fn check_dicts(g: &GroupCoordinator<'_>, dg: &DeviceGroup<'_, '_>) -> Check {
    use rankmesh::{object::DictValue as V, object::TensorDict};
    type DeviceTensorDict = TensorDict<rankmesh::DeviceTensor>;
    let gpu = dg.gpu();
    let (n, me) = (g.size(), g.rank_in_group());
    let host = input(&[3, 2], DType::I32, 0);
    let dev = input(&[4, 5], DType::BF16, 0);
    let mut d = DeviceTensorDict::new();
    d.insert("h".into(), V::Host(host.clone()));
    d.insert("d".into(), V::Tensor(gpu.upload(&dev).map_err(e)?));
    d.insert(
        "empty".into(),
        V::Tensor(gpu.zeros([0, 3], DType::F16).map_err(e)?),
    );
    d.insert("v".into(), V::Value(serde_json::json!({"step": 7})));
    let got = dg
        .broadcast_tensor_dict((me == 0).then_some(&d), 0)
        .map_err(e)?;
    let verify = |got: &DeviceTensorDict, what: &str| -> Check {
        match (&got["h"], &got["d"], &got["empty"], &got["v"]) {
            (V::Host(h), V::Tensor(dd), V::Tensor(empty), V::Value(v)) => {
                same(&format!("{what} host entry"), h, &host, None)?;
                same(
                    &format!("{what} device entry"),
                    &gpu.download(dd).map_err(e)?,
                    &dev,
                    None,
                )?;
                if empty.shape() != [0, 3] || v["step"] != 7 {
                    return Err(format!("{what}: empty tensor or value wrong"));
                }
                Ok(())
            }
            _ => Err(format!("{what}: entries changed kind")),
        }
    };
    verify(&got, "broadcast_tensor_dict")?;
    if n > 1 {
        if me == 0 {
            dg.send_tensor_dict(&d, Some(1), None).map_err(e)?;
        } else if me == 1 {
            verify(
                &dg.recv_tensor_dict(Some(0), None)
                    .map_err(e)?
                    .ok_or("recv_tensor_dict returned no dict")?,
                "send/recv_tensor_dict",
            )?;
        }
        // A host receiver of a device dict: both ends get the handshake
        // error on the metadata (typed by plane), neither waits.
        let err = match me {
            0 => dg.send_tensor_dict(&d, Some(1), None).err(),
            1 => g.recv_tensor_dict(Some(0), None).err(),
            _ => return Ok(()),
        };
        let want = "types differ; this rank uses `rankmesh::object::dict::DictMeta<";
        match err {
            Some(x) if x.to_string().contains(want) => {}
            other => return Err(format!("device dict to a host receiver: {other:?}")),
        }
    }
    Ok(())
}

/// Device forward/backward of every differentiable collective equal the host plane's.
fn check_autograd(g: &GroupCoordinator<'_>, dg: &DeviceGroup<'_, '_>) -> Check {
    use rankmesh::parallel::Differentiable as D;
    let gpu = dg.gpu();
    let n = g.size();
    let x = input(&[2, n * 2, n * 3, 4], DType::F32, g.rank_in_group());
    let dx = gpu.upload(&x).map_err(e)?;
    for op in [
        D::AllReduceSum,
        D::AllGather { dim: 1 },
        D::ReduceScatterSum { dim: -2 },
        D::AllToAll4d {
            scatter_dim: 2,
            gather_dim: 1,
        },
    ] {
        let y = op.forward(g, &x).map_err(e)?;
        let dy = op.forward(dg, &dx).map_err(e)?;
        same(
            &format!("{op:?} forward"),
            &gpu.download(&dy).map_err(e)?,
            &y,
            None,
        )?;
        let gx = op.backward(g, &y).map_err(e)?;
        let dgx = op.backward(dg, &dy).map_err(e)?;
        same(
            &format!("{op:?} backward"),
            &gpu.download(&dgx).map_err(e)?,
            &gx,
            None,
        )?;
    }
    Ok(())
}

/// Bad calls fail on every rank with a message, and the group stays usable
/// (strict mode: the error at the call itself; `deferred_mismatch` covers
/// the deferred mode's error at the next synchronization).
fn check_errors(g: &GroupCoordinator<'_>, dg: &DeviceGroup<'_, '_>) -> Check {
    let mode = g.check_mode();
    g.set_check_mode(CheckMode::Strict).map_err(e)?;
    let checked = strict_errors(g, dg);
    g.set_check_mode(mode).map_err(e)?;
    checked
}

fn strict_errors(g: &GroupCoordinator<'_>, dg: &DeviceGroup<'_, '_>) -> Check {
    let gpu = dg.gpu();
    let me = g.rank_in_group();
    let x = gpu.upload(&input(&[4, 3], DType::F32, me)).map_err(e)?;
    let expect = |r: rankmesh::Result<rankmesh::DeviceTensor>, what: &str| -> Check {
        match r {
            Ok(_) => Err(format!("{what}: expected an error")),
            Err(err) if err.to_string().contains(what) => Ok(()),
            Err(err) => Err(format!("{what}: wrong error: {err}")),
        }
    };
    expect(dg.all_gather(&x, 2), "dim 2 out of range for a 2-d tensor")?;
    expect(dg.all_to_all_4d(&x, 2, 1), "expects a 4-d tensor")?;
    let mut small = gpu.zeros([2, 3], DType::F32).map_err(e)?;
    match gpu.upload_into(&input(&[4, 3], DType::F32, me), &mut small) {
        Err(err)
            if err
                .to_string()
                .contains("upload of a [4, 3] f32 tensor into a [2, 3] f32 device tensor") => {}
        other => return Err(format!("upload_into a smaller tensor: {other:?}")),
    }
    let mut out = gpu.zeros([4, 4], DType::F32).map_err(e)?;
    match dg.all_reduce_into(&x, &mut out, ReduceOp::Sum) {
        Err(err)
            if err
                .to_string()
                .contains("this rank: output is [4, 4] f32, expected [4, 3] f32") => {}
        other => return Err(format!("all_reduce_into a wrong output: {other:?}")),
    }
    if g.size() > 1 {
        // One rank passes another shape: every rank learns who passed what.
        let shape: &[usize] = if me == 1 { &[4, 4] } else { &[4, 3] };
        let y = gpu.upload(&input(shape, DType::F32, me)).map_err(e)?;
        expect(dg.all_reduce(&y, ReduceOp::Sum), "ranks disagree")?;
        one_rank_misuses_a_view(g, dg)?;
        // A host call meeting a device call.
        let err = if me == 0 {
            g.all_reduce(&input(&[4, 3], DType::F32, me), ReduceOp::Sum)
                .err()
        } else {
            dg.all_reduce(&x, ReduceOp::Sum).err()
        };
        match err {
            Some(err) if err.to_string().contains("device shape [4, 3]") => {}
            other => return Err(format!("host/device mix: {other:?}")),
        }
    }
    // Still usable afterwards.
    let ok = gpu
        .download(&dg.all_reduce(&x, ReduceOp::Max).map_err(e)?)
        .map_err(e)?;
    same(
        "after errors",
        &ok,
        &g.all_reduce(&input(&[4, 3], DType::F32, me), ReduceOp::Max)
            .map_err(e)?,
        None,
    )
}

/// A view misused on rank 1 alone (moved out of its borrow) is found before
/// the agreement: every rank refuses the call at once, naming rank 1, and
/// no rank waits for work rank 1 never enqueues — for a collective and for
/// both ends of a send.
fn one_rank_misuses_a_view(g: &GroupCoordinator<'_>, dg: &DeviceGroup<'_, '_>) -> Check {
    let me = g.rank_in_group();
    let gpu = dg.gpu();
    let mut buf = dg
        .stream()
        .alloc_zeros::<f32>(12)
        .map_err(|x| x.to_string())?;
    let escaped = {
        let mut v = dg.view_mut(&mut buf, vec![4, 3]).map_err(e)?;
        let other = gpu.zeros([4, 3], DType::F32).map_err(e)?;
        std::mem::replace(&mut *v, other)
    };
    let fine = gpu.upload(&input(&[4, 3], DType::F32, me)).map_err(e)?;
    let want = "group rank 1 passed a device view used after its borrow ended";
    let here = "this rank: a device view was used after its borrow ended";
    let judge = |what: &str, r: rankmesh::Result<()>| -> Check {
        match r {
            Err(err)
                if err.to_string().contains(want)
                    && (me != 1 || err.to_string().contains(here)) =>
            {
                Ok(())
            }
            other => Err(format!("{what} with rank 1's view misused: {other:?}")),
        }
    };
    let x = if me == 1 { &escaped } else { &fine };
    judge("all_reduce", dg.all_reduce(x, ReduceOp::Sum).map(drop))?;
    let mut out = gpu.zeros([4, 3], DType::F32).map_err(e)?;
    judge(
        "all_reduce_into",
        dg.all_reduce_into(x, &mut out, ReduceOp::Sum),
    )?;
    if me == 0 {
        judge("send to rank 1", dg.send(&fine, Some(1)))?;
    } else if me == 1 {
        let mut into = escaped;
        judge("recv from rank 0", dg.recv_into(&mut into, Some(0)))?;
    }
    Ok(())
}

/// Every device op with the caller's memory (cudarc buffers, as candle's)
/// in and out, enqueued on the caller's stream (a context of the test's own,
/// with cudarc's event tracking on), waited for through an event.
fn check_views(g: &GroupCoordinator<'_>, dg: &DeviceGroup<'_, '_>) -> Check {
    let cu = |x: cudarc::driver::DriverError| x.to_string();
    let ctx = CudaContext::new(dg.gpu().info().ordinal).map_err(cu)?;
    let stream = ctx.new_stream().map_err(cu)?;
    let on = dg.on_stream(&stream).map_err(e)?;
    views_of::<f32>(g, &on, &stream)?;
    views_of::<half::f16>(g, &on, &stream)?;
    views_of::<half::bf16>(g, &on, &stream)?;
    across_streams(g, &on)?;
    misused_views(&on, dg, &stream)
}

/// rankmesh's tensors moving between its stream and the caller's: made on
/// one, used on the other, dropped at once. Only rankmesh's one order of
/// work (and frees after it) makes these right on an asynchronous device.
fn across_streams(g: &GroupCoordinator<'_>, on: &DeviceGroup<'_, '_>) -> Check {
    let gpu = on.gpu();
    let me = g.rank_in_group();
    let x = input(&[6, 5], DType::F32, me);
    for round in 0..16 {
        let uploaded = gpu.upload(&x).map_err(e)?;
        let gathered = on.all_gather(&uploaded, 1).map_err(e)?;
        drop(uploaded);
        let summed = on.all_reduce(&gathered, ReduceOp::Sum).map_err(e)?;
        drop(gathered);
        let want = g
            .all_reduce(&g.all_gather(&x, 1).map_err(e)?, ReduceOp::Sum)
            .map_err(e)?;
        let what =
            format!("made on rankmesh's stream, used on the caller's, read back (round {round})");
        same(&what, &gpu.download(&summed).map_err(e)?, &want, None)?;
    }
    Ok(())
}

type ViewOp<'a> = Box<dyn Fn(&DeviceTensor, &mut DeviceTensor) -> rankmesh::Result<()> + 'a>;

fn views_of<T: Element + DeviceRepr + ValidAsZeroBits>(
    g: &GroupCoordinator<'_>,
    on: &DeviceGroup<'_, '_>,
    stream: &Arc<CudaStream>,
) -> Check {
    let cu = |x: cudarc::driver::DriverError| x.to_string();
    let (n, me) = (g.size(), g.rank_in_group());
    let dt = T::DTYPE;
    let shape = vec![2 * n, 3, n, 2];
    let x = input(&shape, dt, me);
    let xb = stream
        .clone_htod(x.as_slice::<T>().map_err(e)?)
        .map_err(cu)?;
    let zeros = |s: &[usize]| Tensor::zeros(s.to_vec(), dt).unwrap();
    let on_root = |t: Tensor| if me == 0 { t } else { zeros(t.shape()) };
    let cases: Vec<(&str, Tensor, ViewOp<'_>)> = vec![
        (
            "all_reduce_into",
            g.all_reduce(&x, ReduceOp::Sum).map_err(e)?,
            Box::new(|i, o| on.all_reduce_into(i, o, ReduceOp::Sum)),
        ),
        (
            "reduce_into",
            on_root(g.all_reduce(&x, ReduceOp::Sum).map_err(e)?),
            Box::new(|i, o| on.reduce_into(i, o, 0, ReduceOp::Sum)),
        ),
        (
            "all_gather_into (dim 1, packed through scratch)",
            g.all_gather(&x, 1).map_err(e)?,
            Box::new(|i, o| on.all_gather_into(i, o, 1)),
        ),
        (
            "gather_into",
            on_root(g.all_gather(&x, 1).map_err(e)?),
            Box::new(|i, o| on.gather_into(i, o, 0, 1)),
        ),
        (
            "scatter_into",
            g.scatter(&x, 0, 0).map_err(e)?,
            Box::new(|i, o| on.scatter_into(i, o, 0, 0)),
        ),
        (
            "reduce_scatter_into",
            g.reduce_scatter(&x, 0, ReduceOp::Sum).map_err(e)?,
            Box::new(|i, o| on.reduce_scatter_into(i, o, 0, ReduceOp::Sum)),
        ),
        (
            "all_to_all_into",
            g.all_to_all(&x).map_err(e)?,
            Box::new(|i, o| on.all_to_all_into(i, o)),
        ),
        (
            "all_to_all_4d_into",
            g.all_to_all_4d(&x, 2, 1).map_err(e)?,
            Box::new(|i, o| on.all_to_all_4d_into(i, o, 2, 1)),
        ),
        (
            "send_recv_into",
            input(&shape, dt, (me + n - 1) % n),
            Box::new(|i, o| on.send_recv_into(i, o, None, None)),
        ),
    ];
    for (name, want, run) in cases {
        let mut out = stream.alloc_zeros::<T>(want.numel()).map_err(cu)?;
        {
            let xv = on.view(&xb, shape.clone()).map_err(e)?;
            let mut ov = on.view_mut(&mut out, want.shape().to_vec()).map_err(e)?;
            run(&xv, &mut ov).map_err(|x| format!("{name}: {x}"))?;
        }
        on.record_event().map_err(e)?.synchronize().map_err(e)?;
        let got = Tensor::from_vec(want.shape().to_vec(), stream.clone_dtoh(&out).map_err(cu)?);
        same(&format!("{name} {dt}"), &got.map_err(e)?, &want, None)?;
    }
    // In place: broadcast and an all-reduce on one borrowed buffer.
    let mut buf = stream
        .clone_htod(x.as_slice::<T>().map_err(e)?)
        .map_err(cu)?;
    {
        let mut v = on.view_mut(&mut buf, shape.clone()).map_err(e)?;
        on.broadcast(&mut v, 0).map_err(e)?;
        on.all_reduce_in_place(&mut v, ReduceOp::Max).map_err(e)?;
    }
    let event = on.record_event().map_err(e)?;
    event.synchronize().map_err(e)?;
    if !event.query().map_err(e)? {
        return Err("an event waited for is not complete".into());
    }
    let mut want = x.clone();
    g.broadcast(&mut want, 0).map_err(e)?;
    let got = Tensor::from_vec(shape.clone(), stream.clone_dtoh(&buf).map_err(cu)?).map_err(e)?;
    same(
        &format!("broadcast + all_reduce_in_place {dt}"),
        &got,
        &want,
        None,
    )?;
    Ok(())
}

/// Views refused where they would touch the wrong memory: on another
/// stream than the one they were made for, and moved out of their borrow.
fn misused_views(
    on: &DeviceGroup<'_, '_>,
    dg: &DeviceGroup<'_, '_>,
    stream: &Arc<CudaStream>,
) -> Check {
    let mut buf = stream.alloc_zeros::<f32>(6).map_err(|x| x.to_string())?;
    {
        let v = on.view(&buf, vec![2, 3]).map_err(e)?;
        match dg.all_reduce(&v, ReduceOp::Sum) {
            Err(err) if err.to_string().contains("made for stream") => {}
            other => return Err(format!("a view on another stream: {other:?}")),
        }
    }
    let escaped = {
        let mut v = on.view_mut(&mut buf, vec![2, 3]).map_err(e)?;
        let other = on.empty(vec![2, 3], DType::F32).map_err(e)?;
        std::mem::replace(&mut *v, other)
    };
    match on.all_reduce(&escaped, ReduceOp::Sum) {
        Err(err) if err.to_string().contains("after its borrow ended") => Ok(()),
        other => Err(format!("a view moved out of its borrow: {other:?}")),
    }
}

/// Deferred agreement (its own job: a disagreement aborts the rank's NCCL
/// communicators). A call every rank refuses fails at once and leaves the
/// group usable; a shape mismatch is enqueued, and the next synchronize is
/// the same error on every rank, naming who passed what, with no hang.
fn deferred_mismatch() {
    let rt = Runtime::init().expect("MPI init");
    let world = rt.world_group().expect("world group");
    let dg = world.device().expect("device plane");
    let gpu = dg.gpu();
    let me = world.rank_in_group();
    let mode = world.check_mode();
    let x = gpu.upload(&input(&[4, 3], DType::F32, me)).unwrap();
    let refused = dg.all_gather(&x, 2).map(|_| ()).map_err(e);
    let sum = dg.all_reduce(&x, ReduceOp::Sum).map_err(e).and_then(|t| {
        let want = world.all_reduce(&input(&[4, 3], DType::F32, me), ReduceOp::Sum);
        same(
            "all_reduce",
            &gpu.download(&t).map_err(e)?,
            &want.map_err(e)?,
            None,
        )
    });
    // More agreed calls than a shared-memory ring holds (128), with a call
    // refused everywhere inside: the ring's slots are reused, the refused
    // entry only once every member has checked it.
    let mut m = gpu.upload(&input(&[5], DType::F32, me)).unwrap();
    let mut long = Ok(());
    for i in 0..400 {
        if i == 100 {
            long = long.and(match dg.all_gather(&m, 3) {
                Err(_) => Ok(()),
                Ok(_) => Err("a refused call succeeded".to_string()),
            });
        }
        long = long.and(dg.all_reduce_in_place(&mut m, ReduceOp::Max).map_err(e));
    }
    let long = long.and_then(|()| {
        let want = world.all_reduce(&input(&[5], DType::F32, me), ReduceOp::Max);
        same(
            "400 all_reduces",
            &gpu.download(&m).map_err(e)?,
            &want.map_err(e)?,
            None,
        )
    });
    let shape: &[usize] = if me == 1 { &[4, 4] } else { &[4, 3] };
    let y = gpu.upload(&input(shape, DType::F32, me)).unwrap();
    let enqueued = dg.all_reduce(&y, ReduceOp::Sum).map(|_| ()).map_err(e);
    let synced = dg.synchronize().map_err(e);
    println!(
        "rank {me}: mode {} on {}",
        mode.name(),
        world.host_executor()
    );
    println!("rank {me}: refused everywhere: {refused:?}");
    println!("rank {me}: all_reduce after: {sum:?}");
    println!("rank {me}: 400 calls: {long:?}");
    println!("rank {me}: mismatched call: {enqueued:?}");
    println!("rank {me}: synchronize: {synced:?}");
}

/// Deferred agreement with a member that skips a call: its peers' extra
/// agreement never completes, and their synchronize is a timeout error
/// naming the call (RANKMESH_TIMEOUT), not a hang; the member's own calls
/// all matched, so its synchronize succeeds.
fn deferred_skipped_call() {
    let rt = Runtime::init().expect("MPI init");
    let world = rt.world_group().expect("world group");
    let dg = world.device().expect("device plane");
    let me = world.rank_in_group();
    let x = dg.gpu().upload(&input(&[4], DType::F32, me)).unwrap();
    let calls = if me == 0 { 2 } else { 1 };
    for _ in 0..calls {
        dg.all_reduce(&x, ReduceOp::Sum).expect("enqueued");
    }
    println!("rank {me}: synchronize: {:?}", dg.synchronize().map_err(e));
}

/// A member of a stateless group formed by two separately launched jobs
/// (`StatelessGroup::connect`), moving device tensors over the NCCL
/// communicator whose unique id travelled over the group.
fn two_jobs_member() {
    let rt = Runtime::init().expect("MPI init");
    let var = |k: &str| std::env::var(k).unwrap_or_default();
    let me = var("RANKMESH_2J_OFFSET").parse::<usize>().unwrap() + rt.rank();
    let n: usize = var("RANKMESH_2J_WORLD").parse().unwrap();
    let check = || -> Check {
        let g =
            rankmesh::StatelessGroup::connect(&rt, &var("RANKMESH_2J_ADDR"), me, n).map_err(e)?;
        let dev = g.device().map_err(e)?;
        let gpu = dev.gpu();
        let w = Tensor::from_fn([64, 33], DType::F32, |i| (i % 97) as f64 / 7.0 - 3.0).unwrap();
        // Member 0's weights broadcast to every member.
        let broadcast_weights = |what: &str| -> Check {
            let mut t = if me == 0 {
                gpu.upload(&w)
            } else {
                gpu.zeros([64, 33], DType::F32)
            }
            .map_err(e)?;
            dev.broadcast(&mut t, 0).map_err(e)?;
            dev.synchronize().map_err(e)?;
            same(what, &gpu.download(&t).map_err(e)?, &w, None)
        };
        broadcast_weights("broadcast across jobs")?;

        let mut x = gpu.upload(&input(&[6, 5], DType::F32, me)).map_err(e)?;
        dev.all_reduce_in_place(&mut x, ReduceOp::Sum).map_err(e)?;
        dev.synchronize().map_err(e)?;
        let want = Tensor::from_fn([6, 5], DType::F32, |i| {
            (0..n)
                .map(|r| input(&[6, 5], DType::F32, r).to_f64_vec()[i])
                .sum()
        })
        .unwrap();
        same(
            "all_reduce across jobs",
            &gpu.download(&x).map_err(e)?,
            &want,
            None,
        )?;

        let y = input(&[5, 7], DType::BF16, 0);
        if me == 0 {
            dev.send(&gpu.upload(&y).map_err(e)?, n - 1).map_err(e)?;
        } else if me == n - 1 {
            let mut out = gpu.zeros([5, 7], DType::BF16).map_err(e)?;
            dev.recv_into(&mut out, 0).map_err(e)?;
            dev.synchronize().map_err(e)?;
            same(
                "send/recv across jobs",
                &gpu.download(&out).map_err(e)?,
                &y,
                None,
            )?;
        }

        // Disagreements are errors on every member, and the communicator stays usable.
        let mut odd = gpu
            .zeros([if me == 1 { 3 } else { 4 }], DType::F32)
            .map_err(e)?;
        match dev.broadcast(&mut odd, 0) {
            Err(err) if err.to_string().contains("ranks disagree: group rank 0 passed broadcast(device shape [4] f32, src 0) but group rank 1 passed broadcast(device shape [3] f32, src 0)") => {}
            other => return Err(format!("mismatched broadcast: {other:?}")),
        }
        if me <= 1 {
            let got = if me == 0 {
                dev.send(&gpu.zeros([4], DType::F32).map_err(e)?, 1)
            } else {
                dev.recv_into(&mut gpu.zeros([5], DType::F32).map_err(e)?, 0)
            };
            match got {
                Err(err)
                    if err
                        .to_string()
                        .contains("group rank 0 sends send/recv(device shape [4] f32) but group rank 1 expects send/recv(device shape [5] f32)") => {}
                other => return Err(format!("mismatched send/recv: {other:?}")),
            }
        }
        broadcast_weights("broadcast after errors")?;
        g.barrier().map_err(e)
    };
    match check() {
        Ok(()) => println!("2J-DEV-OK rank {me}"),
        Err(m) => println!("2J-DEV-FAILED rank {me}: {m}"),
    }
}

fn main() {
    if std::env::var_os("RANKMESH_2J_ROLE").is_some() {
        two_jobs_member();
    } else if let Some(dir) = std::env::var_os("RANKMESH_EMU_BUILD") {
        // For scripts (bench-check-modes.sh): build the emulators into `dir` only.
        emulator::build(std::path::Path::new(&dir)).expect("building the emulators");
    } else if std::env::var_os("RANKMESH_GPU_DEFERRED_SKIP").is_some() {
        deferred_skipped_call();
    } else if std::env::var_os("RANKMESH_GPU_DEFERRED_MISMATCH").is_some() {
        deferred_mismatch();
    } else if std::env::var_os("RANKMESH_GPU_SPLIT_CHECK").is_some() {
        one_bootstrap();
    } else if std::env::var_os("RANKMESH_GPU_DROP_CHECK").is_some() {
        drop_with_a_quiet_peer();
    } else if std::env::var_os("RANKMESH_GPU_DROP_ORDERS").is_some() {
        drop_in_every_order();
    } else if let Ok(fault) = std::env::var("RANKMESH_GPU_FAULT") {
        device_fault(&fault);
    } else if std::env::var_os("RANKMESH_GPU_WORKER").is_some() {
        worker();
    } else {
        emulator::drive();
    }
}

/// The multi-rank GPU check's faults (`RANKMESH_GPU_FAULT`), at np 2 or
/// more: `mismatch` (rank 1 all-reduces another shape; run it with
/// `RANKMESH_CHECK=strict`), `kill` (rank 1 SIGKILLs itself) or `stop`
/// (rank 1 SIGSTOPs itself) while every rank loops on device all_reduces of
/// 16 MiB, each synchronized. A rank that gets an error prints
/// `FAULT-NAMED rank R: ERROR` and exits 1 (never a pass: the loop runs
/// until an error ends it, and the script's step limit catches a hang).
fn device_fault(fault: &str) {
    let rt = Runtime::init().expect("MPI init");
    let world = rt.world_group().expect("world group");
    let me = world.rank_in_group();
    let run = || -> rankmesh::Result<()> {
        let dg = world.device()?;
        let gpu = dg.gpu();
        if fault == "mismatch" {
            let shape: &[usize] = if me == 1 { &[4, 4] } else { &[4, 3] };
            let x = gpu.upload(&input(shape, DType::F32, me))?;
            dg.all_reduce(&x, ReduceOp::Sum)?;
            return dg.synchronize();
        }
        let mut x = gpu.upload(&random(7 + me as u64, 4 << 20, DType::F32))?;
        dg.all_reduce_in_place(&mut x, ReduceOp::Max)?;
        dg.synchronize()?;
        if me == 1 {
            let sig = if fault == "kill" {
                libc::SIGKILL
            } else {
                libc::SIGSTOP
            };
            support::signal_self_after(sig, std::time::Duration::from_millis(500));
        }
        println!("FAULT-LOOP rank {me}");
        loop {
            dg.all_reduce_in_place(&mut x, ReduceOp::Max)?;
            dg.synchronize()?;
        }
    };
    match run() {
        Ok(()) => println!("FAULT-NOT-RAISED rank {me}"),
        Err(err) => {
            // One write, so the ranks' lines do not interleave.
            let line = format!("FAULT-NAMED rank {me}: {err}\n");
            let _ = std::io::Write::write_all(&mut std::io::stdout(), line.as_bytes());
            let _ = std::io::Write::flush(&mut std::io::stdout());
            std::process::exit(1);
        }
    }
}

/// A counter the NCCL emulator exports (`rankmesh_emu_inits`, ...), read
/// from the library rankmesh loaded (`RANKMESH_NCCL_LIB`); -1 from the real
/// library, which has no such counters (scripts/gpu-check.sh counts NCCL's
/// own "Init COMPLETE" lines there instead).
fn emulator_count(name: &str) -> i32 {
    let Ok(path) = std::env::var("RANKMESH_NCCL_LIB") else {
        return -1;
    };
    // SAFETY: the library rankmesh already loaded; the emulator's counters
    // are `int f(void)`, and a library without the symbol is not called.
    unsafe {
        let Ok(lib) = libloading::Library::new(&path) else {
            return -1;
        };
        let f: Result<libloading::Symbol<unsafe extern "C" fn() -> i32>, _> =
            lib.get(format!("{name}\0").as_bytes());
        f.map_or(-1, |f| f())
    }
}

/// `connect_devices`, then TP/SP/DP groups, a mesh and a split that leaves
/// ranks 2.. out: every group's device all_reduce matches the host one, and
/// the job bootstrapped NCCL once (all other communicators are splits).
/// Prints `SPLIT-OK rank R inits I splits S roots N`.
fn one_bootstrap() {
    let rt = Runtime::init().expect("MPI init");
    let run = || -> Result<(i32, i32, i32), String> {
        rt.connect_devices().map_err(e)?;
        let mut ps = rankmesh::ParallelState::new(&rt).map_err(e)?;
        let w = rt.size();
        let tp = if w.is_multiple_of(2) { 2 } else { 1 };
        // At 4 ranks FastVideo's tp=2, sp=2: the SP groups' all_to_all_4d below.
        let sp = if w == 4 { 2 } else { 1 };
        ps.initialize_model_parallel(tp, sp, None).map_err(e)?;
        let layout =
            rankmesh::MeshLayout::row_major(w, &[("dp", w / tp), ("tp", tp)]).map_err(e)?;
        let mesh = rankmesh::Mesh::new(&rt, layout, &[]).map_err(e)?;
        let groups = [
            ps.world().clone(),
            ps.tp().map_err(e)?,
            ps.sp().map_err(e)?,
            ps.dp().map_err(e)?,
            mesh.group(&["dp"]).map_err(e)?,
            mesh.group(&["tp"]).map_err(e)?,
        ];
        // A split that leaves ranks out: they pass no color and get no group
        // (a world of one, as on a one-GPU machine, keeps just rank 0).
        let part = rt
            .split_groups("part", &[(0..w.min(2)).collect()])
            .map_err(e)?;
        if part.is_some() != (rt.rank() < 2) {
            return Err(format!(
                "rank {} in the group of ranks 0 and 1: {}",
                rt.rank(),
                part.is_some()
            ));
        }
        let gpu = rt.gpu().map_err(e)?;
        for g in groups.iter().chain(part.iter()) {
            let x = random(17 + g.global_rank() as u64, 12, DType::F32);
            let x = x.reshape([4, 3]).map_err(e)?;
            let want = g.all_reduce(&x, ReduceOp::Sum).map_err(e)?;
            let dg = g.device().map_err(e)?;
            let got = gpu
                .download(
                    &dg.all_reduce(&gpu.upload(&x).map_err(e)?, ReduceOp::Sum)
                        .map_err(e)?,
                )
                .map_err(e)?;
            same(
                &format!("device all_reduce on {}", g.name()),
                &got,
                &want,
                Some(ReduceOp::Sum),
            )?;
        }
        // FastVideo's sequence-parallel attention on the SP group's
        // split-made communicator: all_to_all_4d in both directions, on the
        // device against the host plane.
        let sp_group = ps.sp().map_err(e)?;
        if sp_group.size() > 1 {
            let dg = sp_group.device().map_err(e)?;
            let n = sp_group.size();
            let me = sp_group.rank_in_group();
            for (shape, mode) in [([2, 3, n * 2, 4], (2, 1)), ([2, n * 3, 2, 4], (1, 2))] {
                let x = random(31 + me as u64, shape.iter().product(), DType::BF16);
                let x = x.reshape(shape).map_err(e)?;
                let want = sp_group.all_to_all_4d(&x, mode.0, mode.1).map_err(e)?;
                let got = dg
                    .all_to_all_4d(&gpu.upload(&x).map_err(e)?, mode.0, mode.1)
                    .map_err(e)?;
                same(
                    &format!("all_to_all_4d {mode:?} on {}", sp_group.name()),
                    &gpu.download(&got).map_err(e)?,
                    &want,
                    None,
                )?;
            }
            println!("SPLIT-A2A4D rank {} on {}", rt.rank(), sp_group.name());
        }
        Ok((
            emulator_count("rankmesh_emu_inits"),
            emulator_count("rankmesh_emu_splits"),
            emulator_count("rankmesh_emu_roots"),
        ))
    };
    match run() {
        Ok((inits, splits, roots)) => {
            println!(
                "SPLIT-OK rank {} inits {inits} splits {splits} roots {roots}",
                rt.rank()
            )
        }
        Err(m) => {
            println!("SPLIT-FAILED rank {}: {m}", rt.rank());
            std::process::exit(1);
        }
    }
}

/// Rank 1 (RANKMESH_EMU_STALL=1) accepts a device all_reduce and never
/// runs it, then stays quiet; rank 0 drops its group with the call still
/// pending. Prints `DROP rank R after S s`: the drop must end near
/// RANKMESH_TIMEOUT (finalize, then abort), not wait for the quiet peer.
fn drop_with_a_quiet_peer() {
    let rt = Runtime::init().expect("MPI init");
    let world = rt.world_group().expect("world group");
    let gpu = rt.gpu().expect("emulated GPU");
    let dg = world.device().expect("device plane");
    let x = gpu
        .upload(&input(&[4, 3], DType::F32, rt.rank()))
        .expect("upload");
    let pending = dg.all_reduce(&x, ReduceOp::Sum).expect("enqueued");
    if rt.rank() == 1 {
        // Quiet past the two RANKMESH_TIMEOUTs (5 s) rank 0's drop may take.
        std::thread::sleep(std::time::Duration::from_secs(12));
    }
    let start = std::time::Instant::now();
    drop(world);
    println!(
        "DROP rank {} after {:.1} s",
        rt.rank(),
        start.elapsed().as_secs_f64()
    );
    drop(pending);
}

/// Every order `0..n` (Heap's algorithm).
fn orders(n: usize) -> Vec<Vec<usize>> {
    fn heap(k: usize, a: &mut Vec<usize>, out: &mut Vec<Vec<usize>>) {
        if k <= 1 {
            out.push(a.clone());
            return;
        }
        for i in 0..k {
            heap(k - 1, a, out);
            a.swap(if k.is_multiple_of(2) { i } else { 0 }, k - 1);
        }
    }
    let mut out = Vec::new();
    heap(n, &mut (0..n).collect(), &mut out);
    out
}

/// What a program holds besides the runtime, each dropped on its own:
/// ParallelState's groups, a split group, a clone of the world group, and
/// a device result not yet synchronized (its deferred agreement posted).
/// In every order the borrows allow (24), on every rank alike; after each
/// round a fresh device and host all_reduce on the world must still be
/// right, and the runtime goes last. Prints `DROP-ORDERS rank R rounds N`.
fn drop_in_every_order() {
    /// Anything held, dropped when its turn comes.
    trait Held {}
    impl<T> Held for T {}
    let rt = Runtime::init().expect("MPI init");
    let world = rt.world_group().expect("world group");
    let gpu = rt.gpu().expect("emulated GPU");
    let me = rt.rank();
    let mut rounds = 0;
    for order in orders(4) {
        let mut ps = rankmesh::ParallelState::new(&rt).expect("parallel state");
        ps.initialize_model_parallel(1, 1, None)
            .expect("tp = sp = 1");
        let x = gpu.upload(&input(&[4, 3], DType::F32, me)).expect("upload");
        let tp_sum = ps
            .tp()
            .expect("tp")
            .device()
            .expect("device")
            .all_reduce(&x, ReduceOp::Sum);
        let lists: Vec<Vec<usize>> = (0..rt.size()).map(|r| vec![r]).collect();
        let mut held: Vec<Option<Box<dyn Held + '_>>> = vec![
            Some(Box::new(ps)),
            rt.split_groups("one", &lists)
                .expect("split")
                .map(|g| Box::new(g) as Box<dyn Held>),
            Some(Box::new(world.clone())),
            Some(Box::new(tp_sum.expect("enqueued"))),
        ];
        for i in order {
            drop(held[i].take());
        }
        let dg = world.device().expect("device plane");
        let want = world
            .all_reduce(&input(&[4, 3], DType::F32, me), ReduceOp::Sum)
            .expect("host");
        let got = gpu
            .download(&dg.all_reduce(&x, ReduceOp::Sum).expect("device"))
            .expect("download");
        same("world all_reduce after the drops", &got, &want, None).expect("equal");
        rounds += 1;
    }
    drop(world);
    println!("DROP-ORDERS rank {me} rounds {rounds}");
    drop(rt);
}

fn worker() {
    let rt = Runtime::init().expect("MPI init");
    if let Err(why) = rt.gpu() {
        if rt.rank() == 0 {
            println!(
                "gpu tests skipped: {}",
                why.to_string().lines().next().unwrap_or("")
            );
        }
        return;
    }
    let world = rt.world_group().expect("world group");
    let mut groups = vec![world.clone()];
    // A subgroup too, when there are ranks to split: communicators per group.
    if rt.size() >= 2 {
        let firsts: Vec<usize> = (0..rt.size()).step_by(2).collect();
        let lists: Vec<Vec<usize>> = firsts
            .iter()
            .map(|f| (*f..(*f + 2).min(rt.size())).collect())
            .collect();
        if let Some(g) = rt.split_groups("pair", &lists).expect("pairs") {
            groups.push(g);
        }
    }
    let checks: [(&str, CheckFn); 11] = [
        ("plane scenarios vs the serial reference", |_, dg| {
            planes::check_all(dg)
        }),
        ("autograd", check_autograd),
        ("tensor dicts", check_dicts),
        ("reductions", check_reductions),
        ("layout ops", check_layout_ops),
        ("point to point", check_point_to_point),
        ("errors", check_errors),
        ("caller memory and streams", check_views),
        ("bool, 16-bit integer and fp8 dtypes", check_narrow_dtypes),
        ("numerics on random data", check_numerics),
        (
            "ParallelState helpers on device tensors",
            check_helpers_follow_overrides,
        ),
    ];
    let mut failed = 0;
    for g in &groups {
        let dg = g.device().expect("device plane");
        for (name, check) in checks {
            match check(g, &dg) {
                Ok(()) => println!("rank {}: ok {name} on {}", rt.rank(), g.name()),
                Err(m) => {
                    failed += 1;
                    println!("rank {}: FAILED {name} on {}: {m}", rt.rank(), g.name());
                }
            }
        }
    }
    let info = rt.gpu().expect("checked").info().clone();
    println!(
        "rank {}: {} ({}), {} checks failed",
        rt.rank(),
        info.name,
        info.bus_id,
        failed
    );
    drop(groups);
    drop(world);
    drop(rt);
    if failed > 0 {
        std::process::exit(1);
    }
}
