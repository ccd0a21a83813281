//! The result level over [`sys`](super::sys): every NCCL return code becomes
//! a typed [`NcclError`] that keeps the code and NCCL's own texts, and
//! rankmesh's dtypes and reduction operators map to NCCL's enums here.

use super::sys::{dtype as nd, redop, Api, NcclResult, RawComm, UniqueId, SUCCESS};
use crate::reduce::ReduceOp;
use crate::tensor::DType;
use std::os::raw::c_int;

/// A failed NCCL call: the code, and `"NCCL <call>: <ncclGetErrorString>
/// (code N): <ncclGetLastError>"` as the message.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{msg}")]
pub struct NcclError {
    /// `ncclResult_t` (0 for an error rankmesh raised, e.g. a communicator
    /// already aborted).
    pub code: i32,
    /// The whole message.
    pub msg: String,
}

impl NcclError {
    /// An error NCCL returned for `what`, with its texts.
    pub(crate) fn from_code(api: &Api, raw: RawComm, code: NcclResult, what: &str) -> NcclError {
        let mut msg = format!("NCCL {what}: {} (code {code})", api.error_string(code));
        if let Some(last) = api.last_error(raw) {
            msg += &format!(": {last}");
        }
        NcclError { code, msg }
    }

    /// An error rankmesh raises itself (no NCCL code).
    pub(crate) fn other(msg: impl Into<String>) -> NcclError {
        NcclError {
            code: 0,
            msg: msg.into(),
        }
    }
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
        Err(NcclError::from_code(
            api,
            raw,
            code,
            &format!("{what} failed"),
        ))
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

/// NCCL's name for a dtype (every rankmesh dtype has one).
pub fn nccl_dtype(d: DType) -> c_int {
    match d {
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
    }
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
    fn every_dtype_and_operator_has_an_nccl_code() {
        let codes: Vec<c_int> = DType::ALL.iter().map(|d| nccl_dtype(*d)).collect();
        let mut unique = codes.clone();
        unique.sort();
        unique.dedup();
        assert_eq!(unique, (0..10).collect::<Vec<_>>());
        assert_eq!(nccl_dtype(DType::BF16), 9);
        assert_eq!(nccl_op(ReduceOp::Avg), 4);
        assert_eq!(nccl_op(ReduceOp::Min), 3);
    }
}
