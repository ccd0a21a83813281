//! Point-to-point transfers of device tensors: send, recv, send_recv_into.
//! Shape and dtype are checked with the peer over MPI first, as on the host.

use super::collectives::nccl_dtype;
use super::{DeviceGroup, DeviceTensor};
use crate::dispatch::{Descriptor, Op};
use crate::error::Result;
use crate::group::Peer;
use crate::plane::nccl::comm::Communicator;
use crate::tensor::DType;
use std::cell::Ref;
use std::os::raw::c_int;

impl<'g, 'rt> DeviceGroup<'g, 'rt> {
    /// The communicator for a point-to-point call, which cannot create one
    /// (only two members take part).
    fn p2p_comm(&self, op: Op) -> Result<Ref<'g, Communicator<'rt>>> {
        self.group.existing_nccl_comm().ok_or_else(|| {
            self.err(
                op,
                "the group has no NCCL communicator yet: call device().connect() on every \
                 member (or run a device collective) before device send/recv",
            )
        })
    }

    /// Sends `t` to group rank `dst` (the next member when `None`). Shape and
    /// dtype are checked with the receiver over MPI first; then enqueued.
    pub fn send(&self, t: &DeviceTensor, dst: Option<usize>) -> Result<()> {
        let dst = dst.unwrap_or((self.group.rank_in_group() + 1) % self.group.size());
        let desc = Descriptor::for_tensor(Op::Send, t.dtype(), t.shape(), &[]).on_device();
        self.group.point_to_point(desc, Peer::To(dst), |_| {
            let comm = self.p2p_comm(Op::Send)?;
            let src = t.read_ptr(self.gpu.stream());
            comm.grouped("ncclSend", |api, raw| unsafe {
                // SAFETY: `t` holds `numel` elements of its dtype.
                (api.send)(
                    src,
                    t.numel(),
                    nccl_dtype(t.dtype()),
                    dst as c_int,
                    raw,
                    self.stream(),
                )
            })
            .map_err(|m| self.err(Op::Send, m))
        })
    }

    /// Receives a tensor of `shape` and `dtype` from group rank `src` (the
    /// previous member when `None`).
    pub fn recv(&self, shape: &[usize], dtype: DType, src: Option<usize>) -> Result<DeviceTensor> {
        let size = self.group.size();
        let src = src.unwrap_or((self.group.rank_in_group() + size - 1) % size);
        let desc = Descriptor::for_tensor(Op::Send, dtype, shape, &[]).on_device();
        self.group.point_to_point(desc, Peer::From(src), |_| {
            let comm = self.p2p_comm(Op::Send)?;
            let mut t = self.gpu.empty(shape.to_vec(), dtype)?;
            let dst = t.write_ptr(self.gpu.stream());
            comm.grouped("ncclRecv", |api, raw| unsafe {
                // SAFETY: `t` holds `numel` elements of `dtype`.
                (api.recv)(
                    dst,
                    t.numel(),
                    nccl_dtype(dtype),
                    src as c_int,
                    raw,
                    self.stream(),
                )
            })
            .map_err(|m| self.err(Op::Send, m))?;
            Ok(t)
        })
    }
}

impl DeviceGroup<'_, '_> {
    /// Sends `t` to `dst` while receiving `out` from `src` (defaults: next and
    /// previous member), as the host [`send_recv_into`](crate::GroupCoordinator::send_recv_into):
    /// each link is checked by its two ends over MPI; only links that agree
    /// are enqueued, so both ends of a link do the same thing.
    pub fn send_recv_into(
        &self,
        t: &DeviceTensor,
        out: &mut DeviceTensor,
        dst: Option<usize>,
        src: Option<usize>,
    ) -> Result<()> {
        let size = self.group.size();
        let me = self.group.rank_in_group();
        let dst = dst.unwrap_or((me + 1) % size);
        let src = src.unwrap_or((me + size - 1) % size);
        let sent = Descriptor::for_tensor(Op::Send, t.dtype(), t.shape(), &[]).on_device();
        let expected = Descriptor::for_tensor(Op::Send, out.dtype(), out.shape(), &[]).on_device();
        if dst == me || src == me {
            if dst != src {
                return Err(self.err(
                    Op::Send,
                    "dst and src must both be this rank or both another",
                ));
            }
            crate::dispatch::agree_peers(&sent, &expected, me, me)
                .map_err(|m| self.err(Op::Send, m))?;
            return self.copy(t, out);
        }
        let comm = self.p2p_comm(Op::Send)?;
        let s = self.gpu.stream();
        let (sp, rp) = (t.read_ptr(s), out.write_ptr(s));
        let (sn, rn) = (t.numel(), out.numel());
        let (sd, rd) = (nccl_dtype(t.dtype()), nccl_dtype(out.dtype()));
        let mut enqueued = Ok(());
        self.group
            .exchange(sent, dst, expected, src, |send_ok, recv_ok| {
                enqueued = comm.grouped("ncclSend/ncclRecv", |api, raw| unsafe {
                    // SAFETY: both tensors hold the counts passed, on this device.
                    let a = if send_ok {
                        (api.send)(sp, sn, sd, dst as c_int, raw, self.stream())
                    } else {
                        0
                    };
                    if a != 0 || !recv_ok {
                        return a;
                    }
                    (api.recv)(rp, rn, rd, src as c_int, raw, self.stream())
                });
            })?;
        enqueued.map_err(|m| self.err(Op::Send, m))
    }
}
