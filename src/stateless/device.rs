//! Device tensors over NCCL between the members of a stateless group. As vLLM
//! pairs its `StatelessProcessGroup` with a `PyNcclCommunicator`, the unique
//! id travels over the group's own links, so members of separately launched
//! jobs share one NCCL communicator.
//!
//! Every call is agreed on over the group first (strict mode), through the
//! same agreement as every other group (`crate::agree`): each member's call
//! descriptor travels over the group's links, and members that disagree on
//! the op, dtype, shape or root all get the same error naming who passed
//! what, before anything is enqueued. Point-to-point calls check the pair
//! with `agree_peers`, as a `DeviceGroup` does.

use super::StatelessGroup;
use crate::agree::{agree, agree_peers, Descriptor};
use crate::device::{DeviceTensor, Gpu};
use crate::error::{Error, Result};
use crate::group::connect::{
    creation_record, finish_creation, judge_creation, Naming, STATUS_BYTES,
};
use crate::nccl::comm::{Communicator, Membership, Origin};
use crate::nccl::result::unique_id;
use crate::nccl::sys::{RawStream, UniqueId, UNIQUE_ID_BYTES};
use crate::op::Op;
use crate::op::ReduceOp;
use std::cell::Cell;

/// A stateless group's NCCL communicator: device collectives and
/// point-to-point between its members, enqueued on the GPU's stream (call
/// [`synchronize`](Self::synchronize) before reading results on the host).
pub struct StatelessDevice<'g, 'rt> {
    group: &'g StatelessGroup<'rt>,
    gpu: &'rt Gpu,
    comm: Communicator<'rt>,
    /// Calls agreed so far (the descriptors' call numbers).
    seq: Cell<u64>,
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
        // NCCL tells hosts apart by NCCL_HOSTID where it is set.
        let host = crate::device::select::nccl_host_name(
            &self.rt.world().me().host,
            std::env::var("NCCL_HOSTID").ok().as_deref(),
        );
        let mine: std::result::Result<(String, String), String> = match &gpu {
            Ok(g) => g
                .api()
                .map(|_| (host, g.info().bus_id.clone()))
                .map_err(|e| e.to_string()),
            Err(e) => Err(e.to_string()),
        };
        self.agree_on_gpus(mine)?;
        let gpu = gpu?;
        let api = gpu.api().map_err(|e| fail(e.to_string()))?;
        let id = self.unique_id_of_first(api)?;
        gpu.context()
            .bind_to_thread()
            .map_err(|e| fail(format!("binding the CUDA context: {e}")))?;
        // The group reduces as its oldest GPU can.
        let mine = gpu.info().compute_capability;
        let sm = self
            .all_gather_obj(&mine)?
            .into_iter()
            .min()
            .unwrap_or(mine);
        // Created non-blocking and polled under RANKMESH_TIMEOUT (aborted past it).
        let membership = Membership {
            size: self.world_size(),
            rank: self.rank(),
            group: &name,
            sm,
            limit: gpu.timeout(),
        };
        let started =
            Communicator::start(api, Origin::Ids(&[UniqueId::from_bytes(&id)]), &membership);
        // Every member learns every outcome over the group's links.
        let done = finish_creation(started, &|| {});
        let all: Vec<Vec<u8>> = self.all_gather_obj(&creation_record(&done).to_vec())?;
        if let Some(r) = all.iter().position(|rec| rec.len() != STATUS_BYTES) {
            return Err(fail(format!("member {r} sent a malformed creation status")));
        }
        let naming = Naming {
            label: "member",
            rank_of: &|r| r,
        };
        let comm = judge_creation(api, done, &all.concat(), &naming)
            .map_err(|e| Error::nccl(Op::Connect, &name, e))?
            .expect("created from an id");
        gpu.register(comm.state());
        Ok(StatelessDevice {
            group: self,
            gpu,
            comm,
            seq: Cell::new(0),
        })
    }
}

