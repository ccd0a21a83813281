//! What rsmpi lacks, over `mpi::ffi`. It adds shared-memory windows
//! (`MPI_Win_allocate_shared`) over a node-local communicator, where each
//! rank owns one slot and every rank can read every slot, and MPI's null
//! request.
//!
//! MPI owns the segment, so it disappears with the job even when a rank is
//! killed: nothing is named in `/dev/shm` by rankmesh (ModelOpt's fixed
//! `SharedMemory` names collide between jobs and leak on a crash).

use mpi::ffi;
use mpi::topology::SimpleCommunicator;
use mpi::traits::*;
use std::os::raw::{c_int, c_void};

/// Collective over `comm` (ranks of one node): allocates a shared window
/// with `bytes` per rank and returns it with every rank's slot, aligned up
/// to `align` (a power of two) in this process. MPI promises no alignment
/// (Open MPI puts a header before the first segment), so each rank gets
/// `align - 1` bytes of room; mappings are page-aligned in every process, so
/// the same offset into the segment is chosen everywhere for `align` up to
/// a page. Errors abort (`MPI_ERRORS_ARE_FATAL`).
pub(crate) fn allocate_shared(
    comm: &SimpleCommunicator,
    bytes: usize,
    align: usize,
) -> (ffi::MPI_Win, Vec<*mut u8>) {
    let mut base: *mut c_void = std::ptr::null_mut();
    // SAFETY: a zeroed handle is written by MPI before use.
    let mut win: ffi::MPI_Win = unsafe { std::mem::zeroed() };
    // SAFETY: out-pointers are valid; every member of `comm` calls this at
    // the same point.
    unsafe {
        ffi::MPI_Win_allocate_shared(
            (bytes.max(1) + align - 1) as ffi::MPI_Aint,
            1,
            ffi::RSMPI_INFO_NULL,
            comm.as_raw(),
            &mut base as *mut *mut c_void as *mut c_void,
            &mut win,
        );
    }
    let slots = (0..comm.size())
        .map(|r| {
            let (mut size, mut disp): (ffi::MPI_Aint, c_int) = (0, 0);
            let mut p: *mut c_void = std::ptr::null_mut();
            // SAFETY: `r` is a rank of the window's communicator.
            unsafe {
                ffi::MPI_Win_shared_query(
                    win,
                    r,
                    &mut size,
                    &mut disp,
                    &mut p as *mut *mut c_void as *mut c_void,
                )
            };
            let p = p as *mut u8;
            // SAFETY: fewer than `align` bytes in, inside the room allocated.
            unsafe { p.add(p.align_offset(align)) }
        })
        .collect();
    (win, slots)
}

/// A window with `slot` bytes per rank of `comm` (all ranks on one node).
pub struct SlotWindow<'c> {
    win: ffi::MPI_Win,
    comm: &'c SimpleCommunicator,
    slots: Vec<*mut u8>,
    slot: usize,
}

impl<'c> SlotWindow<'c> {
    /// Collective over `comm`: allocates `slot` bytes for every rank.
    pub fn allocate(comm: &'c SimpleCommunicator, slot: usize) -> Self {
        let (win, slots) = allocate_shared(comm, slot, 1);
        SlotWindow {
            win,
            comm,
            slots,
            slot,
        }
    }

    /// Writes this rank's slot.
    pub fn write_own(&mut self, bytes: &[u8]) {
        assert_eq!(bytes.len(), self.slot, "slot size is fixed at allocation");
        let dst = self.slots[self.comm.rank() as usize];
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
        let src = self.slots[rank];
        let mut out = vec![0u8; self.slot];
        // SAFETY: the slot has `slot` bytes; writers finished before the fence.
        unsafe { std::ptr::copy_nonoverlapping(src, out.as_mut_ptr(), self.slot) };
        out
    }
}

impl Drop for SlotWindow<'_> {
    /// Collective over the communicator, like every step of the window.
    fn drop(&mut self) {
        // As for a group's window: not after a call was given up.
        if crate::wait::give_up::gave_up() {
            return;
        }
        // SAFETY: the window is valid and freed once.
        unsafe { ffi::MPI_Win_free(&mut self.win) };
    }
}

/// MPI's null request (what a completed request becomes).
pub(crate) fn null_request() -> ffi::MPI_Request {
    // SAFETY: reading an MPI constant handle.
    unsafe { ffi::RSMPI_REQUEST_NULL }
}

/// Whether the MPI library yields the CPU inside its own blocking calls:
/// Open MPI's `mpi_yield_when_idle` control variable (which its launcher
/// turns on for an oversubscribed node), read through the MPI tool
/// interface after `MPI_Init`. `false` where the library has no such
/// variable: MPICH and Intel MPI poll without yielding.
pub(crate) fn yields_when_idle() -> bool {
    let mut provided: c_int = 0;
    // SAFETY: the tool interface may be initialised any number of times
    // (each matched by the finalize below); every out-pointer is valid, and
    // the value buffer is larger than any scalar the variable may have.
    unsafe {
        if ffi::MPI_T_init_thread(ffi::RSMPI_THREAD_SINGLE, &mut provided) != 0 {
            return false;
        }
        let mut index: c_int = 0;
        let mut value = [0u64; 2];
        let name = c"mpi_yield_when_idle";
        if ffi::MPI_T_cvar_get_index(name.as_ptr(), &mut index) == 0 {
            let mut handle = std::mem::zeroed();
            let mut count: c_int = 0;
            if ffi::MPI_T_cvar_handle_alloc(index, std::ptr::null_mut(), &mut handle, &mut count)
                == 0
            {
                if count == 1 {
                    ffi::MPI_T_cvar_read(handle, value.as_mut_ptr().cast());
                }
                ffi::MPI_T_cvar_handle_free(&mut handle);
            }
        }
        ffi::MPI_T_finalize();
        value[0] != 0
    }
}
