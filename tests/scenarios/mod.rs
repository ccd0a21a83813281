//! Scenarios run by every rank of an mpirun job.

mod adjoint;
mod bench_sweep;
mod collectives;
mod dicts;
mod errors;
mod gathering;
mod groups;
mod headers;
mod helpers;
mod large;
mod mesh;
mod node_aware;
mod nodes;
mod objects;
mod p2p;
mod single_copy;
pub mod planes;
pub mod reference;
mod stateless;
mod stream_ring;
mod streamed;
mod views;
mod workspace;

use rankmesh::Runtime;

pub struct Scenario {
    pub name: &'static str,
    /// World sizes to launch it with on this host.
    pub sizes: &'static [usize],
    /// Fake-node layouts to launch it with (ranks per node, "2,3").
    pub nodes: &'static [&'static str],
    /// Extra environment for the ranks.
    pub env: &'static [(&'static str, &'static str)],
    pub run: fn(&Runtime),
}

const ALL_SIZES: &[usize] = &[1, 2, 3, 4];
/// Forces every transfer through the chunked paths (pieces of a few bytes).
const TINY_CHUNKS: &[(&str, &str)] = &[("RANKMESH_MAX_MESSAGE_BYTES", "7")];

/// Larger tensors in the smallest shared-memory areas: every call crosses
/// many pieces, and all-reduces take the split path (shares of a piece).
const SHM_PIECES: &[(&str, &str)] = &[
    ("RANKMESH_HOST_PLANE", "shm"),
    ("RANKMESH_SHM_CHUNK_BYTES", "12288"),
    ("RANKMESH_TEST_SCALE", "600"),
];

/// The hierarchical executor for groups spanning (fake) nodes.
const HIER: &[(&str, &str)] = &[("RANKMESH_HOST_PLANE", "hier")];

/// The plane scenarios on the host plane (the world group).
fn planes_host(rt: &Runtime) {
    planes::check_all(&rt.world_group().unwrap()).unwrap();
}

/// The MPI executor with every collective started nonblocking and waited
/// for by the wait policy (as on a node whose ranks share CPUs under an MPI
/// that does not yield).
const NONBLOCKING_MPI: &[(&str, &str)] = &[
    ("RANKMESH_HOST_PLANE", "mpi"),
    ("RANKMESH_MPI_CALLS", "nonblocking"),
];

/// `run` after checking that the job agreed to start MPI's collectives
/// nonblocking.
fn nonblocking(rt: &Runtime, run: fn(&Runtime)) {
    assert_eq!(rt.mpi_calls(), rankmesh::group::MpiCalls::Nonblocking);
    run(rt);
}

/// The uneven ops alone (`planes::check_uneven`), on the world.
fn uneven(rt: &Runtime) {
    planes::check_uneven(&rt.world_group().unwrap()).unwrap();
}

/// The plane scenarios on groups spanning nodes: the world, and the world
/// with its members interleaved across nodes (group ranks 0, 1, ... on
/// alternating nodes, so the hierarchy's order is not the group's).
fn planes_across_nodes(rt: &Runtime) {
    let world = rt.world_group().unwrap();
    planes::check_all(&world).unwrap();
    let p = rt.size();
    let mut by_node: Vec<Vec<usize>> = Vec::new();
    for r in 0..p {
        let node = rt.world().ranks[r].node;
        match by_node
            .iter_mut()
            .find(|n| rt.world().ranks[n[0]].node == node)
        {
            Some(n) => n.push(r),
            None => by_node.push(vec![r]),
        }
    }
    let mut interleaved = Vec::new();
    for i in 0..p {
        interleaved.extend(by_node.iter().filter_map(|n| n.get(i)));
    }
    assert_ne!(interleaved, (0..p).collect::<Vec<_>>(), "interleaved");
    let g = rt
        .split_groups("interleaved", &[interleaved.clone()])
        .unwrap()
        .unwrap();
    assert_eq!(g.host_executor(), "hier", "the executor of {interleaved:?}");
    planes::check_all(&g).unwrap();
}

