//! The dispatch path every call goes through. It runs the op's rules on the
//! caller's output, the agreement (the `agree` module's verdicts, carried by
//! an MPI all-reduce of digests, the shared-memory step headers, or the
//! deferred posts), the watch, and the body that moves bytes; point-to-point
//! calls agree with their peer through a header handshake.

use super::{GroupCoordinator, Peer, PlaneTensor};
use crate::agree::{agree, agree_peers, Check, CheckFn, Deferred, Descriptor, Posts};
use crate::dtype::DType;
use crate::error::{Error, Fault, Rejection, Result};
use crate::exec::mpi::{TAG_ANSWER, TAG_HEADER};
use crate::exec::mpi_calls::Calls;
use crate::exec::route::fuses_agreement;
use crate::exec::shm::ShmExec;
use crate::op::{rank_in_range, Args, CheckMode, Op};
use crate::wait::give_up;
use crate::watch::Call;
use mpi::collective::SystemOperation;
use mpi::traits::*;
use std::rc::Rc;

impl<'rt> GroupCoordinator<'rt> {
    /// Puts a blocking step of `op` outside the dispatch path (e.g. NCCL
    /// communicator creation) under the hang watchdog.
    pub(crate) fn watched(&self, op: Op) -> Call<'_> {
        self.watch_now(Descriptor::new(op, &[]))
    }

    /// Watches `desc` as a step at the group's current call number (calls
    /// that do not advance it: point-to-point, communicator creation).
    fn watch_now(&self, mut desc: Descriptor) -> Call<'_> {
        desc.seq = self.inner.seq.get();
        self.inner.watch.call(&desc)
    }

    /// [`watch_now`](Self::watch_now) of a point-to-point call that waits
    /// on group ranks `peers` only (one peer twice, or a ring shift's two):
    /// the watchdog then holds only their departure against it.
    fn watch_between(&self, mut desc: Descriptor, peers: [usize; 2]) -> Call<'_> {
        desc.seq = self.inner.seq.get();
        match (
            self.inner.ranks.get(peers[0]),
            self.inner.ranks.get(peers[1]),
        ) {
            (Some(&a), Some(&b)) => self.inner.watch.call_between(&desc, [a, b]),
            _ => self.inner.watch.call(&desc),
        }
    }

    /// [`watched`](Self::watched) for a point-to-point call with group
    /// rank `peer`.
    pub(crate) fn watched_with(&self, op: Op, peer: usize) -> Call<'_> {
        self.watch_between(Descriptor::new(op, &[]), [peer, peer])
    }

    /// Validates a position argument (`src`, `dst`) for `op`.
    pub(crate) fn check_rank(&self, op: Op, what: &str, rank: usize) -> Result<usize> {
        rank_in_range(what, rank as i64, self.size())
            .map_err(|m| Error::invalid(op, self.name(), m))
    }

    /// The dispatch path of every collective: numbers the call, opens its
    /// tracing span, agrees on descriptors, applies `check`, and only then runs
    /// `body`. `body` gets every rank's descriptor (by group rank) when the op
    /// [needs them all](Descriptor::needs_all), otherwise this rank's only.
    /// `check` depends on the descriptor and the group alone: a repeat of
    /// the last call it passed skips it (see [`Admitted`]).
    pub(crate) fn collective<R>(
        &self,
        desc: Descriptor,
        check: impl Check,
        body: impl FnOnce(&[Descriptor]) -> Result<R>,
    ) -> Result<R> {
        let mut desc = desc;
        self.collective_on(false, &mut desc, check, body)
    }

    /// [`collective`](Self::collective); `fused`: the body's first move is
    /// a host executor call, which on shared memory carries the agreement.
    fn collective_on<R>(
        &self,
        fused: bool,
        desc: &mut Descriptor,
        check: impl Check,
        body: impl FnOnce(&[Descriptor]) -> Result<R>,
    ) -> Result<R> {
        if give_up::armed() && !give_up::inside() {
            return self.collective_caught(fused, desc, check, body);
        }
        let op = desc.own_op();
        desc.seq = self.inner.seq.get();
        self.inner.seq.set(desc.seq + 1);
        let span = tracing::debug_span!(
            "collective",
            rank = self.global_rank(),
            op = op.name(),
            group = self.name(),
            seq = desc.seq,
            dtype = desc.dtype().map_or("-", |d| d.name()),
            shape = ?desc.shape(),
        );
        let _entered = span.enter();
        // The whole call, agreement and data, is watched: a peer that never
        // enters it or stops inside it is named instead of waited for.
        let call = self.inner.watch.call(desc);
        call.finish(self.agree_then(fused, desc, check, body))
    }

    /// [`collective_on`](Self::collective_on) again, inside a landing pad
    /// (its waits can be given up), with the check and the body behind
    /// references: one copy of the dispatch path for every op, apart from
    /// theirs, so the inline ones (every job's whose calls cannot be given
    /// up) keep their code as it was. (Callgrind, 8 B all-reduce on shared
    /// memory: through the pad inline, +5% instructions; a second inline
    /// copy per op, +2%; this, +0.9%.)
    #[cold]
    #[inline(never)]
    fn collective_caught<R>(
        &self,
        fused: bool,
        desc: &mut Descriptor,
        check: impl Check,
        body: impl FnOnce(&[Descriptor]) -> Result<R>,
    ) -> Result<R> {
        let op = desc.own_op();
        let check: &CheckFn<'_> = &check;
        let mut body = Some(body);
        let mut out = None;
        let mut erased = |descs: &[Descriptor]| -> Result<()> {
            let body = body.take().expect("a call runs its body once");
            out = Some(body(descs)?);
            Ok(())
        };
        let erased: &mut dyn FnMut(&[Descriptor]) -> Result<()> = &mut erased;
        self.inner.watch.catching(op, self.name(), || {
            self.collective_on(fused, desc, check, erased)
        })?;
        Ok(out.expect("a call that succeeded ran its body"))
    }

    /// The agreement step of [`collective`](Self::collective), then `body`.
    fn agree_then<R>(
        &self,
        fused: bool,
        desc: &Descriptor,
        check: impl Check,
        body: impl FnOnce(&[Descriptor]) -> Result<R>,
    ) -> Result<R> {
        let op = desc.own_op();
        if let Some(d) = self.inner.device.deferred.get() {
            d.check_usable(op)?;
        }
        if self.size() == 1 {
            return self.run_if_admitted(op, desc, &check, body);
        }
        if desc.is_device() && !op.exchanges_counts() {
            match self.inner.device.check.get() {
                CheckMode::Strict => {}
                CheckMode::Deferred => return self.agree_deferred(desc, check, body),
                CheckMode::Off => return self.run_if_admitted(op, desc, &check, body),
            }
        }
        if let Some(shm) = self.shm() {
            return self.agree_on_shm(shm, fused, desc, check, body);
        }
        // Every call, whatever its kind, starts with the same all-reduce (max)
        // of [digest, !digest, flags, announcement]: it proves that every
        // rank passed the same call with a usable output, and hands every
        // rank the length an object's source announces. Only when the call
        // differs, or the op needs every rank's descriptor (objects of
        // several lengths), are the full descriptors gathered, and every
        // rank takes that branch together.
        let me = self.rank_in_group();
        let (key, verdict) = self.inner.admitted.admit(desc, &check);
        let mine = desc.agreement_record(key, me);
        let mut max = [0u64; 5];
        let calls = Calls(self.inner.comm.as_raw());
        calls.all_reduce(&mine[..], &mut max[..], SystemOperation::max().as_raw());
        if Descriptor::record_agrees(&max, key) {
            if !desc.needs_all() {
                // Identical everywhere: the op's own check gives every rank the same verdict.
                return self.on_verdict(op, verdict, desc, body);
            }
            let announced = Descriptor::announced([max[3], max[4]]);
            if let (Some(src), Some(len)) = (desc.length_source(), announced) {
                // Only the source's length matters, and every rank has it.
                let mut descs = vec![*desc; self.size()];
                for (r, d) in descs.iter_mut().enumerate() {
                    d.len = if r == src { len } else { 0 };
                }
                return self.run_if_agreed(op, &descs, me, &check, body);
            }
        }
        let mut descs = vec![Descriptor::new(op, &[]); self.size()];
        calls.all_gather(
            bytemuck::bytes_of(desc),
            bytemuck::cast_slice_mut::<_, u8>(&mut descs[..]),
        );
        self.run_if_agreed(op, &descs, me, &check, body)
    }

    /// The agreement of a device call in `deferred` mode (see `check`):
    /// posted, and the work enqueued at once. A rank whose own checks refuse
    /// the call enqueues nothing and completes the agreement now, so its
    /// error is the one every member gets.
    fn agree_deferred<R>(
        &self,
        desc: &Descriptor,
        check: impl Check,
        body: impl FnOnce(&[Descriptor]) -> Result<R>,
    ) -> Result<R> {
        let op = desc.own_op();
        let gpu = self.inner.rt.gpu()?;
        let deferred = self.inner.device.deferred.get_or_init(|| {
            // Collective at a group's first deferred call: the shm window.
            let posts = match self.shm() {
                Some(shm) => Posts::ring(shm.window().ring_area(), self.rank_in_group()),
                None => Posts::mpi(self.inner.comm.as_raw()),
            };
            let d = Rc::new(Deferred::new(
                self.name(),
                self.rank_in_group(),
                self.inner.rt.options().timeout,
                posts,
            ));
            gpu.register_deferred(&d);
            d
        });
        gpu.settle_at_call()?;
        if deferred.full() {
            gpu.make_room(deferred)?;
        }
        let (digest, verdict) = self.inner.admitted.admit(desc, &check);
        deferred.post(desc, digest, self.size(), verdict.is_err())?;
        if let Err(rejection) = verdict {
            gpu.settle()?;
            return Err(Error::rejected(op, self.name(), rejection));
        }
        // An NCCL error aborted the group's communicator: its members must
        // not wait for this rank's later posts.
        body(std::slice::from_ref(desc)).inspect_err(|e| {
            if matches!(e, Error::Nccl { .. }) {
                deferred.close();
            }
        })
    }

    /// When this group's device calls agree (see [`CheckMode`]).
    pub fn check_mode(&self) -> CheckMode {
        self.inner.device.check.get()
    }

    /// Sets when this group's device calls agree. Collective: every member
    /// calls it with the same mode at the same point (agreed like any call,
    /// so a member passing another mode is an error on all of them).
    /// Deferred agreements already posted are completed first.
    pub fn set_check_mode(&self, mode: CheckMode) -> Result<()> {
        let desc = Descriptor::of_args(Args::set_check_mode(mode));
        self.collective(
            desc,
            |_| Ok(()),
            |_| {
                if let Ok(gpu) = self.inner.rt.gpu() {
                    gpu.settle()?;
                }
                self.inner.device.check.set(mode);
                Ok(())
            },
        )
    }

    /// [`run_if_agreed`](Self::run_if_agreed) on this rank's descriptor alone (every
    /// rank's is the same), through the group's [`Admitted`].
    fn run_if_admitted<R>(
        &self,
        op: Op,
        desc: &Descriptor,
        check: &CheckFn<'_>,
        body: impl FnOnce(&[Descriptor]) -> Result<R>,
    ) -> Result<R> {
        let verdict = self.inner.admitted.verdict(desc, check);
        self.on_verdict(op, verdict, desc, body)
    }

    /// Refuses the call with this rank's `verdict` on `desc`, or runs `body`
    /// on `desc`: for calls every rank made alike, where this rank's
    /// verdict is every rank's.
    #[inline]
    fn on_verdict<R>(
        &self,
        op: Op,
        verdict: std::result::Result<(), Rejection>,
        desc: &Descriptor,
        body: impl FnOnce(&[Descriptor]) -> Result<R>,
    ) -> Result<R> {
        verdict.map_err(|r| Error::rejected(op, self.name(), r))?;
        tracing::trace!("agreed");
        body(std::slice::from_ref(desc))
    }

    /// Applies the agreement rules and the op's `check` to `descs` (this
    /// rank's alone when every rank's is the same, `me` being 0 then) and
    /// runs `body` on them when they allow the call.
    fn run_if_agreed<R>(
        &self,
        op: Op,
        descs: &[Descriptor],
        me: usize,
        check: &CheckFn<'_>,
        body: impl FnOnce(&[Descriptor]) -> Result<R>,
    ) -> Result<R> {
        agree(descs, me, check).map_err(|r| Error::rejected(op, self.name(), r))?;
        tracing::trace!("agreed");
        body(descs)
    }

    /// The agreement on shared memory. A fused call whose op's checks pass
    /// here publishes its descriptor with the body's first data phase and
    /// runs on; the executor stops at that synchronisation when any rank's
    /// differs, and every rank makes the same error from all of them. Other
    /// calls publish descriptors in a phase of their own, then proceed as
    /// the MPI agreement does.
    fn agree_on_shm<R>(
        &self,
        shm: &ShmExec,
        fused: bool,
        desc: &Descriptor,
        check: impl Check,
        body: impl FnOnce(&[Descriptor]) -> Result<R>,
    ) -> Result<R> {
        let op = desc.own_op();
        let me = self.rank_in_group();
        let one = std::slice::from_ref(desc);
        let (digest, verdict) = self.inner.admitted.admit(desc, &check);
        if fused && !desc.needs_all() && verdict.is_ok() {
            shm.stage(desc, digest);
            let moved = body(one);
            if let Some(descs) = shm.take_disagreement() {
                return Err(match agree(&descs, me, &check) {
                    Err(r) => Error::rejected(op, self.name(), r),
                    Ok(()) => Fault::Disagreed.into_error(op, self.name()),
                });
            }
            if shm.unstage() {
                return Err(Error::invalid(
                    op,
                    self.name(),
                    "internal: the shared-memory body moved nothing (please report)",
                ));
            }
            return moved;
        }
        let pulse = self.inner.rt.watchdog().pulse();
        match shm.exchange_descriptors(desc, digest, desc.needs_all(), &pulse) {
            Some(descs) => self.run_if_agreed(op, &descs, me, &check, body),
            // The same everywhere: this rank's verdict is every rank's.
            None => self.on_verdict(op, verdict, desc, body),
        }
    }

    /// The dispatch path with the op's rules applied: `desc` names the op,
    /// the input and the parameters; `fit` says whether the caller's output
    /// (see [`output_fit`](Self::output_fit)) fits the op's
    /// [output shape](Op::output_shape), flagged in the agreement so every
    /// rank fails together; the op's own parameter checks run on every
    /// rank's descriptor; `body` moves the bytes, and its faults come back
    /// naming the op and the group.
    pub(crate) fn run_op<R>(
        &self,
        desc: &mut Descriptor,
        fit: OutputFit,
        body: impl FnOnce() -> std::result::Result<R, Fault>,
    ) -> Result<R> {
        self.run_op_on(false, desc, fit, body)
    }

    /// [`run_op`](Self::run_op) of a host op with no output tensor, whose
    /// body's first move is a call to the [host executor](Self::host_for):
    /// on the shared-memory window the agreement rides on it.
    pub(crate) fn run_host_op<R>(
        &self,
        mut desc: Descriptor,
        body: impl FnOnce() -> std::result::Result<R, Fault>,
    ) -> Result<R> {
        let fused = fuses_agreement(desc.own_op(), self.planes());
        self.run_op_on(fused, &mut desc, OutputFit::Unchecked, body)
    }

    /// [`run_host_op`](Self::run_host_op) writing into the caller's `out`,
    /// checked first and then handed to `body`.
    pub(crate) fn run_host_op_into<T: PlaneTensor, R>(
        &self,
        mut desc: Descriptor,
        out: &mut T,
        body: impl FnOnce(&mut T) -> std::result::Result<R, Fault>,
    ) -> Result<R> {
        let fit = self.output_fit(&desc, &*out);
        let fused = fuses_agreement(desc.own_op(), self.planes());
        self.run_op_on(fused, &mut desc, fit, || body(out))
    }

    /// Whether `out` fits the output of `desc`'s call on this rank. Only a
    /// verdict travels down the dispatch path: the caller's shape is
    /// copied only when it is wrong, for the message.
    pub(crate) fn output_fit<T: PlaneTensor>(&self, desc: &Descriptor, out: &T) -> OutputFit {
        let op = desc.own_op();
        if !op.output_used_on(self.rank_in_group(), &desc.params) {
            return OutputFit::Unchecked;
        }
        let fits = op.output_fits(desc.dims(), &desc.params, self.size(), out.shape());
        match fits.map(|f| f && Some(out.dtype()) == desc.dtype()) {
            None => OutputFit::Unchecked,
            Some(true) => OutputFit::Fits,
            Some(false) => OutputFit::Unfit(Box::new((out.dtype(), out.shape().to_vec()))),
        }
    }

    fn run_op_on<R>(
        &self,
        fused: bool,
        desc: &mut Descriptor,
        fit: OutputFit,
        body: impl FnOnce() -> std::result::Result<R, Fault>,
    ) -> Result<R> {
        let op = desc.own_op();
        let size = self.size();
        // The descriptor is changed in place and passed on by reference: at
        // 200 bytes, each copy on this path is a `memcpy` per call.
        desc.mark_bad_output(matches!(fit, OutputFit::Unfit(_)));
        self.collective_on(
            fused,
            desc,
            |d| d.validate(op, size),
            |_| body().map_err(|f| f.into_error(op, self.name())),
        )
        .map_err(|e| match (fit, desc.dtype()) {
            (OutputFit::Unfit(out), Some(dt)) => {
                let want = op
                    .output_shape(&desc.shape(), &desc.params, size)
                    .unwrap_or_default();
                explain_output(e, (out.0, &out.1), dt, &want)
            }
            _ => e,
        })
    }

    /// The dispatch path of a point-to-point call: the sender's header meets the
    /// receiver's expectation, both sides check the pair and get the same verdict,
    /// and only then does `body` move the payload. Returns the sender's descriptor.
    pub(crate) fn point_to_point<R>(
        &self,
        desc: Descriptor,
        peer: Peer,
        body: impl FnOnce(&Descriptor) -> std::result::Result<R, Fault>,
    ) -> Result<R> {
        let op = desc.own_op();
        let (peer_rank, sending) = match peer {
            Peer::To(r) => (r, true),
            Peer::From(r) => (r, false),
        };
        let what = if sending { "dst" } else { "src" };
        let peer_rank = self.check_rank(op, what, peer_rank)?;
        if peer_rank == self.rank_in_group() {
            return Err(Error::invalid(
                op,
                self.name(),
                format!(
                    "{what} {peer_rank} is this rank itself (group of size {})",
                    self.size()
                ),
            ));
        }
        let span = tracing::debug_span!(
            "p2p",
            rank = self.global_rank(),
            op = op.name(),
            group = self.name(),
            peer = peer_rank,
            sending,
            dtype = desc.dtype().map_or("-", |d| d.name()),
            shape = ?desc.shape(),
        );
        let _entered = span.enter();
        let plane = self.mpi();
        let call = self.watch_between(desc, [peer_rank, peer_rank]);
        call.run(op, self.name(), || {
            let mut other = Descriptor::new(op, &[]);
            let other_bytes = bytemuck::bytes_of_mut(&mut other);
            let (sent, expected, sender, receiver) = if sending {
                plane.send_header(bytemuck::bytes_of(&desc), peer_rank, TAG_HEADER);
                plane.recv_header(other_bytes, peer_rank, TAG_ANSWER);
                (desc, other, self.rank_in_group(), peer_rank)
            } else {
                plane.recv_header(other_bytes, peer_rank, TAG_HEADER);
                plane.send_header(bytemuck::bytes_of(&desc), peer_rank, TAG_ANSWER);
                (other, desc, peer_rank, self.rank_in_group())
            };
            agree_peers(&sent, &expected, sender, receiver)
                .map_err(|m| Error::mismatch(op, self.name(), m))
                .and_then(|()| body(&sent).map_err(|f| f.into_error(op, self.name())))
        })
    }

    /// The dispatch path of a batch of sends and receives: every pair's
    /// header goes out and its peer's comes back at once (a sender's
    /// descriptor against its receiver's expectation, checked by both
    /// ends), then `body` moves the pairs marked agreed; the first pair that
    /// disagreed is the error, on both of its ends.
    pub(crate) fn exchange_batch(
        &self,
        pairs: &[(Descriptor, Peer)],
        body: impl FnOnce(&[bool]) -> std::result::Result<(), Fault>,
    ) -> Result<()> {
        let op = Op::BatchSendRecv;
        let me = self.rank_in_group();
        let mut peers = Vec::with_capacity(pairs.len());
        for (_, p) in pairs {
            let (what, peer) = match p {
                Peer::To(d) => ("send peer", *d),
                Peer::From(s) => ("receive peer", *s),
            };
            let peer = self.check_rank(op, what, peer)?;
            if peer == me {
                return Err(Error::invalid(
                    op,
                    self.name(),
                    format!("{what} {peer} is this rank itself"),
                ));
            }
            peers.push(peer);
        }
        // A batch with one or two peers (a pipeline stage's next and
        // previous) waits on them only, as a send or a receive does; with
        // more, the watchdog holds any member's departure against it.
        let mut distinct = peers.clone();
        distinct.sort_unstable();
        distinct.dedup();
        let desc = Descriptor::new(op, &[]);
        let call = match distinct[..] {
            [a] => self.watch_between(desc, [a, a]),
            [a, b] => self.watch_between(desc, [a, b]),
            _ => self.watch_now(desc),
        };
        call.run(op, self.name(), || {
            self.swap_then_move(op, pairs, &peers, body)
        })
    }

    /// The batch's header swap and moves, inside its watched call.
    fn swap_then_move(
        &self,
        op: Op,
        pairs: &[(Descriptor, Peer)],
        peers: &[usize],
        body: impl FnOnce(&[bool]) -> std::result::Result<(), Fault>,
    ) -> Result<()> {
        let me = self.rank_in_group();
        // Zeroed: a header cut short by its peer reads as corrupt (no magic).
        let mut theirs = vec![bytemuck::Zeroable::zeroed(); pairs.len()];
        let mine: Vec<(&[u8], usize, i32, i32)> = pairs
            .iter()
            .zip(peers)
            .map(|((d, p), peer)| {
                let tags = match p {
                    Peer::To(_) => (TAG_HEADER, TAG_ANSWER),
                    Peer::From(_) => (TAG_ANSWER, TAG_HEADER),
                };
                (bytemuck::bytes_of(d), *peer, tags.0, tags.1)
            })
            .collect();
        let mut into: Vec<&mut [u8]> = theirs.iter_mut().map(bytemuck::bytes_of_mut).collect();
        self.mpi().swap_headers(&mine, &mut into);
        let verdicts: Vec<std::result::Result<(), String>> = pairs
            .iter()
            .zip(&theirs)
            .zip(peers)
            .map(|(((d, p), other), peer)| match p {
                Peer::To(_) => agree_peers(d, other, me, *peer),
                Peer::From(_) => agree_peers(other, d, *peer, me),
            })
            .collect();
        let agreed: Vec<bool> = verdicts.iter().map(|v| v.is_ok()).collect();
        let moved = body(&agreed);
        let refused = verdicts.into_iter().find_map(|v| v.err());
        match refused {
            Some(m) => Err(Error::mismatch(op, self.name(), m)),
            None => moved.map_err(|f| f.into_error(op, self.name())),
        }
    }

    /// The dispatch path of a combined send/receive (each rank sends to `dst`
    /// and receives from `src`, as in a ring shift): headers and answers are
    /// exchanged with `MPI_Sendrecv`, each link is checked by its two ends,
    /// links that agree move their payload, and a failed link is an error on
    /// both of its ends.
    pub(crate) fn exchange(
        &self,
        sent: Descriptor,
        dst: usize,
        expected: Descriptor,
        src: usize,
        body: impl FnOnce(bool, bool) -> std::result::Result<(), Fault>,
    ) -> Result<()> {
        let op = Op::SendRecv;
        let me = self.rank_in_group();
        let dst = self.check_rank(op, "dst", dst)?;
        let src = self.check_rank(op, "src", src)?;
        let span = tracing::debug_span!(
            "exchange",
            rank = self.global_rank(),
            group = self.name(),
            dst,
            src
        );
        let _entered = span.enter();
        let plane = self.mpi();
        let mut incoming = Descriptor::new(op, &[]);
        let mut answer = Descriptor::new(op, &[]);
        let call = self.watch_between(sent, [dst, src]);
        call.run(Op::SendRecv, self.name(), || {
            plane.exchange_headers(
                bytemuck::bytes_of(&sent),
                dst,
                bytemuck::bytes_of_mut(&mut incoming),
                src,
                TAG_HEADER,
            );
            plane.exchange_headers(
                bytemuck::bytes_of(&expected),
                src,
                bytemuck::bytes_of_mut(&mut answer),
                dst,
                TAG_ANSWER,
            );
            let out_link = agree_peers(&sent, &answer, me, dst);
            let in_link = agree_peers(&incoming, &expected, src, me);
            let moved = body(out_link.is_ok(), in_link.is_ok());
            out_link
                .and(in_link)
                .map_err(|m| Error::mismatch(Op::SendRecv, self.name(), m))
                .and_then(|()| moved.map_err(|f| f.into_error(Op::SendRecv, self.name())))
        })
    }
}

