//! Named meshes: any parallel layout of the world as named dimensions, each
//! with a size and a stride (a rank is the sum of its coordinates times the
//! strides). One type reproduces the layouts the frameworks build:
//!
//! - torch's `init_device_mesh(shape, names)`: row-major, the last
//!   dimension fastest ([`MeshLayout::row_major`]);
//! - Megatron's `RankGenerator` order strings such as `"tp-cp-ep-dp-pp"`,
//!   the first name fastest ([`MeshLayout::ordered`]), and its two
//!   decompositions of one world, dense and expert ([`MeshLayout::megatron`]);
//! - vLLM's `arange(W).reshape(-1, dp, pp, tp)` ([`MeshLayout::vllm`]).
//!
//! A group of one dimension, or of several flattened (torch's `_flatten`,
//! Megatron's `"tp-dp"` tokens, vLLM's EP = DP×TP), holds the ranks that share
//! every other coordinate, in ascending order: the order all three produce.
//! [`Mesh`] makes the groups' communicators, one `MPI_Comm_split` per
//! dimension set. FastVideo's TP/SP/DP layout stays in
//! [`ParallelState`](crate::ParallelState).

use crate::error::{Error, Result};
use crate::group::{GroupCoordinator, Runtime};
use std::cell::RefCell;
use std::collections::BTreeSet;

/// One named dimension: its size and the rank distance between neighbours.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Dim {
    name: String,
    size: usize,
    stride: usize,
}

/// A layout of `world` ranks as named dimensions (pure: no MPI).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MeshLayout {
    world: usize,
    dims: Vec<Dim>,
}

fn bad(msg: String) -> Error {
    Error::Layout(format!("mesh: {msg}"))
}

/// `pp=2 × dp=2 × tp=2`.
fn product_text(dims: &[(&str, usize)]) -> String {
    dims.iter()
        .map(|(n, s)| format!("{n}={s}"))
        .collect::<Vec<_>>()
        .join(" × ")
}

/// Names present, non-empty, unique and sizes above zero.
fn check_names(dims: &[(&str, usize)]) -> Result<()> {
    let mut seen = BTreeSet::new();
    for (name, size) in dims {
        if name.is_empty() || name.contains(['-', ',', '=']) {
            return Err(bad(format!(
                "dimension name {name:?} is empty or holds '-', ',' or '='"
            )));
        }
        if !seen.insert(*name) {
            return Err(bad(format!("dimension {name:?} is named twice")));
        }
        if *size == 0 {
            return Err(bad(format!("dimension {name:?} has size 0")));
        }
    }
    Ok(())
}

/// The product of the sizes must be the world.
fn check_world(world: usize, dims: &[(&str, usize)]) -> Result<()> {
    let product = dims.iter().try_fold(1usize, |p, (_, s)| p.checked_mul(*s));
    if product != Some(world) {
        return Err(bad(format!(
            "{} = {} but the world has {world} ranks",
            product_text(dims),
            product.map_or("more than usize".into(), |p| p.to_string())
        )));
    }
    Ok(())
}

impl MeshLayout {
    /// torch's `init_device_mesh(shape, names)`: the last dimension varies
    /// fastest. The product of the sizes must be `world`.
    pub fn row_major(world: usize, dims: &[(&str, usize)]) -> Result<MeshLayout> {
        check_names(dims)?;
        check_world(world, dims)?;
        let mut stride = 1;
        let mut out = Vec::with_capacity(dims.len());
        for (name, size) in dims.iter().rev() {
            out.push(Dim {
                name: name.to_string(),
                size: *size,
                stride,
            });
            stride *= size;
        }
        out.reverse();
        Ok(MeshLayout { world, dims: out })
    }

