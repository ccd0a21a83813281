//! `MeshLayout` against serial transcriptions of each framework's own rules,
//! written here and not computed by the code under test: torch's row-major
//! `DeviceMesh` and `_flatten`, Megatron's `generate_masked_orthogonal_rank_groups`
//! with `RankGenerator` and its dense and expert generators, vLLM's
//! `arange(W).reshape(-1, dp, pp, tp)` groups, FastVideo's SP/DP groups.
//! World sizes 1 to 1024.

use rankmesh::{parallel::MegatronSizes, MeshLayout};

/// Divisors of `n`.
fn divisors(n: usize) -> Vec<usize> {
    (1..=n).filter(|d| n.is_multiple_of(*d)).collect()
}

// ---- torch: DeviceMesh(arange(W).reshape(shape)) ----

/// The rank at index tuple `idx` of a row-major tensor of `shape`.
fn row_major_rank(shape: &[usize], idx: &[usize]) -> usize {
    idx.iter().zip(shape).fold(0, |r, (i, s)| r * s + i)
}

/// Every index tuple of `shape`, lexicographic (last fastest).
fn tuples(shape: &[usize]) -> Vec<Vec<usize>> {
    let mut out = vec![vec![]];
    for s in shape {
        out = out
            .into_iter()
            .flat_map(|t| {
                (0..*s).map(move |i| {
                    let mut t = t.clone();
                    t.push(i);
                    t
                })
            })
            .collect();
    }
    out
}

/// torch's group of mesh dims `dims` (ascending mesh positions, as `_flatten`
/// requires) for the rank at `me`: the other indices fixed, `dims` walked
/// row-major.
fn torch_group(shape: &[usize], dims: &[usize], me: &[usize]) -> Vec<usize> {
    let sub: Vec<usize> = dims.iter().map(|d| shape[*d]).collect();
    tuples(&sub)
        .into_iter()
        .map(|t| {
            let mut idx = me.to_vec();
            for (d, i) in dims.iter().zip(t) {
                idx[*d] = i;
            }
            row_major_rank(shape, &idx)
        })
        .collect()
}

#[test]
fn torch_row_major_meshes_of_one_to_three_dims() {
    let names = ["pp", "dp", "tp"];
    let mut checked = 0;
    for world in [1usize, 2, 4, 8, 12, 16, 64, 1024] {
        for a in divisors(world) {
            for b in divisors(world / a) {
                let c = world / a / b;
                for shape in [vec![world], vec![a, world / a], vec![a, b, c]] {
                    let dims: Vec<(&str, usize)> = names[3 - shape.len()..]
                        .iter()
                        .copied()
                        .zip(shape.clone())
                        .collect();
                    let m = MeshLayout::row_major(world, &dims).unwrap();
                    // Single dims and every contiguous flatten.
                    let n = shape.len();
                    let sets: Vec<Vec<usize>> = (0..n)
                        .flat_map(|i| (i..n).map(move |j| (i..=j).collect()))
                        .collect();
                    // A sample of ranks at large worlds keeps this fast.
                    let step = (world / 64).max(1);
                    for me in (0..world).step_by(step) {
                        let idx = tuples(&shape)[me].clone();
                        assert_eq!(row_major_rank(&shape, &idx), me);
                        let coords: Vec<usize> = m.coords(me).iter().map(|c| c.1).collect();
                        assert_eq!(coords, idx, "coords of {me} in {dims:?}");
                        for set in &sets {
                            let names: Vec<&str> = set.iter().map(|d| dims[*d].0).collect();
                            assert_eq!(
                                m.group_of(&names, me).unwrap(),
                                torch_group(&shape, set, &idx),
                                "{names:?} of rank {me} in {dims:?}"
                            );
                            checked += 1;
                        }
                    }
                }
            }
        }
    }
    assert!(checked > 10_000, "{checked}");
}

// ---- Megatron: generate_masked_orthogonal_rank_groups, transcribed ----

fn prefix_product(a: &[usize]) -> Vec<usize> {
    let mut r = vec![1];
    let mut init = 1;
    for v in a {
        init *= v;
        r.push(init);
    }
    r
}

