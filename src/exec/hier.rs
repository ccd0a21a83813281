//! The node-aware host executor, for groups whose members span nodes with
//! at least two of them on one node: shared memory within each node and
//! MPI across nodes, every local rank carrying its share of the network
//! traffic.
//!
//! The members of a node, in group-rank order, share a window (the
//! [shared-memory executor](super::shm) on a communicator of their own).
//! Across nodes run *rails*: rail `i` holds local index `i` of every node,
//! ordered by node, for `i` below the smallest node's member count (so on
//! nodes of equal size every member is on one rail). The rails move, for
//! the ops that pay:
//! - **all-reduce**: a reduce-scatter within the node into one slice per
//!   rail, each rail all-reduces its slice across nodes, an all-gather
//!   within the node;
//! - **reduce-scatter** (equal nodes): a reduce-scatter within the node
//!   that leaves local rank `i` the node's sums of the blocks of rail `i`'s
//!   members, then the rail's reduce-scatter;
//! - **all-gather** (equal nodes): the rail's all-gather, then one within
//!   the node, straight into the group's order;
//! - **broadcast**: the root's node shares the buffer, each rail carries
//!   its slice to the other nodes, which all-gather it.
//!
//! Nodes of unequal size run reduce-scatter and all-gather through one
//! leader per node (each node's lowest group rank), as reduce and barrier
//! always do. Gathers, scatters and all-to-all move data between particular
//! pairs of ranks, where staging only adds copies: they run on MPI over the
//! whole group, and so does every op below its crossover
//! (`route` decides, from a crossover per op) unless
//! `RANKMESH_HOST_PLANE=hier` forces the stages.
//!
//! Reductions combine each node's values first, then the nodes' results:
//! narrow floats (f16, bf16, fp8) are rounded once per stage, as NCCL's
//! hierarchical algorithms round at every hop, and `Avg` sums through both
//! stages and divides once at the end.

use super::blocks::{Gathered, Spans};
use super::combine::{combine, divide};
use super::moves::HostMoves;
use super::mpi::{MpiExec, Swap};
use super::shm::{ShmCall, ShmExec};
use crate::dtype::DType;
use crate::error::Fault;
use crate::op::ReduceOp;
use crate::tensor::Tensor;
use crate::ulfm::Kept;
use crate::watch::Pulse;
use mpi::topology::{Color, Communicator, SimpleCommunicator};
use std::cell::{RefCell, RefMut};
use std::ops::Range;

/// How a group spanning nodes runs its host ops, for the debug log.
pub(crate) fn describe(map: &NodeMap, forced: bool) -> String {
    let sizes: Vec<String> = map.members.iter().map(|m| m.len().to_string()).collect();
    let when = super::route::describe_staged(forced);
    format!(
        "node-aware across {} nodes of {} ranks: {when}",
        sizes.len(),
        sizes.join("+")
    )
}

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

    /// Rails: the fewest members a node has.
    fn rails(&self) -> usize {
        self.members.iter().map(Vec::len).min().unwrap_or(1)
    }

    /// Whether every node has as many members.
    fn even(&self) -> bool {
        self.members
            .iter()
            .all(|m| m.len() == self.members[0].len())
    }

    /// On equal nodes: by local index `i`, then node `k`, the group rank of
    /// node `k`'s member `i` (the blocks rail `i` carries, in rail order).
    fn by_rail(&self) -> Vec<usize> {
        let per = self.members[0].len();
        (0..per)
            .flat_map(|i| self.members.iter().map(move |m| m[i]))
            .collect()
    }
}

