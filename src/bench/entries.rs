//! One entry per benchmarked collective, as nccl-tests' `struct testColl`:
//! names, per-rank element counts (aligned as nccl-tests aligns them), bus
//! factor, buffer shapes, deterministic input and expected output. The
//! harness (`mod.rs`) owns every loop; the call itself is the op's method of
//! [`Collectives`](crate::Collectives), so every data plane runs the same entry.

use crate::dtype::DType;
use crate::op::Op;
use crate::op::ReduceOp;
use crate::tensor::Tensor;

/// What a data-movement entry computes for one size.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Counts {
    /// Same count in and out (all_reduce, broadcast, reduce, sendrecv).
    Same,
    /// Each rank's block gathered: out = in × n.
    Gathered,
    /// One block per rank scattered: in = out × n.
    Scattered,
    /// n blocks in and out.
    Exchanged,
}

/// Bus-bandwidth factor (nccl-tests' `getBw`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Bus {
    /// `2 (n-1) / n`.
    AllReduce,
    /// `(n-1) / n`.
    Spread,
    /// `1`.
    One,
}

/// Expected output element `j` on a rank, from the op's definition.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Expect {
    /// The reduction of every rank's element `j`.
    Reduced,
    /// The reduction of every rank's element `me × out + j`.
    ReducedSlice,
    /// The root's element `j`.
    Root,
    /// Element `j mod in` of rank `j / in`.
    Concatenated,
    /// Element `me × out + j` of the root.
    RootSlice,
    /// Block `j / block` of that rank, at offset `me × block`.
    Exchanged,
    /// The previous rank's element `j`.
    Previous,
}

/// One benchmarked collective.
#[derive(Debug, PartialEq)]
pub struct Entry {
    /// The operation.
    pub op: Op,
    name: &'static str,
    counts: Counts,
    bus: Bus,
    expect: Expect,
}

/// Every benchmarked collective, in CLI order.
pub static ALL: [Entry; 11] = [
    entry(
        Op::AllReduce,
        "all_reduce",
        Counts::Same,
        Bus::AllReduce,
        Expect::Reduced,
    ),
    entry(
        Op::AllGather,
        "all_gather",
        Counts::Gathered,
        Bus::Spread,
        Expect::Concatenated,
    ),
    entry(
        Op::ReduceScatter,
        "reduce_scatter",
        Counts::Scattered,
        Bus::Spread,
        Expect::ReducedSlice,
    ),
    entry(
        Op::Broadcast,
        "broadcast",
        Counts::Same,
        Bus::One,
        Expect::Root,
    ),
    entry(
        Op::Reduce,
        "reduce",
        Counts::Same,
        Bus::One,
        Expect::Reduced,
    ),
    entry(
        Op::AllToAll,
        "alltoall",
        Counts::Exchanged,
        Bus::Spread,
        Expect::Exchanged,
    ),
    entry(
        Op::SendRecv,
        "sendrecv",
        Counts::Same,
        Bus::One,
        Expect::Previous,
    ),
    entry(
        Op::AllToAll4d,
        "all_to_all_4d",
        Counts::Exchanged,
        Bus::Spread,
        Expect::Exchanged,
    ),
    entry(
        Op::BroadcastObject,
        "broadcast_object",
        Counts::Same,
        Bus::One,
        Expect::Root,
    ),
    entry(
        Op::Gather,
        "gather",
        Counts::Gathered,
        Bus::Spread,
        Expect::Concatenated,
    ),
    entry(
        Op::Scatter,
        "scatter",
        Counts::Scattered,
        Bus::Spread,
        Expect::RootSlice,
    ),
];

const fn entry(op: Op, name: &'static str, counts: Counts, bus: Bus, expect: Expect) -> Entry {
    Entry {
        op,
        name,
        counts,
        bus,
        expect,
    }
}

impl Entry {
    /// rankmesh's name (nccl-tests' without `_perf`).
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// The program name printed in the preamble (nccl-tests' binary name).
    pub fn program(&self) -> String {
        format!("{}_perf", self.name)
    }

