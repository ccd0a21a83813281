//! The call descriptor every operation exchanges before moving data, and the
//! pure rules that decide whether the ranks agree.
//!
//! Every collective first all-gathers one fixed-size [`Descriptor`] per rank
//! (op, sequence number, dtype, shape, parameters). Each rank then runs the same
//! checks on the same descriptors, so a mismatch (wrong shape on one rank, a
//! skipped call, a bad `dim`) becomes the *same* `Err` on every rank instead of
//! a truncated message, an MPI abort or a hang. Point-to-point calls exchange
//! the descriptor with their peer instead.

use crate::dtype::DType;
use crate::error::Rejection;
use crate::op::ReduceOp;
use crate::op::{Args, Op};
#[cfg(any(test, feature = "internals"))]
use crate::tensor::Tensor;
use bytemuck::{Pod, Zeroable};
use std::cell::RefCell;

/// The bits an all-reduced agreement word uses: 63. MPICH 4.0.2 (Debian,
/// ch4:ucx) reduces `MPI_UINT64_T` and `MPI_UNSIGNED_LONG` with `MPI_MAX`
/// as signed (max(0xFFFFFEFF…, 0) came back 0), so a word with its top bit
/// set would lose to 0 there; below 2^63 both readings give one maximum.
pub const RECORD_BITS: u64 = u64::MAX >> 1;
/// Most tensor dimensions a descriptor carries.
pub const MAX_DIMS: usize = 16;

/// Per-word keys of [`Descriptor::digest`] (splitmix64 outputs): no field
/// is likely to cancel its key.
const DIGEST_KEYS: [u64; 26] = {
    let mut k = [0u64; 26];
    let mut x = 0u64;
    let mut i = 0;
    while i < 26 {
        x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = x;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        k[i] = z ^ (z >> 31);
        i += 1;
    }
    k
};
// The digest reads a descriptor as 25 words: 9 of fields, then the dims.
const _: () = assert!(9 + MAX_DIMS == 25 && std::mem::size_of::<Descriptor>() == 200);
/// One keyed 64×64→128-bit product of a word pair, folded to 64 bits.
#[inline(always)]
fn mum(i: usize, a: u64, b: u64) -> u64 {
    let p = u128::from(a ^ DIGEST_KEYS[i]) * u128::from(b ^ DIGEST_KEYS[i + 1]);
    (p as u64) ^ (p >> 64) as u64
}
const MAGIC: u64 = 0x726b_6d65_7368_0001; // "rkmesh" + wire version 1
const NO_DTYPE: u32 = u32::MAX;
/// Flag: the caller's output tensor does not fit the call.
const BAD_OUTPUT: u32 = 1;
/// Flag: the tensor lives in GPU memory (NCCL plane); part of the agreement,
/// so a host call meeting a device call is an error, not a hang.
const DEVICE: u32 = 2;
/// Flag: an input or output is a device view whose borrow has ended.
const VIEW_ENDED: u32 = 4;
/// Flag: an input or output is a device view made for another stream.
const VIEW_ELSEWHERE: u32 = 8;
/// Flag: an uneven op's counts do not fit the caller's tensors.
const BAD_COUNTS: u32 = 16;
/// Flag: the rank refused its call on its own arguments before it could
/// say what the call was; it calls in only so that its members fail too.
const REFUSED: u32 = 32;
/// Flag: a stand-in for every device call this rank will not make, its NCCL
/// communicator having failed (a deferred agreement posted through MPI).
const CLOSING: u32 = 64;
/// Problems one rank finds in its own arguments before the agreement: not
/// part of the digest, but a call any member flags is refused by all.
const LOCAL_PROBLEMS: u32 = BAD_OUTPUT | VIEW_ENDED | VIEW_ELSEWHERE | BAD_COUNTS | REFUSED;

/// Why a device view cannot be used by a call (found before the agreement).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ViewProblem {
    /// The view was moved out of its `DeviceView` and its borrow ended.
    Ended,
    /// The view was made for a stream other than the call's.
    Elsewhere,
}

/// One rank's view of a call, exchanged before any data moves.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
pub struct Descriptor {
    magic: u64,
    /// Position of this call in the group's sequence of collectives.
    pub seq: u64,
    op: u32,
    dtype: u32,
    ndim: u32,
    /// Local problems that are not part of the agreement (`BAD_OUTPUT`).
    flags: u32,
    /// Elements of the tensor, or bytes of a serialised object.
    pub len: u64,
    /// Operation parameters, named by `Op::param_names`.
    pub params: [i64; 4],
    dims: [u64; MAX_DIMS],
}

impl Descriptor {
    /// A descriptor with no tensor.
    #[inline]
    pub fn new(op: Op, params: &[i64]) -> Descriptor {
        let mut d = Descriptor::zeroed();
        d.magic = MAGIC;
        d.op = op as u32;
        d.dtype = NO_DTYPE;
        d.params[..params.len()].copy_from_slice(params);
        d
    }

    /// A descriptor with no tensor for the op and parameters of `args`.
    #[inline]
    pub(crate) fn of_args(args: Args) -> Descriptor {
        Descriptor::new(args.op(), args.params())
    }