    /// Megatron's `RankGenerator`: `order` names the dimensions, the first
    /// varying fastest (`"tp-cp-ep-dp-pp"`); a dimension of size 1 may be
    /// left out of the order (Megatron appends it), a larger one may not.
    pub fn ordered(world: usize, order: &str, sizes: &[(&str, usize)]) -> Result<MeshLayout> {
        check_names(sizes)?;
        let mut names: Vec<&str> = order.split('-').map(str::trim).collect();
        let mut seen = BTreeSet::new();
        for n in &names {
            if !seen.insert(*n) {
                return Err(bad(format!("order {order:?} names {n:?} twice")));
            }
            if !sizes.iter().any(|(s, _)| s == n) {
                return Err(bad(format!(
                    "order {order:?} names {n:?}, which has no size"
                )));
            }
        }
        for (n, s) in sizes {
            if !names.contains(n) {
                if *s != 1 {
                    return Err(bad(format!(
                        "dimension {n:?} has size {s} but the order {order:?} does not name it"
                    )));
                }
                names.push(n);
            }
        }
        let ordered: Vec<(&str, usize)> = names
            .iter()
            .map(|n| (*n, sizes.iter().find(|(s, _)| s == n).unwrap().1))
            .collect();
        check_world(world, &ordered)?;
        let mut stride = 1;
        let dims = ordered
            .iter()
            .map(|(name, size)| {
                let d = Dim {
                    name: name.to_string(),
                    size: *size,
                    stride,
                };
                stride *= size;
                d
            })
            .collect();
        Ok(MeshLayout { world, dims })
    }

    /// Megatron's `initialize_model_parallel` layouts of one world: the dense
    /// one (`tp`, `cp`, `dp`, `pp`; `ep` of size 1) and the expert one
    /// (expert TP as `tp`, `ep`, expert DP as `dp`, `pp`; `cp` of size 1),
    /// both in `order` (Megatron's default `"tp-cp-ep-dp-pp"`). DP is
    /// `world / (tp·cp·pp)`, expert DP `world / (etp·ep·pp)`; `etp` defaults
    /// to `tp`. Megatron's rules hold: both divide the world, and unless the
    /// order ends in `pp` (or `pp` is 1) the two DP sizes are equal, so the
    /// pipeline groups of both layouts are the same.
    pub fn megatron(
        world: usize,
        order: &str,
        sizes: MegatronSizes,
    ) -> Result<(MeshLayout, MeshLayout)> {
        let MegatronSizes {
            tp,
            pp,
            cp,
            ep,
            etp,
        } = sizes;
        let etp = etp.unwrap_or(tp);
        if tp == 0 || pp == 0 || cp == 0 || ep == 0 || etp == 0 {
            return Err(bad("every Megatron size must be at least 1".into()));
        }
        let dense_model = tp
            .checked_mul(pp)
            .and_then(|m| m.checked_mul(cp))
            .filter(|m| world.is_multiple_of(*m))
            .ok_or_else(|| {
                bad(format!(
                    "the world ({world}) is not divisible by tp × cp × pp = {tp} × {cp} × {pp}"
                ))
            })?;
        let expert_model = etp
            .checked_mul(ep)
            .and_then(|m| m.checked_mul(pp))
            .filter(|m| world.is_multiple_of(*m))
            .ok_or_else(|| {
                bad(format!(
                "the world ({world}) is not divisible by expert tp × ep × pp = {etp} × {ep} × {pp}"
            ))
            })?;
        let (dp, edp) = (world / dense_model, world / expert_model);
        if !(order.trim().ends_with("pp") || pp == 1 || dp == edp) {
            return Err(bad(format!(
                "with the order {order:?} (not ending in pp) the dense and expert data-parallel sizes must be equal, got {dp} and {edp}"
            )));
        }
        let dense = MeshLayout::ordered(
            world,
            order,
            &[("tp", tp), ("cp", cp), ("ep", 1), ("dp", dp), ("pp", pp)],
        )?;
        let expert = MeshLayout::ordered(
            world,
            order,
            &[("tp", etp), ("cp", 1), ("ep", ep), ("dp", edp), ("pp", pp)],
        )?;
        if dense.groups(&["pp"])? != expert.groups(&["pp"])? {
            return Err(bad(format!(
                "the order {order:?} gives the dense and expert layouts different pipeline groups"
            )));
        }
        Ok((dense, expert))
    }

