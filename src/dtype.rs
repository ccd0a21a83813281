//! Element types: the dtype a tensor, a descriptor and an NCCL call name.
//! The bottom of the layers: nothing here imports anything of rankmesh.

use serde::{Deserialize, Serialize};

/// Element type of a tensor.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum DType {
    /// IEEE binary32.
    F32,
    /// IEEE binary64.
    F64,
    /// IEEE binary16.
    F16,
    /// bfloat16.
    BF16,
    /// Signed 8-bit integer.
    I8,
    /// Unsigned 8-bit integer.
    U8,
    /// Signed 32-bit integer.
    I32,
    /// Unsigned 32-bit integer.
    U32,
    /// Signed 64-bit integer.
    I64,
    /// Unsigned 64-bit integer.
    U64,
    /// 8-bit float, 4 exponent and 3 mantissa bits, no infinities (OCP
    /// E4M3FN, CUDA's `__nv_fp8_e4m3`, largest finite 448).
    F8E4M3,
    /// 8-bit float, 5 exponent and 2 mantissa bits (CUDA's `__nv_fp8_e5m2`,
    /// largest finite 57344).
    F8E5M2,
    /// One byte per element: zero is false, anything else true.
    Bool,
    /// Signed 16-bit integer.
    I16,
    /// Unsigned 16-bit integer.
    U16,
}

impl DType {
    /// Every dtype, in wire-code order (append only).
    pub const ALL: [DType; 15] = [
        DType::F32,
        DType::F64,
        DType::F16,
        DType::BF16,
        DType::I8,
        DType::U8,
        DType::I32,
        DType::U32,
        DType::I64,
        DType::U64,
        DType::F8E4M3,
        DType::F8E5M2,
        DType::Bool,
        DType::I16,
        DType::U16,
    ];

    /// Size of one element in bytes.
    pub fn size(self) -> usize {
        match self {
            DType::I8 | DType::U8 | DType::F8E4M3 | DType::F8E5M2 | DType::Bool => 1,
            DType::F16 | DType::BF16 | DType::I16 | DType::U16 => 2,
            DType::F32 | DType::I32 | DType::U32 => 4,
            DType::F64 | DType::I64 | DType::U64 => 8,
        }
    }

    /// Short lower-case name (`f32`, `bf16`, ...).
    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F64 => "f64",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::I8 => "i8",
            DType::U8 => "u8",
            DType::I32 => "i32",
            DType::U32 => "u32",
            DType::I64 => "i64",
            DType::U64 => "u64",
            DType::F8E4M3 => "f8e4m3",
            DType::F8E5M2 => "f8e5m2",
            DType::Bool => "bool",
            DType::I16 => "i16",
            DType::U16 => "u16",
        }
    }

    /// Whether this is a floating-point type.
    pub fn is_float(self) -> bool {
        matches!(
            self,
            DType::F32 | DType::F64 | DType::F16 | DType::BF16 | DType::F8E4M3 | DType::F8E5M2
        )
    }

    pub(crate) fn code(self) -> u32 {
        DType::ALL.iter().position(|d| *d == self).unwrap_or(0) as u32
    }

    pub(crate) fn from_code(code: u32) -> Option<DType> {
        DType::ALL.get(code as usize).copied()
    }
}

impl std::fmt::Display for DType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}