    /// A descriptor for a tensor of `dtype` and `shape`.
    #[inline(always)]
    pub fn for_tensor(op: Op, dtype: DType, shape: &[usize], params: &[i64]) -> Descriptor {
        let mut d = Descriptor::zeroed();
        d.magic = MAGIC;
        d.op = op as u32;
        d.params[..params.len()].copy_from_slice(params);
        d.dtype = dtype.code();
        d.ndim = shape.len() as u32;
        d.len = crate::tensor::numel(shape) as u64;
        for (slot, n) in d.dims.iter_mut().zip(shape) {
            *slot = *n as u64;
        }
        d
    }

    /// Shorthand for [`Descriptor::for_tensor`] with a tensor's dtype and shape.
    #[cfg(any(test, feature = "internals"))]
    pub fn of(op: Op, t: &Tensor, params: &[i64]) -> Descriptor {
        Descriptor::for_tensor(op, t.dtype(), t.shape(), params)
    }

    /// Marks the caller's output buffer as unfit (checked after the exchange,
    /// so the other ranks fail too instead of waiting).
    pub fn mark_bad_output(&mut self, bad: bool) {
        if bad {
            self.flags |= BAD_OUTPUT;
        }
    }

    /// Marks the caller's counts of an uneven op as not fitting its tensors
    /// (checked after the exchange, so the other ranks fail too).
    pub fn mark_bad_counts(&mut self, bad: bool) {
        if bad {
            self.flags |= BAD_COUNTS;
        }
    }

    /// A stand-in for a call this rank refused on its own arguments (a
    /// binding's check, before it could build the call's descriptor): it
    /// matches whatever its members called, and fails it on each of them,
    /// naming this rank.
    pub fn refused_here() -> Descriptor {
        let mut d = Descriptor::new(Op::Barrier, &[]);
        d.flags |= REFUSED;
        d
    }

    /// The last deferred agreement a rank posts through MPI once its NCCL
    /// communicator failed: whatever call it meets cannot complete.
    pub(crate) fn closing() -> Descriptor {
        let mut d = Descriptor::new(Op::Synchronize, &[]);
        d.flags |= CLOSING;
        d
    }

    /// Whether this is [`closing`](Self::closing)'s stand-in.
    pub(crate) fn is_closing(&self) -> bool {
        self.flags & CLOSING != 0
    }

    /// Marks one of the caller's device views as unusable here (checked
    /// after the exchange, so the other ranks fail too instead of waiting).
    pub fn mark_unusable_view(&mut self, problem: ViewProblem) {
        self.flags |= match problem {
            ViewProblem::Ended => VIEW_ENDED,
            ViewProblem::Elsewhere => VIEW_ELSEWHERE,
        };
    }

    /// Whether this rank flagged a problem with its own arguments (an unfit
    /// output, an unusable view): the call is refused on every member.
    pub fn local_problem(&self) -> bool {
        self.local_problems() != 0
    }

    /// The flags of [`local_problem`](Self::local_problem) (members whose
    /// flags differ must compare their full descriptors).
    pub(crate) fn local_problems(&self) -> u32 {
        self.flags & LOCAL_PROBLEMS
    }

