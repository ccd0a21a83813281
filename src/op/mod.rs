//! The op list, one row per op (`ROWS`), written once for every data plane. A
//! row holds the name, parameter names, parameter checks, the output shape a
//! call produces, and where a caller's output is checked. Call sites build an
//! op's parameters by name through [`Args`]. The dispatch path applies these
//! rules itself ([`GroupCoordinator::run_op`](crate::GroupCoordinator)), so
//! an executor only says which op, which tensors, and how to move the bytes.

mod args;
mod mode;
mod reduce;
pub(crate) mod uneven;

pub use args::Args;
pub use mode::CheckMode;
pub use reduce::ReduceOp;
pub(crate) use uneven::Counted;

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
    /// Reduction then scatter along a dim, per-rank counts
    /// (`MPI_Reduce_scatter`).
    ReduceScatterV,
}

impl Op {
    /// This op's row of [`ROWS`].
    #[inline(always)]
    fn row(self) -> &'static Row {
        &ROWS[self as usize - 1]
    }

    /// Public name of the operation.
    pub fn name(self) -> &'static str {
        self.row().name
    }

    #[inline]
    pub(crate) fn from_code(code: u32) -> Option<Op> {
        // Codes run from 1 in row order (asserted below): an index, not a
        // search, since every descriptor read asks.
        ROWS.get((code as usize).wrapping_sub(1)).map(|r| r.op)
    }

    /// Names of the parameters in a descriptor's `params`, in order.
    pub(crate) fn param_names(self) -> &'static [&'static str] {
        self.row().params
    }

    /// Whether the op moves a tensor (its dtype and shape are agreed on).
    pub(crate) fn carries_tensor(self) -> bool {
        self.row().tensor
    }

    /// Whether the op's body starts with a host exchange among every
    /// member (`all_to_all_v`'s counts): its agreement is never deferred or
    /// skipped on a device group, as a member in another call would meet
    /// that exchange unprepared.
    pub(crate) fn exchanges_counts(self) -> bool {
        self.row().per_peer_counts
    }

    /// How an op with per-member counts along one dim shapes its tensors,
    /// `None` for the other ops.
    pub(crate) fn counted(self) -> Option<Counted> {
        self.row().counted
    }

    /// Whether the call's descriptor carries the shape of one row (one
    /// index of dim 0) instead of the whole tensor's: the ranks' tensors
    /// differ in dim 0, their rows must not.
    pub(crate) fn carries_row_shape(self) -> bool {
        self.row().per_peer_counts
    }

    /// The op's own parameter rules, run by every rank on every rank's call
    /// (`dtype`, `shape` and `params` as its descriptor carries them; `size`:
    /// the group size). The message names the value.
    #[inline]
    pub fn validate(
        self,
        dtype: Option<DType>,
        shape: &[usize],
        params: &[i64],
        size: usize,
    ) -> Result<(), String> {
        (self.row().rule)(Call { dtype, shape }, params, size)
    }

    /// Which dims of the input change in the output: (divided by the group
    /// size, multiplied by it). `None` when the parameters name no valid dim.
    #[inline]
    fn resized_dims(self, ndim: usize, params: &[i64]) -> Option<Resized> {
        (self.row().resize)(ndim, params)
    }

    /// Dim `i` of the output for input dim `n`.
    fn output_dim(n: usize, i: usize, resized: Resized, size: usize) -> usize {
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
        !self.row().output_at_root || params.first() == Some(&(me as i64))
    }
}

/// Dims of an input that change in the output: (divided by the group size,
/// multiplied by it).
type Resized = (Option<usize>, Option<usize>);

/// An op's parameter rules: `Err` names the value (see [`Op::validate`]).
type Rule = fn(Call, &[i64], usize) -> Result<(), String>;

/// An op's resized dims for an input of `ndim` dims, `None` when the
/// parameters name no valid dim (see [`Op::output_shape`]).
type Resize = fn(usize, &[i64]) -> Option<Resized>;

