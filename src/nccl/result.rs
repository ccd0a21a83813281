//! The result level over [`sys`](super::sys): typed errors and type mappings.
//! Every NCCL return code becomes a typed [`NcclError`] that keeps the code
//! and NCCL's own texts, and rankmesh's dtypes and reduction operators map to
//! NCCL's enums here.

use super::sys::{dtype as nd, redop, Api, NcclResult, RawComm, UniqueId, SUCCESS};
use crate::dtype::DType;
use crate::error::NcclError;
use crate::op::ReduceOp;
use std::os::raw::c_int;

/// An error NCCL returned for `what`, with its texts.
pub(crate) fn error_of(api: &Api, raw: RawComm, code: NcclResult, what: &str) -> NcclError {
    let mut msg = format!("NCCL {what}: {} (code {code})", api.error_string(code));
    if let Some(last) = api.last_error(raw) {
        msg += &format!(": {last}");
    }
    NcclError { code, msg }
}

/// `Ok` for `ncclSuccess`, else the typed error of `what`.
pub(crate) fn check(
    api: &Api,
    raw: RawComm,
    code: NcclResult,
    what: &str,
) -> Result<(), NcclError> {
    if code == SUCCESS {
        Ok(())
    } else {
        Err(error_of(api, raw, code, &format!("{what} failed")))
    }
}

/// `ncclGetUniqueId`.
pub(crate) fn unique_id(api: &Api) -> Result<UniqueId, NcclError> {
    let mut id = UniqueId::from_bytes(&[0; super::sys::UNIQUE_ID_BYTES]);
    // SAFETY: `id` is a valid out-pointer.
    let rc = unsafe { (api.get_unique_id)(&mut id) };
    if rc == SUCCESS {
        Ok(id)
    } else {
        Err(NcclError {
            code: rc,
            msg: api.error_string(rc),
        })
    }
}

/// First NCCL with `ncclFloat8e4m3` / `ncclFloat8e5m2` (2.24.0).
pub const FP8_VERSION: i32 = 22400;
/// First compute capability NCCL reduces fp8 on (Hopper): below it the
/// library refuses with "FP8 reduction support begins with sm90 capable
/// devices".
pub const FP8_REDUCE_SM: (u32, u32) = (9, 0);

/// NCCL's own type for a dtype it names before 2.24; `None` for the ones it
/// lacks (bool, 16-bit integers) or only names from 2.24 (fp8).
fn classic_type(d: DType) -> Option<c_int> {
    Some(match d {
        DType::F32 => nd::FLOAT32,
        DType::F64 => nd::FLOAT64,
        DType::F16 => nd::FLOAT16,
        DType::BF16 => nd::BFLOAT16,
        DType::I8 => nd::INT8,
        DType::U8 => nd::UINT8,
        DType::I32 => nd::INT32,
        DType::U32 => nd::UINT32,
        DType::I64 => nd::INT64,
        DType::U64 => nd::UINT64,
        DType::F8E4M3 | DType::F8E5M2 | DType::Bool | DType::I16 | DType::U16 => return None,
    })
}

/// How `count` elements of `d` travel in a call that only moves them
/// (gather, broadcast, send, all-to-all): NCCL's type where it has one,
/// else as bytes, which moves the same bits on every NCCL version.
pub fn moved_as(d: DType, count: usize) -> (c_int, usize) {
    match classic_type(d) {
        Some(t) => (t, count),
        None => (nd::UINT8, count * d.size()),
    }
}

/// NCCL's type and operator for reducing `d` with `op` on NCCL `version`
/// and devices of compute capability `sm` (a group's lowest), or why NCCL
/// cannot. Refused here, before NCCL is asked, a reduction leaves the
/// communicator usable, and groups of every size refuse alike. Bool reduces
/// as bytes with sum as max (OR) and prod as min (AND), as PyTorch does;
/// avg of bools is refused earlier, by the op's own check.
pub fn reduced_as(
    d: DType,
    op: ReduceOp,
    version: i32,
    sm: (u32, u32),
) -> Result<(c_int, c_int), NcclError> {
    let fp8 = |t: c_int| {
        if version < FP8_VERSION {
            Err(NcclError::other(format!(
                "NCCL {} cannot reduce {d}: NCCL's fp8 types arrived in 2.24 \
                 (moving {d} without reducing works on any version)",
                super::loader::decode_version(version)
            )))
        } else if sm < FP8_REDUCE_SM {
            Err(NcclError::other(format!(
                "NCCL cannot reduce {d} on sm {}.{}: NCCL reduces fp8 from sm {}.{} (Hopper) on \
                 (moving {d} without reducing works on any GPU; reduce in f16 or bf16 here)",
                sm.0, sm.1, FP8_REDUCE_SM.0, FP8_REDUCE_SM.1
            )))
        } else {
            Ok(t)
        }
    };
    if matches!(d, DType::F8E4M3 | DType::F8E5M2) && op == ReduceOp::Avg {
        // Seen on a GPU (NCCL 2.28.3, H100): ncclAvg of fp8 is an invalid
        // argument, with no message from NCCL.
        return Err(NcclError::other(format!(
            "NCCL has no average for {d} (ncclAvg covers its integer and 16/32/64-bit float \
             types): all_reduce with sum and scale, or average in bf16"
        )));
    }
    let t = match d {
        DType::F8E4M3 => fp8(nd::FLOAT8_E4M3)?,
        DType::F8E5M2 => fp8(nd::FLOAT8_E5M2)?,
        DType::Bool => {
            let op = match op {
                ReduceOp::Sum | ReduceOp::Max => redop::MAX,
                _ => redop::MIN,
            };
            return Ok((nd::UINT8, op));
        }
        DType::I16 | DType::U16 => {
            return Err(NcclError::other(format!(
                "NCCL has no 16-bit integer type, so the device plane cannot reduce {d} \
                 (moving it works; reduce in i32 or on the host plane)"
            )))
        }
        _ => classic_type(d).expect("every other dtype is NCCL's"),
    };
    Ok((t, nccl_op(op)))
}

