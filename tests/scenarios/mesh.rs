//! Meshes on real MPI jobs: every dimension's group and a flattened group
//! hold the ranks a serial transcription gives (row-major, Megatron's order
//! strings with the first name fastest, vLLM's EP = DP×TP), and an
//! all-reduce over each group sums exactly its members; bad layouts are the
//! same error on every rank before any communicator exists. On fake nodes,
//! an intra-node dimension that spans nodes is refused, naming the group and
//! the hosts.

use rankmesh::Collectives as _;
use rankmesh::{parallel::MegatronSizes, Mesh, MeshLayout, ReduceOp, Runtime, Tensor};

/// Ranks sharing every coordinate but `free` with `me`, where coordinate `i`
/// of rank `r` is `(r / stride[i]) % size[i]` (written independently of the
/// library: a plain scan of the world).
fn scan_group(world: usize, dims: &[(usize, usize)], free: &[usize], me: usize) -> Vec<usize> {
    let coord = |r: usize, i: usize| (r / dims[i].1) % dims[i].0;
    (0..world)
        .filter(|r| (0..dims.len()).all(|i| free.contains(&i) || coord(*r, i) == coord(me, i)))
        .collect()
}

/// Checks each group's members and an all-reduce of world ranks over it.
fn check(rt: &Runtime, mesh: &Mesh, names: &[&str], want: Vec<usize>) {
    let g = mesh.group(names).unwrap();
    assert_eq!(
        g.ranks(),
        want.as_slice(),
        "{names:?} on rank {}",
        rt.rank()
    );
    let x = Tensor::from_vec([1], vec![rt.rank() as f64 + 0.25]).unwrap();
    let sum = g.all_reduce(&x, ReduceOp::Sum).unwrap();
    let expect: f64 = want.iter().map(|r| *r as f64 + 0.25).sum();
    assert_eq!(sum.as_slice::<f64>().unwrap(), [expect], "{names:?} sum");
}