pub const ALL: &[Scenario] = &[
    Scenario {
        name: "uneven_mpi",
        nodes: &[],
        sizes: &[2, 3, 4],
        env: &[("RANKMESH_HOST_PLANE", "mpi")],
        run: uneven,
    },
    Scenario {
        name: "uneven_chunked",
        nodes: &[],
        sizes: &[2, 3],
        env: &[
            ("RANKMESH_HOST_PLANE", "mpi"),
            ("RANKMESH_MAX_MESSAGE_BYTES", "7"),
        ],
        run: uneven,
    },
    Scenario {
        name: "uneven_shm_pieces",
        nodes: &[],
        sizes: &[2, 3, 4],
        env: SHM_PIECES,
        run: uneven,
    },
    Scenario {
        name: "uneven_nodes",
        nodes: &["2,2", "2,3"],
        sizes: &[],
        env: HIER,
        run: uneven,
    },
    Scenario {
        name: "views",
        nodes: &[],
        sizes: ALL_SIZES,
        env: &[],
        run: views::run,
    },
    Scenario {
        name: "views_mpi",
        nodes: &[],
        sizes: &[2, 3],
        env: &[("RANKMESH_HOST_PLANE", "mpi")],
        run: views::run,
    },
    Scenario {
        name: "collectives",
        nodes: &[],
        sizes: ALL_SIZES,
        env: &[],
        run: collectives::run,
    },
    Scenario {
        name: "collectives_chunked",
        nodes: &[],
        sizes: &[2, 3],
        env: TINY_CHUNKS,
        run: collectives::run,
    },
    Scenario {
        name: "collectives_shm_pieces",
        nodes: &[],
        sizes: &[2, 3, 4],
        env: SHM_PIECES,
        run: collectives::run,
    },
    Scenario {
        name: "collectives_mpi",
        nodes: &[],
        sizes: &[2, 3],
        env: &[("RANKMESH_HOST_PLANE", "mpi")],
        run: collectives::run,
    },
    Scenario {
        name: "collectives_nonblocking",
        nodes: &[],
        sizes: &[2, 3],
        env: NONBLOCKING_MPI,
        run: |rt| nonblocking(rt, collectives::run),
    },
    Scenario {
        name: "uneven_nonblocking",
        nodes: &[],
        sizes: &[2, 3],
        env: NONBLOCKING_MPI,
        run: |rt| nonblocking(rt, uneven),
    },
    Scenario {
        name: "errors_nonblocking",
        nodes: &[],
        sizes: &[2, 3],
        env: NONBLOCKING_MPI,
        run: |rt| nonblocking(rt, errors::run),
    },
    Scenario {
        name: "p2p_nonblocking",
        nodes: &[],
        sizes: &[2, 3],
        env: NONBLOCKING_MPI,
        run: |rt| nonblocking(rt, p2p::run),
    },
    Scenario {
        name: "objects_nonblocking",
        nodes: &[],
        sizes: &[2, 3],
        env: NONBLOCKING_MPI,
        run: |rt| nonblocking(rt, objects::run),
    },
    Scenario {
        name: "planes_host",
        nodes: &[],
        sizes: ALL_SIZES,
        env: &[],
        run: planes_host,
    },
    Scenario {
        name: "objects",
        nodes: &[],
        sizes: ALL_SIZES,
        env: &[],
        run: objects::run,
    },
    Scenario {
        name: "objects_mpi",
        nodes: &[],
        sizes: &[2, 3],
        env: &[("RANKMESH_HOST_PLANE", "mpi")],
        run: objects::run,
    },
    Scenario {
        name: "objects_chunked",
        nodes: &[],
        sizes: &[3],
        env: TINY_CHUNKS,
        run: objects::run,
    },
    Scenario {
        name: "p2p",
        nodes: &[],
        sizes: &[2, 3, 4],
        env: &[],
        run: p2p::run,
    },
    Scenario {
        name: "mesh",
        sizes: &[1, 2, 3, 4, 8],
        nodes: &[],
        env: &[],
        run: mesh::run,
    },
    Scenario {
        name: "mesh_nodes",
        sizes: &[],
        nodes: &["2,2"],
        env: &[],
        run: mesh::run_on_nodes,
    },
    Scenario {
        name: "groups",
        nodes: &[],
        sizes: ALL_SIZES,
        env: &[],
        run: groups::run,
    },
    Scenario {
        name: "tensor_dicts",
        nodes: &[],
        sizes: &[2, 4],
        env: &[],
        run: dicts::run,
    },
    Scenario {
        name: "adjoint",
        nodes: &[],
        sizes: ALL_SIZES,
        env: &[],
        run: adjoint::run,
    },
    Scenario {
        name: "errors",
        nodes: &[],
        sizes: ALL_SIZES,
        env: &[],
        run: errors::run,
    },
    Scenario {
        name: "errors_mpi",
        nodes: &[],
        sizes: &[2, 3],
        env: &[("RANKMESH_HOST_PLANE", "mpi")],
        run: errors::run,
    },
    Scenario {
        name: "helpers",
        nodes: &[],
        sizes: ALL_SIZES,
        env: &[],
        run: helpers::run,
    },
    Scenario {
        name: "gathering",
        nodes: &[],
        sizes: ALL_SIZES,
        env: &[],
        run: gathering::run,
    },
    Scenario {
        name: "stateless",
        nodes: &[],
        sizes: ALL_SIZES,
        env: &[],
        run: stateless::run,
    },
    Scenario {
        name: "stateless_chunked",
        nodes: &[],
        sizes: &[2],
        env: TINY_CHUNKS,
        run: stateless::run,
    },
    Scenario {
        name: "gathering_without_shm",
        nodes: &[],
        sizes: &[3],
        env: &[("RANKMESH_GATHER_SHM", "0")],
        run: gathering::run,
    },
    Scenario {
        name: "workspace",
        nodes: &[],
        sizes: &[1, 3],
        env: &[],
        run: workspace::run,
    },
    Scenario {
        name: "bench_sweep",
        nodes: &[],
        sizes: &[2, 3, 4],
        env: &[],
        run: bench_sweep::run,
    },
    Scenario {
        name: "nodes",
        nodes: &["2,2", "3,3", "2,3,1"],
        sizes: &[],
        env: &[],
        run: nodes::run,
    },
    Scenario {
        name: "collectives_across_nodes",
        nodes: &["2,2"],
        sizes: &[],
        env: &[],
        run: collectives::run,
    },
    Scenario {
        name: "collectives_across_nodes_hier",
        nodes: &["2,2", "2,3", "1,3"],
        sizes: &[],
        env: HIER,
        run: collectives::run,
    },
    Scenario {
        name: "collectives_across_nodes_hier_pieces",
        nodes: &["2,3"],
        sizes: &[],
        env: &[
            ("RANKMESH_HOST_PLANE", "hier"),
            ("RANKMESH_SHM_CHUNK_BYTES", "12288"),
            ("RANKMESH_TEST_SCALE", "600"),
        ],
        run: collectives::run,
    },
    Scenario {
        name: "collectives_across_nodes_mpi",
        nodes: &["2,2"],
        sizes: &[],
        env: &[("RANKMESH_HOST_PLANE", "mpi")],
        run: collectives::run,
    },
    Scenario {
        name: "planes_across_nodes",
        nodes: &["2,2", "2,3"],
        sizes: &[],
        env: HIER,
        run: planes_across_nodes,
    },
    Scenario {
        name: "errors_across_nodes",
        nodes: &["2,3"],
        sizes: &[],
        env: HIER,
        run: errors::run,
    },
    Scenario {
        name: "objects_across_nodes",
        nodes: &["2,3"],
        sizes: &[],
        env: HIER,
        run: objects::run,
    },
    Scenario {
        name: "zero_first_per_node",
        nodes: &["2,2", "2,3"],
        sizes: &[1, 3],
        env: &[],
        run: helpers::zero_first_per_node,
    },
    Scenario {
        name: "gathering_across_nodes",
        nodes: &["2,2"],
        sizes: &[],
        env: &[],
        run: gathering::run,
    },
    Scenario {
        name: "header_payloads",
        nodes: &[],
        sizes: &[2, 3, 4],
        env: &[],
        run: headers::run,
    },
    Scenario {
        name: "streamed_outputs",
        nodes: &[],
        sizes: &[2, 3],
        env: &[],
        run: streamed::run,
    },
    Scenario {
        name: "stream_ring",
        nodes: &[],
        sizes: &[2, 3, 4],
        env: &[
            ("RANKMESH_HOST_PLANE", "shm"),
            ("RANKMESH_SINGLE_COPY", "none"),
        ],
        run: stream_ring::run,
    },
    Scenario {
        // Areas smaller than a piece: one piece per area, a ring of two.
        name: "stream_ring_small_areas",
        nodes: &[],
        sizes: &[2, 3],
        env: &[
            ("RANKMESH_HOST_PLANE", "shm"),
            ("RANKMESH_SINGLE_COPY", "none"),
            ("RANKMESH_SHM_CHUNK_BYTES", "96K"),
        ],
        run: stream_ring::run,
    },
    Scenario {
        name: "node_aware",
        nodes: &["2,2", "2,3", "1,3"],
        sizes: &[],
        env: &[],
        run: node_aware::run,
    },
    Scenario {
        name: "node_aware_forced",
        nodes: &["2,2", "2,3"],
        sizes: &[],
        env: HIER,
        run: node_aware::run,
    },
    Scenario {
        name: "single_copy",
        nodes: &[],
        sizes: &[2, 3, 4],
        env: &[("RANKMESH_SINGLE_COPY", "cma")],
        run: single_copy::run,
    },
    Scenario {
        name: "single_copy_auto",
        nodes: &[],
        sizes: &[3],
        env: &[],
        run: single_copy::run,
    },
    Scenario {
        name: "single_copy_off",
        nodes: &[],
        sizes: &[2, 3],
        env: &[("RANKMESH_SINGLE_COPY", "none")],
        run: single_copy::run,
    },
    Scenario {
        name: "large_buffers",
        nodes: &[],
        sizes: &[2],
        env: &[],
        run: large::run,
    },
];
