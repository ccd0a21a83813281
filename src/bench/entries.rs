//! One entry per benchmarked collective, as nccl-tests' `struct testColl`. An
//! entry holds names, per-rank element counts (aligned as nccl-tests aligns
//! them), bus factor, buffer shapes, deterministic input, expected output,
//! and the call itself (`Entry::call`, nccl-tests' `runColl`): the op's
//! method of [`Collectives`](crate::Collectives), so every data plane runs
//! the same entry. The harness (`mod.rs`) owns every loop; `baseline.rs`
//! holds the raw MPI and NCCL calls timed beside it.

use crate::dtype::DType;
use crate::error::Result;
use crate::group::Collectives;
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
    /// Source by the receive counts, at its send offset to this rank.
    ExchangedV,
    /// Source by the counts, at the offset into its block.
    ConcatenatedV,
    /// The reduction of every rank's element at this rank's offset by the
    /// counts.
    ReducedSliceV,
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
pub static ALL: [Entry; 14] = [
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
    entry(
        Op::AllToAllV,
        "alltoallv",
        Counts::Exchanged,
        Bus::Spread,
        Expect::ExchangedV,
    ),
    entry(
        Op::AllGatherV,
        "all_gather_v",
        Counts::Gathered,
        Bus::Spread,
        Expect::ConcatenatedV,
    ),
    entry(
        Op::ReduceScatterV,
        "reduce_scatter_v",
        Counts::Scattered,
        Bus::Spread,
        Expect::ReducedSliceV,
    ),
];

/// The per-member counts of an uneven entry on one rank (empty for the
/// others): `alltoallv`'s send and receive counts, or the counted ops'
/// counts (`all_gather_v`, `reduce_scatter_v`: the same in both).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Split {
    /// Elements this rank sends each member (`alltoallv`), or each
    /// member's elements (the counted ops).
    pub send: Vec<usize>,
    /// Elements this rank receives from each member.
    pub recv: Vec<usize>,
    /// The skewed blocks every rank's counts are made of.
    pub blocks: Vec<usize>,
}

