//! The hierarchical host executor, for groups whose members span nodes
//! with at least two of them on one node: shared memory within each node,
//! MPI among one leader per node, shared memory back out — so only one rank
//! per node crosses the network, once per call.
//!
//! The members of a node, in group-rank order, share a window (the
//! [shared-memory executor](super::shm) on a communicator of their own);
//! the leaders (each node's lowest group rank, ordered by it, so a leader's
//! rank among them is its node's index) share an MPI communicator.
//! all-reduce, reduce, reduce-scatter, broadcast, all-gather and barrier
//! run in those three stages (a reduce-scatter's leaders exchange node
//! shares: each node's members' blocks). Gathers, scatters and all-to-all
//! move data between particular pairs of ranks, where staging through
//! leaders only adds copies: they run on MPI over the whole group.
//!
//! Reductions combine each node's values first, then the nodes' results:
//! narrow floats (f16, bf16, fp8) are rounded once per stage, as NCCL's
//! hierarchical algorithms round at every hop, and `Avg` sums through both
//! stages and divides once at the end.

use super::combine::divide;
use super::executor::HostMoves;
use super::mpi::{BlockLayout, MpiExec};
use super::shm::{ShmCall, ShmExec};
use crate::error::Fault;
use crate::op::ReduceOp;
use crate::tensor::Tensor;
use crate::watch::Pulse;
use mpi::topology::{Color, Communicator, SimpleCommunicator};

/// Where each member of a group lives, by node.
pub(crate) struct NodeMap {
    /// By group rank: the node's index (nodes numbered by their lowest
    /// group rank).
    node_of: Vec<usize>,
    /// By node: its members' group ranks, ascending.
    members: Vec<Vec<usize>>,
}

impl NodeMap {
    /// From each member's node id (any numbering), by group rank.
    pub(crate) fn new(node_ids: &[usize]) -> NodeMap {
        let mut ids: Vec<usize> = Vec::new();
        let mut members: Vec<Vec<usize>> = Vec::new();
        let node_of = node_ids
            .iter()
            .enumerate()
            .map(|(r, id)| {
                let k = ids.iter().position(|x| x == id).unwrap_or_else(|| {
                    ids.push(*id);
                    members.push(Vec::new());
                    ids.len() - 1
                });
                members[k].push(r);
                k
            })
            .collect();
        NodeMap { node_of, members }
    }

    /// Whether the hierarchy has anything to share: more than one node, and
    /// a node with more than one member.
    pub(crate) fn worth_it(&self) -> bool {
        self.members.len() > 1 && self.members.iter().any(|m| m.len() > 1)
    }

    fn local_index(&self, r: usize) -> usize {
        let node = &self.members[self.node_of[r]];
        node.iter()
            .position(|m| *m == r)
            .expect("a member of its node")
    }
}

/// A group's hierarchy, made at its first host collective (collective).
pub(crate) struct Hier {
    map: NodeMap,
    me: usize,
    /// The window of this rank's node; `None` when it is alone there.
    local: Option<ShmExec>,
    /// The leaders' communicator, on leaders only.
    leaders: Option<SimpleCommunicator>,
    max_message_bytes: usize,
}

impl Hier {
    /// Splits `comm` (the group's, this rank being group rank `me`) by
    /// node and into leaders; `local_plane` makes the node's shared-memory
    /// executor from the node's communicator.
    pub(crate) fn new(
        comm: &SimpleCommunicator,
        map: NodeMap,
        me: usize,
        max_message_bytes: usize,
        local_plane: impl FnOnce(&SimpleCommunicator, usize) -> ShmExec,
    ) -> Hier {
        let node = map.node_of[me];
        let local_index = map.local_index(me);
        let node_comm = comm
            .split_by_color_with_key(Color::with_value(node as i32), me as i32)
            .expect("every member has a node");
        let leader_color = if local_index == 0 {
            Color::with_value(0)
        } else {
            Color::undefined()
        };
        let leaders = comm.split_by_color_with_key(leader_color, me as i32);
        let local = (map.members[node].len() > 1).then(|| local_plane(&node_comm, local_index));
        Hier {
            map,
            me,
            local,
            leaders,
            max_message_bytes,
        }
    }

    /// The node this rank is on, and its index there.
    fn here(&self) -> (usize, usize) {
        (self.map.node_of[self.me], self.map.local_index(self.me))
    }
}

/// One host call on a [`Hier`]: its three stages, and MPI over the whole
/// group for the moves that stay flat.
pub(crate) struct HierCall<'a> {
    pub(crate) hier: &'a Hier,
    /// MPI over the group's communicator.
    pub(crate) flat: MpiExec<'a>,
    pub(crate) pulse: Pulse<'a>,
}

