//! The op list's identities and each op's rules, written once for every data
//! plane: parameter names, parameter checks, the output shape a call produces,
//! and where a caller's output is checked. The dispatch path applies these
//! rules itself ([`GroupCoordinator::run_op`](crate::GroupCoordinator)), so an
//! executor only says which op, which tensors, and how to move the bytes.

mod mode;
mod reduce;
pub(crate) mod uneven;

pub use mode::CheckMode;
pub use reduce::ReduceOp;

use crate::dtype::DType;

/// The two FastVideo all-to-all modes `(scatter_dim, gather_dim)`.
pub(crate) const ALL_TO_ALL_MODES: [(i64, i64); 2] = [(2, 1), (1, 2)];

/// Every operation rankmesh names: the collectives of
/// [`Collectives`](crate::Collectives), the object plane, and the steps
/// around them. The discriminant is the wire code in call descriptors
/// (append only).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum Op {
    /// Group barrier.
    Barrier = 1,
    /// Element-wise reduction, result everywhere.
    AllReduce,
    /// Concatenation along a dim, result everywhere.
    AllGather,
    /// Concatenation along a dim, result on one rank.
    Gather,
    /// Reduction then scatter along a dim.
    ReduceScatter,
    /// Copy from one rank to all.
    Broadcast,
    /// FastVideo's 4-d all-to-all.
    AllToAll4d,
    /// Tensor to one peer.
    Send,
    /// Serialised object from one rank to all.
    BroadcastObject,
    /// Serialised objects from all ranks to all.
    AllGatherObject,
    /// Serialised objects from all ranks to one.
    GatherObject,
    /// Serialised object to one peer.
    SendObject,
    /// Reduction, result on one rank.
    Reduce,
    /// Equal blocks of dim 0 exchanged between all ranks.
    AllToAll,
    /// Creation of the group's NCCL communicator.
    Connect,
    /// Equal slices along a dim from one rank to all (the inverse of gather).
    Scatter,
    /// Combined send to one peer and receive from another (ring shift).
    SendRecv,
    /// Waiting for enqueued device work.
    Synchronize,
    /// Creating a group (collective over its parent or its members).
    CreateGroup,
    /// Setting a group's check mode (agreed like a collective).
    SetCheckMode,
    /// Sends and receives issued together (torch's `batch_isend_irecv`).
    BatchSendRecv,
    /// Rows of dim 0 exchanged between all ranks, per-peer counts
    /// (`MPI_Alltoallv`; torch's `all_to_all_single` with split sizes).
    AllToAllV,
    /// Concatenation along a dim of every rank's slices, per-rank counts
    /// (`MPI_Allgatherv`).
    AllGatherV,
}

const _: () = {
    let mut i = 0;
    while i < Op::ALL.len() {
        assert!(
            Op::ALL[i] as u32 == i as u32 + 1,
            "Op::ALL is in code order"
        );
        i += 1;
    }
};

impl Op {
    const ALL: [Op; 23] = [
        Op::Barrier,
        Op::AllReduce,
        Op::AllGather,
        Op::Gather,
        Op::ReduceScatter,
        Op::Broadcast,
        Op::AllToAll4d,
        Op::Send,
        Op::BroadcastObject,
        Op::AllGatherObject,
        Op::GatherObject,
        Op::SendObject,
        Op::Reduce,
        Op::AllToAll,
        Op::Connect,
        Op::Scatter,
        Op::SendRecv,
        Op::Synchronize,
        Op::CreateGroup,
        Op::SetCheckMode,
        Op::BatchSendRecv,
        Op::AllToAllV,
        Op::AllGatherV,
    ];

