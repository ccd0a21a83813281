//! The host plane of `rankmesh bench`: tensors stay in host memory, and the
//! baseline is the same data movement as direct MPI calls.

use super::entries::Split;
use super::{baseline, BenchConfig, BenchPlane};
use crate::error::{Error, Result};
use crate::group::GroupCoordinator;
use crate::object::Objects;
use crate::tensor::{HostData, Tensor};

/// The host plane of a group.
pub(super) struct HostBench<'g, 'rt>(pub &'g GroupCoordinator<'rt>);

impl<'rt> BenchPlane<'rt> for HostBench<'_, 'rt> {
    type C = GroupCoordinator<'rt>;

    fn coll(&self) -> &GroupCoordinator<'rt> {
        self.0
    }

    /// A copy with half a page of slack: consecutive buffers then start at
    /// different page offsets, as device allocations do (see
    /// `Tensor::copy_with_slack`), so the numbers do not depend on where
    /// malloc happened to put them.
    fn upload(&self, t: &Tensor) -> Result<Tensor> {
        Ok(t.copy_with_slack(2048 + 64))
    }

    fn upload_into(&self, t: &Tensor, d: &mut Tensor) -> Result<()> {
        d.bytes_mut().copy_from_slice(t.bytes());
        Ok(())
    }

    fn download(&self, d: &Tensor) -> Result<Tensor> {
        Ok(d.clone())
    }

    fn settle(&self) -> Result<()> {
        Ok(())
    }

    fn baseline(
        &self,
        cfg: &BenchConfig,
        input: &Tensor,
        output: &mut Tensor,
        split: &Split,
    ) -> Result<bool> {
        baseline::host(cfg, self.0.raw_comm(), input, output, split)
    }

    /// `broadcast_object`: the typed object broadcast of the output's
    /// bytes, as a `Vec<u8>` received in place (`broadcast_object_into`:
    /// the same buffers every iteration, as nccl-tests reuses its own).
    fn run_other(&self, cfg: &BenchConfig, _input: &Tensor, output: &mut Tensor) -> Result<()> {
        let group = &self.0;
        output
            .with_owned_data(|data| match data {
                HostData::U8(bytes) => Some(group.broadcast_object_into(bytes, cfg.root)),
                _ => None,
            })
            .flatten()
            .unwrap_or_else(|| {
                Err(Error::Usage {
                    what: "bench broadcast_object",
                    group: group.name().to_string(),
                    msg: "it moves bytes: use -d uint8".into(),
                })
            })
    }
}
