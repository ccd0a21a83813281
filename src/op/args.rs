//! [`Args`]: an op and its parameters, built by name. The positions in a
//! descriptor's `params` are written here and read by the op's row
//! ([`super::ROWS`]) only, so a call site never spells an index. The
//! constructors of the ops that reshape are public, with
//! [`Args::output_shape`], so that a binding allocating outputs (the Python
//! package) asks the op's own rule instead of writing it again.

use super::{CheckMode, Op, ReduceOp};

/// An op with its parameters in descriptor order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Args {
    op: Op,
    params: [i64; 4],
}

impl Args {
    const fn with(op: Op, a: i64, b: i64) -> Args {
        Args {
            op,
            params: [a, b, 0, 0],
        }
    }

    /// An op without parameters (barrier, all_to_all, send/recv and the
    /// steps around the collectives).
    pub(crate) const fn bare(op: Op) -> Args {
        Args::with(op, 0, 0)
    }

    pub(crate) fn all_reduce(op: ReduceOp) -> Args {
        Args::with(Op::AllReduce, op.code(), 0)
    }

    pub(crate) fn reduce(dst: usize, op: ReduceOp) -> Args {
        Args::with(Op::Reduce, dst as i64, op.code())
    }

    /// `all_gather` along `dim` (negative: from the end).
    pub fn all_gather(dim: isize) -> Args {
        Args::with(Op::AllGather, dim as i64, 0)
    }

    /// An op with per-member `counts` along `dim` (its row is
    /// [`counted`](super::Op::counted)), reducing with `reduce` if it
    /// reduces. The counts travel as their digest: ranks that pass
    /// different counts disagree.
    pub(crate) fn counted(op: Op, dim: isize, counts: &[usize], reduce: Option<ReduceOp>) -> Args {
        debug_assert!(op.counted().is_some(), "{op:?} has no counts");
        let mut args = Args::with(op, dim as i64, counts_digest(counts));
        args.params[2] = reduce.map_or(0, ReduceOp::code);
        args
    }

    /// `gather` onto group rank `dst` along `dim`.
    pub fn gather(dst: usize, dim: isize) -> Args {
        Args::with(Op::Gather, dst as i64, dim as i64)
    }

    pub(crate) fn scatter(src: usize, dim: isize) -> Args {
        Args::with(Op::Scatter, src as i64, dim as i64)
    }

    /// `reduce_scatter` along `dim` with `op`.
    pub fn reduce_scatter(dim: isize, op: ReduceOp) -> Args {
        Args::with(Op::ReduceScatter, dim as i64, op.code())
    }

    pub(crate) fn broadcast(src: usize) -> Args {
        Args::with(Op::Broadcast, src as i64, 0)
    }

    /// FastVideo's `all_to_all_4D` with `(scatter_dim, gather_dim)`.
    pub fn all_to_all_4d(scatter_dim: usize, gather_dim: usize) -> Args {
        Args::with(Op::AllToAll4d, scatter_dim as i64, gather_dim as i64)
    }

    pub(crate) fn set_check_mode(mode: CheckMode) -> Args {
        Args::with(Op::SetCheckMode, mode.code() as i64, 0)
    }

    /// `type_digest`: the object type's digest, so that ranks passing
    /// different types disagree.
    pub(crate) fn broadcast_object(src: usize, type_digest: i64) -> Args {
        Args::with(Op::BroadcastObject, src as i64, type_digest)
    }

    pub(crate) fn gather_object(dst: usize, type_digest: i64) -> Args {
        Args::with(Op::GatherObject, dst as i64, type_digest)
    }

    /// An object op whose only parameter is the type's digest
    /// (`all_gather_object`, `send_object`).
    pub(crate) fn object(op: Op, type_digest: i64) -> Args {
        debug_assert!(matches!(op, Op::AllGatherObject | Op::SendObject));
        Args::with(op, type_digest, 0)
    }

    /// The shape of the output for an input of `shape` on a group of
    /// `size` (the op's own rule, as the allocating forms and the output
    /// check use it); `None` when the arguments name none (the call then
    /// fails on every rank, saying why).
    pub fn output_shape(&self, shape: &[usize], size: usize) -> Option<Vec<usize>> {
        self.op.output_shape(shape, &self.params, size)
    }

    #[inline(always)]
    pub(crate) fn op(&self) -> Op {
        self.op
    }

    #[inline(always)]
    pub(crate) fn params(&self) -> &[i64; 4] {
        &self.params
    }
}

/// The digest of an uneven op's counts that its descriptor carries, so
/// that ranks passing different counts disagree.
fn counts_digest(counts: &[usize]) -> i64 {
    let words: Vec<u64> = counts.iter().map(|n| *n as u64).collect();
    xxhash_rust::xxh3::xxh3_64(bytemuck::cast_slice(&words)) as i64
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each constructor's values land where its op's row reads them: the
    /// row's checks and output shape see the arguments by name.
    #[test]
    fn constructors_write_what_the_rows_read() {
        let shape = [2, 6];
        let shaped = |a: Args, size| a.output_shape(&shape, size);
        assert_eq!(shaped(Args::gather(1, -1), 2), Some(vec![2, 12]));
        assert_eq!(shaped(Args::all_gather(0), 3), Some(vec![6, 6]));
        assert_eq!(shaped(Args::scatter(0, 1), 3), Some(vec![2, 2]));
        let sum = ReduceOp::Sum;
        assert_eq!(shaped(Args::reduce_scatter(-2, sum), 2), Some(vec![1, 6]));
        let check = |a: Args, size| a.op().validate(None, &shape, a.params(), size);
        assert!(check(Args::gather(2, 0), 2).unwrap_err().contains("dst 2"));
        assert!(check(Args::broadcast(3), 2).unwrap_err().contains("src 3"));
        assert!(check(Args::scatter(0, 1), 4).unwrap_err().contains("dim 1"));
        assert!(check(Args::reduce(5, sum), 2)
            .unwrap_err()
            .contains("dst 5"));
        assert!(check(Args::broadcast_object(2, 7), 2)
            .unwrap_err()
            .contains("src 2"));
        assert!(check(Args::gather_object(4, 7), 2)
            .unwrap_err()
            .contains("dst 4"));
        assert!(check(Args::set_check_mode(CheckMode::Off), 2).is_ok());
        let a2a = Args::all_to_all_4d(2, 1);
        assert_eq!(a2a.output_shape(&[1, 2, 8, 4], 4), Some(vec![1, 8, 2, 4]));
        assert!(Args::gather(1, 0)
            .op()
            .output_used_on(1, Args::gather(1, 0).params()));
        assert!(!Args::gather(1, 0)
            .op()
            .output_used_on(0, Args::gather(1, 0).params()));
        assert_ne!(
            Args::counted(Op::AllGatherV, 0, &[1, 2], None),
            Args::counted(Op::AllGatherV, 0, &[2, 1], None)
        );
    }
}