    /// Public name of the operation.
    pub fn name(self) -> &'static str {
        match self {
            Op::Barrier => "barrier",
            Op::AllReduce => "all_reduce",
            Op::AllGather => "all_gather",
            Op::Gather => "gather",
            Op::ReduceScatter => "reduce_scatter",
            Op::Broadcast => "broadcast",
            Op::AllToAll4d => "all_to_all_4d",
            Op::Send => "send/recv",
            Op::BroadcastObject => "broadcast_object",
            Op::AllGatherObject => "all_gather_object",
            Op::GatherObject => "gather_object",
            Op::SendObject => "send_object/recv_object",
            Op::Reduce => "reduce",
            Op::AllToAll => "all_to_all",
            Op::Connect => "connect",
            Op::Scatter => "scatter",
            Op::SendRecv => "send_recv",
            Op::Synchronize => "synchronize",
            Op::CreateGroup => "create_group",
            Op::SetCheckMode => "set_check_mode",
            Op::BatchSendRecv => "batch_send_recv",
            Op::AllToAllV => "all_to_all_v",
            Op::AllGatherV => "all_gather_v",
        }
    }

    #[inline]
    pub(crate) fn from_code(code: u32) -> Option<Op> {
        // Codes run from 1 in declaration order (asserted below): an index,
        // not a search, since every descriptor read asks.
        let op = Op::ALL.get((code as usize).wrapping_sub(1)).copied();
        debug_assert!(op.is_none_or(|o| o as u32 == code));
        op
    }

    /// Names of the parameters in a descriptor's `params`, in order.
    pub(crate) fn param_names(self) -> &'static [&'static str] {
        match self {
            Op::Barrier
            | Op::Send
            | Op::BatchSendRecv
            | Op::AllToAll
            | Op::AllToAllV
            | Op::Connect
            | Op::SendRecv
            | Op::Synchronize
            | Op::CreateGroup => &[],
            Op::Reduce => &["dst", "op"],
            Op::AllReduce => &["op"],
            Op::AllGather => &["dim"],
            Op::AllGatherV => &["dim", "counts"],
            Op::Gather => &["dst", "dim"],
            Op::Scatter => &["src", "dim"],
            Op::ReduceScatter => &["dim", "op"],
            Op::Broadcast => &["src"],
            Op::AllToAll4d => &["scatter_dim", "gather_dim"],
            Op::BroadcastObject => &["src", "type"],
            Op::AllGatherObject | Op::SendObject => &["type"],
            Op::GatherObject => &["dst", "type"],
            Op::SetCheckMode => &["mode"],
        }
    }

    /// Whether the op moves a tensor (its dtype and shape are agreed on).
    pub(crate) fn carries_tensor(self) -> bool {
        matches!(
            self,
            Op::AllReduce
                | Op::AllGather
                | Op::Gather
                | Op::Scatter
                | Op::ReduceScatter
                | Op::Broadcast
                | Op::AllToAll4d
                | Op::Send
                | Op::BatchSendRecv
                | Op::Reduce
                | Op::AllToAll
                | Op::AllToAllV
                | Op::AllGatherV
        )
    }

    /// Whether the op's body starts with a host exchange among every
    /// member (`all_to_all_v`'s counts): its agreement is never deferred or
    /// skipped on a device group, as a member in another call would meet
    /// that exchange unprepared.
    pub(crate) fn exchanges_counts(self) -> bool {
        self == Op::AllToAllV
    }

    /// Whether the call's descriptor carries the shape of one row (one
    /// index of dim 0) instead of the whole tensor's: the ranks' tensors
    /// differ in dim 0, their rows must not.
    pub(crate) fn carries_row_shape(self) -> bool {
        self == Op::AllToAllV
    }

    /// The op's own parameter rules, run by every rank on every rank's call
    /// (`dtype`, `shape` and `params` as its descriptor carries them; `size`:
    /// the group size). The message names the value.
    pub fn validate(
        self,
        dtype: Option<DType>,
        shape: &[usize],
        params: &[i64],
        size: usize,
    ) -> Result<(), String> {
        let p = params;
        let d = Call { dtype, shape };
        match self {
            Op::AllReduce => reduction_defined(d, p[0]),
            Op::Reduce => {
                rank_in_range("dst", p[0], size)?;
                reduction_defined(d, p[1])
            }
            Op::Gather => rank_in_range("dst", p[0], size).map(|_| ()),
            Op::Broadcast => rank_in_range("src", p[0], size).map(|_| ()),
            Op::Scatter => {
                rank_in_range("src", p[0], size)?;
                let k = dim_in_range(d.shape.len(), p[1])?;
                divisible(d, k, size, "dim")
            }
            Op::AllGather | Op::AllGatherV => dim_in_range(d.shape.len(), p[0]).map(|_| ()),
            Op::ReduceScatter => {
                let k = dim_in_range(d.shape.len(), p[0])?;
                divisible(d, k, size, "dim")?;
                reduction_defined(d, p[1])
            }
            Op::AllToAll => {
                if shape.is_empty() {
                    return Err("expects a tensor with at least one dimension".into());
                }
                divisible(d, 0, size, "dim")
            }
            Op::AllToAll4d => {
                if shape.len() != 4 {
                    return Err(format!("expects a 4-d tensor, got shape {shape:?}"));
                }
                let mode = (p[0], p[1]);
                if !ALL_TO_ALL_MODES.contains(&mode) {
                    return Err(format!(
                        "(scatter_dim, gather_dim) = {mode:?} is not supported; use (2, 1) or (1, 2)"
                    ));
                }
                divisible(d, p[0] as usize, size, "scatter dim")
            }
            Op::SetCheckMode => CheckMode::from_code(p[0])
                .map(|_| ())
                .ok_or_else(|| format!("mode {} is not a check mode", p[0])),
            _ => Ok(()),
        }
    }

    /// Which dims of the input change in the output: (divided by the group
    /// size, multiplied by it). `None` when the parameters name no valid dim.
    fn resized_dims(self, ndim: usize, params: &[i64]) -> Option<(Option<usize>, Option<usize>)> {
        let param = |i: usize| params.get(i).copied().unwrap_or(0);
        let at = |dim: i64| normalize_dim(dim as isize, ndim);
        Some(match self {
            Op::AllGather => (None, Some(at(param(0))?)),
            Op::Gather => (None, Some(at(param(1))?)),
            Op::ReduceScatter => (Some(at(param(0))?), None),
            // The descriptor's shape is the output's (counts summed).
            Op::AllGatherV => {
                at(param(0))?;
                (None, None)
            }
            // Each rank's output has its own dim 0, checked with its counts.
            Op::AllToAllV => return None,
            Op::Scatter => (Some(at(param(1))?), None),
            Op::AllToAll4d => {
                let mode = (param(0), param(1));
                if ndim != 4 || !ALL_TO_ALL_MODES.contains(&mode) {
                    return None;
                }
                (Some(mode.0 as usize), Some(mode.1 as usize))
            }
            _ => (None, None),
        })
    }

    /// Dim `i` of the output for input dim `n`.
    fn output_dim(
        n: usize,
        i: usize,
        resized: (Option<usize>, Option<usize>),
        size: usize,
    ) -> usize {
        let n = if resized.0 == Some(i) {
            n / size.max(1)
        } else {
            n
        };
        if resized.1 == Some(i) {
            n * size
        } else {
            n
        }
    }

    /// The shape of the op's output for an input of `shape` with `params` on
    /// a group of `size`; `None` when the parameters do not name one (the
    /// check then says why).
    pub fn output_shape(self, shape: &[usize], params: &[i64], size: usize) -> Option<Vec<usize>> {
        let resized = self.resized_dims(shape.len(), params)?;
        Some(
            shape
                .iter()
                .enumerate()
                .map(|(i, n)| Op::output_dim(*n, i, resized, size))
                .collect(),
        )
    }

    /// Whether `out` is the output shape for an input of dims `input`
    /// (without allocating: this runs on every call); `None` as for
    /// [`output_shape`](Self::output_shape).
    pub(crate) fn output_fits(
        self,
        input: impl ExactSizeIterator<Item = usize>,
        params: &[i64],
        size: usize,
        out: &[usize],
    ) -> Option<bool> {
        let resized = self.resized_dims(input.len(), params)?;
        Some(
            input.len() == out.len()
                && input
                    .enumerate()
                    .all(|(i, n)| Op::output_dim(n, i, resized, size) == out[i]),
        )
    }

    /// Whether the caller's output is used (and checked) on group rank `me`:
    /// a gather's output exists only on its destination.
    pub(crate) fn output_used_on(self, me: usize, params: &[i64]) -> bool {
        match self {
            Op::Gather => params.first() == Some(&(me as i64)),
            _ => true,
        }
    }
}

