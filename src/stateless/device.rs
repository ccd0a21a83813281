//! Device tensors over NCCL between the members of a stateless group (the
//! way vLLM pairs its `StatelessProcessGroup` with a `PyNcclCommunicator`):
//! the unique id travels over the group's own links, so members of
//! separately launched jobs share one NCCL communicator.
//!
//! Every call is agreed on over the group first (strict mode): members that
//! disagree on the op, dtype, shape or root all get the same error naming
//! who passed what, before anything is enqueued.

use super::StatelessGroup;
use crate::device::{DeviceTensor, Gpu};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::nccl::comm::Communicator;
use crate::nccl::result::unique_id;
use crate::nccl::sys::{RawStream, UniqueId, UNIQUE_ID_BYTES};
use crate::op::Op;
use crate::op::ReduceOp;
use serde::{Deserialize, Serialize};

/// What a member is about to enqueue.
#[derive(Serialize, Deserialize, PartialEq, Debug, Clone)]
struct Call {
    op: String,
    dtype: DType,
    shape: Vec<usize>,
    /// Root, peer or reduction, as the op uses it.
    param: i64,
}

impl std::fmt::Display for Call {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}({:?} {}, {})",
            self.op, self.shape, self.dtype, self.param
        )
    }
}

/// A stateless group's NCCL communicator: device collectives and
/// point-to-point between its members, enqueued on the GPU's stream (call
/// [`synchronize`](Self::synchronize) before reading results on the host).
pub struct StatelessDevice<'g, 'rt> {
    group: &'g StatelessGroup<'rt>,
    gpu: &'rt Gpu,
    comm: Communicator<'rt>,
}

impl<'rt> StatelessGroup<'rt> {
    /// Creates the group's NCCL communicator on this rank's GPU (every
    /// member calls it): checks that no two members share a GPU, sends
    /// member 0's unique id over the group, initialises, and makes every
    /// member fail alike when one fails.
    pub fn device(&self) -> Result<StatelessDevice<'_, 'rt>> {
        let name = self.name().to_string();
        let fail = |msg: String| Error::invalid(Op::Connect, &name, msg);
        // Every member learns every member's GPU (or why it has none) first.
        let gpu = self.rt.gpu();
        let host = self.rt.world().me().host.clone();
        let mine: std::result::Result<(String, String), String> = match &gpu {
            Ok(g) => g
                .api()
                .map(|_| (host, g.info().bus_id.clone()))
                .map_err(|e| e.to_string()),
            Err(e) => Err(e.to_string()),
        };
        let all = self.all_gather_obj(&mine)?;
        let mut devices: Vec<(String, String)> = Vec::with_capacity(all.len());
        for (r, d) in all.into_iter().enumerate() {
            devices
                .push(d.map_err(|m| fail(format!("member {r} has no usable GPU or NCCL: {m}")))?);
        }
        for (b, dev) in devices.iter().enumerate() {
            if let Some(a) = devices[..b].iter().position(|d| d == dev) {
                return Err(fail(format!(
                    "members {a} and {b} would share GPU {} on {} (NCCL refuses two ranks on \
                     one GPU)",
                    dev.1, dev.0
                )));
            }
        }
        let gpu = gpu?;
        let api = gpu.api().map_err(|e| fail(e.to_string()))?;
        let id: std::result::Result<Vec<u8>, String> = if self.rank() == 0 {
            unique_id(api)
                .map(|id| id.to_bytes().to_vec())
                .map_err(|e| e.msg)
        } else {
            Err(String::new())
        };
        let id = self
            .broadcast_obj((self.rank() == 0).then_some(&id), 0)?
            .map_err(|m| fail(format!("ncclGetUniqueId failed on member 0: {m}")))?;
        let id: [u8; UNIQUE_ID_BYTES] = id
            .try_into()
            .map_err(|_| fail("member 0 sent a unique id of the wrong size".into()))?;
        gpu.context()
            .bind_to_thread()
            .map_err(|e| fail(format!("binding the CUDA context: {e}")))?;
        let created = Communicator::init(
            api,
            UniqueId::from_bytes(&id),
            self.world_size(),
            self.rank(),
            &name,
        );
        let outcome: std::result::Result<(), String> =
            created.as_ref().map(|_| ()).map_err(|e| e.msg.clone());
        let outcomes = self.all_gather_obj(&outcome)?;
        if let Some((rank, Err(msg))) = outcomes.iter().enumerate().find(|(_, o)| o.is_err()) {
            if let Ok(c) = created {
                c.state().abort(api, "a peer failed to initialise");
            }
            return Err(fail(format!(
                "ncclCommInitRank failed on member {rank}: {msg}"
            )));
        }
        let comm = created.map_err(|e| Error::nccl(Op::Connect, &name, e))?;
        gpu.register(comm.state());
        Ok(StatelessDevice {
            group: self,
            gpu,
            comm,
        })
    }
}

impl StatelessDevice<'_, '_> {
    fn stream(&self) -> RawStream {
        self.gpu.stream().cu_stream() as RawStream
    }

    fn nccl(&self, op: Op, e: crate::NcclError) -> Error {
        Error::nccl(op, self.group.name(), e)
    }

