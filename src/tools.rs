//! The tools behind the `rankmesh` CLI, as a library: [`bench`](mod@bench)
//! (nccl-tests-compatible collective benchmarks and the self-checking
//! workload), [`doctor`] (finds the slow node, rank or link) and [`topo`]
//! (where every rank runs and which groups it belongs to).

#[doc(inline)]
pub use crate::{bench, doctor, topo};