    /// vLLM's layout: `arange(W).reshape(-1, dp, pp, tp)`, dimensions
    /// `ext_dp` (external data parallelism, the `-1`), `dp`, `pp`, `tp`.
    /// vLLM's EP group is `group(&["dp", "tp"])`.
    pub fn vllm(world: usize, dp: usize, pp: usize, tp: usize) -> Result<MeshLayout> {
        let inner = dp.checked_mul(pp).and_then(|m| m.checked_mul(tp));
        let ext = inner
            .filter(|m| *m > 0 && world.is_multiple_of(*m))
            .map(|m| world / m)
            .ok_or_else(|| {
                bad(format!(
                    "the world ({world}) is not divisible by dp × pp × tp = {dp} × {pp} × {tp}"
                ))
            })?;
        MeshLayout::row_major(
            world,
            &[("ext_dp", ext), ("dp", dp), ("pp", pp), ("tp", tp)],
        )
    }

    /// The number of ranks.
    pub fn world(&self) -> usize {
        self.world
    }

    /// The dimensions' names and sizes, in the order they were given.
    pub fn dims(&self) -> impl Iterator<Item = (&str, usize)> {
        self.dims.iter().map(|d| (d.name.as_str(), d.size))
    }

    /// Rank `rank`'s coordinate along each dimension, in the order given.
    pub fn coords(&self, rank: usize) -> Vec<(&str, usize)> {
        self.dims
            .iter()
            .map(|d| (d.name.as_str(), (rank / d.stride) % d.size))
            .collect()
    }

    /// Rank `rank`'s coordinate along dimension `name`; an error names the
    /// dimensions there are.
    pub fn coord(&self, rank: usize, name: &str) -> Result<usize> {
        let d = self.pick(&[name])?[0];
        Ok((rank / d.stride) % d.size)
    }

    /// This layout with dimension `name` (which exists) of `size` instead,
    /// every dimension keeping its place in the rank order.
    pub(crate) fn resized(&self, name: &str, size: usize) -> MeshLayout {
        let mut dims = self.dims.clone();
        let mut order: Vec<usize> = (0..dims.len()).collect();
        order.sort_by_key(|&i| dims[i].stride);
        let mut stride = 1;
        for i in order {
            if dims[i].name == name {
                dims[i].size = size;
            }
            dims[i].stride = stride;
            stride *= dims[i].size;
        }
        MeshLayout {
            world: stride,
            dims,
        }
    }

    /// The dimensions named by `names`, checked: known, each once.
    fn pick(&self, names: &[&str]) -> Result<Vec<&Dim>> {
        if names.is_empty() {
            return Err(bad("a group needs at least one dimension".into()));
        }
        let mut picked: Vec<&Dim> = Vec::with_capacity(names.len());
        for n in names {
            let Some(d) = self.dims.iter().find(|d| d.name == *n) else {
                let known: Vec<&str> = self.dims.iter().map(|d| d.name.as_str()).collect();
                return Err(bad(format!(
                    "no dimension {n:?} (the mesh has {})",
                    known.join(", ")
                )));
            };
            if picked.iter().any(|p| p.name == d.name) {
                return Err(bad(format!("dimension {n:?} is named twice in a group")));
            }
            picked.push(d);
        }
        picked.sort_by_key(|d| d.stride);
        Ok(picked)
    }

    /// The ranks that share every coordinate of `base` outside `picked`, in
    /// ascending order (the first, smallest-stride dimension fastest).
    fn members(picked: &[&Dim], base: usize) -> Vec<usize> {
        let mut out = vec![base];
        for d in picked {
            out = (0..d.size)
                .flat_map(|i| out.iter().map(move |r| r + i * d.stride))
                .collect();
        }
        out.sort_unstable();
        out
    }