    /// What this rank's flags say about an unusable device view.
    fn view_refusal(&self) -> Option<&'static str> {
        if self.flags & VIEW_ENDED != 0 {
            Some("passed a device view used after its borrow ended (moved out of its DeviceView)")
        } else if self.flags & VIEW_ELSEWHERE != 0 {
            Some(
                "passed a device view made for another stream than the call's: make views \
                 with the DeviceGroup (and stream) that uses them",
            )
        } else {
            None
        }
    }

    /// Marks the call as one on device tensors (NCCL data plane).
    #[inline(always)]
    pub fn on_device(mut self) -> Descriptor {
        self.flags |= DEVICE;
        self
    }

    /// Whether the call moves device tensors.
    pub fn is_device(&self) -> bool {
        self.flags & DEVICE != 0
    }

    /// Whether [`mark_bad_output`](Self::mark_bad_output) flagged this rank.
    pub fn bad_output(&self) -> bool {
        self.flags & BAD_OUTPUT != 0
    }

    /// The raw op code as sent.
    pub(crate) fn op_code(&self) -> u32 {
        self.op
    }

    /// The op of a descriptor this rank built (from an [`Op`], so it names
    /// one); a peer's may carry any code: read those with [`op`](Self::op).
    #[inline]
    pub(crate) fn own_op(&self) -> Op {
        self.op().expect("a descriptor this rank built names an Op")
    }

    /// The operation, `None` for a corrupt code.
    pub fn op(&self) -> Option<Op> {
        Op::from_code(self.op)
    }

    /// The dtype, `None` when the call carries none.
    pub fn dtype(&self) -> Option<DType> {
        DType::from_code(self.dtype)
    }

    /// The shape (the first `MAX_DIMS` dims when there are more).
    pub fn shape(&self) -> Vec<usize> {
        let n = (self.ndim as usize).min(MAX_DIMS);
        self.dims[..n].iter().map(|d| *d as usize).collect()
    }

    /// The dims, without allocating (the first `MAX_DIMS` when there are more).
    pub fn dims(&self) -> impl ExactSizeIterator<Item = usize> + '_ {
        let n = (self.ndim as usize).min(MAX_DIMS);
        self.dims[..n].iter().map(|d| *d as usize)
    }

    /// The descriptor's leading 8-byte words that hold what it says: every
    /// field but the dims past the tensor's (the dims come last). A copy
    /// of these, read back through
    /// [`without_stale_dims`](Self::without_stale_dims), is the descriptor.
    pub(crate) fn used_words(&self) -> &[u64] {
        const DIMS_AT: usize = std::mem::offset_of!(Descriptor, dims) / 8;
        const _: () = assert!(DIMS_AT + MAX_DIMS == std::mem::size_of::<Descriptor>() / 8);
        let words: &[u64; DIMS_AT + MAX_DIMS] = bytemuck::cast_ref(self);
        &words[..DIMS_AT + (self.ndim as usize).min(MAX_DIMS)]
    }

    /// This descriptor with the dims past the tensor's zeroed: what was
    /// written where only the [used words](Self::used_words) were copied
    /// over an earlier descriptor.
    pub(crate) fn without_stale_dims(mut self) -> Descriptor {
        let ndim = (self.ndim as usize).min(MAX_DIMS);
        self.dims[ndim..].fill(0);
        self
    }

    /// Number of dimensions as sent.
    pub fn ndim(&self) -> usize {
        self.ndim as usize
    }

    /// Human description: `all_gather(shape [2, 3] f32, dim -1)`.
    pub fn describe(&self) -> String {
        if self.flags & REFUSED != 0 {
            return "a call it refused on its own arguments".into();
        }
        let Some(op) = self.op() else {
            return format!("unknown op code {}", self.op);
        };
        let mut parts = Vec::new();
        if op.carries_tensor() {
            let dt = self.dtype().map_or("?", DType::name);
            let place = if self.is_device() { "device " } else { "" };
            let place = if op.carries_row_shape() {
                format!("{place}rows of ")
            } else {
                place.to_string()
            };
            parts.push(if self.ndim() > MAX_DIMS {
                format!(
                    "{place}{}-d tensor of {} elements {dt}",
                    self.ndim(),
                    self.len
                )
            } else {
                format!("{place}shape {:?} {dt}", self.shape())
            });
        }
        for (name, v) in op.param_names().iter().zip(self.params) {
            parts.push(match *name {
                "op" => format!("op {}", ReduceOp::from_code(v).map_or("?", ReduceOp::name)),
                "type" => format!("type #{:016x}", v as u64),
                "counts" => format!("counts #{:016x}", v as u64),
                "mode" => format!(
                    "mode {}",
                    crate::op::CheckMode::from_code(v).map_or("?", crate::op::CheckMode::name)
                ),
                _ => format!("{name} {v}"),
            });
        }
        format!("{}({})", op.name(), parts.join(", "))
    }

    /// 64-bit digest of everything ranks must agree on (magic, call number and
    /// the agreement fields): equal digests everywhere mean agreement, up to
    /// a 2^-64 collision chance. The calls themselves build it from a
    /// cached sum (`Admitted`); this is the tests' way in.
    #[cfg(any(test, feature = "internals"))]
    pub fn digest(&self) -> u64 {
        self.digest_from(self.digest_sum())
    }

    /// The digest of this call from [`digest_sum`](Self::digest_sum) of a
    /// call that differs from it at most in its call number.
    fn digest_from(&self, sum: u64) -> u64 {
        // The call number's term is the one added here, so that a repeated
        // call (see [`Admitted`]) hashes one word pair, not all of them.
        let mut h = sum.wrapping_add(mum(0, self.magic, self.seq));
        h ^= h >> 33;
        h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
        h ^= h >> 33;
        h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
        h ^ (h >> 33)
    }

    /// The digest's sum over every field but the magic and call number.
    fn digest_sum(&self) -> u64 {
        // Runs on every call the digest of a repeated one does not cover,
        // so: the fields read in place, hashed as keyed 64×64→128-bit
        // products of word pairs, summed (no loop-carried dependency).
        // Only the dims the tensor has are hashed, as `agreement_key`
        // compares only those: a 2-d tensor costs 5 products instead of 12.
        let tensor = self.op().is_some_and(Op::carries_tensor);
        let ndim = if tensor {
            (self.ndim as usize).min(MAX_DIMS)
        } else {
            0
        };
        let dim = |i: usize| if i < ndim { self.dims[i] } else { 0 };
        let [p0, p1, p2, p3] = self.params.map(|p| p as u64);
        let shape = u64::from(self.ndim) | u64::from(self.is_device()) << 32;
        let mut h = mum(2, u64::from(self.op) << 32 | u64::from(self.dtype), shape)
            .wrapping_add(mum(4, if tensor { self.len } else { 0 }, p0))
            .wrapping_add(mum(6, p1, p2))
            .wrapping_add(mum(8, p3, dim(0)));
        for i in (1..ndim).step_by(2) {
            h = h.wrapping_add(mum(9 + i, dim(i), dim(i + 1)));
        }
        h
    }

    /// Whether `other` is the same call as this one but for its call
    /// number: every field and flag, and the dims the tensor has.
    fn same_but_seq(&self, other: &Descriptor) -> bool {
        let a: &[u64; 25] = bytemuck::cast_ref(self);
        let b: &[u64; 25] = bytemuck::cast_ref(other);
        // Word 1 is `seq`; `ndim` (word 3) is compared before its dims.
        // Differences or-ed, not compared slice by slice: no `memcmp` call.
        let differ = |words: std::ops::Range<usize>| words.fold(0, |x, i| x | (a[i] ^ b[i]));
        a[0] == b[0] && differ(2..9) == 0 && differ(9..self.used_words().len()) == 0
    }

    /// The group rank whose `len` is the call's own (an object broadcast's
    /// source): every rank learns it from the agreement itself, while
    /// other ranks' lengths mean nothing.
    pub fn length_source(&self) -> Option<usize> {
        match self.op() {
            Some(Op::BroadcastObject) => usize::try_from(self.params[0]).ok(),
            _ => None,
        }
    }

    /// What this rank (group rank `me`) adds to the agreement's maximum
    /// to announce a [length source](Self::length_source)'s `len`: the
    /// source `[len, !len]` (in 63 bits: [`RECORD_BITS`]), every other
    /// rank `[0, 0]`. The maximum is the source's pair exactly when no rank
    /// added more; a rank that adds to either word breaks the pair, as
    /// raising one would need lowering the other, so a lying peer cannot
    /// change the length the others see.
    pub fn announcement(&self, me: usize) -> [u64; 2] {
        match self.length_source() {
            Some(src) if src == me => [self.len, !self.len & RECORD_BITS],
            _ => [0, 0],
        }
    }

    /// The length every rank's [announcement](Self::announcement) says
    /// the source has, from their elementwise maximum; `None` if a rank
    /// added anything but its part.
    pub fn announced(max: [u64; 2]) -> Option<u64> {
        (max[1] == !max[0] & RECORD_BITS).then_some(max[0])
    }

    /// What this rank adds to the all-reduce (max) that opens a call on the
    /// MPI executor: `[key, !key, problem, announcement]`, every word below
    /// 2^63 ([`RECORD_BITS`]). `key` is [`Admitted::admit`]'s digest.
    pub fn agreement_record(&self, key: u64, me: usize) -> [u64; 5] {
        let [len, not_len] = self.announcement(me);
        [
            key & RECORD_BITS,
            !key & RECORD_BITS,
            u64::from(self.local_problem()),
            len,
            not_len,
        ]
    }

    /// Whether the elementwise maximum of every rank's
    /// [record](Self::agreement_record) says they all passed the call of
    /// `key` with a usable output.
    pub fn record_agrees(max: &[u64; 5], key: u64) -> bool {
        max[..3] == [key & RECORD_BITS, !key & RECORD_BITS, 0]
    }

    /// Whether every rank must see every descriptor (variable-length objects).
    pub fn needs_all(&self) -> bool {
        matches!(
            self.op(),
            Some(Op::BroadcastObject | Op::AllGatherObject | Op::GatherObject)
        )
    }

    /// `op`'s own rules ([`Op::validate`]) on this call in a group of `size`.
    pub fn validate(&self, op: Op, size: usize) -> Result<(), String> {
        op.validate(self.dtype(), &self.shape(), &self.params, size)
    }

    /// The fields that must be equal across ranks for the call to proceed.
    fn agreement_key(&self) -> (u32, u32, u32, bool, u64, [u64; MAX_DIMS], [i64; 4]) {
        let tensor = self.op().is_some_and(Op::carries_tensor);
        let (len, mut dims) = if tensor {
            (self.len, self.dims)
        } else {
            (0, [0; MAX_DIMS])
        };
        // Dims past the tensor's are nobody's shape: not compared.
        let ndim = (self.ndim as usize).min(MAX_DIMS);
        dims[ndim..].fill(0);
        (
            self.op,
            self.dtype,
            self.ndim,
            self.is_device(),
            len,
            dims,
            self.params,
        )
    }
}