/// The digest of an uneven op's counts that its descriptor carries, so
/// that ranks passing different counts disagree.
pub(crate) fn counts_digest(counts: &[usize]) -> i64 {
    let words: Vec<u64> = counts.iter().map(|n| *n as u64).collect();
    xxhash_rust::xxh3::xxh3_64(bytemuck::cast_slice(&words)) as i64
}

/// Normalises a possibly negative dimension index; `None` when out of range.
pub fn normalize_dim(dim: isize, ndim: usize) -> Option<usize> {
    let n = ndim as isize;
    let d = if dim < 0 { dim + n } else { dim };
    (0..n).contains(&d).then_some(d as usize)
}

/// The tensor a rule looks at: its dtype (`None`: not a tensor call) and shape.
#[derive(Clone, Copy)]
struct Call<'a> {
    dtype: Option<DType>,
    shape: &'a [usize],
}

/// Checks that `dim` indexes a tensor of `ndim` dims and returns it normalised.
pub(crate) fn dim_in_range(ndim: usize, dim: i64) -> Result<usize, String> {
    normalize_dim(dim as isize, ndim)
        .ok_or_else(|| format!("dim {dim} out of range for a {ndim}-d tensor"))
}

/// Checks that a group position is inside a group of `size`.
pub(crate) fn rank_in_range(what: &str, rank: i64, size: usize) -> Result<usize, String> {
    usize::try_from(rank)
        .ok()
        .filter(|r| *r < size)
        .ok_or_else(|| format!("{what} {rank} is not a rank of this group of size {size}"))
}

