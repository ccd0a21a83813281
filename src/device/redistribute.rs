//! Device collectives that move slices between ranks: all_gather, gather,
//! reduce_scatter, all_to_all and all_to_all_4d. Non-leading dims are packed
//! and unpacked with the `Copy2d` plans the host plane uses too.

use super::collectives::{fits, nccl_dtype, nccl_op, offset, offset_mut};
use super::copy::run_copies;
use super::{DeviceGroup, DeviceTensor};
use crate::collectives::{check_all_to_all_4d, divisible, scaled};
use crate::dispatch::{dim_in_range, rank_in_range, Descriptor, Op};
use crate::error::Result;
use crate::layout_ops::{
    concat_dim_copies, is_contiguous_split, normalize_dim, split_dim_copies, Copy2d,
};
use crate::plane::nccl::comm::Communicator;
use crate::reduce::ReduceOp;
use crate::tensor::DType;
use std::os::raw::{c_int, c_void};

impl DeviceGroup<'_, '_> {
    /// Concatenation of every member's tensor along `dim`, in group-rank order.
    pub fn all_gather(&self, t: &DeviceTensor, dim: isize) -> Result<DeviceTensor> {
        let shape = normalize_dim(dim, t.ndim())
            .map(|d| scaled(t.shape(), d, self.group.size(), true))
            .unwrap_or_default();
        let mut out = self.gpu.empty(shape, t.dtype())?;
        self.all_gather_into(t, &mut out, dim)?;
        Ok(out)
    }

    /// [`all_gather`](Self::all_gather) into `out`.
    pub fn all_gather_into(
        &self,
        t: &DeviceTensor,
        out: &mut DeviceTensor,
        dim: isize,
    ) -> Result<()> {
        let size = self.group.size();
        let d = normalize_dim(dim, t.ndim());
        let want = d.map(|d| scaled(t.shape(), d, size, true));
        let ok = want.as_ref().is_some_and(|w| fits(out, t.dtype(), w));
        let desc = Descriptor::for_tensor(Op::AllGather, t.dtype(), t.shape(), &[dim as i64])
            .on_device()
            .with_bad_output(d.is_some() && !ok);
        self.group
            .collective(
                desc,
                |d| dim_in_range(d, d.params[0]).map(|_| ()),
                |_| {
                    let d = d.expect("checked by dispatch");
                    let comm = self.comm()?;
                    let s = self.gpu.stream();
                    let dt = nccl_dtype(t.dtype());
                    let src = t.read_ptr(s);
                    let gather = |dst: *mut c_void| {
                        // SAFETY: `dst` holds `size` blocks of `t`'s size.
                        unsafe { comm.all_gather(src, dst, t.numel(), dt, self.stream()) }
                            .map_err(|m| self.err(Op::AllGather, m))
                    };
                    if is_contiguous_split(t.shape(), d) {
                        return gather(out.write_ptr(s));
                    }
                    let mut blocks = self.gpu.empty([out.nbytes()], DType::U8)?;
                    let bp = blocks.write_ptr(s);
                    gather(bp)?;
                    let plan = concat_dim_copies(t.shape(), d, size, t.dtype().size());
                    run_copies(&plan, bp, out.write_ptr(s), s.cu_stream())
                },
            )
            .map_err(|e| match &want {
                Some(w) => self.explain(e, out, t.dtype(), w),
                None => e,
            })
    }