    /// Rank `rank`'s group of the dimensions `names` (several: flattened).
    pub fn group_of(&self, names: &[&str], rank: usize) -> Result<Vec<usize>> {
        if rank >= self.world {
            return Err(bad(format!(
                "rank {rank} is not in a world of {}",
                self.world
            )));
        }
        let picked = self.pick(names)?;
        let base = rank
            - picked
                .iter()
                .map(|d| ((rank / d.stride) % d.size) * d.stride)
                .sum::<usize>();
        Ok(MeshLayout::members(&picked, base))
    }

    /// Every group of the dimensions `names`, in Megatron's order (the
    /// group index runs over the other dimensions, smallest stride fastest).
    pub fn groups(&self, names: &[&str]) -> Result<Vec<Vec<usize>>> {
        let picked = self.pick(names)?;
        let mut others: Vec<&Dim> = self
            .dims
            .iter()
            .filter(|d| !picked.iter().any(|p| p.name == d.name))
            .collect();
        others.sort_by_key(|d| d.stride);
        Ok(MeshLayout::members(&others, 0)
            .into_iter()
            .map(|base| MeshLayout::members(&picked, base))
            .collect())
    }
}

/// Megatron's parallel sizes (`initialize_model_parallel`'s arguments); DP
/// follows from the world.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MegatronSizes {
    /// Tensor-parallel size.
    pub tp: usize,
    /// Pipeline-parallel size.
    pub pp: usize,
    /// Context-parallel size.
    pub cp: usize,
    /// Expert-parallel size.
    pub ep: usize,
    /// Expert tensor-parallel size (`None`: `tp`).
    pub etp: Option<usize>,
}

impl Default for MegatronSizes {
    fn default() -> Self {
        MegatronSizes {
            tp: 1,
            pp: 1,
            cp: 1,
            ep: 1,
            etp: None,
        }
    }
}

/// A layout's groups over the job: every single dimension's group of this
/// rank is made with the mesh (one `MPI_Comm_split` each); a flattened group
/// is made at its first [`group`](Self::group) call, which every rank of the
/// world must make (torch's `_flatten` is collective too).
pub struct Mesh<'rt> {
    rt: &'rt Runtime,
    layout: MeshLayout,
    groups: RefCell<Vec<(Vec<String>, GroupCoordinator<'rt>)>>,
}

