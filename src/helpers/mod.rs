//! Main-rank helpers (axolotl's `utils.distributed`) and the
//! shared-filesystem [`Workspace`] built on them. They are done so that a
//! failure on one rank is an error on every rank instead of a hang until a
//! timeout, and values keep their type (no float32 rounding).

mod workspace;

pub use workspace::{RankState, Workspace};

use crate::error::{Error, Result};
use crate::group::Runtime;
use crate::group::{AsGroup, GroupCoordinator};
use crate::object::Objects;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use std::fmt::Display;

/// Whether more than one rank takes part.
pub fn is_distributed(rt: &Runtime) -> bool {
    rt.size() > 1
}

/// Whether this is world rank 0 (true in a world of 1).
pub fn is_main_process(rt: &Runtime) -> bool {
    rt.rank() == 0
}

/// Whether this is the first rank on its node.
pub fn is_local_main_process(rt: &Runtime) -> bool {
    rt.world().me().local_rank == 0
}

/// Runs `f` on world rank 0 only and returns its value there (`None`
/// elsewhere): axolotl's `zero_only`. Not collective: nothing waits and
/// nothing is sent (use [`GroupCoordinator::main_only`] to share the value).
///
/// ```
/// # use rankmesh::prelude::*;
/// # let rt = rankmesh::Runtime::init()?;
/// let logged = rankmesh::helpers::zero_only(&rt, || "written once");
/// assert_eq!(logged.is_some(), rt.rank() == 0);
/// # Ok::<(), rankmesh::Error>(())
/// ```
pub fn zero_only<R>(rt: &Runtime, f: impl FnOnce() -> R) -> Option<R> {
    is_main_process(rt).then(f)
}

/// A function's result as it travels between ranks.
#[derive(Serialize, Deserialize)]
enum Outcome<T> {
    Ok(T),
    Failed(String),
}

impl<T> Outcome<T> {
    fn of<E: Display>(r: std::result::Result<T, E>) -> Self {
        r.map_or_else(|e| Outcome::Failed(e.to_string()), Outcome::Ok)
    }
}

/// Main-rank helpers on a group (axolotl's and ModelOpt's): run a function on
/// one rank first or only, and make its result or failure every rank's.
pub trait MainRank<'rt>: AsGroup<'rt> {
    /// Group rank 0 runs `f` first (e.g. to download or preprocess), then the
    /// others run theirs (axolotl's `zero_first`). If rank 0's `f` fails, every
    /// rank returns that error at once and the others never run `f`; a failure
    /// on any other rank is also returned everywhere.
    ///
    /// ```
    /// # use rankmesh::prelude::*;
    /// # let rt = rankmesh::Runtime::init()?;
    /// let world = rt.world_group()?;
    /// // Rank 0 fills the cache; the others then read it.
    /// let path = world.main_first(|| std::fs::create_dir_all(std::env::temp_dir().join("cache"))
    ///     .map(|_| std::env::temp_dir().join("cache")))?;
    /// assert!(path.is_dir());
    /// # Ok::<(), rankmesh::Error>(())
    /// ```
    fn main_first<R, E: Display>(
        &self,
        f: impl FnOnce() -> std::result::Result<R, E>,
    ) -> Result<R> {
        let g = self.as_group();
        first_then_rest(g, "main_first", g.is_first_rank(), f)
    }

    /// The ranks that pass `is_main` run `f` first, together; the others run
    /// theirs once every one of them has finished (axolotl's
    /// `zero_first(is_main)`). With [`is_local_main_process`] that is one rank
    /// per node first, e.g. to fill a node-local cache. A failure of a first
    /// runner is an error on every rank at once (the others never run `f`);
    /// a failure of any other rank is an error everywhere too.
    ///
    /// ```
    /// # use rankmesh::prelude::*;
    /// # let rt = rankmesh::Runtime::init()?;
    /// use rankmesh::helpers::is_local_main_process;
    /// let world = rt.world_group()?;
    /// let dir = std::env::temp_dir().join(format!("node-cache-{}", std::process::id()));
    /// world.zero_first(is_local_main_process(&rt), || std::fs::create_dir_all(&dir))?;
    /// # std::fs::remove_dir(&dir).ok();
    /// # Ok::<(), rankmesh::Error>(())
    /// ```
    fn zero_first<R, E: Display>(
        &self,
        is_main: bool,
        f: impl FnOnce() -> std::result::Result<R, E>,
    ) -> Result<R> {
        let g = self.as_group();
        first_then_rest(g, "zero_first", is_main, f)
    }

    /// Group rank `src` computes `f`; its value (or its error) reaches every
    /// rank (axolotl's `compute_and_broadcast(fn, rank)`). Any serde type,
    /// exactly (axolotl rounds through float32).
    ///
    /// ```
    /// # use rankmesh::prelude::*;
    /// # let rt = rankmesh::Runtime::init()?;
    /// let world = rt.world_group()?;
    /// let seed: u64 = world.compute_and_broadcast(|| Ok::<_, String>((1 << 53) + 1), 0)?;
    /// assert_eq!(seed, 9007199254740993); // exact, unlike a float32 round trip
    /// # Ok::<(), rankmesh::Error>(())
    /// ```
    fn compute_and_broadcast<T, E>(
        &self,
        f: impl FnOnce() -> std::result::Result<T, E>,
        src: usize,
    ) -> Result<T>
    where
        T: Serialize + DeserializeOwned + 'static,
        E: Display,
    {
        let g = self.as_group();
        let src = g.check_rank(crate::op::Op::BroadcastObject, "src", src)?;
        let outcome = (g.rank_in_group() == src).then(|| Outcome::of(f()));
        match g.broadcast_object(outcome.as_ref(), src)? {
            Outcome::Ok(v) => Ok(v),
            Outcome::Failed(msg) => Err(failed(g, "compute_and_broadcast", src, msg)),
        }
    }

