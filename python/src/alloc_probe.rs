//! The extension's allocator: the system's, with the largest allocation
//! each thread made since it last asked. It backs the package's claim that
//! an in-place collective allocates nothing of its tensor's size, which
//! Python's `tracemalloc` cannot see (the library allocates on the Rust
//! heap). The cost is one thread-local compare per allocation.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

struct Probe;

thread_local! {
    static LARGEST: Cell<usize> = const { Cell::new(0) };
}

fn note(size: usize) {
    // `try_with`: a thread being torn down still allocates.
    let _ = LARGEST.try_with(|l| {
        if size > l.get() {
            l.set(size);
        }
    });
}

// SAFETY: every method forwards to `System` unchanged; `note` allocates
// nothing.
unsafe impl GlobalAlloc for Probe {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note(layout.size());
        // SAFETY: the caller's layout (and block) handed on unchanged.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        note(layout.size());
        // SAFETY: the caller's layout (and block) handed on unchanged.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note(new_size);
        // SAFETY: the caller's layout (and block) handed on unchanged.
        unsafe { System.realloc(ptr, layout, new_size) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: the caller's layout (and block) handed on unchanged.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static PROBE: Probe = Probe;

/// The largest allocation (bytes) this thread made on the Rust heap since
/// the last call, which starts the count again.
pub fn largest_since_last() -> usize {
    LARGEST.with(|l| l.replace(0))
}