impl HierCall<'_> {
    /// The group's size.
    fn members(&self) -> usize {
        self.hier.map.node_of.len()
    }

    fn local(&self) -> Option<ShmCall<'_>> {
        self.hier.local.as_ref().map(|plane| ShmCall {
            plane,
            pulse: self.pulse,
        })
    }

    fn leaders(&self) -> Option<MpiExec<'_>> {
        let comm = self.hier.leaders.as_ref()?;
        (comm.size() > 1).then(|| MpiExec::new(comm, self.hier.max_message_bytes, self.pulse))
    }

    /// Broadcasts `buf` from local index `root` across this rank's node.
    fn local_broadcast(&self, buf: &mut [u8], root: usize) -> Result<(), Fault> {
        match self.local() {
            Some(node) => node.broadcast(buf, root),
            None => Ok(()),
        }
    }

    /// The reduction of `input` over every member, on this node's leader
    /// (other members' `acc` is left as it was); `op` is `Sum` for `Avg`.
    fn reduce_to_leader(
        &self,
        input: &Tensor,
        acc: &mut Tensor,
        op: ReduceOp,
    ) -> Result<(), Fault> {
        match self.local() {
            Some(node) => node.reduce_into_root(input, acc, 0, op),
            None => {
                acc.bytes_mut().copy_from_slice(input.bytes());
                Ok(())
            }
        }
    }
}

/// What the stages combine with: `Avg` sums, and divides once at the end.
fn staged(op: ReduceOp) -> ReduceOp {
    match op {
        ReduceOp::Avg => ReduceOp::Sum,
        op => op,
    }
}