/// Avg has no meaning for bools (sum is OR, prod AND); PyTorch refuses it too.
fn reduction_defined(d: Call, op: i64) -> Result<(), String> {
    if d.dtype == Some(DType::Bool) && ReduceOp::from_code(op) == Some(ReduceOp::Avg) {
        return Err("avg is not defined for bool tensors (sum is OR, prod is AND)".into());
    }
    Ok(())
}

fn divisible(d: Call, dim: usize, size: usize, what: &str) -> Result<(), String> {
    let n = d.shape[dim];
    if !n.is_multiple_of(size) {
        return Err(format!(
            "{what} {dim} of size {n} is not divisible by the group size {size}"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `op`'s rules on an f32 tensor of `shape` in a group of `size`.
    fn validate(op: Op, shape: &[usize], params: &[i64], size: usize) -> Result<(), String> {
        op.validate(Some(DType::F32), shape, params, size)
    }

    #[test]
    fn codes_round_trip() {
        for op in Op::ALL {
            assert_eq!(Op::from_code(op as u32), Some(op));
        }
        assert_eq!(Op::from_code(0), None);
    }

    #[test]
    fn output_shapes() {
        assert_eq!(
            Op::AllGather.output_shape(&[2, 3], &[-1], 4),
            Some(vec![2, 12])
        );
        assert_eq!(
            Op::Gather.output_shape(&[2, 3], &[1, 0], 2),
            Some(vec![4, 3])
        );
        assert_eq!(
            Op::ReduceScatter.output_shape(&[8, 3], &[0, 0], 4),
            Some(vec![2, 3])
        );
        assert_eq!(
            Op::Scatter.output_shape(&[2, 8], &[0, 1], 4),
            Some(vec![2, 2])
        );
        assert_eq!(
            Op::AllToAll4d.output_shape(&[1, 2, 8, 4], &[2, 1], 4),
            Some(vec![1, 8, 2, 4])
        );
        assert_eq!(Op::AllToAll4d.output_shape(&[1, 2, 8, 4], &[3, 1], 4), None);
        assert_eq!(Op::AllGather.output_shape(&[2, 3], &[2], 4), None);
        assert_eq!(Op::AllReduce.output_shape(&[5], &[0], 3), Some(vec![5]));
    }

    #[test]
    fn checks_name_the_value() {
        assert_eq!(
            validate(Op::Scatter, &[2, 6], &[0, 1], 4).unwrap_err(),
            "dim 1 of size 6 is not divisible by the group size 4"
        );
        assert_eq!(
            validate(Op::Scatter, &[2, 8], &[4, 1], 4).unwrap_err(),
            "src 4 is not a rank of this group of size 4"
        );
        assert!(validate(Op::AllToAll4d, &[1, 2, 3], &[2, 1], 2)
            .unwrap_err()
            .contains("4-d"));
        assert!(validate(Op::AllToAll, &[], &[], 2).is_err());
        assert!(validate(Op::AllToAll, &[4], &[], 2).is_ok());
        let avg = ReduceOp::Avg.code();
        let bools = Some(DType::Bool);
        assert!(Op::AllReduce
            .validate(bools, &[4], &[avg], 2)
            .unwrap_err()
            .contains("bool"));
        assert!(Op::ReduceScatter
            .validate(bools, &[4], &[0, avg], 2)
            .is_err());
        assert!(validate(Op::AllReduce, &[4], &[avg], 2).is_ok());
    }

    #[test]
    fn normalize_dim_handles_negative_and_out_of_range() {
        assert_eq!(normalize_dim(-1, 4), Some(3));
        assert_eq!(normalize_dim(-4, 4), Some(0));
        assert_eq!(normalize_dim(-5, 4), None);
        assert_eq!(normalize_dim(4, 4), None);
        assert_eq!(normalize_dim(0, 0), None);
    }

    #[test]
    fn gather_output_only_on_its_destination() {
        assert!(Op::Gather.output_used_on(1, &[1, 0]));
        assert!(!Op::Gather.output_used_on(0, &[1, 0]));
        assert!(Op::Reduce.output_used_on(0, &[1, 0]));
    }

    #[test]
    fn rank_and_dim_checks() {
        assert_eq!(rank_in_range("src", 2, 4), Ok(2));
        assert!(rank_in_range("dst", -1, 4).is_err());
        assert_eq!(dim_in_range(2, -2), Ok(0));
        assert!(dim_in_range(2, 2).is_err());
    }
}