    /// Like [`all_gather`](Self::all_gather), the result only on group rank `dst`.
    pub fn gather(&self, t: &DeviceTensor, dst: usize, dim: isize) -> Result<Option<DeviceTensor>> {
        let desc =
            Descriptor::for_tensor(Op::Gather, t.dtype(), t.shape(), &[dst as i64, dim as i64])
                .on_device();
        let size = self.group.size();
        let me = self.group.rank_in_group();
        let check = |d: &Descriptor| {
            rank_in_range("dst", d.params[0], size)?;
            dim_in_range(d, d.params[1]).map(|_| ())
        };
        self.group.collective(desc, check, |_| {
            let d = normalize_dim(dim, t.ndim()).expect("checked by dispatch");
            let comm = self.comm()?;
            let s = self.gpu.stream();
            let dt = nccl_dtype(t.dtype());
            let src = t.read_ptr(s);
            if me != dst {
                comm.grouped("ncclSend", |api, raw| unsafe {
                    // SAFETY: `t` is alive until the stream runs the send.
                    (api.send)(src, t.numel(), dt, dst as c_int, raw, self.stream())
                })
                .map_err(|m| self.err(Op::Gather, m))?;
                return Ok(None);
            }
            let bytes = t.nbytes();
            let mut blocks = self.gpu.empty([bytes * size], DType::U8)?;
            let bp = blocks.write_ptr(s);
            comm.grouped("ncclRecv", |api, raw| {
                for r in (0..size).filter(|r| *r != me) {
                    // SAFETY: block `r` of `blocks` holds `t.numel()` elements.
                    let rc = unsafe {
                        (api.recv)(
                            offset_mut(bp, r * bytes),
                            t.numel(),
                            dt,
                            r as c_int,
                            raw,
                            self.stream(),
                        )
                    };
                    if rc != 0 {
                        return rc;
                    }
                }
                0
            })
            .map_err(|m| self.err(Op::Gather, m))?;
            let own = Copy2d::bytes(0, me * bytes, bytes);
            run_copies(&[own], src, bp, s.cu_stream())?;
            let mut out = self
                .gpu
                .empty(scaled(t.shape(), d, size, true), t.dtype())?;
            let plan = concat_dim_copies(t.shape(), d, size, t.dtype().size());
            run_copies(&plan, bp, out.write_ptr(s), s.cu_stream())?;
            Ok(Some(out))
        })
    }

    /// Reduces every member's tensor and leaves slice `r` along `dim` on group rank `r`.
    pub fn reduce_scatter(
        &self,
        t: &DeviceTensor,
        dim: isize,
        op: ReduceOp,
    ) -> Result<DeviceTensor> {
        let shape = normalize_dim(dim, t.ndim())
            .map(|d| scaled(t.shape(), d, self.group.size(), false))
            .unwrap_or_default();
        let mut out = self.gpu.empty(shape, t.dtype())?;
        self.reduce_scatter_into(t, &mut out, dim, op)?;
        Ok(out)
    }

    /// [`reduce_scatter`](Self::reduce_scatter) into `out`.
    pub fn reduce_scatter_into(
        &self,
        t: &DeviceTensor,
        out: &mut DeviceTensor,
        dim: isize,
        op: ReduceOp,
    ) -> Result<()> {
        let size = self.group.size();
        let d = normalize_dim(dim, t.ndim());
        let want = d.map(|d| scaled(t.shape(), d, size, false));
        let ok = want.as_ref().is_some_and(|w| fits(out, t.dtype(), w));
        let desc = Descriptor::for_tensor(
            Op::ReduceScatter,
            t.dtype(),
            t.shape(),
            &[dim as i64, op.code()],
        )
        .on_device()
        .with_bad_output(d.is_some() && !ok);
        let check = |d: &Descriptor| {
            let k = dim_in_range(d, d.params[0])?;
            divisible(d, k, size, "dim")
        };
        self.group
            .collective(desc, check, |_| {
                let d = d.expect("checked by dispatch");
                let comm = self.comm()?;
                let s = self.gpu.stream();
                let recv_count = out.numel();
                let scatter = |src: *const c_void, dst: *mut c_void| {
                    // SAFETY: `src` holds `size` slices of `out`'s size.
                    unsafe {
                        comm.reduce_scatter(
                            src,
                            dst,
                            recv_count,
                            nccl_dtype(t.dtype()),
                            nccl_op(op),
                            self.stream(),
                        )
                    }
                    .map_err(|m| self.err(Op::ReduceScatter, m))
                };
                let out_p = out.write_ptr(s);
                if is_contiguous_split(t.shape(), d) {
                    return scatter(t.read_ptr(s), out_p);
                }
                let mut packed = self.gpu.empty([t.nbytes()], DType::U8)?;
                let pp = packed.write_ptr(s);
                let plan = split_dim_copies(t.shape(), d, size, t.dtype().size());
                run_copies(&plan, t.read_ptr(s), pp, s.cu_stream())?;
                scatter(pp, out_p)
            })
            .map_err(|e| match &want {
                Some(w) => self.explain(e, out, t.dtype(), w),
                None => e,
            })
    }

