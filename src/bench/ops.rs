//! What each benchmarked collective contributes to the harness (as in
//! nccl-tests, one small description per collective): its names, per-rank
//! element counts, bus-bandwidth factor, the rankmesh call, the raw-MPI
//! baseline call, and its deterministic input and expected output.

use crate::error::Result;
use crate::group::GroupCoordinator;
use crate::reduce::ReduceOp;
use crate::tensor::{DType, HostData, Tensor};
use mpi::collective::SystemOperation;
use mpi::topology::SimpleCommunicator;
use mpi::traits::*;

/// A benchmarkable collective.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BenchOp {
    /// `all_reduce_perf`.
    AllReduce,
    /// `all_gather_perf`.
    AllGather,
    /// `reduce_scatter_perf`.
    ReduceScatter,
    /// `broadcast_perf`.
    Broadcast,
    /// `reduce_perf`.
    Reduce,
    /// `alltoall_perf`.
    AllToAll,
    /// `sendrecv_perf`: ring shift.
    SendRecv,
    /// rankmesh's FastVideo all-to-all (mode (2, 1)).
    AllToAll4d,
    /// rankmesh's typed object broadcast of a byte vector.
    BroadcastObject,
}

impl BenchOp {
    /// Every collective, in CLI order.
    pub const ALL: [BenchOp; 9] = [
        BenchOp::AllReduce,
        BenchOp::AllGather,
        BenchOp::ReduceScatter,
        BenchOp::Broadcast,
        BenchOp::Reduce,
        BenchOp::AllToAll,
        BenchOp::SendRecv,
        BenchOp::AllToAll4d,
        BenchOp::BroadcastObject,
    ];

