//! Which host executor runs a call: the one decision, from the op, the bytes
//! it moves and the planes its group has. MPI runs every op on any group;
//! the shared-memory window within a node and the node-aware stages across
//! nodes are fast paths that an op opts into here, where they pay.

use crate::op::Op;

/// The executor a host call runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Route {
    /// MPI on the group's communicator: every op.
    Mpi,
    /// The group's shared-memory window (a group on one node).
    Shm,
    /// Shared memory within nodes, MPI among them (a group spanning nodes).
    Hier,
}

/// The fast paths a group has, fixed when it is made (the same on every
/// member).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Planes {
    /// A shared-memory window: the members share one node.
    pub(crate) shm: bool,
    /// Node-aware stages: the members span nodes, two or more on some.
    pub(crate) hier: bool,
    /// `RANKMESH_HOST_PLANE=hier`: every op with stages runs them at every size.
    pub(crate) forced_hier: bool,
}

/// Ops the shared-memory window runs, at every size. The window carries
/// their agreement in its first data phase (see `GroupCoordinator`'s
/// `agree_on_shm`), so an op listed here must be one `ShmCall` implements.
const ON_SHM: u64 = mask(&[
    Op::Barrier,
    Op::AllReduce,
    Op::Reduce,
    Op::ReduceScatter,
    Op::AllGather,
    Op::Gather,
    Op::Scatter,
    Op::Broadcast,
    Op::AllToAll,
    Op::AllToAll4d,
    Op::AllToAllV,
    Op::AllGatherV,
    Op::BroadcastObject,
    Op::AllGatherObject,
    Op::GatherObject,
]);

/// Ops the node-aware stages run, from a crossover each (bytes as the bench
/// counts them: the buffer, an all-gather's output, a reduce-scatter's
/// input). Below it, and for every other op, the group's flat MPI is faster
/// (measured in docs/BENCHMARKS.md's fake-node tables).
const STAGED_FROM: [(Op, usize); 4] = [
    (Op::AllReduce, 256 << 10),
    (Op::ReduceScatter, 64 << 10),
    (Op::AllGather, 32 << 10),
    (Op::Reduce, 1 << 20),
];

/// Ops the stages can run (`RANKMESH_HOST_PLANE=hier` runs them at every size).
const HAS_STAGES: u64 = mask(&[
    Op::AllReduce,
    Op::ReduceScatter,
    Op::AllGather,
    Op::Reduce,
    Op::Broadcast,
    Op::Barrier,
]);

const fn mask(ops: &[Op]) -> u64 {
    let mut m = 0;
    let mut i = 0;
    while i < ops.len() {
        m |= bit(ops[i]);
        i += 1;
    }
    m
}

#[inline(always)]
const fn bit(op: Op) -> u64 {
    1 << (op as u64 & 63)
}

/// The executor that runs `op` moving `bytes` on a group with `planes`.
#[inline(always)]
pub(crate) fn route(op: Op, bytes: usize, planes: Planes) -> Route {
    if planes.shm && bit(op) & ON_SHM != 0 {
        return Route::Shm;
    }
    if planes.hier && runs_staged(op, bytes, planes.forced_hier) {
        return Route::Hier;
    }
    Route::Mpi
}

/// Whether `op`'s agreement rides on its first data phase: it runs on the
/// shared-memory window whatever its size.
#[inline(always)]
pub(crate) fn fuses_agreement(op: Op, planes: Planes) -> bool {
    // The window's ops run on it at every size: the bytes do not matter.
    route(op, 0, planes) == Route::Shm
}

fn runs_staged(op: Op, bytes: usize, forced: bool) -> bool {
    match forced {
        true => bit(op) & HAS_STAGES != 0,
        false => STAGED_FROM
            .iter()
            .any(|(o, from)| *o == op && bytes >= *from),
    }
}

/// How a group spanning nodes runs its host ops, for the debug log.
pub(crate) fn describe_staged(forced: bool) -> String {
    match forced {
        true => "every op that has stages in stages (RANKMESH_HOST_PLANE=hier)".to_string(),
        false => {
            let from: Vec<String> = STAGED_FROM
                .iter()
                .map(|(op, from)| format!("{} from {from} B", op.name()))
                .collect();
            format!("{} in stages, the rest flat on MPI", from.join(", "))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ONE_NODE: Planes = Planes {
        shm: true,
        hier: false,
        forced_hier: false,
    };
    const NODES: Planes = Planes {
        shm: false,
        hier: true,
        forced_hier: false,
    };

    #[test]
    fn every_op_fits_the_masks() {
        // Codes run from 1; the masks hold 64.
        assert!(Op::AllGatherV as u64 <= 63);
    }

    #[test]
    fn ops_without_a_fast_path_run_on_mpi_on_any_group() {
        for planes in [ONE_NODE, NODES] {
            for op in [Op::Send, Op::SendRecv, Op::BatchSendRecv, Op::SendObject] {
                assert_eq!(route(op, 1 << 30, planes), Route::Mpi, "{op:?}");
                assert!(!fuses_agreement(op, planes));
            }
        }
    }

    #[test]
    fn one_node_runs_its_ops_on_the_window_at_every_size() {
        for bytes in [0, 8, 1 << 30] {
            assert_eq!(route(Op::AllReduce, bytes, ONE_NODE), Route::Shm);
            assert_eq!(route(Op::AllToAllV, bytes, ONE_NODE), Route::Shm);
        }
        assert!(fuses_agreement(Op::AllReduce, ONE_NODE));
    }

    #[test]
    fn nodes_run_stages_from_each_crossover() {
        assert_eq!(route(Op::AllReduce, (256 << 10) - 1, NODES), Route::Mpi);
        assert_eq!(route(Op::AllReduce, 256 << 10, NODES), Route::Hier);
        assert_eq!(route(Op::AllGather, 32 << 10, NODES), Route::Hier);
        assert_eq!(route(Op::Broadcast, 1 << 30, NODES), Route::Mpi);
        assert_eq!(route(Op::AllToAll, 1 << 30, NODES), Route::Mpi);
        let forced = Planes {
            forced_hier: true,
            ..NODES
        };
        assert_eq!(route(Op::Broadcast, 8, forced), Route::Hier);
        assert_eq!(route(Op::Barrier, 0, forced), Route::Hier);
        assert_eq!(route(Op::AllToAll, 1 << 30, forced), Route::Mpi);
        assert!(!fuses_agreement(Op::AllReduce, NODES));
    }
}