/// NCCL's reduction operator.
pub fn nccl_op(op: ReduceOp) -> c_int {
    match op {
        ReduceOp::Sum => redop::SUM,
        ReduceOp::Prod => redop::PROD,
        ReduceOp::Min => redop::MIN,
        ReduceOp::Max => redop::MAX,
        ReduceOp::Avg => redop::AVG,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_dtype_moves_and_the_classic_ones_keep_their_codes() {
        let classic: Vec<c_int> = DType::ALL[..10].iter().map(|d| moved_as(*d, 1).0).collect();
        let mut unique = classic.clone();
        unique.sort();
        unique.dedup();
        assert_eq!(unique, (0..10).collect::<Vec<_>>());
        assert_eq!(moved_as(DType::BF16, 3), (9, 3));
        assert_eq!(moved_as(DType::I16, 3), (nd::UINT8, 6));
        assert_eq!(moved_as(DType::F8E4M3, 3), (nd::UINT8, 3));
        assert_eq!(nccl_op(ReduceOp::Avg), 4);
        assert_eq!(nccl_op(ReduceOp::Min), 3);
    }

    #[test]
    fn reductions_map_or_say_why_not() {
        let new = 22703;
        let reduced_as = |d, op, v| reduced_as(d, op, v, (9, 0));
        assert_eq!(reduced_as(DType::F8E4M3, ReduceOp::Sum, new), Ok((10, 0)));
        assert_eq!(reduced_as(DType::F8E5M2, ReduceOp::Max, new), Ok((11, 2)));
        let old = reduced_as(DType::F8E5M2, ReduceOp::Sum, 22005).unwrap_err();
        assert!(
            old.msg.contains("NCCL 2.20.5 cannot reduce f8e5m2"),
            "{old}"
        );
        assert_eq!(reduced_as(DType::Bool, ReduceOp::Sum, new), Ok((1, 2)));
        assert_eq!(reduced_as(DType::Bool, ReduceOp::Prod, new), Ok((1, 3)));
        assert_eq!(reduced_as(DType::Bool, ReduceOp::Min, new), Ok((1, 3)));
        let e = reduced_as(DType::U16, ReduceOp::Sum, new).unwrap_err();
        assert!(e.msg.contains("no 16-bit integer type"), "{e}");
        assert_eq!(reduced_as(DType::F32, ReduceOp::Avg, new), Ok((7, 4)));
        for fp8 in [DType::F8E4M3, DType::F8E5M2] {
            let avg = reduced_as(fp8, ReduceOp::Avg, new).unwrap_err();
            assert!(
                avg.msg
                    .starts_with(&format!("NCCL has no average for {fp8}")),
                "{avg}"
            );
        }
    }

    #[test]
    fn fp8_reductions_need_sm90() {
        let ampere = super::reduced_as(DType::F8E4M3, ReduceOp::Sum, 22703, (8, 0)).unwrap_err();
        assert!(
            ampere
                .msg
                .starts_with("NCCL cannot reduce f8e4m3 on sm 8.0: NCCL reduces fp8 from sm 9.0"),
            "{ampere}"
        );
        assert_eq!(
            super::reduced_as(DType::F8E5M2, ReduceOp::Sum, 22703, (10, 0)),
            Ok((11, 0))
        );
        // Other dtypes reduce on any device; fp8 moves anywhere.
        assert_eq!(
            super::reduced_as(DType::BF16, ReduceOp::Sum, 22703, (7, 0)),
            Ok((9, 0))
        );
        assert_eq!(moved_as(DType::F8E4M3, 5), (nd::UINT8, 5));
    }
}