    /// Group rank 0 computes `f`; the result reaches every rank (axolotl's
    /// `zero_only` with the value shared).
    ///
    /// ```
    /// # use rankmesh::prelude::*;
    /// # let rt = rankmesh::Runtime::init()?;
    /// let world = rt.world_group()?;
    /// let vocab: Vec<String> = world.main_only(|| Ok::<_, String>(vec!["<pad>".into(), "<eos>".into()]))?;
    /// assert_eq!(vocab.len(), 2);
    /// # Ok::<(), rankmesh::Error>(())
    /// ```
    fn main_only<T, E>(&self, f: impl FnOnce() -> std::result::Result<T, E>) -> Result<T>
    where
        T: Serialize + DeserializeOwned + 'static,
        E: Display,
    {
        let g = self.as_group();
        g.compute_and_broadcast(f, 0)
    }

    /// Every rank runs `f`; group rank `dst` gets all values in group-rank
    /// order (`Some`), the others `None`. A failure anywhere is an error everywhere.
    ///
    /// ```
    /// # use rankmesh::prelude::*;
    /// # let rt = rankmesh::Runtime::init()?;
    /// let world = rt.world_group()?;
    /// let losses = world.gather_from_all_ranks(|| Ok::<_, String>(0.25f64), 0)?;
    /// if world.is_first_rank() {
    ///     assert_eq!(losses.unwrap().len(), world.size());
    /// }
    /// # Ok::<(), rankmesh::Error>(())
    /// ```
    fn gather_from_all_ranks<T, E>(
        &self,
        f: impl FnOnce() -> std::result::Result<T, E>,
        dst: usize,
    ) -> Result<Option<Vec<T>>>
    where
        T: Serialize + DeserializeOwned + 'static,
        E: Display,
    {
        let g = self.as_group();
        let dst = g.check_rank(crate::op::Op::GatherObject, "dst", dst)?;
        let value = f();
        let mine = value.as_ref().err().map(|e| e.to_string());
        agree_on_failures(g, "gather_from_all_ranks", mine)?;
        let value = value
            .map_err(|e| failed(g, "gather_from_all_ranks", g.rank_in_group(), e.to_string()))?;
        g.gather_object(&value, dst)
    }

    /// Every rank runs `f1`; group rank 0 reduces the values with `f2`; the
    /// result reaches every rank.
    ///
    /// ```
    /// # use rankmesh::prelude::*;
    /// # let rt = rankmesh::Runtime::init()?;
    /// let world = rt.world_group()?;
    /// let tokens: u64 = world.reduce_and_broadcast(|| Ok::<_, String>(1000u64), |v| v.iter().sum())?;
    /// assert_eq!(tokens, 1000 * world.size() as u64);
    /// # Ok::<(), rankmesh::Error>(())
    /// ```
    fn reduce_and_broadcast<T, U, E>(
        &self,
        f1: impl FnOnce() -> std::result::Result<T, E>,
        f2: impl FnOnce(Vec<T>) -> U,
    ) -> Result<U>
    where
        T: Serialize + DeserializeOwned + 'static,
        U: Serialize + DeserializeOwned + 'static,
        E: Display,
    {
        let g = self.as_group();
        let gathered = g.gather_from_all_ranks(f1, 0)?;
        let reduced = gathered.map(f2);
        g.broadcast_object(reduced.as_ref(), 0)
    }
}

impl<'rt> MainRank<'rt> for GroupCoordinator<'rt> {}

fn failed(g: &GroupCoordinator<'_>, op: &'static str, rank: usize, msg: String) -> Error {
    Error::Failed {
        op,
        group: g.name().to_string(),
        rank,
        msg,
    }
}

/// Every rank learns whether `mine` failed anywhere; the first failure
/// (in group-rank order) becomes the error on all of them.
fn agree_on_failures(
    g: &GroupCoordinator<'_>,
    op: &'static str,
    mine: Option<String>,
) -> Result<()> {
    let all: Vec<Option<String>> = g.all_gather_object(&mine)?;
    match all
        .into_iter()
        .enumerate()
        .find_map(|(r, m)| m.map(|m| (r, m)))
    {
        Some((r, m)) => Err(failed(g, op, r, m)),
        None => Ok(()),
    }
}

/// The ranks with `first` run `f`, every rank learns of their failures,
/// then the others run theirs and every rank learns of those.
fn first_then_rest<R, E: Display>(
    g: &GroupCoordinator<'_>,
    op: &'static str,
    first: bool,
    f: impl FnOnce() -> std::result::Result<R, E>,
) -> Result<R> {
    let failure = |r: &std::result::Result<R, E>| r.as_ref().err().map(|e| e.to_string());
    let result = if first {
        let r = f();
        agree_on_failures(g, op, failure(&r))?;
        agree_on_failures(g, op, None)?;
        r
    } else {
        agree_on_failures(g, op, None)?;
        let r = f();
        agree_on_failures(g, op, failure(&r))?;
        r
    };
    result.map_err(|e| failed(g, op, g.rank_in_group(), e.to_string()))
}