/// A group's hierarchy, made at its first host collective (collective).
pub(crate) struct Hier {
    map: NodeMap,
    me: usize,
    /// The window of this rank's node; `None` when it is alone there.
    local: Option<ShmExec>,
    /// The node's members, for MPI among them (the window's fallback).
    /// It and the two below are revocable (`ulfm::revoke_all`).
    node: Kept,
    /// The leaders' communicator, on leaders only.
    leaders: Option<Kept>,
    /// This rank's rail, on ranks whose local index is below the rails.
    rail: Option<Kept>,
    /// [`NodeMap::by_rail`] on equal nodes; empty otherwise.
    by_rail: Vec<usize>,
    max_message_bytes: usize,
    /// Slice-sized tensors and bytes the stages reuse across calls.
    scratch: [RefCell<Option<Tensor>>; 3],
    scratch_bytes: RefCell<Vec<u8>>,
}

impl Hier {
    /// Splits `comm` (the group's, this rank being group rank `me`) by
    /// node, into rails and into leaders; `local_plane` makes the node's
    /// shared-memory executor from the node's communicator.
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
        let rail_color = if local_index < map.rails() {
            Color::with_value(local_index as i32)
        } else {
            Color::undefined()
        };
        // Keyed by node, so a rail's rank is its member's node index.
        let rail = comm.split_by_color_with_key(rail_color, node as i32);
        let local = (map.members[node].len() > 1).then(|| local_plane(&node_comm, local_index));
        let by_rail = if map.even() {
            map.by_rail()
        } else {
            Vec::new()
        };
        Hier {
            map,
            me,
            local,
            leaders: leaders.map(Kept::revocable),
            rail: rail.map(Kept::revocable),
            by_rail,
            node: Kept::revocable(node_comm),
            max_message_bytes,
            scratch: Default::default(),
            scratch_bytes: RefCell::new(Vec::new()),
        }
    }

    /// The node this rank is on, and its index there.
    fn here(&self) -> (usize, usize) {
        (self.map.node_of[self.me], self.map.local_index(self.me))
    }

    /// Scratch tensor `k` holding `elems` elements of `dtype` (reused while
    /// they stay the same; its contents are whatever the last call left).
    fn scratch(&self, k: usize, elems: usize, dtype: DType) -> Result<RefMut<'_, Tensor>, Fault> {
        let mut slot = self.scratch[k].borrow_mut();
        if !slot
            .as_ref()
            .is_some_and(|t| t.dtype() == dtype && t.numel() == elems)
        {
            *slot = Some(Tensor::zeros([elems], dtype)?);
        }
        Ok(RefMut::map(slot, |t| t.as_mut().expect("set above")))
    }

    /// Scratch bytes, `len` of them.
    fn scratch_bytes(&self, len: usize) -> RefMut<'_, [u8]> {
        let mut v = self.scratch_bytes.borrow_mut();
        if v.len() < len {
            v.resize(len, 0);
        }
        RefMut::map(v, |v| &mut v[..len])
    }

    /// By local index on this rank's node: the bytes of an `elems`-element
    /// buffer its rail carries (one slice per rail; none past the rails).
    fn slices(&self, elems: usize, elem: usize) -> Vec<Range<usize>> {
        let rails = self.map.rails();
        let on_node = self.map.members[self.here().0].len();
        let end = elems * elem;
        (0..on_node)
            .map(|i| match i < rails {
                true => (i * elems / rails) * elem..((i + 1) * elems / rails) * elem,
                false => end..end,
            })
            .collect()
    }
}

