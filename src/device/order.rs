//! One order for all of rankmesh's device work, whatever streams it runs on.
//!
//! NCCL kernels of different communicators on concurrent streams can
//! deadlock when ranks enqueue them in different orders (a documented NCCL
//! hazard). rankmesh therefore keeps its work in one chain: the *tail* is
//! the stream of the latest enqueue, and a call on another stream first
//! makes that stream wait for the tail (one event), then becomes the tail.
//! So rankmesh's calls run in the order the program issued them, on one
//! stream or many; switching costs one event record and one wait, staying
//! on a stream costs nothing.
//!
//! Frees follow the same chain: a rankmesh-owned tensor is freed on the
//! stream it was allocated on, so before the free that stream waits for the
//! tail when they differ (the tensor may have been used on the tail since).

use cudarc::driver::{CudaStream, DriverError};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// The stream carrying rankmesh's latest device work (see the module docs).
pub(crate) struct Tail {
    stream: Mutex<Arc<CudaStream>>,
    /// Its handle, read without the lock on every call (the common case:
    /// the same stream again).
    handle: AtomicUsize,
}

impl Tail {
    pub(crate) fn new(stream: Arc<CudaStream>) -> Arc<Tail> {
        Arc::new(Tail {
            handle: AtomicUsize::new(stream.cu_stream() as usize),
            stream: Mutex::new(stream),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Arc<CudaStream>> {
        self.stream.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Puts `stream` at the end of the chain: it waits for the tail's work
    /// when it is another stream. Call before enqueuing anything on `stream`.
    pub(crate) fn order_on(&self, stream: &Arc<CudaStream>) -> Result<(), DriverError> {
        if self.handle.load(Ordering::Acquire) == stream.cu_stream() as usize {
            return Ok(());
        }
        let mut tail = self.lock();
        if tail.cu_stream() != stream.cu_stream() {
            stream.join(&tail)?;
            *tail = stream.clone();
            self.handle
                .store(stream.cu_stream() as usize, Ordering::Release);
        }
        Ok(())
    }

    /// The stream to wait on for all of rankmesh's work so far.
    pub(crate) fn stream(&self) -> Arc<CudaStream> {
        self.lock().clone()
    }

    /// Orders a free enqueued on `stream` after the tail's work. A failure
    /// is recorded in the context (cudarc's way for errors in `Drop`).
    pub(crate) fn before_free(&self, stream: &Arc<CudaStream>) {
        if self.handle.load(Ordering::Acquire) == stream.cu_stream() as usize {
            return;
        }
        let tail = self.lock();
        if tail.cu_stream() != stream.cu_stream() {
            stream.context().record_err(stream.join(&tail));
        }
    }
}