    /// Parses a rankmesh name or an nccl-tests binary name (`all_reduce_perf`).
    pub fn parse(s: &str) -> Option<&'static Entry> {
        let base = s.strip_suffix("_perf").unwrap_or(s);
        let base = if base == "all_to_all" {
            "alltoall"
        } else {
            base
        };
        ALL.iter().find(|e| e.name == base)
    }

    /// Whether the reduction operator applies.
    pub fn reduces(&self) -> bool {
        matches!(self.op, Op::AllReduce | Op::ReduceScatter | Op::Reduce)
    }

    /// Whether the `redop` column names the `-o` operator: the reductions,
    /// and sendrecv, which nccl-tests has printed the operator for since 2021.
    pub fn shows_redop(&self) -> bool {
        self.reduces() || self.op == Op::SendRecv
    }

    /// Whether a root applies.
    pub fn rooted(&self) -> bool {
        matches!(
            self.op,
            Op::Broadcast | Op::Reduce | Op::BroadcastObject | Op::Gather | Op::Scatter
        )
    }

    /// (send, receive, parameter) element counts per rank for a `count`-element
    /// size, aligned as nccl-tests aligns them (16 bytes per rank's block).
    pub fn counts(&self, count: usize, n: usize, elem: usize) -> (usize, usize, usize) {
        let align = (16 / elem).max(1);
        let base = count / n / align * align;
        match self.counts {
            Counts::Same => (count, count, count),
            Counts::Gathered => (base, base * n, base),
            Counts::Scattered => (base * n, base, base),
            Counts::Exchanged => (base * n, base * n, base),
        }
    }

    /// nccl-tests' bus-bandwidth factor for `n` ranks.
    pub fn bus_factor(&self, n: usize) -> f64 {
        let n = n as f64;
        match self.bus {
            Bus::AllReduce => 2.0 * (n - 1.0) / n,
            Bus::Spread => (n - 1.0) / n,
            Bus::One => 1.0,
        }
    }

    /// Input and output shapes for `send` and `recv` elements on a group of `n`.
    pub fn shapes(&self, send: usize, recv: usize, n: usize) -> (Vec<usize>, Vec<usize>) {
        match self.op {
            Op::AllToAll4d => (vec![1, 1, n, send / n], vec![1, n, 1, send / n]),
            _ => (vec![send], vec![recv]),
        }
    }

    /// Host input and output tensors for one size on group rank `me` of
    /// `n`: this rank's deterministic input, and an output that is zero
    /// except where the collective works in place on the root's data.
    pub fn buffers(
        &self,
        count: usize,
        dtype: DType,
        (me, n): (usize, usize),
        op: ReduceOp,
        root: usize,
    ) -> crate::Result<(Tensor, Tensor)> {
        let (send, recv, _) = self.counts(count, n, dtype.size());
        let (ins, outs) = self.shapes(send, recv, n);
        let own = matches!(self.op, Op::Broadcast | Op::BroadcastObject) && me == root;
        Ok((
            Tensor::from_fn(ins, dtype, |i| value(me, i, op))?,
            Tensor::from_fn(outs, dtype, |i| if own { value(me, i, op) } else { 0.0 })?,
        ))
    }

    /// Number of elements of `output` that differ from the expected result
    /// on group rank `me` of `n` (0 where the rank holds no result).
    pub fn count_wrong(
        &self,
        (me, n): (usize, usize),
        input_len: usize,
        output: &Tensor,
        op: ReduceOp,
        root: usize,
    ) -> u64 {
        let dtype = output.dtype();
        // The result exists on the root only (not validated elsewhere).
        if matches!(self.op, Op::Reduce | Op::Gather) && me != root {
            return 0;
        }
        let out_len = output.numel();
        let block = out_len / n.max(1);
        let expected = |j: usize| -> f64 {
            match self.expect {
                Expect::Reduced => reduced(n, j, dtype, op),
                Expect::ReducedSlice => reduced(n, me * out_len + j, dtype, op),
                Expect::Root => value(root, j, op),
                Expect::Concatenated => value(j / input_len, j % input_len, op),
                Expect::RootSlice => value(root, me * out_len + j, op),
                Expect::Exchanged => value(j / block, me * block + j % block, op),
                Expect::Previous => value((me + n - 1) % n, j, op),
            }
        };
        // Avg of floats is one rounded division: allow one unit in the last
        // place. fp8 holds the inputs exactly but not their sums, and NCCL
        // rounds at every hop: allow one rounding per rank.
        let tol = match (op, dtype) {
            (_, DType::F8E4M3) => n as f64 / 16.0,
            (_, DType::F8E5M2) => n as f64 / 8.0,
            (ReduceOp::Avg, DType::F16) => 1e-3,
            (ReduceOp::Avg, DType::BF16) => 8e-3,
            (ReduceOp::Avg, DType::F32) => 2e-7,
            (ReduceOp::Avg, DType::F64) => 4e-16,
            _ => 0.0,
        };
        let tol = if self.reduces() { tol } else { 0.0 };
        // Expected values rounded to the dtype once, then compared element-wise.
        // Built like the output, so it fits in memory; if it still cannot be
        // had, NaN makes every element count as wrong rather than right.
        let want = Tensor::from_fn(output.shape().to_vec(), dtype, expected)
            .map_or_else(|_| vec![f64::NAN; output.numel()], |t| t.to_f64_vec());
        output
            .to_f64_vec()
            .iter()
            .zip(want)
            .filter(|(got, want)| (*got - want).abs() > tol * want.abs())
            .count() as u64
    }
}