fn inner_product(a: &[usize], b: &[usize]) -> usize {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

fn decompose(index: usize, shape: &[usize]) -> Vec<usize> {
    let stride = prefix_product(shape);
    let idx: Vec<usize> = shape
        .iter()
        .zip(&stride)
        .map(|(s, d)| (index / d) % s)
        .collect();
    assert_eq!(inner_product(&idx, &stride[..shape.len()]), index);
    idx
}

/// Python's `[s for s, m in zip(values, mask) if m == keep]`.
fn where_mask(values: &[usize], mask: &[bool], keep: bool) -> Vec<usize> {
    values
        .iter()
        .zip(mask)
        .filter(|(_, m)| **m == keep)
        .map(|(s, _)| *s)
        .collect()
}

fn masked_orthogonal_groups(
    world: usize,
    parallel_size: &[usize],
    mask: &[bool],
) -> Vec<Vec<usize>> {
    let masked_shape = where_mask(parallel_size, mask, true);
    let unmasked_shape = where_mask(parallel_size, mask, false);
    let global_stride = prefix_product(parallel_size);
    let masked_stride = where_mask(&global_stride, mask, true);
    let unmasked_stride = where_mask(&global_stride, mask, false);
    let group_size = *prefix_product(&masked_shape).last().unwrap();
    let num_of_group = world / group_size;
    (0..num_of_group)
        .map(|group_index| {
            let group_idx = decompose(group_index, &unmasked_shape);
            (0..group_size)
                .map(|rank_in_group| {
                    let rank_idx = decompose(rank_in_group, &masked_shape);
                    inner_product(&rank_idx, &masked_stride)
                        + inner_product(&group_idx, &unmasked_stride)
                })
                .collect()
        })
        .collect()
}

/// RankGenerator(tp, ep, dp, pp, cp, order).get_ranks(token).
fn rank_generator(sizes: [(&str, usize); 5], order: &str, token: &str) -> Vec<Vec<usize>> {
    let world: usize = sizes.iter().map(|s| s.1).product();
    let mut order: Vec<String> = order.split('-').map(String::from).collect();
    for (name, size) in sizes {
        if !order.iter().any(|o| o == name) {
            assert_eq!(size, 1);
            order.push(name.to_string());
        }
    }
    let ordered: Vec<usize> = order
        .iter()
        .map(|o| sizes.iter().find(|s| s.0 == o).unwrap().1)
        .collect();
    let tokens: Vec<&str> = token.split('-').collect();
    let mask: Vec<bool> = order.iter().map(|o| tokens.contains(&o.as_str())).collect();
    masked_orthogonal_groups(world, &ordered, &mask)
}

#[test]
fn megatron_order_strings_dense_and_expert() {
    let orders = [
        "tp-cp-ep-dp-pp",
        "tp-pp-dp",
        "tp-dp-pp",
        "tp-cp-dp-pp",
        "tp-ep-dp-pp",
        "tp-cp-ep-pp-dp",
    ];
    let dense_tokens = [
        "tp", "cp", "dp", "pp", "dp-cp", "tp-pp", "tp-cp", "tp-dp-cp",
    ];
    let expert_tokens = ["tp", "ep", "dp", "pp", "tp-ep", "tp-ep-pp"];
    let mut checked = 0;
    for world in [1usize, 2, 4, 8, 16, 64, 1024] {
        for tp in divisors(world) {
            for pp in divisors(world / tp) {
                for cp in divisors(world / tp / pp) {
                    for ep in [1, 2, 4] {
                        for etp in [None, Some(1)] {
                            let sizes = MegatronSizes {
                                tp,
                                pp,
                                cp,
                                ep,
                                etp,
                            };
                            for order in orders {
                                let needs =
                                    |n: &str, s: usize| s == 1 || order.split('-').any(|o| o == n);
                                let etp_v = etp.unwrap_or(tp);
                                if !needs("cp", cp)
                                    || !needs("ep", ep)
                                    || world % (etp_v * ep * pp) != 0
                                {
                                    continue;
                                }
                                let dp = world / (tp * cp * pp);
                                let edp = world / (etp_v * ep * pp);
                                if !(order.ends_with("pp") || pp == 1 || dp == edp) {
                                    assert!(MeshLayout::megatron(world, order, sizes).is_err());
                                    continue;
                                }
                                let Ok((dense, expert)) = MeshLayout::megatron(world, order, sizes)
                                else {
                                    panic!("{world} {order} {sizes:?}");
                                };
                                for token in dense_tokens {
                                    let names: Vec<&str> = token.split('-').collect();
                                    let want = rank_generator(
                                        [("tp", tp), ("pp", pp), ("dp", dp), ("ep", 1), ("cp", cp)],
                                        order,
                                        token,
                                    );
                                    assert_eq!(
                                        dense.groups(&names).unwrap(),
                                        want,
                                        "{world} {order} {sizes:?} {token}"
                                    );
                                    checked += 1;
                                }
                                for token in expert_tokens {
                                    let names: Vec<&str> = token.split('-').collect();
                                    let want = rank_generator(
                                        [
                                            ("tp", etp_v),
                                            ("pp", pp),
                                            ("dp", edp),
                                            ("ep", ep),
                                            ("cp", 1),
                                        ],
                                        order,
                                        token,
                                    );
                                    assert_eq!(
                                        expert.groups(&names).unwrap(),
                                        want,
                                        "{world} {order} {sizes:?} expert {token}"
                                    );
                                    checked += 1;
                                }
                            }
                        }
                    }
                }
            }
        }
    }
    assert!(checked > 1000, "{checked}");
}

#[test]
fn megatron_sizes_that_do_not_divide_are_refused() {
    let sizes = |tp, pp, cp, ep| MegatronSizes {
        tp,
        pp,
        cp,
        ep,
        etp: None,
    };
    let err = MeshLayout::megatron(6, "tp-cp-ep-dp-pp", sizes(4, 1, 1, 1)).unwrap_err();
    assert!(
        err.to_string()
            .contains("not divisible by tp × cp × pp = 4 × 1 × 1"),
        "{err}"
    );
    let err = MeshLayout::megatron(8, "tp-cp-ep-dp-pp", sizes(1, 1, 1, 3)).unwrap_err();
    assert!(
        err.to_string().contains("expert tp × ep × pp = 1 × 3 × 1"),
        "{err}"
    );
    let err = MeshLayout::megatron(8, "tp-dp-pp", sizes(1, 1, 2, 1)).unwrap_err();
    assert!(
        err.to_string().contains("\"cp\" has size 2 but the order"),
        "{err}"
    );
}

// ---- vLLM: arange(W).reshape(-1, dp, pp, tp) ----

/// vLLM's groups, by their transposes: `view(-1, tp)`, `transpose(2, 3)`,
/// `transpose(1, 3)`, and EP's `transpose(1, 2).reshape(-1, dp * tp)`.
fn vllm_groups(world: usize, dp: usize, pp: usize, tp: usize, which: &str) -> Vec<Vec<usize>> {
    let ext = world / (dp * pp * tp);
    let rank = |e: usize, d: usize, p: usize, t: usize| ((e * dp + d) * pp + p) * tp + t;
    let mut out = Vec::new();
    match which {
        "tp" => (0..world / tp).for_each(|g| out.push((g * tp..(g + 1) * tp).collect())),
        "pp" => {
            for e in 0..ext {
                for d in 0..dp {
                    for t in 0..tp {
                        out.push((0..pp).map(|p| rank(e, d, p, t)).collect());
                    }
                }
            }
        }
        "dp" => {
            for e in 0..ext {
                for t in 0..tp {
                    for p in 0..pp {
                        out.push((0..dp).map(|d| rank(e, d, p, t)).collect());
                    }
                }
            }
        }
        "ep" => {
            for e in 0..ext {
                for p in 0..pp {
                    out.push(
                        (0..dp)
                            .flat_map(|d| (0..tp).map(move |t| rank(e, d, p, t)))
                            .collect(),
                    );
                }
            }
        }
        _ => unreachable!(),
    }
    out.sort();
    out
}

#[test]
fn vllm_layouts_and_its_ep_group() {
    for world in [1usize, 2, 4, 8, 16, 24, 64, 1024] {
        for dp in divisors(world) {
            for pp in divisors(world / dp) {
                for tp in divisors(world / dp / pp) {
                    let m = MeshLayout::vllm(world, dp, pp, tp).unwrap();
                    for (which, names) in [
                        ("tp", vec!["tp"]),
                        ("pp", vec!["pp"]),
                        ("dp", vec!["dp"]),
                        ("ep", vec!["dp", "tp"]),
                    ] {
                        let mut got = m.groups(&names).unwrap();
                        got.sort();
                        assert_eq!(
                            got,
                            vllm_groups(world, dp, pp, tp, which),
                            "{world} dp{dp} pp{pp} tp{tp} {which}"
                        );
                    }
                }
            }
        }
    }
    assert!(MeshLayout::vllm(6, 4, 1, 1).is_err());
}

// ---- FastVideo: SP groups [i*s, (i+1)*s), DP groups range(i, W, s) ----

#[test]
fn fastvideos_sp_and_dp_groups_as_a_mesh() {
    for world in [1usize, 2, 4, 8, 64, 1024] {
        for s in divisors(world) {
            let m = MeshLayout::row_major(world, &[("dp", world / s), ("sp", s)]).unwrap();
            let sp: Vec<Vec<usize>> = (0..world / s)
                .map(|i| (i * s..(i + 1) * s).collect())
                .collect();
            let dp: Vec<Vec<usize>> = (0..s).map(|i| (i..world).step_by(s).collect()).collect();
            let mut got_sp = m.groups(&["sp"]).unwrap();
            got_sp.sort();
            let mut got_dp = m.groups(&["dp"]).unwrap();
            got_dp.sort();
            assert_eq!(got_sp, sp, "{world} sp{s}");
            assert_eq!(got_dp, dp, "{world} sp{s}");
        }
    }
}