/// Everything rankmesh knows about one op, in one place: adding a
/// collective adds a row here (docs/ARCHITECTURE.md, "Adding a
/// collective"). Rules and resizes read `params` by the positions that
/// [`Args`]'s constructors write.
struct Row {
    op: Op,
    /// Public name, as errors, traces and the bench print it.
    name: &'static str,
    /// Names of `params`, in order.
    params: &'static [&'static str],
    /// Moves a tensor: its dtype and shape are agreed on.
    tensor: bool,
    /// Per-peer row counts (`all_to_all_v`): the descriptor carries one
    /// row's shape, and the counts are exchanged before the data.
    per_peer_counts: bool,
    /// The caller's output exists only on the rank named by `params[0]`.
    output_at_root: bool,
    /// Per-member counts along one dim (`params[0]`), which side holds
    /// which (see [`Counted`]).
    counted: Option<Counted>,
    rule: Rule,
    resize: Resize,
}

impl Row {
    /// An op with no parameter rule whose output has its input's shape.
    const fn of(op: Op, name: &'static str, params: &'static [&'static str]) -> Row {
        Row {
            op,
            name,
            params,
            tensor: false,
            per_peer_counts: false,
            output_at_root: false,
            counted: None,
            rule: |_, _, _| Ok(()),
            resize: |_, _| Some((None, None)),
        }
    }

    const fn tensor(mut self) -> Row {
        self.tensor = true;
        self
    }

    const fn rule(mut self, rule: Rule) -> Row {
        self.rule = rule;
        self
    }

    const fn resize(mut self, resize: Resize) -> Row {
        self.resize = resize;
        self
    }

    /// An op with per-member counts along dim `params[0]` (`params[1]`: the
    /// counts' digest): where the descriptor carries the input's shape
    /// (`Scatters`), each member's output is its own, checked with its counts.
    const fn counted(mut self, counted: Counted) -> Row {
        self.counted = Some(counted);
        self.rule = |d, p, _| dim_in_range(d.shape.len(), p[0]).map(drop);
        self.resize = match counted {
            Counted::Gathers => |n, p| dim_at(n, p, 0).map(|_| (None, None)),
            Counted::Scatters => |_, _| None,
        };
        self.tensor()
    }
}

/// Dim `params[i]` normalised for `ndim` dims.
fn dim_at(ndim: usize, params: &[i64], i: usize) -> Option<usize> {
    normalize_dim(params.get(i).copied().unwrap_or(0) as isize, ndim)
}

/// The op list, one row per op, in code order.
const ROWS: [Row; 24] = [
    Row::of(Op::Barrier, "barrier", &[]),
    Row::of(Op::AllReduce, "all_reduce", &["op"])
        .tensor()
        .rule(|d, p, _| reduction_defined(d, p[0])),
    Row::of(Op::AllGather, "all_gather", &["dim"])
        .tensor()
        .rule(|d, p, _| dim_in_range(d.shape.len(), p[0]).map(drop))
        .resize(|n, p| Some((None, Some(dim_at(n, p, 0)?)))),
    Row {
        output_at_root: true,
        ..Row::of(Op::Gather, "gather", &["dst", "dim"])
            .tensor()
            .rule(|_, p, size| rank_in_range("dst", p[0], size).map(drop))
            .resize(|n, p| Some((None, Some(dim_at(n, p, 1)?))))
    },
    Row::of(Op::ReduceScatter, "reduce_scatter", &["dim", "op"])
        .tensor()
        .rule(|d, p, size| {
            let k = dim_in_range(d.shape.len(), p[0])?;
            divisible(d, k, size, "dim")?;
            reduction_defined(d, p[1])
        })
        .resize(|n, p| Some((Some(dim_at(n, p, 0)?), None))),
    Row::of(Op::Broadcast, "broadcast", &["src"])
        .tensor()
        .rule(|_, p, size| rank_in_range("src", p[0], size).map(drop)),
    Row::of(
        Op::AllToAll4d,
        "all_to_all_4d",
        &["scatter_dim", "gather_dim"],
    )
    .tensor()
    .rule(|d, p, size| {
        if d.shape.len() != 4 {
            return Err(format!("expects a 4-d tensor, got shape {:?}", d.shape));
        }
        let mode = (p[0], p[1]);
        if !ALL_TO_ALL_MODES.contains(&mode) {
            return Err(format!(
                "(scatter_dim, gather_dim) = {mode:?} is not supported; use (2, 1) or (1, 2)"
            ));
        }
        divisible(d, p[0] as usize, size, "scatter dim")
    })
    .resize(|n, p| {
        let mode = (p.first().copied()?, p.get(1).copied()?);
        (n == 4 && ALL_TO_ALL_MODES.contains(&mode))
            .then_some((Some(mode.0 as usize), Some(mode.1 as usize)))
    }),
    Row::of(Op::Send, "send/recv", &[]).tensor(),
    Row::of(Op::BroadcastObject, "broadcast_object", &["src", "type"])
        .rule(|_, p, size| rank_in_range("src", p[0], size).map(drop)),
    Row::of(Op::AllGatherObject, "all_gather_object", &["type"]),
    Row::of(Op::GatherObject, "gather_object", &["dst", "type"])
        .rule(|_, p, size| rank_in_range("dst", p[0], size).map(drop)),
    Row::of(Op::SendObject, "send_object/recv_object", &["type"]),
    Row::of(Op::Reduce, "reduce", &["dst", "op"])
        .tensor()
        .rule(|d, p, size| {
            rank_in_range("dst", p[0], size)?;
            reduction_defined(d, p[1])
        }),
    Row::of(Op::AllToAll, "all_to_all", &[])
        .tensor()
        .rule(|d, _, size| {
            if d.shape.is_empty() {
                return Err("expects a tensor with at least one dimension".into());
            }
            divisible(d, 0, size, "dim")
        }),
    Row::of(Op::Connect, "connect", &[]),
    Row::of(Op::Scatter, "scatter", &["src", "dim"])
        .tensor()
        .rule(|d, p, size| {
            rank_in_range("src", p[0], size)?;
            let k = dim_in_range(d.shape.len(), p[1])?;
            divisible(d, k, size, "dim")
        })
        .resize(|n, p| Some((Some(dim_at(n, p, 1)?), None))),
    Row::of(Op::SendRecv, "send_recv", &[]),
    Row::of(Op::Synchronize, "synchronize", &[]),
    Row::of(Op::CreateGroup, "create_group", &[]),
    Row::of(Op::SetCheckMode, "set_check_mode", &["mode"]).rule(|_, p, _| {
        CheckMode::from_code(p[0])
            .map(drop)
            .ok_or_else(|| format!("mode {} is not a check mode", p[0]))
    }),
    Row::of(Op::BatchSendRecv, "batch_send_recv", &[]).tensor(),
    // Each rank's output has its own dim 0, checked with its counts.
    Row {
        per_peer_counts: true,
        ..Row::of(Op::AllToAllV, "all_to_all_v", &[])
            .tensor()
            .resize(|_, _| None)
    },
    Row::of(Op::AllGatherV, "all_gather_v", &["dim", "counts"]).counted(Counted::Gathers),
    Row::of(
        Op::ReduceScatterV,
        "reduce_scatter_v",
        &["dim", "counts", "op"],
    )
    .counted(Counted::Scatters)
    .rule(|d, p, _| {
        dim_in_range(d.shape.len(), p[0])?;
        reduction_defined(d, p[2])
    }),
];

const _: () = {
    let mut i = 0;
    while i < ROWS.len() {
        assert!(ROWS[i].op as u32 == i as u32 + 1, "ROWS is in code order");
        i += 1;
    }
};

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
        for op in ROWS.iter().map(|r| r.op) {
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