impl HostMoves for HierCall<'_> {
    fn barrier(&self) -> Result<(), Fault> {
        if let Some(node) = self.local() {
            node.barrier()?;
        }
        if let Some(leaders) = self.leaders() {
            leaders.barrier();
        }
        match self.local() {
            Some(node) => node.barrier(),
            None => Ok(()),
        }
    }

    fn all_reduce_into(&self, input: &Tensor, out: &mut Tensor, op: ReduceOp) -> Result<(), Fault> {
        self.reduce_to_leader(input, out, staged(op))?;
        // Every leader is in a leaders' communicator of two or more nodes.
        if let Some(leaders) = self.leaders() {
            let node_sum = out.clone();
            leaders.all_reduce_into(&node_sum, out, staged(op));
            if op == ReduceOp::Avg {
                divide(out.dtype(), out.bytes_mut(), self.members());
            }
        }
        self.local_broadcast(out.bytes_mut(), 0)
    }

    fn reduce_into_root(
        &self,
        input: &Tensor,
        out: &mut Tensor,
        root: usize,
        op: ReduceOp,
    ) -> Result<(), Fault> {
        let (node, local) = self.hier.here();
        let root_node = self.hier.map.node_of[root];
        let mut acc = input.clone();
        self.reduce_to_leader(input, &mut acc, staged(op))?;
        if local == 0 {
            if let Some(leaders) = self.leaders() {
                let node_sum = acc.clone();
                leaders.reduce_into_root(&node_sum, &mut acc, root_node, staged(op));
            }
            if node == root_node && op == ReduceOp::Avg {
                divide(acc.dtype(), acc.bytes_mut(), self.members());
            }
        }
        if node == root_node {
            // The node's leader holds the result; a root that is not the
            // leader gets it over the node's window.
            let root_local = self.hier.map.local_index(root);
            if root_local != 0 {
                self.local_broadcast(acc.bytes_mut(), 0)?;
            }
            if self.hier.me == root {
                out.bytes_mut().copy_from_slice(acc.bytes());
            }
        }
        Ok(())
    }

    fn reduce_scatter_block_into(
        &self,
        packed: &Tensor,
        out: &mut Tensor,
        op: ReduceOp,
    ) -> Result<(), Fault> {
        // The node's sum on its leader; the leaders' reduce-scatter, node k
        // getting its members' blocks; each leader's scatter over its
        // node's window. Only the node shares cross the network.
        let b = out.nbytes();
        let (node, local) = self.hier.here();
        let members = &self.hier.map.members;
        let mut acc = packed.clone();
        self.reduce_to_leader(packed, &mut acc, staged(op))?;
        // On the leader: every node's part, `most` blocks, its members'
        // first (nodes may differ in size; the padding's reduction is read
        // by no one), then the leaders' reduce-scatter leaves this node's.
        let mut part = None;
        if local == 0 {
            let most = members.iter().map(Vec::len).max().unwrap_or(1);
            let elems = b / packed.dtype().size();
            let mut ordered = Tensor::zeros([members.len() * most * elems], packed.dtype())?;
            for (k, ranks) in members.iter().enumerate() {
                for (j, r) in ranks.iter().enumerate() {
                    let at = (k * most + j) * b;
                    ordered.bytes_mut()[at..at + b]
                        .copy_from_slice(&acc.bytes()[r * b..(r + 1) * b]);
                }
            }
            part = Some(match self.leaders() {
                Some(leaders) => {
                    let mut mine = Tensor::zeros([most * elems], packed.dtype())?;
                    leaders.reduce_scatter_block_into(&ordered, &mut mine, staged(op));
                    mine
                }
                // One node: its part is every block.
                None => ordered,
            });
        }
        let share = part.as_ref().map(|t| &t.bytes()[..members[node].len() * b]);
        match (self.local(), share) {
            (Some(n), share) => n.scatter(share, out.bytes_mut(), 0)?,
            // A node of one: this rank is its leader.
            (None, Some(share)) => out.bytes_mut().copy_from_slice(share),
            (None, None) => unreachable!("a rank alone on its node leads it"),
        }
        if op == ReduceOp::Avg {
            divide(out.dtype(), out.bytes_mut(), self.members());
        }
        Ok(())
    }

    fn all_gather_into(&self, block: &[u8], out: &mut [u8]) -> Result<(), Fault> {
        let b = block.len();
        let local = self.hier.here().1;
        let mine = match self.local() {
            Some(n) => n.gather(block, 0)?,
            None => Some(block.to_vec()),
        };
        if local == 0 {
            let mine = mine.expect("the node's leader gathers");
            let members = &self.hier.map.members;
            let blobs = match self.leaders() {
                Some(leaders) => {
                    let lens: Vec<usize> = members.iter().map(|m| m.len() * b).collect();
                    leaders.all_gather_varcount(&mine, &lens)
                }
                None => vec![mine],
            };
            for (blob, ranks) in blobs.iter().zip(members) {
                for (j, r) in ranks.iter().enumerate() {
                    out[r * b..(r + 1) * b].copy_from_slice(&blob[j * b..(j + 1) * b]);
                }
            }
        }
        self.local_broadcast(out, 0)
    }

    fn gather(&self, block: &[u8], root: usize) -> Result<Option<Vec<u8>>, Fault> {
        HostMoves::gather(&self.flat, block, root)
    }

    fn gather_varcount(
        &self,
        mine: &[u8],
        lens: &[usize],
        root: Option<usize>,
    ) -> Result<Option<Vec<Vec<u8>>>, Fault> {
        HostMoves::gather_varcount(&self.flat, mine, lens, root)
    }

    fn scatter(&self, send: Option<&[u8]>, recv: &mut [u8], root: usize) -> Result<(), Fault> {
        HostMoves::scatter(&self.flat, send, recv, root)
    }

    fn broadcast(&self, buf: &mut [u8], root: usize) -> Result<(), Fault> {
        let (node, _) = self.hier.here();
        let root_node = self.hier.map.node_of[root];
        let root_local = self.hier.map.local_index(root);
        // The root's node first, when the root is not its leader; then the
        // leaders; then every node whose members do not have it yet.
        if node == root_node && root_local != 0 {
            self.local_broadcast(buf, root_local)?;
        }
        if let Some(leaders) = self.leaders() {
            leaders.broadcast(buf, root_node);
        }
        if node != root_node || root_local == 0 {
            self.local_broadcast(buf, 0)?;
        }
        Ok(())
    }

    fn all_to_all_into(&self, send: &[u8], out: &mut [u8]) -> Result<(), Fault> {
        HostMoves::all_to_all_into(&self.flat, send, out)
    }

    fn all_gather_v_into(&self, mine: &[u8], lens: &[usize], out: &mut [u8]) -> Result<(), Fault> {
        HostMoves::all_gather_v_into(&self.flat, mine, lens, out)
    }

    fn all_to_all_strided(
        &self,
        send: &[u8],
        send_layout: BlockLayout,
        out: &mut [u8],
        recv_layout: BlockLayout,
    ) -> Result<bool, Fault> {
        HostMoves::all_to_all_strided(&self.flat, send, send_layout, out, recv_layout)
    }
}

#[cfg(test)]
mod tests {
    use super::NodeMap;

    #[test]
    fn nodes_are_numbered_by_their_lowest_member() {
        // Members on nodes 7, 3, 7, 3, 9 (a group not laid out node by node).
        let map = NodeMap::new(&[7, 3, 7, 3, 9]);
        assert_eq!(map.node_of, [0, 1, 0, 1, 2]);
        assert_eq!(map.members, [vec![0, 2], vec![1, 3], vec![4]]);
        assert_eq!(map.local_index(3), 1);
        assert!(map.worth_it());
        assert!(!NodeMap::new(&[1, 2, 3]).worth_it());
        assert!(!NodeMap::new(&[1, 1, 1]).worth_it());
    }
}