/// Block `k` of `n` in a skewed split of `base` elements per block on
/// average: weights ramp linearly from `1 - skew` to `1 + skew` (mean 1,
/// so the totals stay the nominal size), each aligned down to `align`.
fn skewed(base: usize, n: usize, skew: f64, align: usize, k: usize) -> usize {
    if n < 2 {
        return base;
    }
    let w = 1.0 + skew * (2.0 * k as f64 / (n - 1) as f64 - 1.0);
    (base as f64 * w) as usize / align * align
}

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
        matches!(
            self.op,
            Op::AllReduce | Op::ReduceScatter | Op::Reduce | Op::ReduceScatterV
        )
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

    /// The counts of an uneven entry on group rank `me` of `n` for a
    /// `count`-element size (nominal: [`counts`](Self::counts)) skewed by
    /// `skew` (`--skew`, 0 to 1). `alltoallv`: rank `q` sends rank `r` the
    /// skewed block `(r - q) mod n`, so every rank sends and receives the
    /// nominal total; `all_gather_v`: rank `r` contributes block `r`;
    /// `reduce_scatter_v`: rank `r` keeps block `r`.
    pub fn split(&self, count: usize, (me, n): (usize, usize), elem: usize, skew: f64) -> Split {
        let align = (16 / elem).max(1);
        let (_, _, base) = self.counts(count, n, elem);
        let blocks: Vec<usize> = (0..n).map(|k| skewed(base, n, skew, align, k)).collect();
        match self.op {
            Op::AllToAllV => Split {
                send: (0..n).map(|r| blocks[(r + n - me) % n]).collect(),
                recv: (0..n).map(|q| blocks[(me + n - q) % n]).collect(),
                blocks,
            },
            Op::AllGatherV | Op::ReduceScatterV => Split {
                send: blocks.clone(),
                recv: blocks.clone(),
                blocks,
            },
            _ => Split::default(),
        }
    }

    /// One call of this entry's collective through `c`'s
    /// [`Collectives`] method, with the bench's reduction and root (nccl-tests'
    /// `runColl`); `None` for an op only a plane runs (`broadcast_object`).
    pub(crate) fn call<'rt, C: Collectives<'rt>>(
        &self,
        c: &C,
        (red, root): (ReduceOp, usize),
        input: &C::Tensor,
        output: &mut C::Tensor,
        split: &Split,
    ) -> Option<Result<()>> {
        Some(match self.op {
            Op::AllReduce => c.all_reduce_into(input, output, red),
            Op::AllGather => c.all_gather_into(input, output, 0),
            Op::ReduceScatter => c.reduce_scatter_into(input, output, 0, red),
            // Broadcast works in place on the output (the root's holds the data).
            Op::Broadcast => c.broadcast(output, root),
            Op::Reduce => c.reduce_into(input, output, root, red),
            Op::Gather => c.gather_into(input, output, root, 0),
            Op::Scatter => c.scatter_into(input, output, root, 0),
            Op::AllToAll => c.all_to_all_into(input, output),
            Op::SendRecv => c.send_recv_into(input, output, None, None),
            Op::AllToAll4d => c.all_to_all_4d_into(input, output, 2, 1),
            Op::AllToAllV => c.all_to_all_v_into(input, &split.send, output, &split.recv),
            Op::AllGatherV => c.all_gather_v_into(input, output, &split.send, 0),
            Op::ReduceScatterV => c.reduce_scatter_v_into(input, output, &split.send, 0, red),
            _ => return None,
        })
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
    /// `n` (`split`: this rank's [`split`](Self::split)): this rank's
    /// deterministic input, and an output that is zero except where the
    /// collective works in place on the root's data.
    pub fn buffers(
        &self,
        count: usize,
        dtype: DType,
        (me, n): (usize, usize),
        op: ReduceOp,
        root: usize,
        split: &Split,
    ) -> Result<(Tensor, Tensor)> {
        let (send, recv, _) = self.counts(count, n, dtype.size());
        let (ins, outs) = match self.op {
            Op::AllToAllV => (vec![split.send.iter().sum()], vec![split.recv.iter().sum()]),
            Op::AllGatherV => (vec![split.send[me]], vec![split.send.iter().sum()]),
            Op::ReduceScatterV => (vec![split.send.iter().sum()], vec![split.send[me]]),
            _ => self.shapes(send, recv, n),
        };
        let own = matches!(self.op, Op::Broadcast | Op::BroadcastObject) && me == root;
        Ok((
            Tensor::from_fn(ins, dtype, |i| value(me, i, op))?,
            Tensor::from_fn(outs, dtype, |i| if own { value(me, i, op) } else { 0.0 })?,
        ))
    }

    /// Number of elements of `output` that differ from the expected result
    /// on group rank `me` of `n` (0 where the rank holds no result;
    /// `split`: this rank's [`split`](Self::split)).
    pub fn count_wrong(
        &self,
        (me, n): (usize, usize),
        input_len: usize,
        output: &Tensor,
        (op, root): (ReduceOp, usize),
        split: &Split,
    ) -> u64 {
        let dtype = output.dtype();
        // The result exists on the root only (not validated elsewhere).
        if matches!(self.op, Op::Reduce | Op::Gather) && me != root {
            return 0;
        }
        let out_len = output.numel();
        let block = out_len / n.max(1);
        // Uneven entries: (first output element, source, its first element).
        let sources: Vec<(usize, usize, usize)> = match self.expect {
            Expect::ExchangedV | Expect::ConcatenatedV => {
                let (mut at, mut list) = (0, Vec::new());
                for (q, got) in split.recv.iter().enumerate() {
                    let from = match self.expect {
                        // Rank q's offset of its block to this rank.
                        Expect::ExchangedV => (0..me).map(|r| split.blocks[(r + n - q) % n]).sum(),
                        _ => 0,
                    };
                    list.push((at, q, from));
                    at += got;
                }
                list
            }
            _ => Vec::new(),
        };
        let source = |j: usize| {
            let i = sources.partition_point(|s| s.0 <= j) - 1;
            let (start, q, from) = sources[i];
            value(q, from + j - start, op)
        };
        let expected = |j: usize| -> f64 {
            match self.expect {
                Expect::Reduced => reduced(n, j, dtype, op),
                Expect::ReducedSlice => reduced(n, me * out_len + j, dtype, op),
                Expect::ReducedSliceV => {
                    reduced(n, split.send[..me].iter().sum::<usize>() + j, dtype, op)
                }
                Expect::Root => value(root, j, op),
                Expect::Concatenated => value(j / input_len, j % input_len, op),
                Expect::RootSlice => value(root, me * out_len + j, op),
                Expect::Exchanged => value(j / block, me * block + j % block, op),
                Expect::Previous => value((me + n - 1) % n, j, op),
                Expect::ExchangedV | Expect::ConcatenatedV => source(j),
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
        let none = Split::default();
        let (input, _) = e
            .buffers(36, DType::F32, (root, n), ReduceOp::Sum, root, &none)
            .unwrap();
        assert_eq!(input.numel(), 36);
        let slice = |k: usize| {
            Tensor::from_bytes([12], DType::F32, &input.bytes()[k * 48..(k + 1) * 48]).unwrap()
        };
        assert_eq!(
            e.count_wrong((me, n), 36, &slice(1), (ReduceOp::Sum, root), &none),
            0
        );
        assert!(e.count_wrong((me, n), 36, &slice(0), (ReduceOp::Sum, root), &none) > 0);
    }

    #[test]
    fn skewed_splits_keep_the_nominal_totals() {
        let e = get("alltoallv");
        // 4 ranks, 4096 floats per block on average, skew 0.5: blocks ramp
        // from 2048 to 6144 (aligned down to 4 floats).
        let all: Vec<Split> = (0..4)
            .map(|me| e.split(4096 * 4, (me, 4), 4, 0.5))
            .collect();
        assert_eq!(all[0].blocks, [2048, 3412, 4776, 6144]);
        for (me, s) in all.iter().enumerate() {
            // What q sends me is what I receive from q.
            for (q, theirs) in all.iter().enumerate() {
                assert_eq!(theirs.send[me], s.recv[q]);
            }
            assert_eq!(s.send.iter().sum::<usize>(), s.recv.iter().sum::<usize>());
        }
        assert_eq!(e.split(4096 * 4, (1, 4), 4, 0.0).send, [4096; 4]);
        // Validation finds a wrong element of a skewed exchange.
        let me = 2;
        let (_, mut out) = e
            .buffers(4096 * 4, DType::F32, (me, 4), ReduceOp::Sum, 0, &all[me])
            .unwrap();
        let got: Vec<f64> = {
            let mut v = Vec::new();
            for (q, theirs) in all.iter().enumerate() {
                let from: usize = theirs.send[..me].iter().sum();
                v.extend((0..theirs.send[me]).map(|k| value(q, from + k, ReduceOp::Sum)));
            }
            v
        };
        out = Tensor::from_fn(out.shape().to_vec(), DType::F32, |i| got[i]).unwrap();
        let check = |t: &Tensor| e.count_wrong((me, 4), 0, t, (ReduceOp::Sum, 0), &all[me]);
        assert_eq!(check(&out), 0);
        out.bytes_mut()[4] ^= 1;
        assert_eq!(check(&out), 1);
        let g = get("all_gather_v").split(4096 * 4, (0, 4), 4, 1.0);
        assert_eq!(g.send, [0, 2728, 5460, 8192]);
    }
}
