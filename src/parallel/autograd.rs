//! Backward rules of the differentiable collectives, for Rust autodiff
//! frameworks to wire into their graphs.
//!
//! Viewing a collective as a linear map `A` on the concatenation of every
//! rank's tensor, the gradient is `Aᵀ`: all_gather ↔ reduce_scatter(sum),
//! all_reduce(sum) ↔ all_reduce(sum), all_to_all_4d(a, b) ↔ all_to_all_4d(b, a).

use crate::error::Result;
use crate::group::Collectives;
use crate::op::ReduceOp;

/// A differentiable (linear) collective.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Differentiable {
    /// `all_reduce` with `Sum`; its own adjoint.
    AllReduceSum,
    /// `all_gather(dim)`; adjoint `reduce_scatter(dim, Sum)`.
    AllGather {
        /// Concatenation dim.
        dim: isize,
    },
    /// `reduce_scatter(dim, Sum)`; adjoint `all_gather(dim)`.
    ReduceScatterSum {
        /// Scattered dim.
        dim: isize,
    },
    /// `all_to_all_4d(scatter_dim, gather_dim)`; adjoint with the dims swapped.
    AllToAll4d {
        /// Dimension split across ranks.
        scatter_dim: usize,
        /// Dimension assembled from ranks.
        gather_dim: usize,
    },
}

impl Differentiable {
    /// The collective whose application is the gradient of this one.
    pub fn adjoint(self) -> Differentiable {
        match self {
            Differentiable::AllReduceSum => Differentiable::AllReduceSum,
            Differentiable::AllGather { dim } => Differentiable::ReduceScatterSum { dim },
            Differentiable::ReduceScatterSum { dim } => Differentiable::AllGather { dim },
            Differentiable::AllToAll4d {
                scatter_dim,
                gather_dim,
            } => Differentiable::AllToAll4d {
                scatter_dim: gather_dim,
                gather_dim: scatter_dim,
            },
        }
    }

    /// Applies the collective on any data plane (host group or device group).
    pub fn forward<'rt, C: Collectives<'rt>>(self, c: &C, x: &C::Tensor) -> Result<C::Tensor> {
        match self {
            Differentiable::AllReduceSum => c.all_reduce(x, ReduceOp::Sum),
            Differentiable::AllGather { dim } => c.all_gather(x, dim),
            Differentiable::ReduceScatterSum { dim } => c.reduce_scatter(x, dim, ReduceOp::Sum),
            Differentiable::AllToAll4d {
                scatter_dim,
                gather_dim,
            } => c.all_to_all_4d(x, scatter_dim, gather_dim),
        }
    }

    /// Gradient with respect to the input, given the gradient of the output.
    pub fn backward<'rt, C: Collectives<'rt>>(
        self,
        c: &C,
        grad_output: &C::Tensor,
    ) -> Result<C::Tensor> {
        self.adjoint().forward(c, grad_output)
    }
}