/// Deterministic input: small non-negative integers, exact in every dtype,
/// whose sums and products are exact (or wrap identically) in any order.
pub fn value(rank: usize, i: usize, op: ReduceOp) -> f64 {
    if op == ReduceOp::Prod {
        1.0 + f64::from(u8::from((rank + i).is_multiple_of(13)))
    } else {
        ((rank * 3 + i) % 8) as f64
    }
}

/// Wraps an exact integer to `dtype`'s range (two's complement), as the
/// integer reductions do.
fn wrap(v: i128, dtype: DType) -> f64 {
    let bits = dtype.size() as u32 * 8;
    let m = v.rem_euclid(1i128 << bits);
    let signed = matches!(dtype, DType::I8 | DType::I16 | DType::I32 | DType::I64);
    if signed && m >= 1i128 << (bits - 1) {
        (m - (1i128 << bits)) as f64
    } else {
        m as f64
    }
}

/// The reduction over ranks `0..n` of `value(q, i)`, as the collective defines it.
fn reduced(n: usize, i: usize, dtype: DType, op: ReduceOp) -> f64 {
    let vals = (0..n).map(|q| value(q, i, op));
    if dtype == DType::Bool {
        let mut truths = vals.map(|v| v != 0.0);
        let all_or_any = match op {
            ReduceOp::Prod | ReduceOp::Min => truths.all(|t| t),
            _ => truths.any(|t| t),
        };
        return f64::from(u8::from(all_or_any));
    }
    if dtype.is_float() {
        return match op {
            ReduceOp::Sum => vals.sum(),
            ReduceOp::Avg => vals.sum::<f64>() / n as f64,
            ReduceOp::Prod => vals.product(),
            ReduceOp::Min => vals.fold(f64::INFINITY, f64::min),
            ReduceOp::Max => vals.fold(f64::NEG_INFINITY, f64::max),
        };
    }
    let ints = vals.map(|v| v as i128);
    match op {
        ReduceOp::Sum => wrap(ints.sum(), dtype),
        ReduceOp::Avg => (wrap(ints.sum(), dtype) / n as f64).trunc(),
        ReduceOp::Prod => wrap(ints.fold(1i128, |a, b| a.wrapping_mul(b)), dtype),
        ReduceOp::Min => ints.min().unwrap_or(0) as f64,
        ReduceOp::Max => ints.max().unwrap_or(0) as f64,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn get(name: &str) -> &'static Entry {
        Entry::parse(name).unwrap()
    }

    #[test]
    fn names_and_aliases() {
        for e in &ALL {
            assert_eq!(Entry::parse(e.name()), Some(e));
            assert_eq!(Entry::parse(&e.program()), Some(e));
        }
        assert_eq!(Entry::parse("all_to_all").unwrap().op, Op::AllToAll);
        assert_eq!(Entry::parse("scatter_perf").unwrap().op, Op::Scatter);
        assert_eq!(Entry::parse("hypercube_perf"), None);
    }

    #[test]
    fn bus_factors_are_nccl_tests_factors() {
        assert_eq!(get("all_reduce").bus_factor(4), 1.5);
        assert_eq!(get("all_gather").bus_factor(4), 0.75);
        assert_eq!(get("reduce_scatter").bus_factor(2), 0.5);
        assert_eq!(get("alltoall").bus_factor(8), 0.875);
        assert_eq!(get("scatter").bus_factor(4), 0.75);
        for name in ["broadcast", "reduce", "sendrecv"] {
            assert_eq!(get(name).bus_factor(4), 1.0);
        }
        assert_eq!(get("all_reduce").bus_factor(1), 0.0);
    }

    #[test]
    fn counts_are_aligned_like_nccl_tests() {
        // 32 MiB of floats on 3 ranks: per-rank block aligned down to 16 bytes.
        let count = 32 * 1024 * 1024 / 4;
        let (s, r, p) = get("all_gather").counts(count, 3, 4);
        assert_eq!((s, r, p), (2796200, 8388600, 2796200));
        assert_eq!(
            get("reduce_scatter").counts(count, 3, 4),
            (8388600, 2796200, 2796200)
        );
        assert_eq!(
            get("scatter").counts(count, 3, 4),
            (8388600, 2796200, 2796200)
        );
        assert_eq!(
            get("alltoall").counts(count, 3, 4),
            (8388600, 8388600, 2796200)
        );
        assert_eq!(get("all_reduce").counts(count, 3, 4), (count, count, count));
        assert_eq!(get("all_gather").counts(2, 4, 1), (0, 0, 0));
    }

    #[test]
    fn expected_values_wrap_like_the_integer_types() {
        assert_eq!(wrap(130, DType::I8), -126.0);
        assert_eq!(wrap(256 + 5, DType::U8), 5.0);
        assert_eq!(wrap(-1, DType::U32), u32::MAX as f64);
        assert_eq!(reduced(4, 0, DType::F32, ReduceOp::Sum), 10.0);
        assert_eq!(reduced(4, 0, DType::I32, ReduceOp::Avg), 2.0);
        assert_eq!(wrap(40000, DType::I16), -25536.0);
        assert_eq!(wrap(70000, DType::U16), 4464.0);
        // Rank 0's element 0 is 0: an OR is true, an AND false.
        assert_eq!(reduced(2, 0, DType::Bool, ReduceOp::Sum), 1.0);
        assert_eq!(reduced(2, 0, DType::Bool, ReduceOp::Min), 0.0);
        assert_eq!(reduced(1, 0, DType::Bool, ReduceOp::Max), 0.0);
    }

    #[test]
    fn scatter_expects_the_roots_slices() {
        let e = get("scatter");
        let (me, n, root) = (1, 3, 0);
        let (input, _) = e
            .buffers(36, DType::F32, (root, n), ReduceOp::Sum, root)
            .unwrap();
        assert_eq!(input.numel(), 36);
        let slice = |k: usize| {
            Tensor::from_bytes([12], DType::F32, &input.bytes()[k * 48..(k + 1) * 48]).unwrap()
        };
        assert_eq!(
            e.count_wrong((me, n), 36, &slice(1), ReduceOp::Sum, root),
            0
        );
        assert!(e.count_wrong((me, n), 36, &slice(0), ReduceOp::Sum, root) > 0);
    }
}
