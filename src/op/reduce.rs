//! Reduction operators.

use crate::parse::{choice, Choice};
use serde::{Deserialize, Serialize};

/// Element-wise reduction operator.
///
/// `Avg` is the sum divided by the group size: for floats in the type's
/// accumulation precision (f32 for f16/bf16), for integers with truncating
/// division of the (wrapping) sum.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ReduceOp {
    /// Sum.
    Sum,
    /// Product.
    Prod,
    /// Minimum.
    Min,
    /// Maximum.
    Max,
    /// Mean over the group.
    Avg,
}

impl ReduceOp {
    /// Every operator.
    pub const ALL: [ReduceOp; 5] = [
        ReduceOp::Sum,
        ReduceOp::Prod,
        ReduceOp::Min,
        ReduceOp::Max,
        ReduceOp::Avg,
    ];

    /// Lower-case name, as nccl-tests spells it.
    pub fn name(self) -> &'static str {
        match self {
            ReduceOp::Sum => "sum",
            ReduceOp::Prod => "prod",
            ReduceOp::Min => "min",
            ReduceOp::Max => "max",
            ReduceOp::Avg => "avg",
        }
    }

    pub(crate) fn code(self) -> i64 {
        ReduceOp::ALL.iter().position(|o| *o == self).unwrap_or(0) as i64
    }

    pub(crate) fn from_code(code: i64) -> Option<ReduceOp> {
        usize::try_from(code)
            .ok()
            .and_then(|i| ReduceOp::ALL.get(i).copied())
    }

    /// Serial reference: combines `a` and `b` as the collective would (in f64).
    pub fn combine(self, a: f64, b: f64) -> f64 {
        match self {
            ReduceOp::Sum | ReduceOp::Avg => a + b,
            ReduceOp::Prod => a * b,
            ReduceOp::Min => a.min(b),
            ReduceOp::Max => a.max(b),
        }
    }
}

choice!(ReduceOp, &ReduceOp::ALL);

impl std::str::FromStr for ReduceOp {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        ReduceOp::named(s)
            .ok_or_else(|| format!("unknown reduction {s:?} (sum, prod, min, max, avg)"))
    }
}
