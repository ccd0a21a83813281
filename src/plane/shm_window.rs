//! An MPI shared-memory window (`MPI_Win_allocate_shared`) over a node-local
//! communicator: each rank owns one slot, every rank can read every slot.
//!
//! MPI owns the segment, so it disappears with the job even when a rank is
//! killed: nothing is named in `/dev/shm` by rankmesh (ModelOpt's fixed
//! `SharedMemory` names collide between jobs and leak on a crash).

use mpi::ffi;
use mpi::topology::SimpleCommunicator;
use mpi::traits::*;
use std::os::raw::{c_int, c_void};

/// A window with `slot` bytes per rank of `comm` (all ranks on one node).
pub struct SharedWindow<'c> {
    win: ffi::MPI_Win,
    comm: &'c SimpleCommunicator,
    slot: usize,
}

impl<'c> SharedWindow<'c> {
    /// Collective over `comm`: allocates `slot` bytes for every rank.
    pub fn allocate(comm: &'c SimpleCommunicator, slot: usize) -> Self {
        let mut base: *mut c_void = std::ptr::null_mut();
        // SAFETY: zero-initialised handle is written by MPI before use.
        let mut win: ffi::MPI_Win = unsafe { std::mem::zeroed() };
        // SAFETY: out-pointers are valid; errors abort (MPI_ERRORS_ARE_FATAL).
        unsafe {
            ffi::MPI_Win_allocate_shared(
                slot.max(1) as ffi::MPI_Aint,
                1,
                ffi::RSMPI_INFO_NULL,
                comm.as_raw(),
                &mut base as *mut *mut c_void as *mut c_void,
                &mut win,
            );
        }
        SharedWindow { win, comm, slot }
    }

    fn slot_ptr(&self, rank: usize) -> *mut u8 {
        let mut size: ffi::MPI_Aint = 0;
        let mut disp: c_int = 0;
        let mut base: *mut c_void = std::ptr::null_mut();
        // SAFETY: `rank` is a rank of the window's communicator.
        unsafe {
            ffi::MPI_Win_shared_query(
                self.win,
                rank as c_int,
                &mut size,
                &mut disp,
                &mut base as *mut *mut c_void as *mut c_void,
            );
        }
        base as *mut u8
    }

    /// Writes this rank's slot.
    pub fn write_own(&mut self, bytes: &[u8]) {
        assert_eq!(bytes.len(), self.slot, "slot size is fixed at allocation");
        let dst = self.slot_ptr(self.comm.rank() as usize);
        // SAFETY: the slot has `slot` bytes and only this rank writes it.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), dst, bytes.len()) };
    }

    /// Collective: completes every rank's writes before anyone reads.
    pub fn fence(&self) {
        // SAFETY: valid window; fence is collective over its communicator.
        unsafe { ffi::MPI_Win_fence(0, self.win) };
    }

    /// Copies rank `rank`'s slot (call after [`fence`](Self::fence)).
    pub fn read(&self, rank: usize) -> Vec<u8> {
        let src = self.slot_ptr(rank);
        let mut out = vec![0u8; self.slot];
        // SAFETY: the slot has `slot` bytes; writers finished before the fence.
        unsafe { std::ptr::copy_nonoverlapping(src, out.as_mut_ptr(), self.slot) };
        out
    }
}

impl Drop for SharedWindow<'_> {
    /// Collective over the communicator, like every step of the window.
    fn drop(&mut self) {
        // SAFETY: the window is valid and freed once.
        unsafe { ffi::MPI_Win_free(&mut self.win) };
    }
}