impl<'rt> Mesh<'rt> {
    /// [`MeshLayout::row_major`] over the whole world, then
    /// [`new`](Self::new): `Mesh::row_major(&rt, &[("pp", 2), ("dp", 2), ("tp", 2)], &["tp"])`.
    pub fn row_major(
        rt: &'rt Runtime,
        dims: &[(&str, usize)],
        intra_node: &[&str],
    ) -> Result<Mesh<'rt>> {
        Mesh::new(rt, MeshLayout::row_major(rt.size(), dims)?, intra_node)
    }

    /// Makes the mesh on the whole world. `intra_node` names dimensions whose
    /// groups must each lie on one node (tensor parallelism, usually): one
    /// that spans nodes fails on every rank before any communicator exists,
    /// naming the group and the nodes.
    pub fn new(rt: &'rt Runtime, layout: MeshLayout, intra_node: &[&str]) -> Result<Mesh<'rt>> {
        if layout.world != rt.size() {
            return Err(bad(format!(
                "the layout has {} ranks but the world has {}",
                layout.world,
                rt.size()
            )));
        }
        for dim in intra_node {
            for group in layout.groups(&[dim])? {
                let ranks = &rt.world().ranks;
                let mut nodes: Vec<usize> = group.iter().map(|r| ranks[*r].node).collect();
                nodes.sort_unstable();
                nodes.dedup();
                if nodes.len() > 1 {
                    let host = |n: usize| {
                        ranks
                            .iter()
                            .find(|i| i.node == n)
                            .map_or(format!("node {n}"), |i| i.host.clone())
                    };
                    let names: Vec<String> = nodes.iter().map(|n| host(*n)).collect();
                    return Err(bad(format!(
                        "{dim} group {group:?} spans nodes {}",
                        names.join(" and ")
                    )));
                }
            }
        }
        let mesh = Mesh {
            rt,
            layout,
            groups: RefCell::new(Vec::new()),
        };
        let names: Vec<String> = mesh.layout.dims.iter().map(|d| d.name.clone()).collect();
        for name in &names {
            mesh.group(&[name.as_str()])?;
        }
        Ok(mesh)
    }

    /// The layout.
    pub fn layout(&self) -> &MeshLayout {
        &self.layout
    }

    /// This rank's coordinates.
    pub fn coords(&self) -> Vec<(&str, usize)> {
        self.layout.coords(self.rt.rank())
    }

    /// This rank's coordinate along dimension `name` (`mesh.coord("pp")?`
    /// is this rank's pipeline stage); an error names the dimensions there
    /// are.
    pub fn coord(&self, name: &str) -> Result<usize> {
        self.layout.coord(self.rt.rank(), name)
    }

    /// This rank's group of the dimensions `names` (`&["tp"]`, or several to
    /// flatten: `&["dp", "cp"]`). The first call for a new set of several
    /// dimensions is collective over the world.
    pub fn group(&self, names: &[&str]) -> Result<GroupCoordinator<'rt>> {
        let key: Vec<String> = {
            let mut k: Vec<String> = names.iter().map(|n| n.to_string()).collect();
            k.sort();
            k
        };
        if let Some((_, g)) = self.groups.borrow().iter().find(|(k, _)| *k == key) {
            return Ok(g.clone());
        }
        let lists = self.layout.groups(names)?;
        let label = names.join("_");
        let made = self
            .rt
            .split_groups(&label, &lists)?
            .ok_or_else(|| bad(format!("rank {} is in no {label} group", self.rt.rank())))?;
        debug_assert!(lists.iter().any(|l| l.as_slice() == made.ranks()));
        self.groups.borrow_mut().push((key, made.clone()));
        Ok(made)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn row_major_is_torchs_order() {
        let m = MeshLayout::row_major(8, &[("pp", 2), ("dp", 2), ("tp", 2)]).unwrap();
        assert_eq!(m.group_of(&["tp"], 5).unwrap(), [4, 5]);
        assert_eq!(m.group_of(&["dp"], 5).unwrap(), [5, 7]);
        assert_eq!(m.group_of(&["pp"], 5).unwrap(), [1, 5]);
        assert_eq!(m.coords(5), [("pp", 1), ("dp", 0), ("tp", 1)]);
        assert_eq!(m.group_of(&["dp", "tp"], 5).unwrap(), [4, 5, 6, 7]);
        assert_eq!(m.groups(&["pp"]).unwrap(), [[0, 4], [1, 5], [2, 6], [3, 7]]);
    }

    #[test]
    fn bad_layouts_are_named() {
        let err = |r: Result<MeshLayout>| r.unwrap_err().to_string();
        assert_eq!(
            err(MeshLayout::row_major(6, &[("pp", 2), ("dp", 2), ("tp", 2)])),
            "invalid parallel layout: mesh: pp=2 × dp=2 × tp=2 = 8 but the world has 6 ranks"
        );
        assert!(err(MeshLayout::row_major(4, &[("tp", 2), ("tp", 2)])).contains("named twice"));
        assert!(err(MeshLayout::row_major(4, &[("tp", 0), ("dp", 4)])).contains("size 0"));
        assert!(
            err(MeshLayout::ordered(4, "tp-dp", &[("tp", 2), ("pp", 2)]))
                .contains("names \"dp\", which has no size")
        );
        assert!(err(MeshLayout::ordered(4, "tp", &[("tp", 2), ("pp", 2)]))
            .contains("\"pp\" has size 2 but the order \"tp\" does not name it"));
        let m = MeshLayout::row_major(4, &[("dp", 2), ("tp", 2)]).unwrap();
        assert!(m
            .group_of(&["ep"], 0)
            .unwrap_err()
            .to_string()
            .contains("no dimension \"ep\""));
        assert!(m.group_of(&["tp", "tp"], 0).is_err());
    }
}