    /// Every member's call, compared: the same error everywhere on a mismatch.
    fn agree(&self, op: Op, call: Call) -> Result<()> {
        let calls = self.group.all_gather_obj(&call)?;
        if let Some((r, other)) = calls.iter().enumerate().find(|(_, c)| **c != calls[0]) {
            return Err(Error::mismatch(
                op,
                self.group.name(),
                format!("member 0 called {} but member {r} called {other}", calls[0]),
            ));
        }
        Ok(())
    }

    /// Member `src`'s tensor into `t` on every member (in place).
    pub fn broadcast(&self, t: &mut DeviceTensor, src: usize) -> Result<()> {
        let op = Op::Broadcast;
        let call = Call {
            op: "broadcast".into(),
            dtype: t.dtype(),
            shape: t.shape().to_vec(),
            param: src as i64,
        };
        self.agree(op, call)?;
        let src = self.group.check_rank(op, "src", src)?;
        let (n, dt) = (t.numel(), t.dtype());
        let p = t.ptr_on(self.gpu.enqueue_own()?)?;
        // SAFETY: in place, as NCCL allows; `t` holds `n` elements until the stream ran.
        unsafe { self.comm.broadcast(p, p, n, dt, src, self.stream()) }
            .map_err(|e| self.nccl(op, e))
    }

    /// Element-wise reduction of every member's `t`, in place.
    pub fn all_reduce_in_place(&self, t: &mut DeviceTensor, reduce_op: ReduceOp) -> Result<()> {
        let op = Op::AllReduce;
        let call = Call {
            op: format!("all_reduce {}", reduce_op.name()),
            dtype: t.dtype(),
            shape: t.shape().to_vec(),
            param: 0,
        };
        self.agree(op, call)?;
        let (n, dt) = (t.numel(), t.dtype());
        let p = t.ptr_on(self.gpu.enqueue_own()?)?;
        // SAFETY: in place, as NCCL allows.
        unsafe { self.comm.all_reduce(p, p, n, dt, reduce_op, self.stream()) }
            .map_err(|e| self.nccl(op, e))
    }

    /// Sends `t` to member `dst`, once `dst` has confirmed a matching
    /// [`recv_into`](Self::recv_into) (so a mismatch is an error on both,
    /// never a hang in NCCL).
    pub fn send(&self, t: &DeviceTensor, dst: usize) -> Result<()> {
        let op = Op::Send;
        let dst = self.peer(op, "dst", dst)?;
        let call = Call {
            op: "send".into(),
            dtype: t.dtype(),
            shape: t.shape().to_vec(),
            param: self.group.rank() as i64,
        };
        self.group.send_obj(&call, dst)?;
        let verdict: std::result::Result<(), String> = self.group.recv_obj(dst)?;
        verdict.map_err(|m| Error::mismatch(op, self.group.name(), m))?;
        // SAFETY: `t` holds `numel` elements of its dtype until the stream ran.
        unsafe {
            self.comm.send(
                t.ptr_on(self.gpu.enqueue_own()?)?,
                t.numel(),
                t.dtype(),
                dst,
                self.stream(),
            )
        }
        .map_err(|e| self.nccl(op, e))
    }

    /// Receives member `src`'s [`send`](Self::send) into `out`, whose dtype
    /// and shape must match the sender's.
    pub fn recv_into(&self, out: &mut DeviceTensor, src: usize) -> Result<()> {
        let op = Op::Send;
        let src = self.peer(op, "src", src)?;
        let sent: Call = self.group.recv_obj(src)?;
        let verdict = if sent.dtype == out.dtype() && sent.shape == out.shape() {
            Ok(())
        } else {
            Err(format!(
                "member {src} sends {:?} {} but member {} receives into {:?} {}",
                sent.shape,
                sent.dtype,
                self.group.rank(),
                out.shape(),
                out.dtype()
            ))
        };
        self.group.send_obj(&verdict, src)?;
        verdict.map_err(|m| Error::mismatch(op, self.group.name(), m))?;
        let (n, dt) = (out.numel(), out.dtype());
        // SAFETY: `out` holds `n` elements of its dtype until the stream ran.
        unsafe {
            self.comm.recv(
                out.ptr_on(self.gpu.enqueue_own()?)?,
                n,
                dt,
                src,
                self.stream(),
            )
        }
        .map_err(|e| self.nccl(op, e))
    }

    /// Waits for the enqueued work (NCCL errors and `RANKMESH_TIMEOUT`
    /// become errors, as on every device plane).
    pub fn synchronize(&self) -> Result<()> {
        self.gpu.synchronize()
    }

    /// The GPU the communicator runs on.
    pub fn gpu(&self) -> &Gpu {
        self.gpu
    }

    fn peer(&self, op: Op, what: &str, rank: usize) -> Result<usize> {
        let rank = self.group.check_rank(op, what, rank)?;
        if rank == self.group.rank() {
            return Err(Error::invalid(
                op,
                self.group.name(),
                format!("{what} {rank} is this member itself"),
            ));
        }
        Ok(rank)
    }
}