/// A call's check on one rank's descriptor, besides the agreement's own
/// comparisons: the op's parameter rules and the plane's limits. `Err`
/// says what is wrong, and every rank's error names the rank it came from.
pub(crate) trait Check: Fn(&Descriptor) -> Result<(), String> {}

impl<F: Fn(&Descriptor) -> Result<(), String>> Check for F {}

/// A [`Check`] behind a reference, where the dispatch path hands it on.
pub(crate) type CheckFn<'c> = dyn Fn(&Descriptor) -> Result<(), String> + 'c;

/// Decides whether the descriptors of all ranks (indexed by group rank) allow
/// the call. Every rank computes the same verdict from the same input; the
/// caller's own problems are reported without a rank prefix.
pub fn agree(descs: &[Descriptor], me: usize, check: &CheckFn<'_>) -> Result<(), Rejection> {
    agree_on_call(descs)?;
    if descs[me].op().is_some_and(Op::carries_tensor) && descs[me].ndim() > MAX_DIMS {
        return Err(Rejection::Invalid(format!(
            "tensors have at most {MAX_DIMS} dimensions, got {}",
            descs[me].ndim()
        )));
    }
    check(&descs[me]).map_err(Rejection::Invalid)?;
    for (r, d) in descs.iter().enumerate() {
        if r != me {
            check(d).map_err(|m| Rejection::Invalid(format!("group rank {r}: {m}")))?;
        }
    }
    if let Some((r, why)) = descs
        .iter()
        .enumerate()
        .find_map(|(r, d)| d.view_refusal().map(|why| (r, why)))
    {
        return Err(Rejection::Invalid(format!("group rank {r} {why}")));
    }
    if let Some(r) = descs.iter().position(|d| d.flags & BAD_COUNTS != 0) {
        return Err(Rejection::Invalid(format!(
            "group rank {r} passed counts that do not fit its tensors"
        )));
    }
    if let Some(r) = descs.iter().position(Descriptor::bad_output) {
        return Err(Rejection::Invalid(format!(
            "group rank {r} passed an output tensor of the wrong shape or dtype"
        )));
    }
    Ok(())
}

