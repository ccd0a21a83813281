//! A stateless group's links inside one MPI job: a sub-communicator of the
//! listed world ranks, frames handed to `MPI_Isend` as owned buffers.

use super::{Header, Links, TAG_OBJECT};
use crate::error::Result;
use crate::exec::mpi::isend_bytes;
use crate::group::GroupCoordinator;
use crate::op::Op;
use mpi::ffi;
use mpi::traits::*;
use std::cell::RefCell;
use std::collections::VecDeque;
use std::os::raw::c_int;

/// A sent frame MPI may still be reading.
struct Pending {
    _header: Box<Header>,
    payload: Vec<u8>,
    requests: Vec<ffi::MPI_Request>,
}

impl Pending {
    fn done(&mut self) -> bool {
        let mut flag: c_int = 0;
        // SAFETY: live or null requests; their buffers are owned by `self`.
        unsafe {
            ffi::MPI_Testall(
                self.requests.len() as c_int,
                self.requests.as_mut_ptr(),
                &mut flag,
                ffi::RSMPI_STATUSES_IGNORE,
            )
        };
        flag != 0
    }

    fn wait(&mut self) {
        // SAFETY: as in `done`.
        unsafe {
            ffi::MPI_Waitall(
                self.requests.len() as c_int,
                self.requests.as_mut_ptr(),
                ffi::RSMPI_STATUSES_IGNORE,
            )
        };
    }
}

pub(super) struct MpiLinks<'rt> {
    pub(super) group: GroupCoordinator<'rt>,
    outbox: RefCell<VecDeque<Pending>>,
}

impl<'rt> MpiLinks<'rt> {
    pub(super) fn new(group: GroupCoordinator<'rt>) -> Self {
        MpiLinks {
            group,
            outbox: RefCell::new(VecDeque::new()),
        }
    }

    /// Forgets sends MPI has finished with.
    fn reap(&self) {
        self.outbox.borrow_mut().retain_mut(|p| !p.done());
    }
}

impl Links for MpiLinks<'_> {
    fn name(&self) -> &str {
        self.group.name()
    }

    fn rank(&self) -> usize {
        self.group.rank_in_group()
    }

    fn size(&self) -> usize {
        self.group.size()
    }

    fn max_object_bytes(&self) -> u64 {
        self.group.runtime().options().max_object_bytes
    }

    fn watch<R>(&self, op: Op, f: impl FnOnce() -> Result<R>) -> Result<R> {
        let call = self.group.watched(op);
        call.run(op, self.group.name(), f)
    }

    fn post(&self, header: Header, payload: Vec<u8>, dsts: &[usize], limit: usize) -> Result<()> {
        self.reap();
        let held = |o: &VecDeque<Pending>| o.iter().map(|p| p.payload.len()).sum::<usize>();
        if held(&self.outbox.borrow()) + payload.len() > limit {
            let call = self.group.watched(Op::SendObject);
            while held(&self.outbox.borrow()) + payload.len() > limit {
                let Some(mut oldest) = self.outbox.borrow_mut().pop_front() else {
                    break;
                };
                oldest.wait();
            }
            drop(call);
        }
        let header = Box::new(header);
        let piece = self.group.mpi().max_piece();
        let comm = self.group.raw_comm().as_raw();
        let mut requests = Vec::new();
        for dst in dsts {
            let header_bytes: &[u8] = bytemuck::cast_slice(&header[..]);
            for buf in std::iter::once(header_bytes).chain(payload.chunks(piece)) {
                // SAFETY: `header` and `payload` move into the outbox with the
                // request and stay there (heap buffers do not move) until
                // MPI reports it complete.
                requests.push(unsafe { isend_bytes(comm, buf, *dst, TAG_OBJECT) });
            }
        }
        self.outbox.borrow_mut().push_back(Pending {
            _header: header,
            payload,
            requests,
        });
        Ok(())
    }

    fn read_header(&self, _op: Op, src: usize) -> Result<Header> {
        self.reap();
        let mut header = [0u64; 4];
        self.group
            .mpi()
            .recv_header(bytemuck::cast_slice_mut(&mut header[..]), src, TAG_OBJECT);
        Ok(header)
    }

    fn read_payload(&self, op: Op, src: usize, buf: &mut [u8]) -> Result<()> {
        self.group
            .mpi()
            .recv_tagged(buf, src, TAG_OBJECT)
            .map_err(|f| f.into_error(op, self.group.name()))
    }

    fn flush(&self) -> Result<()> {
        let call = self.group.watched(Op::SendObject);
        while let Some(mut oldest) = self.outbox.borrow_mut().pop_front() {
            oldest.wait();
        }
        call.finish(Ok(()))
    }
}