    /// rankmesh's name.
    pub fn name(self) -> &'static str {
        match self {
            BenchOp::AllReduce => "all_reduce",
            BenchOp::AllGather => "all_gather",
            BenchOp::ReduceScatter => "reduce_scatter",
            BenchOp::Broadcast => "broadcast",
            BenchOp::Reduce => "reduce",
            BenchOp::AllToAll => "alltoall",
            BenchOp::SendRecv => "sendrecv",
            BenchOp::AllToAll4d => "all_to_all_4d",
            BenchOp::BroadcastObject => "broadcast_object",
        }
    }

    /// The program name printed in the preamble (nccl-tests' binary name).
    pub fn program(self) -> String {
        format!("{}_perf", self.name())
    }

    /// Parses a rankmesh name or an nccl-tests binary name (`all_reduce_perf`).
    pub fn parse(s: &str) -> Option<BenchOp> {
        let base = s.strip_suffix("_perf").unwrap_or(s);
        let base = if base == "all_to_all" {
            "alltoall"
        } else {
            base
        };
        BenchOp::ALL.into_iter().find(|o| o.name() == base)
    }

    /// Whether the reduction operator applies.
    pub fn reduces(self) -> bool {
        matches!(
            self,
            BenchOp::AllReduce | BenchOp::ReduceScatter | BenchOp::Reduce
        )
    }

    /// Whether a root applies.
    pub fn rooted(self) -> bool {
        matches!(
            self,
            BenchOp::Broadcast | BenchOp::Reduce | BenchOp::BroadcastObject
        )
    }

    /// (send, receive, parameter) element counts per rank for a `count`-element
    /// size, aligned as nccl-tests aligns them (16 bytes per rank's block).
    pub fn counts(self, count: usize, n: usize, elem: usize) -> (usize, usize, usize) {
        let align = (16 / elem).max(1);
        let base = count / n / align * align;
        match self {
            BenchOp::AllGather => (base, base * n, base),
            BenchOp::ReduceScatter => (base * n, base, base),
            BenchOp::AllToAll | BenchOp::AllToAll4d => (base * n, base * n, base),
            _ => (count, count, count),
        }
    }

    /// nccl-tests' bus-bandwidth factor for `n` ranks.
    pub fn bus_factor(self, n: usize) -> f64 {
        let n = n as f64;
        match self {
            BenchOp::AllReduce => 2.0 * (n - 1.0) / n,
            BenchOp::AllGather
            | BenchOp::ReduceScatter
            | BenchOp::AllToAll
            | BenchOp::AllToAll4d => (n - 1.0) / n,
            BenchOp::Broadcast | BenchOp::Reduce | BenchOp::SendRecv | BenchOp::BroadcastObject => {
                1.0
            }
        }
    }

    /// Input shape for `send` elements on a group of `n`.
    fn input_shape(self, send: usize, n: usize) -> Vec<usize> {
        match self {
            BenchOp::AllToAll4d => vec![1, 1, n, send / n],
            _ => vec![send],
        }
    }

    /// Fresh input and output tensors for one size.
    pub fn buffers(self, g: &GroupCoordinator<'_>, count: usize, dtype: DType) -> (Tensor, Tensor) {
        let (send, recv, _) = self.counts(count, g.size(), dtype.size());
        let out_shape = match self {
            BenchOp::AllToAll4d => vec![1, g.size(), 1, send / g.size()],
            _ => vec![recv],
        };
        (
            Tensor::zeros(self.input_shape(send, g.size()), dtype),
            Tensor::zeros(out_shape, dtype),
        )
    }

    /// One rankmesh call from `input` into `output`.
    pub fn run(
        self,
        g: &GroupCoordinator<'_>,
        input: &Tensor,
        output: &mut Tensor,
        op: ReduceOp,
        root: usize,
    ) -> Result<()> {
        match self {
            BenchOp::AllReduce => g.all_reduce_into(input, output, op),
            BenchOp::AllGather => g.all_gather_into(input, output, 0),
            BenchOp::ReduceScatter => g.reduce_scatter_into(input, output, 0, op),
            // Broadcast works in place on the output (the root's holds the data).
            BenchOp::Broadcast => g.broadcast(output, root),
            BenchOp::Reduce => g.reduce_into(input, output, root, op),
            BenchOp::AllToAll => g.all_to_all_into(input, output),
            BenchOp::SendRecv => g.send_recv_into(input, output, None, None),
            BenchOp::AllToAll4d => {
                *output = g.all_to_all_4d(input, 2, 1)?;
                Ok(())
            }
            BenchOp::BroadcastObject => {
                let mine = (g.rank_in_group() == root).then(|| output.bytes().to_vec());
                let got: Vec<u8> = g.broadcast_object(mine.as_ref(), root)?;
                output.bytes_mut().copy_from_slice(&got);
                Ok(())
            }
        }
    }

    /// The same data movement through direct MPI calls (no rankmesh layer);
    /// `false` when MPI has no equivalent (16-bit float reductions, `avg`).
    pub fn run_mpi(
        self,
        comm: &SimpleCommunicator,
        input: &Tensor,
        output: &mut Tensor,
        op: ReduceOp,
        root: usize,
    ) -> bool {
        let n = comm.size();
        let me = comm.rank();
        let root_proc = comm.process_at_rank(root as i32);
        // Zero elements: nothing moves (and MPI reads two empty Rust buffers as aliased).
        if input.numel() == 0 && output.numel() == 0 {
            return true;
        }
        match self {
            BenchOp::AllGather => comm.all_gather_into(input.bytes(), output.bytes_mut()),
            BenchOp::Broadcast | BenchOp::BroadcastObject => {
                root_proc.broadcast_into(output.bytes_mut())
            }
            BenchOp::AllToAll | BenchOp::AllToAll4d => {
                comm.all_to_all_into(input.bytes(), output.bytes_mut())
            }
            BenchOp::SendRecv => {
                let (next, prev) = (
                    comm.process_at_rank((me + 1) % n),
                    comm.process_at_rank((me + n - 1) % n),
                );
                mpi::point_to_point::send_receive_into(
                    input.bytes(),
                    &next,
                    output.bytes_mut(),
                    &prev,
                );
            }
            BenchOp::AllReduce | BenchOp::ReduceScatter | BenchOp::Reduce => {
                let sys = match op {
                    ReduceOp::Sum => SystemOperation::sum(),
                    ReduceOp::Prod => SystemOperation::product(),
                    ReduceOp::Min => SystemOperation::min(),
                    ReduceOp::Max => SystemOperation::max(),
                    ReduceOp::Avg => return false,
                };
                macro_rules! typed {
                    ($i:expr, $o:expr) => {
                        match self {
                            BenchOp::AllReduce => {
                                comm.all_reduce_into($i.as_slice(), $o.as_mut_slice(), &sys)
                            }
                            BenchOp::ReduceScatter => comm.reduce_scatter_block_into(
                                $i.as_slice(),
                                $o.as_mut_slice(),
                                &sys,
                            ),
                            _ if me as usize == root => {
                                root_proc.reduce_into_root($i.as_slice(), $o.as_mut_slice(), &sys)
                            }
                            _ => root_proc.reduce_into($i.as_slice(), &sys),
                        }
                    };
                }
                let (i, o) = (input.data(), output.data_mut());
                match (i, o) {
                    (HostData::F32(i), HostData::F32(o)) => typed!(i, o),
                    (HostData::F64(i), HostData::F64(o)) => typed!(i, o),
                    (HostData::I8(i), HostData::I8(o)) => typed!(i, o),
                    (HostData::U8(i), HostData::U8(o)) => typed!(i, o),
                    (HostData::I32(i), HostData::I32(o)) => typed!(i, o),
                    (HostData::U32(i), HostData::U32(o)) => typed!(i, o),
                    (HostData::I64(i), HostData::I64(o)) => typed!(i, o),
                    (HostData::U64(i), HostData::U64(o)) => typed!(i, o),
                    _ => return false,
                }
            }
        }
        true
    }
}