/// A group's last call that passed this rank's own checks, so that a
/// repeated call (only its call number differs: a loop's usual case) skips
/// them and hashes one word pair of its digest. Its verdict and digest are
/// the ones [`agree`] on `desc` alone and [`Descriptor::digest`] give.
#[derive(Default)]
pub(crate) struct Admitted {
    last: RefCell<Option<(Descriptor, u64)>>,
}

impl Admitted {
    /// This rank's verdict on `desc` alone ([`agree`] with `check`) and
    /// its digest.
    pub fn admit(&self, desc: &Descriptor, check: &CheckFn<'_>) -> (u64, Result<(), Rejection>) {
        let (sum, verdict) = self.verdict_and_sum(desc, check);
        (desc.digest_from(sum), verdict)
    }

    /// [`admit`](Self::admit) without the digest, for a call no other
    /// rank checks (a group of one, `RANKMESH_CHECK=off`).
    pub fn verdict(&self, desc: &Descriptor, check: &CheckFn<'_>) -> Result<(), Rejection> {
        self.verdict_and_sum(desc, check).1
    }

    #[inline]
    fn verdict_and_sum(
        &self,
        desc: &Descriptor,
        check: &CheckFn<'_>,
    ) -> (u64, Result<(), Rejection>) {
        if let Some((last, sum)) = &*self.last.borrow() {
            if desc.same_but_seq(last) {
                return (*sum, Ok(()));
            }
        }
        let sum = desc.digest_sum();
        let verdict = agree(std::slice::from_ref(desc), 0, check);
        if verdict.is_ok() {
            *self.last.borrow_mut() = Some((*desc, sum));
        }
        (sum, verdict)
    }
}

/// The part of [`agree`] that compares the ranks with each other.
fn agree_on_call(descs: &[Descriptor]) -> Result<(), Rejection> {
    let mismatch = |m: String| Err(Rejection::Mismatch(m));
    if let Some(r) = descs
        .iter()
        .position(|d| d.magic != MAGIC || d.op().is_none())
    {
        return mismatch(format!(
            "group rank {r} sent a corrupt call descriptor (magic {:#x}, op code {}): is it running the same rankmesh version?",
            descs[r].magic, descs[r].op
        ));
    }
    let first = &descs[0];
    // A member's refusal of its own arguments explains any difference: its
    // stand-in cannot say which call it was.
    if let Some(r) = descs.iter().position(|d| d.flags & REFUSED != 0) {
        if descs.iter().all(|d| d.seq == first.seq) {
            return Err(Rejection::Invalid(format!(
                "group rank {r} refused call #{} on its own arguments (its error says why)",
                first.seq
            )));
        }
    }
    for (r, d) in descs.iter().enumerate().skip(1) {
        if d.op != first.op || d.seq != first.seq {
            return mismatch(format!(
                "ranks are in different calls: group rank 0 is in call #{} {} but group rank {r} is in call #{} {}",
                first.seq,
                first.describe(),
                d.seq,
                d.describe()
            ));
        }
        if d.agreement_key() != first.agreement_key() {
            return mismatch(format!(
                "ranks disagree: group rank 0 passed {} but group rank {r} passed {}",
                first.describe(),
                d.describe()
            ));
        }
    }
    Ok(())
}

/// A one-way message's call and type, as its frame announces them or its
/// receiver expects them (stateless groups: the sender hands the frame off
/// and does not wait, so the receiver alone can judge the pair).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Frame<'a> {
    /// The call's name (`send_obj`, `barrier`, ...).
    pub call: &'a str,
    /// The payload type's digest.
    pub digest: i64,
}

/// The receiver's verdict on a frame from group rank `src`: the same call,
/// and the same type (`type_name`: the receiver's, for the message).
pub(crate) fn agree_frame(
    sent: Frame<'_>,
    expected: Frame<'_>,
    type_name: &str,
    src: usize,
) -> Result<(), String> {
    if sent.call != expected.call {
        return Err(format!(
            "group rank {src} called {} but this rank called {}",
            sent.call, expected.call
        ));
    }
    if sent.digest != expected.digest {
        return Err(format!(
            "group rank {src} sent another type than this rank's `{type_name}`"
        ));
    }
    Ok(())
}

