//! Benchmark configuration: nccl-tests' flags and their parsing rules.

use super::entries::Entry;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::op::Op;
use crate::op::ReduceOp;

/// How per-rank times are combined (nccl-tests `-a`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Average {
    /// Rank 0's time.
    Rank0,
    /// Mean over ranks.
    Mean,
    /// Fastest rank.
    Min,
    /// Slowest rank.
    Max,
}

/// Which groups run the benchmark.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GroupChoice {
    /// The whole world.
    World,
    /// Every TP group at once.
    Tp,
    /// Every SP group at once.
    Sp,
    /// Every DP group at once.
    Dp,
}

/// A full benchmark configuration (nccl-tests flags plus rankmesh's).
#[derive(Clone, Debug)]
pub struct BenchConfig {
    /// Collective.
    pub op: &'static Entry,
    /// `-b`.
    pub min_bytes: usize,
    /// `-e`.
    pub max_bytes: usize,
    /// `-i`.
    pub step_bytes: usize,
    /// `-f` (> 1: multiply instead of add).
    pub step_factor: usize,
    /// `-n`.
    pub iters: usize,
    /// `-w`.
    pub warmup: usize,
    /// `-m`.
    pub agg: usize,
    /// `-N` (0: until killed).
    pub cycles: usize,
    /// `-c`: validation runs per size (0: off).
    pub check: usize,
    /// `-o`.
    pub redop: ReduceOp,
    /// `-d`.
    pub dtype: DType,
    /// `-r`.
    pub root: usize,
    /// `--skew` (uneven entries): per-member counts ramp from `1 - skew` to
    /// `1 + skew` times the nominal block.
    pub skew: f64,
    /// `-z`: 1 wait and barrier after each call, 2 wait after each call, 3
    /// wait and barrier after each iteration (barrier not timed).
    pub blocking: usize,
    /// `-a`.
    pub average: Average,
    /// `--group` with `--tp` / `--sp`.
    pub group: GroupChoice,
    /// TP size for `--group`.
    pub tp: usize,
    /// SP size for `--group`.
    pub sp: usize,
    /// `--backend nccl`: device tensors through NCCL instead of host memory through MPI.
    pub device: bool,
    /// `--baseline`: raw MPI on the host plane, raw NCCL on the device plane.
    pub baseline: bool,
    /// `--stats`.
    pub stats: bool,
    /// Flip one output element on rank 0 before the first validation (tests the checker).
    pub corrupt: bool,
    /// `--min-bw` / `NCCL_TESTS_MIN_BW`.
    pub min_bw: Option<f64>,
    /// Show progress on stderr when it is a terminal.
    pub progress: bool,
    /// `-R` as nccl-tests: 0 plain buffers; 1 buffers from `ncclMemAlloc`
    /// registered with `ncclCommRegister`; 2 registered as symmetric windows
    /// (`ncclCommWindowRegister`). Device plane only.
    pub register: u8,
}

/// nccl-tests' type names (its `-d` names, and what its tables print);
/// `bool`, `int16` and `uint16`, which nccl-tests lacks, in its style.
pub fn nccl_type_name(d: DType) -> &'static str {
    match d {
        DType::F32 => "float",
        DType::F64 => "double",
        DType::F16 => "half",
        DType::BF16 => "bfloat16",
        DType::I8 => "int8",
        DType::U8 => "uint8",
        DType::I32 => "int32",
        DType::U32 => "uint32",
        DType::I64 => "int64",
        DType::U64 => "uint64",
        DType::F8E4M3 => "f8e4m3",
        DType::F8E5M2 => "f8e5m2",
        DType::Bool => "bool",
        DType::I16 => "int16",
        DType::U16 => "uint16",
    }
}

/// Parses nccl-tests' `-d` names (and rankmesh's `f32`, `bf16`, ...).
pub fn parse_dtype(s: &str) -> Option<DType> {
    DType::ALL
        .into_iter()
        .find(|d| nccl_type_name(*d) == s || d.name() == s)
}

/// nccl-tests' sizes (`4096`, `16M`), the same parser the `RANKMESH_*_BYTES`
/// variables use, in bytes of this machine's `usize`.
pub fn parse_size(s: &str) -> Option<usize> {
    crate::parse::parse_size(s).and_then(|b| usize::try_from(b).ok())
}

/// The sizes of a sweep, in bytes.
pub fn sizes(cfg: &BenchConfig) -> Vec<usize> {
    let mut out = Vec::new();
    let mut s = cfg.min_bytes;
    while s <= cfg.max_bytes {
        out.push(s);
        let next = if cfg.step_factor > 1 {
            s.saturating_mul(cfg.step_factor)
        } else {
            s.saturating_add(cfg.step_bytes)
        };
        if next == s {
            break;
        }
        s = next;
    }
    out
}

impl BenchConfig {
    /// Rejects sizes and flags that cannot run, on every rank alike.
    pub fn validate(&self, group_size: usize) -> Result<()> {
        let bad = |m: String| {
            Err(Error::Usage {
                what: "bench",
                group: "world".into(),
                msg: m,
            })
        };
        if self.min_bytes > self.max_bytes {
            return bad(format!(
                "minimum size {} is above maximum size {}",
                self.min_bytes, self.max_bytes
            ));
        }
        if self.step_factor <= 1 && self.step_bytes == 0 && self.min_bytes != self.max_bytes {
            return bad("step bytes (-i) must be positive when -f is 1".into());
        }
        if self.blocking > 3 {
            return bad(format!(
                "-z {}: use 0 (none), 1 (wait and barrier per call), 2 (wait per call) or 3 (wait and barrier per iteration)",
                self.blocking
            ));
        }
        if self.iters == 0 || self.agg == 0 {
            return bad("-n and -m must be at least 1".into());
        }
        if self.op.rooted() && self.root >= group_size {
            return bad(format!(
                "root {} is not a rank of a group of size {group_size}",
                self.root
            ));
        }
        if !(0.0..=1.0).contains(&self.skew) {
            return bad(format!("--skew {}: use a value from 0 to 1", self.skew));
        }
        if self.op.op == Op::BroadcastObject && self.dtype != DType::U8 {
            return bad("broadcast_object moves bytes: use -d uint8".into());
        }
        Ok(())
    }
}
