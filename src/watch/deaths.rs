//! The moment a process of the node ends, for a job that survives a lost
//! rank (ULFM). A thread waits on every other local rank's process
//! (`pidfd_open`, `poll`) and rings this rank's bell when one ends, so the
//! watchdog looks at once. A rank that leaves rankmesh rings the node's
//! bells itself; a killed one cannot, and the survivors' recovery would
//! wait for the next tick. A process that ended without leaving rankmesh
//! is noted lost at once (`ulfm::note_lost`): a rank waiting outside any
//! call (a device plane's deferred agreements, settled at a download) has
//! no watchdog to tell it.

use super::board::{BoardView, State};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::Arc;
use std::thread::JoinHandle;

/// The thread, stopped and joined on drop.
pub(super) struct Deaths {
    wake: OwnedFd,
    thread: Option<JoinHandle<()>>,
}

impl Deaths {
    /// Watches the processes of the node's other ranks (as `board` lists
    /// them); `None` where the kernel has no pidfds (Linux before 5.3):
    /// the watchdog's tick finds them then.
    pub(super) fn start(board: Arc<BoardView>) -> Option<Deaths> {
        let me = std::process::id();
        let pids: Vec<(u32, OwnedFd)> = board
            .read_all()
            .iter()
            .filter(|st| st.pid != me && st.pid != 0)
            .filter_map(|st| Some((st.pid, pidfd(st.pid)?)))
            .collect();
        // SAFETY: a plain eventfd, owned from here.
        let wake = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
        if wake < 0 {
            return None;
        }
        // SAFETY: a fresh descriptor nothing else owns.
        let wake = unsafe { OwnedFd::from_raw_fd(wake) };
        let stop = wake.as_raw_fd();
        let thread = std::thread::Builder::new()
            .name("rankmesh-deaths".into())
            .spawn(move || wait_for_deaths(&board, pids, stop))
            .ok()?;
        Some(Deaths {
            wake,
            thread: Some(thread),
        })
    }
}

impl Drop for Deaths {
    fn drop(&mut self) {
        let one: u64 = 1;
        // SAFETY: an 8-byte write to our eventfd.
        unsafe { libc::write(self.wake.as_raw_fd(), (&one as *const u64).cast(), 8) };
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A pidfd of `pid`, if the kernel gives one (the process may be gone).
fn pidfd(pid: u32) -> Option<OwnedFd> {
    // SAFETY: pidfd_open(pid, 0) returns a new descriptor or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) };
    // SAFETY: a fresh descriptor nothing else owns.
    (fd >= 0).then(|| unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// Rings this rank's bell each time one of `pids` (pid, pidfd) ends, and
/// notes its rank lost unless its runtime finished or left first, until
/// `stop` is readable.
fn wait_for_deaths(board: &BoardView, mut pids: Vec<(u32, OwnedFd)>, stop: i32) {
    loop {
        let mut fds: Vec<libc::pollfd> = std::iter::once(stop)
            .chain(pids.iter().map(|(_, fd)| fd.as_raw_fd()))
            .map(|fd| libc::pollfd {
                fd,
                events: libc::POLLIN,
                revents: 0,
            })
            .collect();
        // SAFETY: `fds` is a valid array of its length.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, -1) };
        if n < 0 {
            if std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return;
        }
        if fds[0].revents != 0 {
            return;
        }
        let ended: Vec<bool> = fds[1..].iter().map(|p| p.revents != 0).collect();
        if ended.iter().any(|&e| e) {
            let gone: Vec<u32> = (0..pids.len())
                .filter(|&i| ended[i])
                .map(|i| pids[i].0)
                .collect();
            let lost = board.read_all().into_iter().filter(|st| {
                gone.contains(&st.pid) && !matches!(st.state, State::Finished | State::Left)
            });
            crate::ulfm::note_lost(lost.map(|st| st.rank));
            let mut i = 0;
            pids.retain(|_| {
                i += 1;
                !ended[i - 1]
            });
            board.ring_own();
        }
    }
}