/// Adds this rank's output and the expected one to an output error, when
/// this rank's output is the one that does not fit.
fn explain_output(e: Error, out: (DType, &[usize]), dtype: DType, shape: &[usize]) -> Error {
    match e {
        Error::InvalidArgument { .. } if out != (dtype, shape) => e.noted(format_args!(
            "this rank: output is {:?} {}, expected {shape:?} {dtype}",
            out.1, out.0
        )),
        e => e,
    }
}

/// The descriptor of the tensor op `args` on input `t` (host or device, by its type).
#[inline(always)]
pub(crate) fn tensor_desc<T: PlaneTensor>(args: Args, t: &T) -> Descriptor {
    shaped_desc::<T>(args, t.dtype(), t.shape())
}

/// The descriptor of the tensor op `args` on a `T` of `dtype` described
/// by `shape` (the input's, or what the op's descriptor carries instead).
#[inline(always)]
pub(crate) fn shaped_desc<T: PlaneTensor>(args: Args, dtype: DType, shape: &[usize]) -> Descriptor {
    let desc = Descriptor::for_tensor(args.op(), dtype, shape, args.params());
    if T::ON_DEVICE {
        desc.on_device()
    } else {
        desc
    }
}

/// A caller's output as the dispatch path checked it (see
/// [`GroupCoordinator::output_fit`]).
pub(crate) enum OutputFit {
    /// No output, or one this op does not check here.
    Unchecked,
    Fits,
    /// Its dtype and shape, for the message every rank's error then carries.
    Unfit(Box<(DType, Vec<usize>)>),
}