impl StatelessGroup<'_> {
    /// Every member's GPU (the node NCCL sees it on, its bus id) or why it
    /// has none, gathered: the same error on every member when one has none
    /// or two would share one.
    fn agree_on_gpus(&self, mine: std::result::Result<(String, String), String>) -> Result<()> {
        let fail = |msg: String| Error::invalid(Op::Connect, self.name(), msg);
        let all = self.all_gather_obj(&mine)?;
        let mut devices: Vec<(String, String)> = Vec::with_capacity(all.len());
        for (r, d) in all.into_iter().enumerate() {
            devices
                .push(d.map_err(|m| fail(format!("member {r} has no usable GPU or NCCL: {m}")))?);
        }
        if let Some((a, b)) = crate::device::select::first_shared(&devices, |p, q| p == q) {
            return Err(fail(format!(
                "members {a} and {b} would share GPU {} on {} (NCCL refuses two ranks on one GPU)",
                devices[b].1, devices[b].0
            )));
        }
        Ok(())
    }

    /// The NCCL unique id member 0 makes, sent to every member (its
    /// failure there is every member's error).
    fn unique_id_of_first(&self, api: &crate::nccl::sys::Api) -> Result<[u8; UNIQUE_ID_BYTES]> {
        let fail = |msg: String| Error::invalid(Op::Connect, self.name(), msg);
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
        id.try_into()
            .map_err(|_| fail("member 0 sent a unique id of the wrong size".into()))
    }
}

impl StatelessDevice<'_, '_> {
    fn stream(&self) -> RawStream {
        self.gpu.stream().cu_stream() as RawStream
    }

    fn nccl(&self, op: Op, e: crate::error::NcclError) -> Error {
        Error::nccl(op, self.group.name(), e)
    }

    /// This member's descriptor of a device call of `op` on `t`.
    fn call_desc(op: Op, t: &DeviceTensor, params: &[i64]) -> Descriptor {
        Descriptor::for_tensor(op, t.dtype(), t.shape(), params).on_device()
    }

    /// Every member's descriptor, over the group's links, then the one
    /// agreement's verdict: the same error on every member on a mismatch.
    /// Collectives are numbered, so a member that skipped one is named.
    fn agree(&self, mut desc: Descriptor) -> Result<()> {
        desc.seq = self.seq.get();
        self.seq.set(desc.seq + 1);
        let op = desc.op().unwrap_or(Op::Synchronize);
        let name = self.group.name();
        let sent = self
            .group
            .all_gather_obj(&bytemuck::bytes_of(&desc).to_vec())?;
        let descs = sent
            .iter()
            .enumerate()
            .map(|(r, bytes)| descriptor_from(bytes, r).map_err(|m| Error::mismatch(op, name, m)))
            .collect::<Result<Vec<_>>>()?;
        let size = descs.len();
        agree(&descs, self.group.rank(), &|d: &Descriptor| {
            d.validate(op, size)
        })
        .map_err(|r| Error::rejected(op, name, r))
    }

    /// Member `src`'s tensor into `t` on every member (in place).
    pub fn broadcast(&self, t: &mut DeviceTensor, src: usize) -> Result<()> {
        let op = Op::Broadcast;
        self.agree(Self::call_desc(op, t, &[src as i64]))?;
        let (n, dt) = (t.numel(), t.dtype());
        let p = t.ptr_on(self.gpu.enqueue_own()?)?;
        // SAFETY: in place, as NCCL allows; `t` holds `n` elements until the stream ran.
        unsafe { self.comm.broadcast(p, p, n, dt, src, self.stream()) }
            .map_err(|e| self.nccl(op, e))
    }

    /// Element-wise reduction of every member's `t`, in place.
    pub fn all_reduce_in_place(&self, t: &mut DeviceTensor, reduce_op: ReduceOp) -> Result<()> {
        let op = Op::AllReduce;
        self.agree(Self::call_desc(op, t, &[reduce_op.code()]))?;
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
        let desc = Self::call_desc(op, t, &[]);
        self.group
            .send_obj(&bytemuck::bytes_of(&desc).to_vec(), dst)?;
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
        let bytes: Vec<u8> = self.group.recv_obj(src)?;
        let expected = Self::call_desc(op, out, &[]);
        let verdict = descriptor_from(&bytes, src)
            .and_then(|sent| agree_peers(&sent, &expected, src, self.group.rank()));
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

/// Member `r`'s descriptor from the bytes it sent (a peer that sends
/// something else is named).
fn descriptor_from(bytes: &[u8], r: usize) -> std::result::Result<Descriptor, String> {
    if bytes.len() != std::mem::size_of::<Descriptor>() {
        return Err(format!(
            "group rank {r} sent a call descriptor of {} bytes: is it running the same rankmesh version?",
            bytes.len()
        ));
    }
    Ok(bytemuck::pod_read_unaligned(bytes))
}