/// Checks a peer-to-peer pair: what the sender sends against what the receiver expects.
/// Both peers call it with the same pair and get the same verdict.
pub fn agree_peers(
    sent: &Descriptor,
    expected: &Descriptor,
    sender: usize,
    receiver: usize,
) -> Result<(), String> {
    for (who, d) in [(sender, sent), (receiver, expected)] {
        if d.magic != MAGIC || d.op().is_none() {
            return Err(format!(
                "group rank {who} sent a corrupt message header (magic {:#x})",
                d.magic
            ));
        }
    }
    for (who, d) in [(sender, sent), (receiver, expected)] {
        if let Some(why) = d.view_refusal() {
            return Err(format!("group rank {who} {why}"));
        }
    }
    if sent.agreement_key() != expected.agreement_key() {
        return Err(format!(
            "group rank {sender} sends {} but group rank {receiver} expects {}",
            sent.describe(),
            expected.describe()
        ));
    }
    // An object's receiver announces the most it accepts in `len`.
    if sent.op() == Some(Op::SendObject) && sent.len > expected.len {
        return Err(format!(
            "group rank {sender} sends an object of {} bytes but group rank {receiver} accepts at most {} (RANKMESH_MAX_OBJECT_BYTES)",
            sent.len, expected.len
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(_: &Descriptor) -> Result<(), String> {
        Ok(())
    }

    #[test]
    fn a_frames_receiver_names_another_call_or_type() {
        let frame = |call, digest| Frame { call, digest };
        assert!(agree_frame(frame("send_obj", 7), frame("send_obj", 7), "u32", 2).is_ok());
        assert_eq!(
            agree_frame(frame("barrier", 0), frame("send_obj", 7), "u32", 2).unwrap_err(),
            "group rank 2 called barrier but this rank called send_obj"
        );
        assert_eq!(
            agree_frame(frame("send_obj", 8), frame("send_obj", 7), "u32", 2).unwrap_err(),
            "group rank 2 sent another type than this rank's `u32`"
        );
    }

    #[test]
    fn equal_descriptors_agree() {
        let d = Descriptor::for_tensor(Op::AllGather, DType::F32, &[2, 3], &[-1]);
        assert!(agree(&[d, d, d], 1, &ok).is_ok());
    }

    #[test]
    fn shape_mismatch_names_both_ranks_and_shapes() {
        let a = Descriptor::for_tensor(Op::AllGather, DType::F32, &[2, 3], &[-1]);
        let b = Descriptor::for_tensor(Op::AllGather, DType::F32, &[2, 4], &[-1]);
        let e = agree(&[a, a, b], 0, &ok).unwrap_err();
        assert_eq!(
            e.message(),
            "ranks disagree: group rank 0 passed all_gather(shape [2, 3] f32, dim -1) but group rank 2 passed all_gather(shape [2, 4] f32, dim -1)"
        );
        assert_eq!(agree(&[a, a, b], 2, &ok).unwrap_err(), e);
    }

    #[test]
    fn different_ops_or_calls_are_reported() {
        let mut a = Descriptor::new(Op::Barrier, &[]);
        let mut b = Descriptor::for_tensor(Op::AllReduce, DType::I32, &[4], &[0]);
        a.seq = 3;
        b.seq = 3;
        let e = agree(&[a, b], 0, &ok).unwrap_err();
        assert!(matches!(e, Rejection::Mismatch(_)));
        let e = e.message();
        assert!(e.contains("group rank 0 is in call #3 barrier()"), "{e}");
        assert!(
            e.contains("group rank 1 is in call #3 all_reduce(shape [4] i32, op sum)"),
            "{e}"
        );
        // A member that refused its own arguments is named, whatever the
        // others called; the group's agreement still holds.
        let mut refused = Descriptor::refused_here();
        refused.seq = 3;
        let e = agree(&[b, refused], 0, &ok).unwrap_err();
        assert_eq!(
            e,
            Rejection::Invalid(
                "group rank 1 refused call #3 on its own arguments (its error says why)".into()
            )
        );
        assert_eq!(agree(&[a, refused], 1, &ok).unwrap_err(), e);
        refused.seq = 4;
        assert!(matches!(
            agree(&[b, refused], 0, &ok).unwrap_err(),
            Rejection::Mismatch(m) if m.contains("group rank 1 is in call #4 a call it refused on its own arguments")
        ));
        b = a;
        b.seq = 4;
        assert!(agree(&[a, b], 1, &ok)
            .unwrap_err()
            .message()
            .contains("call #4"));
    }

    #[test]
    fn corrupt_descriptor_is_detected() {
        let a = Descriptor::new(Op::Barrier, &[]);
        let mut bytes = bytemuck::bytes_of(&a).to_vec();
        bytes[0] ^= 0xff;
        let bad: Descriptor = bytemuck::pod_read_unaligned(&bytes);
        assert!(agree(&[a, bad], 0, &ok)
            .unwrap_err()
            .message()
            .contains("group rank 1 sent a corrupt call descriptor"));
    }

    #[test]
    fn check_failures_name_the_failing_rank_for_others() {
        let d = Descriptor::for_tensor(Op::AllGather, DType::F32, &[2, 3, 4], &[3]);
        let check = |d: &Descriptor| d.validate(Op::AllGather, 2);
        assert_eq!(
            agree(&[d, d], 0, &check).unwrap_err(),
            Rejection::Invalid("dim 3 out of range for a 3-d tensor".into())
        );
    }

    #[test]
    fn a_lying_rank_cannot_change_an_announced_length() {
        let src = Descriptor::new(Op::BroadcastObject, &[0, 42]);
        let max = |parts: &[[u64; 2]]| {
            parts
                .iter()
                .fold([0, 0], |m, p| [m[0].max(p[0]), m[1].max(p[1])])
        };
        for len in [0, 1, 994, 1 << 40, u64::MAX] {
            let mut source = src;
            source.len = len;
            let honest = [
                source.announcement(0),
                src.announcement(1),
                src.announcement(2),
            ];
            assert_eq!(Descriptor::announced(max(&honest)), Some(len));
            for lie in [1, 2, 993, 995, 1 << 20, 1 << 40, u64::MAX - 1, u64::MAX] {
                for forged in [[lie, !lie], [lie, 0], [0, lie], [lie, lie]] {
                    let got = Descriptor::announced(max(&[honest[0], forged, honest[2]]));
                    assert!(
                        got.is_none() || got == Some(len),
                        "a liar adding {forged:?} to {len} made the others see {got:?}"
                    );
                }
            }
        }
        // Ops without a length source announce nothing.
        let barrier = Descriptor::new(Op::Barrier, &[]);
        assert_eq!(barrier.announcement(0), [0, 0]);
    }

    #[test]
    fn object_lengths_may_differ_but_types_may_not() {
        let mut a = Descriptor::new(Op::AllGatherObject, &[7]);
        let mut b = a;
        a.len = 10;
        b.len = 20;
        assert!(agree(&[a, b], 0, &ok).is_ok());
        b.params[0] = 8;
        assert!(agree(&[a, b], 0, &ok)
            .unwrap_err()
            .message()
            .contains("type #"));
    }

    #[test]
    fn peers_compare_headers() {
        let s = Descriptor::for_tensor(Op::Send, DType::F16, &[4], &[]);
        let r = Descriptor::for_tensor(Op::Send, DType::F32, &[4], &[]);
        assert_eq!(
            agree_peers(&s, &r, 0, 1).unwrap_err(),
            "group rank 0 sends send/recv(shape [4] f16) but group rank 1 expects send/recv(shape [4] f32)"
        );
        assert!(agree_peers(&s, &s, 0, 1).is_ok());
    }

    #[test]
    fn dims_past_the_tensors_are_neither_hashed_nor_compared() {
        // Every dim a tensor has counts, for every ndim the digest pairs differently.
        for ndim in 1..=MAX_DIMS {
            let shape: Vec<usize> = (0..ndim).map(|i| i + 2).collect();
            let base = Descriptor::for_tensor(Op::AllReduce, DType::F32, &shape, &[0]);
            for i in 0..ndim {
                let mut other = shape.clone();
                other[i] += 1;
                let d = Descriptor::for_tensor(Op::AllReduce, DType::F32, &other, &[0]);
                assert_ne!(d.digest(), base.digest(), "ndim {ndim}, dim {i}");
                assert!(agree(&[base, d], 0, &ok).is_err());
            }
        }
        // A peer's stray words past its tensor's dims name no different shape.
        let base = Descriptor::for_tensor(Op::AllReduce, DType::F32, &[3, 5], &[0]);
        let mut stray = base;
        stray.dims[2] = 7;
        stray.dims[MAX_DIMS - 1] = 9;
        assert_eq!(stray.digest(), base.digest());
        assert_eq!(agree(&[base, stray], 1, &ok), Ok(()));
    }

    /// The opening all-reduce's maximum is the same whether the MPI reads
    /// the words as unsigned (Open MPI) or signed (MPICH 4.0.2's MPI_MAX of
    /// MPI_UINT64_T): the call agrees, and the source's length is announced,
    /// in both readings; a changed key or a forged length is caught in both.
    #[test]
    fn the_agreement_record_has_one_maximum_signed_or_unsigned() {
        let max_of = |records: &[[u64; 5]], signed: bool| -> [u64; 5] {
            let mut m = [0u64; 5];
            for r in records {
                for (w, v) in m.iter_mut().zip(r) {
                    let bigger = if signed {
                        (*v as i64) > (*w as i64)
                    } else {
                        v > w
                    };
                    if bigger {
                        *w = *v;
                    }
                }
            }
            m
        };
        let mut src = Descriptor::new(Op::BroadcastObject, &[1, 7]);
        src.len = 1 << 40;
        let other = Descriptor::new(Op::BroadcastObject, &[1, 7]);
        for key in [0u64, 1, 0x866d_b2d0_bcd1_bd52, u64::MAX, 1 << 63] {
            let records = [other.agreement_record(key, 0), src.agreement_record(key, 1)];
            for signed in [false, true] {
                let max = max_of(&records, signed);
                assert!(
                    Descriptor::record_agrees(&max, key),
                    "{key:x} signed {signed}"
                );
                assert_eq!(Descriptor::announced([max[3], max[4]]), Some(1 << 40));
                assert!(!Descriptor::record_agrees(&max, key ^ 2), "{key:x}");
            }
            let differs = [
                other.agreement_record(key, 0),
                src.agreement_record(key ^ 4, 1),
            ];
            for signed in [false, true] {
                assert!(!Descriptor::record_agrees(&max_of(&differs, signed), key));
            }
            // A peer that adds to the length's word breaks the pair.
            let mut lying = other.agreement_record(key, 0);
            lying[3] = 1 << 41;
            for signed in [false, true] {
                let max = max_of(&[lying, src.agreement_record(key, 1)], signed);
                assert_eq!(Descriptor::announced([max[3], max[4]]), None);
            }
        }
    }

    #[test]
    fn admitted_gives_the_verdicts_and_digests_of_agree() {
        // `src` 2 is out of range in a group of 2: refused by the check.
        let check = |d: &Descriptor| d.validate(Op::Broadcast, 2);
        let admitted = Admitted::default();
        let base = Descriptor::for_tensor(Op::Broadcast, DType::F32, &[3, 5], &[1]);
        let mut calls = Vec::new();
        for seq in 0..3 {
            let mut d = base;
            d.seq = seq;
            calls.push(d);
        }
        let mut bad_output = base;
        bad_output.mark_bad_output(true);
        let mut ended = base;
        ended.mark_unusable_view(ViewProblem::Ended);
        calls.extend([
            bad_output,
            base,
            Descriptor::for_tensor(Op::Broadcast, DType::F32, &[3, 5], &[2]),
            base,
            Descriptor::for_tensor(Op::Broadcast, DType::F32, &[3, 6], &[1]),
            Descriptor::for_tensor(Op::Broadcast, DType::F32, &[3, 5, 1], &[1]),
            Descriptor::for_tensor(Op::Broadcast, DType::F16, &[3, 5], &[1]),
            ended,
            base.on_device(),
            base,
        ]);
        for (i, d) in calls.iter_mut().enumerate() {
            d.seq += i as u64;
            let (digest, verdict) = admitted.admit(d, &check);
            assert_eq!(digest, d.digest(), "call {i}");
            assert_eq!(
                verdict,
                agree(std::slice::from_ref(d), 0, &check),
                "call {i}"
            );
        }
        assert!(admitted.admit(&calls[5], &check).1.is_err());
        assert!(admitted.admit(&calls[3], &check).1.is_err());
    }

    #[test]
    fn digest_covers_every_agreed_field_and_no_local_flag() {
        let base = Descriptor::for_tensor(Op::AllGather, DType::F32, &[3, 5, 7], &[1]);
        let mut changed = vec![
            Descriptor::for_tensor(Op::AllGather, DType::F16, &[3, 5, 7], &[1]),
            Descriptor::for_tensor(Op::AllGather, DType::F32, &[3, 5, 8], &[1]),
            Descriptor::for_tensor(Op::AllGather, DType::F32, &[3, 7, 5], &[1]),
            Descriptor::for_tensor(Op::AllGather, DType::F32, &[3, 5, 7, 1], &[1]),
            Descriptor::for_tensor(Op::AllGather, DType::F32, &[3, 5, 7], &[2]),
            Descriptor::for_tensor(Op::AllReduce, DType::F32, &[3, 5, 7], &[1]),
            base.on_device(),
        ];
        let mut later = base;
        later.seq += 1;
        changed.push(later);
        for (i, p) in [0, 1, 2, 3].into_iter().enumerate() {
            let mut d = base;
            d.params[p] ^= 1 << (i * 13);
            changed.push(d);
        }
        let mut digests: Vec<u64> = changed.iter().map(Descriptor::digest).collect();
        digests.push(base.digest());
        let n = digests.len();
        digests.sort_unstable();
        digests.dedup();
        assert_eq!(digests.len(), n, "two descriptors share a digest");
        // Nor is the local bad-output flag (it travels beside the digest).
        let mut flagged = base;
        flagged.mark_bad_output(true);
        assert_eq!(flagged.digest(), base.digest());
    }

    #[test]
    fn host_and_device_calls_disagree() {
        let h = Descriptor::for_tensor(Op::AllReduce, DType::BF16, &[8], &[0]);
        let d = h.on_device();
        assert_ne!(h.digest(), d.digest());
        assert_eq!(
            agree(&[h, d], 0, &ok).unwrap_err().message(),
            "ranks disagree: group rank 0 passed all_reduce(shape [8] bf16, op sum) but group rank 1 passed all_reduce(device shape [8] bf16, op sum)"
        );
        assert!(agree(&[d, d], 1, &ok).is_ok());
    }
}
