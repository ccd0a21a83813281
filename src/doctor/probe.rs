//! Pairwise probes on raw MPI, every wait bounded: a peer that does not
//! answer within the deadline is named and the job is aborted with a
//! message, never left hanging. The doctor measures MPI itself, so it
//! bypasses rankmesh's group layer (no agreement step in the timings).

use mpi::request::{scope, Request};
use mpi::topology::SimpleCommunicator;
use mpi::traits::*;
use std::time::{Duration, Instant};

/// Tag of the doctor's messages, apart from rankmesh's own.
const TAG: i32 = 0x0d0c;

/// Exit code of a doctor run aborted because a peer did not answer.
pub const UNREACHABLE_EXIT: i32 = 3;

/// Deadline-watched point-to-point and barrier steps on one communicator.
pub struct Probe<'c> {
    comm: &'c SimpleCommunicator,
    deadline: Duration,
}

impl<'c> Probe<'c> {
    /// Probes on `comm`; every wait gives up after `deadline`.
    pub fn new(comm: &'c SimpleCommunicator, deadline: Duration) -> Self {
        Probe { comm, deadline }
    }

    fn give_up(&self, msg: &str) -> ! {
        let line = format!(
            "rankmesh doctor: rank {}: {msg} within {:.1} s; aborting the job\n",
            self.comm.rank(),
            self.deadline.as_secs_f64()
        );
        let _ = std::io::Write::write_all(&mut std::io::stderr(), line.as_bytes());
        self.comm.abort(UNREACHABLE_EXIT)
    }

    /// Polls `req` until it completes or the deadline counted from `start`
    /// passes (then names `what` and aborts); `pause` runs between polls.
    fn finish<'a, D: ?Sized, S: mpi::request::Scope<'a>>(
        &self,
        mut req: Request<'a, D, S>,
        start: Instant,
        what: &dyn Fn() -> String,
        pause: &dyn Fn(),
    ) {
        loop {
            match req.test() {
                Ok(_) => return,
                Err(r) => req = r,
            }
            if start.elapsed() > self.deadline {
                self.give_up(&what());
            }
            pause();
        }
    }

    /// Sends `send` to `peer` while receiving `recv` from it; returns the
    /// seconds it took.
    pub fn exchange(&self, peer: usize, send: &[u8], recv: &mut [u8], step: &str) -> f64 {
        let start = Instant::now();
        let what = || format!("{step}: no answer from rank {peer}");
        scope(|sc| {
            let p = self.comm.process_at_rank(peer as i32);
            let r = p.immediate_receive_into_with_tag(sc, recv, TAG);
            let s = p.immediate_send_with_tag(sc, send, TAG);
            self.finish(s, start, &what, &std::thread::yield_now);
            self.finish(r, start, &what, &std::thread::yield_now);
        });
        start.elapsed().as_secs_f64()
    }

    /// The fastest of `reps` exchanges of `bytes` with `peer`, in seconds,
    /// after as many untimed ones (TCP grows its windows over the first
    /// transfers of a connection). The best of several is what the link can
    /// do; noise on a shared machine only ever slows a sample down.
    pub fn best_exchange(&self, peer: usize, bytes: usize, reps: usize, step: &str) -> f64 {
        let send = vec![0x5au8; bytes];
        let mut recv = vec![0u8; bytes];
        for _ in 0..reps {
            self.exchange(peer, &send, &mut recv, step);
        }
        (0..reps)
            .map(|_| self.exchange(peer, &send, &mut recv, step))
            .fold(f64::INFINITY, f64::min)
    }

    /// A barrier of the whole communicator, bounded by the deadline.
    pub fn barrier(&self, step: &str) {
        let start = Instant::now();
        let what = || format!("{step}: not every rank reached the step");
        // Ranks idle in this round leave the cores to the measuring pairs:
        // naps from 50 us, doubling to 1 ms, so a long wait costs them little.
        let nap = || {
            let waited = start.elapsed().as_micros() as u64;
            let us = waited.next_power_of_two().clamp(50, 1000);
            std::thread::sleep(Duration::from_micros(us));
        };
        self.finish(self.comm.immediate_barrier(), start, &what, &nap);
    }
}

/// A round-robin schedule of `n` participants (the circle method): in each
/// round every participant has at most one partner, so pairs measured at
/// once do not share an endpoint, and every pair meets exactly once.
pub fn rounds(n: usize) -> Vec<Vec<(usize, usize)>> {
    if n < 2 {
        return Vec::new();
    }
    let m = n + n % 2; // an odd count gets a "bye" seat
    let mut seats: Vec<usize> = (0..m).collect();
    let mut out = Vec::with_capacity(m - 1);
    for _ in 0..m - 1 {
        let round = (0..m / 2)
            .map(|i| (seats[i], seats[m - 1 - i]))
            .filter(|&(a, b)| a < n && b < n)
            .map(|(a, b)| (a.min(b), a.max(b)))
            .collect();
        out.push(round);
        seats[1..].rotate_right(1);
    }
    out
}

/// `me`'s partner in `round`, if it has one.
pub fn partner(round: &[(usize, usize)], me: usize) -> Option<usize> {
    round.iter().find_map(|&(a, b)| {
        if a == me {
            Some(b)
        } else if b == me {
            Some(a)
        } else {
            None
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    #[test]
    fn every_pair_meets_once_and_no_one_twice_a_round() {
        for n in 0..9 {
            let mut seen = BTreeSet::new();
            for round in rounds(n) {
                let mut busy = BTreeSet::new();
                for &(a, b) in &round {
                    assert!(a < b && b < n);
                    assert!(busy.insert(a) && busy.insert(b), "n={n}: {round:?}");
                    assert!(seen.insert((a, b)), "n={n}: ({a},{b}) twice");
                }
            }
            assert_eq!(seen.len(), n * n.saturating_sub(1) / 2, "n={n}");
        }
        assert_eq!(partner(&[(0, 3), (1, 2)], 2), Some(1));
        assert_eq!(partner(&[(0, 3)], 1), None);
    }
}