/// Deterministic input: small non-negative integers, exact in every dtype,
/// whose sums and products are exact (or wrap identically) in any order.
pub fn value(rank: usize, i: usize, op: ReduceOp) -> f64 {
    if op == ReduceOp::Prod {
        1.0 + f64::from(u8::from((rank + i) % 13 == 0))
    } else {
        ((rank * 3 + i) % 8) as f64
    }
}

/// Wraps an exact integer to `dtype`'s range (two's complement), as the
/// integer reductions do.
fn wrap(v: i128, dtype: DType) -> f64 {
    let bits = dtype.size() as u32 * 8;
    let m = v.rem_euclid(1i128 << bits);
    let signed = matches!(dtype, DType::I8 | DType::I32 | DType::I64);
    if signed && m >= 1i128 << (bits - 1) {
        (m - (1i128 << bits)) as f64
    } else {
        m as f64
    }
}

/// The reduction over ranks `0..n` of `value(q, i)`, as the collective defines it.
fn reduced(n: usize, i: usize, dtype: DType, op: ReduceOp) -> f64 {
    let vals = (0..n).map(|q| value(q, i, op));
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

impl BenchOp {
    /// Fills `input` (and the root's `output` where the collective works in
    /// place) with this rank's deterministic data; zeroes other outputs.
    pub fn init(
        self,
        g: &GroupCoordinator<'_>,
        input: &mut Tensor,
        output: &mut Tensor,
        op: ReduceOp,
        root: usize,
    ) {
        let me = g.rank_in_group();
        *input = Tensor::from_fn(input.shape().to_vec(), input.dtype(), |i| value(me, i, op));
        let own = matches!(self, BenchOp::Broadcast | BenchOp::BroadcastObject) && me == root;
        *output = Tensor::from_fn(output.shape().to_vec(), output.dtype(), |i| {
            if own {
                value(me, i, op)
            } else {
                0.0
            }
        });
    }

    /// Number of elements of `output` that differ from the expected result on
    /// this rank (0 where the rank holds no result).
    pub fn count_wrong(
        self,
        g: &GroupCoordinator<'_>,
        input_len: usize,
        output: &Tensor,
        op: ReduceOp,
        root: usize,
    ) -> u64 {
        let (n, me) = (g.size(), g.rank_in_group());
        let dtype = output.dtype();
        if self == BenchOp::Reduce && me != root {
            return 0;
        }
        let block = output.numel() / n.max(1);
        let expected = |j: usize| -> f64 {
            match self {
                BenchOp::AllReduce | BenchOp::Reduce => reduced(n, j, dtype, op),
                BenchOp::ReduceScatter => reduced(n, me * output.numel() + j, dtype, op),
                BenchOp::Broadcast | BenchOp::BroadcastObject => value(root, j, op),
                BenchOp::AllGather => value(j / input_len, j % input_len, op),
                BenchOp::AllToAll | BenchOp::AllToAll4d => {
                    value(j / block, me * block + j % block, op)
                }
                BenchOp::SendRecv => value((me + n - 1) % n, j, op),
            }
        };
        // Avg of floats is one rounded division: allow one unit in the last place.
        let tol = match (op, dtype) {
            (ReduceOp::Avg, DType::F16) => 1e-3,
            (ReduceOp::Avg, DType::BF16) => 8e-3,
            (ReduceOp::Avg, DType::F32) => 2e-7,
            (ReduceOp::Avg, DType::F64) => 4e-16,
            _ => 0.0,
        };
        let tol = if self.reduces() { tol } else { 0.0 };
        // Expected values rounded to the dtype once, then compared element-wise.
        let want = Tensor::from_fn(output.shape().to_vec(), dtype, expected).to_f64_vec();
        output
            .to_f64_vec()
            .iter()
            .zip(want)
            .filter(|(got, want)| (*got - want).abs() > tol * want.abs())
            .count() as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_aliases() {
        for op in BenchOp::ALL {
            assert_eq!(BenchOp::parse(op.name()), Some(op));
            assert_eq!(BenchOp::parse(&op.program()), Some(op));
        }
        assert_eq!(BenchOp::parse("all_to_all"), Some(BenchOp::AllToAll));
        assert_eq!(BenchOp::parse("gather_perf"), None);
    }

    #[test]
    fn bus_factors_are_nccl_tests_factors() {
        assert_eq!(BenchOp::AllReduce.bus_factor(4), 1.5);
        assert_eq!(BenchOp::AllGather.bus_factor(4), 0.75);
        assert_eq!(BenchOp::ReduceScatter.bus_factor(2), 0.5);
        assert_eq!(BenchOp::AllToAll.bus_factor(8), 0.875);
        for op in [BenchOp::Broadcast, BenchOp::Reduce, BenchOp::SendRecv] {
            assert_eq!(op.bus_factor(4), 1.0);
        }
        assert_eq!(BenchOp::AllReduce.bus_factor(1), 0.0);
    }

    #[test]
    fn counts_are_aligned_like_nccl_tests() {
        // 32 MiB of floats on 3 ranks: per-rank block aligned down to 16 bytes.
        let count = 32 * 1024 * 1024 / 4;
        let (s, r, p) = BenchOp::AllGather.counts(count, 3, 4);
        assert_eq!((s, r, p), (2796200, 8388600, 2796200));
        assert_eq!(
            BenchOp::ReduceScatter.counts(count, 3, 4),
            (8388600, 2796200, 2796200)
        );
        assert_eq!(
            BenchOp::AllToAll.counts(count, 3, 4),
            (8388600, 8388600, 2796200)
        );
        assert_eq!(
            BenchOp::AllReduce.counts(count, 3, 4),
            (count, count, count)
        );
        assert_eq!(BenchOp::AllGather.counts(2, 4, 1), (0, 0, 0));
    }

    #[test]
    fn expected_values_wrap_like_the_integer_types() {
        assert_eq!(wrap(130, DType::I8), -126.0);
        assert_eq!(wrap(256 + 5, DType::U8), 5.0);
        assert_eq!(wrap(-1, DType::U32), u32::MAX as f64);
        assert_eq!(reduced(4, 0, DType::F32, ReduceOp::Sum), 10.0);
        assert_eq!(reduced(4, 0, DType::I32, ReduceOp::Avg), 2.0);
    }
}