    /// Block `r` of `src` to group rank `r`, block `r` of `dst` from rank `r`
    /// (`size` blocks of `block` bytes each; own block copied locally).
    fn exchange_blocks(
        &self,
        comm: &Communicator<'_>,
        op: Op,
        src: *const c_void,
        dst: *mut c_void,
        block: usize,
        dtype: DType,
    ) -> Result<()> {
        let size = self.group.size();
        let me = self.group.rank_in_group();
        let count = block / dtype.size();
        let dt = nccl_dtype(dtype);
        if size > 1 {
            comm.grouped("ncclSend/ncclRecv", |api, raw| {
                for r in (0..size).filter(|r| *r != me) {
                    // SAFETY: blocks `r` of both buffers hold `count` elements.
                    let rc = unsafe {
                        let a = (api.send)(
                            offset(src, r * block),
                            count,
                            dt,
                            r as c_int,
                            raw,
                            self.stream(),
                        );
                        if a != 0 {
                            a
                        } else {
                            (api.recv)(
                                offset_mut(dst, r * block),
                                count,
                                dt,
                                r as c_int,
                                raw,
                                self.stream(),
                            )
                        }
                    };
                    if rc != 0 {
                        return rc;
                    }
                }
                0
            })
            .map_err(|m| self.err(op, m))?;
        }
        let own = Copy2d::bytes(me * block, me * block, block);
        run_copies(&[own], src, dst, self.gpu.stream().cu_stream())
    }

    /// Equal blocks of dim 0 exchanged between all members (nccl-tests' `alltoall`).
    pub fn all_to_all(&self, t: &DeviceTensor) -> Result<DeviceTensor> {
        let mut out = self.gpu.empty(t.shape().to_vec(), t.dtype())?;
        self.all_to_all_into(t, &mut out)?;
        Ok(out)
    }

    /// [`all_to_all`](Self::all_to_all) into `out` (same shape and dtype as `t`).
    pub fn all_to_all_into(&self, t: &DeviceTensor, out: &mut DeviceTensor) -> Result<()> {
        let size = self.group.size();
        let ok = fits(out, t.dtype(), t.shape());
        let desc = Descriptor::for_tensor(Op::AllToAll, t.dtype(), t.shape(), &[])
            .on_device()
            .with_bad_output(!ok);
        let check = |d: &Descriptor| {
            if d.ndim() == 0 {
                return Err("expects a tensor with at least one dimension".into());
            }
            divisible(d, 0, size, "dim")
        };
        self.group
            .collective(desc, check, |_| {
                let comm = self.comm()?;
                let s = self.gpu.stream();
                let block = t.nbytes() / size;
                self.exchange_blocks(
                    &comm,
                    Op::AllToAll,
                    t.read_ptr(s),
                    out.write_ptr(s),
                    block,
                    t.dtype(),
                )
            })
            .map_err(|e| self.explain(e, out, t.dtype(), t.shape()))
    }

    /// FastVideo's `all_to_all_4D` on device (see the host
    /// [`all_to_all_4d`](crate::GroupCoordinator::all_to_all_4d)): pack with strided
    /// 2-D copies, exchange with grouped send/recv, unpack with 2-D copies.
    pub fn all_to_all_4d(
        &self,
        t: &DeviceTensor,
        scatter_dim: usize,
        gather_dim: usize,
    ) -> Result<DeviceTensor> {
        let desc = Descriptor::for_tensor(
            Op::AllToAll4d,
            t.dtype(),
            t.shape(),
            &[scatter_dim as i64, gather_dim as i64],
        )
        .on_device();
        let size = self.group.size();
        self.group.collective(
            desc,
            |d| check_all_to_all_4d(d, size),
            |_| {
                let comm = self.comm()?;
                let s = self.gpu.stream();
                let elem = t.dtype().size();
                let mut packed = self.gpu.empty([t.nbytes()], DType::U8)?;
                let pp = packed.write_ptr(s);
                let plan = split_dim_copies(t.shape(), scatter_dim, size, elem);
                run_copies(&plan, t.read_ptr(s), pp, s.cu_stream())?;
                let mut received = self.gpu.empty([t.nbytes()], DType::U8)?;
                let rp = received.write_ptr(s);
                self.exchange_blocks(&comm, Op::AllToAll4d, pp, rp, t.nbytes() / size, t.dtype())?;
                let block_shape = scaled(t.shape(), scatter_dim, size, false);
                let mut out = self
                    .gpu
                    .empty(scaled(&block_shape, gather_dim, size, true), t.dtype())?;
                let plan = concat_dim_copies(&block_shape, gather_dim, size, elem);
                run_copies(&plan, rp, out.write_ptr(s), s.cu_stream())?;
                Ok(out)
            },
        )
    }
}