/// One host call on a [`Hier`]: its stages, and MPI over the whole group
/// for the moves that stay flat.
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
        let flat = MpiExec::new(&self.hier.node, self.hier.max_message_bytes, self.pulse);
        self.hier.local.as_ref().map(|plane| ShmCall {
            plane,
            flat,
            pulse: self.pulse,
        })
    }

    fn leaders(&self) -> Option<MpiExec<'_>> {
        let comm = self.hier.leaders.as_ref()?;
        (comm.size() > 1).then(|| MpiExec::new(comm, self.hier.max_message_bytes, self.pulse))
    }

    fn rail(&self) -> Option<MpiExec<'_>> {
        let comm = self.hier.rail.as_ref()?;
        Some(MpiExec::new(comm, self.hier.max_message_bytes, self.pulse))
    }

    /// Broadcasts `buf` from local index `root` across this rank's node.
    fn local_broadcast(&self, buf: &mut [u8], root: usize) -> Result<(), Fault> {
        match self.local() {
            Some(node) => node.broadcast(buf, root),
            None => Ok(()),
        }
    }

    /// Every local rank's `slices[i]` of `out`, from its `mine`.
    fn local_all_gather(
        &self,
        mine: &[u8],
        slices: &[Range<usize>],
        out: &mut [u8],
    ) -> Result<(), Fault> {
        match self.local() {
            Some(node) => node.all_gather_blocks(mine, Spans(slices), out),
            // Alone on its node: its one slice.
            None => {
                out[slices[0].clone()].copy_from_slice(mine);
                Ok(())
            }
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

    /// reduce-scatter through rails (equal nodes): local rank `i` reduces
    /// the node's share of rail `i`'s members' blocks, the rail
    /// reduce-scatters them across nodes.
    fn reduce_scatter_on_rails(
        &self,
        packed: &Tensor,
        out: &mut Tensor,
        op: ReduceOp,
    ) -> Result<(), Fault> {
        let (b, dtype) = (out.nbytes(), out.dtype());
        let nodes = self.hier.map.members.len();
        let blocks = Gathered {
            sub: b,
            per: nodes,
            order: &self.hier.by_rail,
        };
        let mut share = self.hier.scratch(0, nodes * out.numel(), dtype)?;
        match self.local() {
            Some(node) => {
                node.reduce_scatter_blocks(packed.bytes(), blocks, share.bytes_mut(), dtype, op)?
            }
            // A node of one on equal nodes: every node has one member.
            None => share.bytes_mut().copy_from_slice(packed.bytes()),
        }
        let rail = self
            .rail()
            .expect("on equal nodes every member is on a rail");
        if nodes != 2 {
            rail.reduce_scatter_block_into(&share, out, op)?;
            return Ok(());
        }
        // Two nodes: swap the other node's block for this one's, combine.
        let node = self.hier.here().0;
        let mut theirs = self.hier.scratch_bytes(b);
        let (mine, other) = (node * b..(node + 1) * b, (1 - node) * b..(2 - node) * b);
        rail.swap(1 - node, &share.bytes()[other], &mut theirs)?;
        let both = |q: usize| match q == node {
            true => &share.bytes()[mine.clone()],
            false => &theirs[..],
        };
        combine(dtype, op, 2, both, out.bytes_mut());
        Ok(())
    }

    /// reduce-scatter through the leaders (unequal nodes): the node's sum on
    /// its leader; the leaders' reduce-scatter, node k getting its members'
    /// blocks; each leader's scatter over its node's window.
    fn reduce_scatter_by_leaders(
        &self,
        packed: &Tensor,
        out: &mut Tensor,
        op: ReduceOp,
    ) -> Result<(), Fault> {
        let b = out.nbytes();
        let (dtype, elems) = (packed.dtype(), out.numel());
        let (node, local) = self.hier.here();
        let members = &self.hier.map.members;
        let mut acc = self.hier.scratch(0, packed.numel(), dtype)?;
        self.reduce_to_leader(packed, &mut acc, op)?;
        // On the leader: every node's part, `most` blocks, its members'
        // first (nodes may differ in size; the padding's reduction is read
        // by no one), then the leaders' reduce-scatter leaves this node's.
        let most = members.iter().map(Vec::len).max().unwrap_or(1);
        let mut part = None;
        if local == 0 {
            let mut ordered = self.hier.scratch(2, members.len() * most * elems, dtype)?;
            for (k, ranks) in members.iter().enumerate() {
                for (j, r) in ranks.iter().enumerate() {
                    let at = (k * most + j) * b;
                    ordered.bytes_mut()[at..at + b]
                        .copy_from_slice(&acc.bytes()[r * b..(r + 1) * b]);
                }
            }
            let leaders = self.leaders().expect("unequal nodes: two or more");
            let mut mine = self.hier.scratch(1, most * elems, dtype)?;
            leaders.reduce_scatter_block_into(&ordered, &mut mine, op)?;
            part = Some(mine);
        }
        let share = part.as_ref().map(|t| &t.bytes()[..members[node].len() * b]);
        match (self.local(), share) {
            (Some(n), share) => n.scatter(share, out.bytes_mut(), 0),
            // A node of one: this rank is its leader.
            (None, Some(share)) => {
                out.bytes_mut().copy_from_slice(share);
                Ok(())
            }
            (None, None) => unreachable!("a rank alone on its node leads it"),
        }
    }

    /// all-gather through rails (equal nodes): the rail's all-gather of
    /// this rank's block, then the node's, each rank's share landing where
    /// its rail's members' blocks go.
    fn all_gather_on_rails(&self, block: &[u8], out: &mut [u8]) -> Result<(), Fault> {
        let b = block.len();
        let nodes = self.hier.map.members.len();
        let mut share = self.hier.scratch_bytes(nodes * b);
        let rail = self
            .rail()
            .expect("on equal nodes every member is on a rail");
        if nodes == 2 {
            // Two nodes: one swap of blocks.
            let node = self.hier.here().0;
            let (first, second) = share.split_at_mut(b);
            let (mine, theirs) = match node {
                0 => (first, second),
                _ => (second, first),
            };
            mine.copy_from_slice(block);
            rail.swap(1 - node, block, theirs)?;
        } else {
            rail.all_gather_into(block, &mut share)?;
        }
        let blocks = Gathered {
            sub: b,
            per: nodes,
            order: &self.hier.by_rail,
        };
        match self.local() {
            Some(node) => node.all_gather_blocks(&share, blocks, out),
            None => {
                out.copy_from_slice(&share);
                Ok(())
            }
        }
    }

    /// all-gather through the leaders (unequal nodes).
    fn all_gather_by_leaders(&self, block: &[u8], out: &mut [u8]) -> Result<(), Fault> {
        let b = block.len();
        let (node, local) = self.hier.here();
        let mine = match self.local() {
            Some(n) => {
                let size = self.hier.map.members[node].len();
                let mut mine = (local == 0).then(|| vec![0u8; b * size]);
                n.gather_into(block, mine.as_deref_mut(), 0)?;
                mine
            }
            None => Some(block.to_vec()),
        };
        if local == 0 {
            let mine = mine.expect("the node's leader gathers");
            let members = &self.hier.map.members;
            let leaders = self.leaders().expect("unequal nodes: two or more");
            let lens: Vec<usize> = members.iter().map(|m| m.len() * b).collect();
            let blobs = leaders
                .gather_varcount(&mine, &lens, None)?
                .expect("an all-gather gives every rank");
            for (blob, ranks) in blobs.iter().zip(members) {
                for (j, r) in ranks.iter().enumerate() {
                    out[r * b..(r + 1) * b].copy_from_slice(&blob[j * b..(j + 1) * b]);
                }
            }
        }
        self.local_broadcast(out, 0)
    }
}

/// Rounds a pipelined all-reduce cuts each rail's slice into (fewer when
/// a round's part would fall under [`ROUND_MIN`] bytes; docs/BENCHMARKS.md,
/// "Tuned constants").
const ROUNDS: usize = 8;
/// Smallest part of a slice one round moves.
const ROUND_MIN: usize = 128 << 10;

/// The rounds of a pipelined all-reduce over `slices` (by local index):
/// round k holds part k of every slice, whole cache lines (so whole
/// elements) but the last.
fn rounds(slices: &[Range<usize>]) -> Vec<Vec<Range<usize>>> {
    let longest = slices.iter().map(Range::len).max().unwrap_or(0);
    let part = (longest / ROUNDS).max(ROUND_MIN).next_multiple_of(64);
    let count = longest.div_ceil(part).max(1);
    (0..count)
        .map(|k| {
            slices
                .iter()
                .map(|s| {
                    let at = (s.start + k * part).min(s.end);
                    at..(at + part).min(s.end)
                })
                .collect()
        })
        .collect()
}

/// What the stages combine with: `Avg` sums, and divides once at the end.
fn staged(op: ReduceOp) -> ReduceOp {
    match op {
        ReduceOp::Avg => ReduceOp::Sum,
        op => op,
    }
}

impl HostMoves for HierCall<'_> {
    fn flat(&self) -> MpiExec<'_> {
        self.flat
    }

    fn barrier(&self) -> Result<(), Fault> {
        if let Some(node) = self.local() {
            node.barrier()?;
        }
        if let Some(leaders) = self.leaders() {
            leaders.barrier()?;
        }
        match self.local() {
            Some(node) => node.barrier(),
            None => Ok(()),
        }
    }

    fn all_reduce_into(&self, input: &Tensor, out: &mut Tensor, op: ReduceOp) -> Result<(), Fault> {
        let dtype = input.dtype();
        let slices = self.hier.slices(input.numel(), dtype.size());
        let (node, local) = self.hier.here();
        let elems = slices[local].len() / dtype.size();
        let mut summed = self.hier.scratch(0, elems, dtype)?;
        let mut reduced = self.hier.scratch(1, elems, dtype)?;
        let rounds = rounds(&slices);
        let node_sum = |spans: &[Range<usize>], summed: &mut [u8]| match self.local() {
            Some(node) => {
                node.reduce_scatter_blocks(input.bytes(), Spans(spans), summed, dtype, staged(op))
            }
            None => {
                summed.copy_from_slice(&input.bytes()[spans[0].clone()]);
                Ok(())
            }
        };
        // This rank's part of round k: its slice's bytes `mine[k]`.
        let mine: Vec<Range<usize>> = rounds
            .iter()
            .map(|spans| {
                let at = spans[local].start - slices[local].start;
                at..at + spans[local].len()
            })
            .collect();
        let finish = |reduced: &mut [u8]| {
            if op == ReduceOp::Avg {
                divide(dtype, reduced, self.members());
            }
        };
        match self.rail() {
            // Two nodes: the rounds overlap, each part sent to the other
            // node as soon as it is summed and gathered as soon as the
            // other node's arrives.
            Some(rail) if self.hier.map.members.len() == 2 => {
                let mut theirs = self.hier.scratch_bytes(summed.nbytes());
                // SAFETY: `theirs` is read only after each part's arrival;
                // `summed`'s parts are not written again once sent; both
                // outlive the swap.
                let mut swap = unsafe { Swap::post(&rail, 1 - node, &mut theirs, &mine) };
                for (spans, part) in rounds.iter().zip(&mine) {
                    node_sum(spans, &mut summed.bytes_mut()[part.clone()])?;
                    // SAFETY: see above.
                    unsafe { swap.send(&summed.bytes()[part.clone()]) };
                }
                for (k, (spans, part)) in rounds.iter().zip(&mine).enumerate() {
                    swap.received(k)?;
                    let both = |q: usize| match q == node {
                        true => &summed.bytes()[part.clone()],
                        false => &theirs[part.clone()],
                    };
                    let reduced = &mut reduced.bytes_mut()[part.clone()];
                    combine(dtype, staged(op), 2, both, reduced);
                    finish(reduced);
                    self.local_all_gather(reduced, spans, out.bytes_mut())?;
                    swap.progress();
                }
                swap.finish();
            }
            // More nodes: the node's sums, the rails' all-reduces, the
            // node's all-gather, one after another.
            Some(rail) => {
                node_sum(&slices, summed.bytes_mut())?;
                rail.all_reduce_into(&summed, &mut reduced, staged(op))?;
                finish(reduced.bytes_mut());
                self.local_all_gather(reduced.bytes(), &slices, out.bytes_mut())?;
            }
            // Off the rails (a node larger than the smallest): no part.
            None => {
                for spans in &rounds {
                    node_sum(spans, &mut [])?;
                }
                for spans in &rounds {
                    self.local_all_gather(&[], spans, out.bytes_mut())?;
                }
            }
        }
        Ok(())
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
        let (elems, dtype) = (input.numel(), input.dtype());
        let mut acc = self.hier.scratch(0, elems, dtype)?;
        self.reduce_to_leader(input, &mut acc, staged(op))?;
        let mut result = self.hier.scratch(1, elems, dtype)?;
        if local == 0 {
            match self.leaders() {
                Some(leaders) => {
                    leaders.reduce_into_root(&acc, &mut result, root_node, staged(op))?
                }
                None => result.bytes_mut().copy_from_slice(acc.bytes()),
            }
            if node == root_node && op == ReduceOp::Avg {
                divide(dtype, result.bytes_mut(), self.members());
            }
        }
        if node == root_node {
            // The node's leader holds the result; a root that is not the
            // leader gets it over the node's window.
            let root_local = self.hier.map.local_index(root);
            if root_local != 0 {
                self.local_broadcast(result.bytes_mut(), 0)?;
            }
            if self.hier.me == root {
                out.bytes_mut().copy_from_slice(result.bytes());
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
        match self.hier.by_rail.is_empty() {
            false => self.reduce_scatter_on_rails(packed, out, staged(op))?,
            true => self.reduce_scatter_by_leaders(packed, out, staged(op))?,
        }
        if op == ReduceOp::Avg {
            divide(out.dtype(), out.bytes_mut(), self.members());
        }
        Ok(())
    }

    fn all_gather_into(&self, block: &[u8], out: &mut [u8]) -> Result<(), Fault> {
        match self.hier.by_rail.is_empty() {
            false => self.all_gather_on_rails(block, out),
            true => self.all_gather_by_leaders(block, out),
        }
    }

    fn broadcast(&self, buf: &mut [u8], root: usize) -> Result<(), Fault> {
        let (node, local) = self.hier.here();
        let root_node = self.hier.map.node_of[root];
        // The root's node shares the whole buffer; each rail carries its
        // slice from there; every other node all-gathers the slices.
        if node == root_node {
            self.local_broadcast(buf, self.hier.map.local_index(root))?;
        }
        let slices = self.hier.slices(buf.len(), 1);
        if let Some(rail) = self.rail() {
            rail.broadcast(&mut buf[slices[local].clone()], root_node)?;
        }
        if node != root_node {
            let mut mine = self.hier.scratch_bytes(slices[local].len());
            mine.copy_from_slice(&buf[slices[local].clone()]);
            self.local_all_gather(&mine, &slices, buf)?;
        }
        Ok(())
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

    #[test]
    fn rails_follow_the_smallest_node() {
        // Nodes of 2 and 3 members: two rails; a node of one: one rail.
        let map = NodeMap::new(&[5, 5, 6, 6, 6]);
        assert_eq!((map.rails(), map.even()), (2, false));
        assert_eq!(NodeMap::new(&[1, 2, 2]).rails(), 1);
        // Equal nodes, members alternating: rail 0 carries ranks 0 and 1,
        // rail 1 ranks 2 and 3.
        let map = NodeMap::new(&[7, 8, 7, 8]);
        assert!(map.even());
        assert_eq!(map.by_rail(), [0, 1, 2, 3]);
        let map = NodeMap::new(&[7, 7, 8, 8]);
        assert_eq!(map.by_rail(), [0, 2, 1, 3]);
    }
}