pub fn run(rt: &Runtime) {
    let (w, me) = (rt.size(), rt.rank());
    // torch: (pp, dp, tp) row-major, tp fastest.
    let tp = if w % 2 == 0 { 2 } else { 1 };
    let dp = if (w / tp) % 2 == 0 { 2 } else { 1 };
    let pp = w / tp / dp;
    let layout = MeshLayout::row_major(w, &[("pp", pp), ("dp", dp), ("tp", tp)]).unwrap();
    let mesh = Mesh::new(rt, layout, &[]).unwrap();
    let dims = [(pp, dp * tp), (dp, tp), (tp, 1)];
    let coords: Vec<usize> = mesh.coords().iter().map(|c| c.1).collect();
    assert_eq!(coords, [me / (dp * tp), (me / tp) % dp, me % tp]);
    check(rt, &mesh, &["tp"], scan_group(w, &dims, &[2], me));
    check(rt, &mesh, &["dp"], scan_group(w, &dims, &[1], me));
    check(rt, &mesh, &["pp"], scan_group(w, &dims, &[0], me));
    check(rt, &mesh, &["dp", "tp"], scan_group(w, &dims, &[1, 2], me));

    // Megatron: "tp-cp-ep-dp-pp", first name fastest; experts re-factor the world.
    let sizes = MegatronSizes {
        tp,
        pp: 1,
        cp: 1,
        ep: w / tp,
        etp: Some(1),
    };
    let (dense, expert) = MeshLayout::megatron(w, "tp-cp-ep-dp-pp", sizes).unwrap();
    let dense = Mesh::new(rt, dense, &[]).unwrap();
    let dense_dims = [(tp, 1), (w / tp, tp)]; // tp, dp
    check(rt, &dense, &["tp"], scan_group(w, &dense_dims, &[0], me));
    check(rt, &dense, &["dp"], scan_group(w, &dense_dims, &[1], me));
    let expert = Mesh::new(rt, expert, &[]).unwrap();
    let expert_dims = [(1, 1), (w / tp, 1), (tp, w / tp)]; // etp, ep, edp
    check(rt, &expert, &["ep"], scan_group(w, &expert_dims, &[1], me));
    check(rt, &expert, &["dp"], scan_group(w, &expert_dims, &[2], me));

    // vLLM: arange(W).reshape(-1, dp, pp, tp); EP = DP×TP flattened.
    let vllm = Mesh::new(rt, MeshLayout::vllm(w, dp, pp, tp).unwrap(), &[]).unwrap();
    let vdims = [(1, w), (dp, pp * tp), (pp, tp), (tp, 1)];
    check(rt, &vllm, &["pp"], scan_group(w, &vdims, &[2], me));
    check(rt, &vllm, &["dp", "tp"], scan_group(w, &vdims, &[1, 3], me));

    // Bad input: the same error on every rank, before any communicator.
    let other = MeshLayout::row_major(w + 1, &[("dp", w + 1)]).unwrap();
    let err = Mesh::new(rt, other, &[])
        .err()
        .expect("a layout for another world");
    assert_eq!(
        err.to_string(),
        format!(
            "invalid parallel layout: mesh: the layout has {} ranks but the world has {w}",
            w + 1
        )
    );
    let err = mesh.group(&["ep"]).expect_err("an unknown dimension");
    assert!(
        err.to_string()
            .contains("no dimension \"ep\" (the mesh has pp, dp, tp)"),
        "{err}"
    );
    // Everything above still works after the errors.
    check(rt, &mesh, &["tp"], scan_group(w, &dims, &[2], me));

    // The shorthands a (pp, dp, tp) program reaches for first.
    let short = Mesh::row_major(rt, &[("pp", pp), ("dp", dp), ("tp", tp)], &[]).unwrap();
    assert_eq!(short.coord("pp").unwrap(), me / (dp * tp));
    assert_eq!(short.coord("tp").unwrap(), me % tp);
    assert_eq!(
        short.coord("ep").unwrap_err().to_string(),
        "invalid parallel layout: mesh: no dimension \"ep\" (the mesh has pp, dp, tp)"
    );
    // Counts before an uneven exchange, as torch's all_to_all_single of splits.
    let world = short.group(&["pp", "dp", "tp"]).unwrap();
    let send: Vec<usize> = (0..w).map(|r| 10 * me + r + 1).collect();
    let want: Vec<usize> = (0..w).map(|s| 10 * s + me + 1).collect();
    assert_eq!(world.exchange_counts(&send).unwrap(), want);
    let err = world.exchange_counts(&vec![1; 2 * w]).unwrap_err();
    assert!(
        err.to_string().contains(&format!(
            "send_counts has {} entries but the group has {w} members",
            2 * w
        )),
        "{err}"
    );
    assert_eq!(world.exchange_counts(&send).unwrap(), want);
}

/// On fake nodes "2,2": tp across a node's ranks is accepted; tp across the
/// two nodes is refused on every rank, naming the group and the hosts.
pub fn run_on_nodes(rt: &Runtime) {
    let w = rt.size();
    assert_eq!(w, 4, "launched on 2,2");
    let within = MeshLayout::row_major(4, &[("dp", 2), ("tp", 2)]).unwrap();
    let mesh = Mesh::new(rt, within, &["tp"]).unwrap();
    let me = rt.rank();
    check(rt, &mesh, &["tp"], vec![me & !1, me | 1]);
    let across = MeshLayout::row_major(4, &[("tp", 2), ("dp", 2)]).unwrap();
    let err = Mesh::new(rt, across, &["tp"])
        .err()
        .expect("tp across nodes");
    assert_eq!(
        err.to_string(),
        "invalid parallel layout: mesh: tp group [0, 2] spans nodes rankmesh-node0 and rankmesh-node1"
    );
    // A non-declared dimension may cross nodes.
    let across = MeshLayout::row_major(4, &[("tp", 2), ("dp", 2)]).unwrap();
    let mesh = Mesh::new(rt, across, &[]).unwrap();
    check(rt, &mesh, &["tp"], vec![me % 2, me % 2 + 2]);
}
