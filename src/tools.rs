//! The tools behind the `rankmesh` CLI, as a library. They are
//! [`bench`](mod@bench) (nccl-tests-compatible collective benchmarks and the
//! self-checking workload), [`doctor`] (finds the slow node, rank or link)
//! and [`topo`] (where every rank runs and which groups it belongs to).

pub mod bench {
    //! `rankmesh bench`: nccl-tests-compatible collective benchmarks on the
    //! host and device planes, with raw-library baselines, the
    //! self-checking workload and the plots.
    #[doc(inline)]
    pub use crate::bench::*;
}

pub mod doctor {
    //! `rankmesh doctor`: which node, rank or link of the job is slow.
    #[doc(inline)]
    pub use crate::doctor::*;
}

pub mod topo {
    //! `rankmesh topo`: where every rank runs and which groups it belongs to.
    #[doc(inline)]
    pub use crate::topo::*;
}
