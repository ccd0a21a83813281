//! A shared-filesystem workspace (ModelOpt's `NFSWorkspace`), done safely.
//!
//! Each rank writes one file (its config and tensors); any rank reads any
//! other's. The run directory is private to the user (0700) and named after
//! the job plus a token drawn at creation, so concurrent jobs never collide.
//! Every file carries a header with the format version, the writer's rank,
//! the run token and a checksum: a truncated, corrupted or stale file is an
//! error, a missing one is `None`. Writes are atomic (temporary file, fsync,
//! rename, fsync of the directory), so a reader never sees half a file.
//!
//! Reads and writes are not collective (as in ModelOpt): synchronise with
//! `barrier` between writing and reading.
//!
//! The filesystem is not trusted either: reads follow no symlink
//! (`O_NOFOLLOW`), open only regular files (a FIFO or device is an error,
//! never a block), read no more than the file's size, and check every size
//! in the header with overflow-checked arithmetic. Temporary files left by
//! writers that died mid-write (same host, process gone) are removed by the
//! next write.

use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::group::Collectives;
use crate::group::GroupCoordinator;
use crate::helpers::MainRank;
use crate::object::Objects;
use crate::tensor::{checked_nbytes, Tensor};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fs;
use std::io::{Read, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use xxhash_rust::xxh3::{xxh3_128, xxh3_64};

const MAGIC: &[u8; 8] = b"RMWSPACE";
/// Version of the file format this build writes and reads.
pub const FORMAT_VERSION: u32 = 2;
const HEADER_BYTES: usize = 8 + 4 + 4 + 16 + 8 + 8 + 8;

/// What one rank stored.
#[derive(Clone, Debug, PartialEq)]
pub struct RankState {
    /// The rank's config, if it wrote one.
    pub config: Option<serde_json::Value>,
    /// The rank's tensors by name.
    pub tensors: BTreeMap<String, Tensor>,
}

/// Metadata stored before the raw tensor bytes.
#[derive(Serialize, Deserialize)]
struct Meta {
    config: Option<String>,
    tensors: Vec<(String, DType, Vec<usize>)>,
}

/// A per-run directory on a shared file system.
///
/// ```
/// # let rt = rankmesh::Runtime::init()?;
/// use rankmesh::{Collectives, Tensor, helpers::Workspace};
/// use std::collections::BTreeMap;
/// let world = rt.world_group()?;
/// let root = std::env::temp_dir().join(format!("rankmesh-doc-{}", std::process::id()));
/// let ws = Workspace::create(&root, &world)?;
/// let w = BTreeMap::from([("w".to_string(), Tensor::from_vec([2], vec![1f32, 2.0])?)]);
/// ws.write(Some(&serde_json::json!({"layer": 0})), &w)?;
/// world.barrier()?;
/// let state = ws.read(0)?.expect("rank 0 wrote");
/// assert_eq!(state.tensors, w);
/// ws.remove(&world)?;
/// # std::fs::remove_dir(&root).ok();
/// # Ok::<(), rankmesh::Error>(())
/// ```
#[derive(Clone, Debug)]
pub struct Workspace {
    dir: PathBuf,
    token: [u8; 16],
    rank: usize,
    size: usize,
}

fn io_err(path: &Path, what: &str, e: std::io::Error) -> Error {
    Error::Workspace {
        path: path.to_path_buf(),
        msg: format!("{what}: {e}"),
    }
}

/// `s` with every character but ASCII letters, digits and `-` made `_`
/// (safe in file names, and free of the `.` that separates their parts).
fn file_safe(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// The launcher's job identity, for readable directory names.
fn job_label() -> String {
    let id = ["SLURM_JOB_ID", "PMIX_NAMESPACE", "OMPI_MCA_orte_ess_jobid"]
        .iter()
        .find_map(|k| std::env::var(k).ok())
        .unwrap_or_else(|| "local".into());
    file_safe(&id)
}

/// This host's name as it appears in temporary file names.
fn host_label() -> String {
    file_safe(&mpi::environment::processor_name().unwrap_or_default())
}

/// A file's payload checksum: XXH3-64 (about 20 GB/s on the development
/// VM, docs/bench-log/; FNV-1a, one byte at a time, was the slowest step of
/// saving or loading a large file, and format version 1).
fn checksum(payload: &[u8]) -> u64 {
    xxh3_64(payload)
}

/// 128 bits from the OS's randomness: differ between runs, and no other
/// process can predict them (a clock-based name could be claimed first).
fn new_token(root: &Path) -> Result<[u8; 16]> {
    let mut t = [0u8; 16];
    getrandom::fill(&mut t).map_err(|e| Error::Workspace {
        path: root.to_path_buf(),
        msg: format!("no randomness from the OS for the run token: {e}"),
    })?;
    Ok(t)
}

impl Workspace {
    /// Collective over `group`: group rank 0 creates `root/rankmesh-{job}-{token}`
    /// (mode 0700, `root` created if missing) and every member gets its handle.
    pub fn create(root: impl AsRef<Path>, group: &GroupCoordinator<'_>) -> Result<Workspace> {
        let root = root.as_ref();
        let drawn = group.is_first_rank().then(|| new_token(root));
        let proposal = drawn.as_ref().and_then(|t| t.as_ref().ok()).map(|token| {
            let hex: String = token.iter().map(|b| format!("{b:02x}")).collect();
            (root.join(format!("rankmesh-{}-{hex}", job_label())), *token)
        });
        // Without a token rank 0 sends nothing: every member fails, and
        // rank 0 says why.
        let sent: Result<(PathBuf, [u8; 16])> = group.broadcast_object(proposal.as_ref(), 0);
        if let Some(Err(e)) = drawn {
            return Err(e);
        }
        let (dir, token) = sent?;
        Workspace::made_by_first(group, dir, token, |dir| {
            fs::create_dir_all(root)
                .map_err(|e| io_err(root, "cannot create the workspace root", e))?;
            fs::create_dir(dir).map_err(|e| io_err(dir, "cannot create the run directory", e))?;
            Ok(true)
        })
    }

    /// Collective over `group`: `dir` itself is the workspace (ModelOpt's
    /// `NFSWorkspace(workspace_path)`), created with mode 0700 if missing.
    /// Files already there are kept and the run token is derived from the
    /// path, so a later launch opening the same path reads what an earlier
    /// one wrote; [`clear`](Self::clear) starts afresh.
    pub fn at(dir: impl AsRef<Path>, group: &GroupCoordinator<'_>) -> Result<Workspace> {
        let dir = dir.as_ref();
        let dir: PathBuf =
            group.broadcast_object(group.is_first_rank().then_some(&dir.to_path_buf()), 0)?;
        let text = dir.to_string_lossy();
        let mut token = [0u8; 16];
        let derived = xxh3_128(format!("rankmesh-workspace/{text}").as_bytes());
        token.copy_from_slice(&derived.to_le_bytes());
        Workspace::made_by_first(group, dir, token, |dir| {
            if dir.is_dir() {
                return Ok(false);
            }
            fs::create_dir_all(dir).map_err(|e| io_err(dir, "cannot create the workspace", e))?;
            Ok(true)
        })
    }

    /// Group rank 0 runs `make` and makes `dir` private (0700) if `make`
    /// created it (an existing directory keeps its mode); then every other member checks that it sees it (a shared file
    /// system) and gets its handle. A failure anywhere is an error everywhere.
    fn made_by_first(
        group: &GroupCoordinator<'_>,
        dir: PathBuf,
        token: [u8; 16],
        make: impl FnOnce(&Path) -> Result<bool>,
    ) -> Result<Workspace> {
        group.main_first(|| -> Result<()> {
            if group.is_first_rank() {
                if make(&dir)? {
                    fs::set_permissions(&dir, fs::Permissions::from_mode(0o700))
                        .map_err(|e| io_err(&dir, "cannot make the workspace private", e))?;
                }
                Ok(())
            } else if !dir.is_dir() {
                Err(Error::Workspace {
                    path: dir.clone(),
                    msg: "the workspace directory is not visible here: is it on a shared file system?".into(),
                })
            } else {
                Ok(())
            }
        })?;
        Ok(Workspace {
            dir,
            token,
            rank: group.rank_in_group(),
            size: group.size(),
        })
    }

    /// Whether the workspace directory exists (ModelOpt's `is_initialized`):
    /// true from creation until [`remove`](Self::remove).
    pub fn is_initialized(&self) -> bool {
        self.dir.is_dir()
    }

    /// Removes this rank's file, if any (not collective).
    pub fn clear(&self) -> Result<()> {
        let path = self.file_of(self.rank);
        match fs::remove_file(&path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                Err(io_err(&path, "cannot remove", e))
            }
            _ => Ok(()),
        }
    }

    /// The run directory.
    pub fn path(&self) -> &Path {
        &self.dir
    }

    /// Path of group rank `rank`'s file.
    pub fn file_of(&self, rank: usize) -> PathBuf {
        self.dir.join(format!("rank-{rank:06}.rmws"))
    }

    /// Atomically replaces this rank's file with `config` and `tensors`.
    pub fn write(
        &self,
        config: Option<&serde_json::Value>,
        tensors: &BTreeMap<String, Tensor>,
    ) -> Result<()> {
        let meta = Meta {
            config: config.map(|c| c.to_string()),
            tensors: tensors
                .iter()
                .map(|(k, t)| (k.clone(), t.dtype(), t.shape().to_vec()))
                .collect(),
        };
        let mut payload = postcard::to_stdvec(&meta).map_err(|e| Error::Workspace {
            path: self.dir.clone(),
            msg: format!("cannot encode metadata: {e}"),
        })?;
        let meta_len = payload.len() as u64;
        for t in tensors.values() {
            payload.extend_from_slice(t.bytes());
        }
        let mut file = Vec::with_capacity(HEADER_BYTES + payload.len());
        file.extend_from_slice(MAGIC);
        file.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
        file.extend_from_slice(&(self.rank as u32).to_le_bytes());
        file.extend_from_slice(&self.token);
        file.extend_from_slice(&(payload.len() as u64).to_le_bytes());
        file.extend_from_slice(&meta_len.to_le_bytes());
        file.extend_from_slice(&checksum(&payload).to_le_bytes());
        file.extend_from_slice(&payload);

        let path = self.file_of(self.rank);
        self.sweep_dead_writers();
        let tmp = self.dir.join(format!(
            ".rank-{:06}.{}.{}.tmp",
            self.rank,
            host_label(),
            std::process::id()
        ));
        let written = (|| {
            let mut f = fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&tmp)
                .map_err(|e| io_err(&tmp, "cannot create", e))?;
            f.write_all(&file)
                .map_err(|e| io_err(&tmp, "cannot write", e))?;
            f.sync_all().map_err(|e| io_err(&tmp, "cannot sync", e))?;
            fs::rename(&tmp, &path).map_err(|e| io_err(&path, "cannot rename into place", e))
        })();
        if written.is_err() {
            let _ = fs::remove_file(&tmp);
        }
        written?;
        fs::File::open(&self.dir)
            .and_then(|d| d.sync_all())
            .map_err(|e| io_err(&self.dir, "cannot sync the directory", e))
    }

    /// Removes temporary files of writers on this host whose process is
    /// gone (killed mid-write); other hosts' files are theirs to sweep.
    fn sweep_dead_writers(&self) {
        let Ok(entries) = fs::read_dir(&self.dir) else {
            return;
        };
        let host = host_label();
        for e in entries.flatten() {
            let name = e.file_name();
            let Some(name) = name.to_str() else { continue };
            let Some(rest) = name
                .strip_prefix(".rank-")
                .and_then(|n| n.strip_suffix(".tmp"))
            else {
                continue;
            };
            let mut parts = rest.rsplitn(2, '.');
            let (Some(pid), Some(prefix)) = (parts.next(), parts.next()) else {
                continue;
            };
            let same_host = prefix.split_once('.').is_some_and(|(_, h)| h == host);
            let alive = pid
                .parse::<u32>()
                .is_ok_and(|p| Path::new(&format!("/proc/{p}")).exists());
            if same_host && !alive {
                let _ = fs::remove_file(e.path());
            }
        }
    }

    /// Group rank `rank`'s state: `None` if it wrote nothing, an error if the
    /// file is truncated, corrupt, from another run or another format.
    pub fn read(&self, rank: usize) -> Result<Option<RankState>> {
        if rank >= self.size {
            return Err(Error::Workspace {
                path: self.dir.clone(),
                msg: format!("rank {rank} is not in the group (size {})", self.size),
            });
        }
        let path = self.file_of(rank);
        // No symlink is followed and nothing but a regular file is read;
        // O_NONBLOCK keeps a FIFO planted here from blocking the open.
        let mut f = match fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
            .open(&path)
        {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) if e.raw_os_error() == Some(libc::ELOOP) => {
                return Err(io_err(&path, "refusing to follow a symbolic link", e))
            }
            Err(e) => return Err(io_err(&path, "cannot open", e)),
        };
        let meta = f.metadata().map_err(|e| io_err(&path, "cannot stat", e))?;
        if !meta.file_type().is_file() {
            return Err(Error::Workspace {
                path,
                msg: "not a regular file".into(),
            });
        }
        let len = usize::try_from(meta.len()).unwrap_or(usize::MAX);
        let mut header = [0u8; HEADER_BYTES];
        if len < HEADER_BYTES {
            return Err(Error::Workspace {
                path,
                msg: format!("truncated: {len} bytes, the header alone needs {HEADER_BYTES}"),
            });
        }
        f.read_exact(&mut header)
            .map_err(|e| io_err(&path, "cannot read", e))?;
        if &header[..8] != MAGIC {
            return Err(Error::Workspace {
                path,
                msg: "not a rankmesh workspace file (bad magic)".into(),
            });
        }
        // The header's payload length must match the file: nothing beyond
        // the file's own size is ever allocated or read.
        let claimed = u64::from_le_bytes(header[32..40].try_into().expect("8 bytes"));
        if claimed != (len - HEADER_BYTES) as u64 {
            return Err(Error::Workspace {
                path,
                msg: format!(
                    "truncated or padded: the header announces {claimed} payload bytes, the file holds {}",
                    len - HEADER_BYTES
                ),
            });
        }
        let mut bytes = Vec::new();
        bytes.try_reserve_exact(len).map_err(|e| Error::Workspace {
            path: path.clone(),
            msg: format!("cannot allocate {len} bytes: {e}"),
        })?;
        bytes.extend_from_slice(&header);
        (&mut f)
            .take((len - HEADER_BYTES) as u64)
            .read_to_end(&mut bytes)
            .map_err(|e| io_err(&path, "cannot read", e))?;
        self.decode(&path, rank, &bytes).map(Some)
    }

    fn decode(&self, path: &Path, rank: usize, bytes: &[u8]) -> Result<RankState> {
        let bad = |msg: String| Error::Workspace {
            path: path.to_path_buf(),
            msg,
        };
        if bytes.len() < HEADER_BYTES {
            return Err(bad(format!(
                "truncated: {} bytes, the header alone needs {HEADER_BYTES}",
                bytes.len()
            )));
        }
        let u32_at = |i: usize| u32::from_le_bytes(bytes[i..i + 4].try_into().expect("4 bytes"));
        let u64_at = |i: usize| u64::from_le_bytes(bytes[i..i + 8].try_into().expect("8 bytes"));
        if &bytes[..8] != MAGIC {
            return Err(bad("not a rankmesh workspace file (bad magic)".into()));
        }
        if u32_at(8) != FORMAT_VERSION {
            return Err(bad(format!(
                "format version {}, this build reads {FORMAT_VERSION}",
                u32_at(8)
            )));
        }
        if u32_at(12) as usize != rank {
            return Err(bad(format!(
                "written by group rank {}, expected {rank}",
                u32_at(12)
            )));
        }
        if bytes[16..32] != self.token {
            return Err(bad(
                "stale: written by another run of this workspace root".into()
            ));
        }
        let (len, meta_len, sum) = (u64_at(32), u64_at(40), u64_at(48));
        let payload = &bytes[HEADER_BYTES..];
        if payload.len() as u64 != len {
            return Err(bad(format!(
                "truncated: payload has {} of {len} bytes",
                payload.len()
            )));
        }
        if checksum(payload) != sum {
            return Err(bad("corrupt: checksum mismatch".into()));
        }
        let meta_len = usize::try_from(meta_len)
            .ok()
            .filter(|m| *m <= payload.len())
            .ok_or_else(|| bad(format!("metadata length {meta_len} runs past the payload")))?;
        let meta: Meta = crate::object::depth::from_postcard(&payload[..meta_len])
            .map_err(|e| bad(format!("corrupt metadata: {e}")))?;
        let config = meta
            .config
            .map(|c| serde_json::from_str(&c).map_err(|e| bad(format!("config is not JSON: {e}"))))
            .transpose()?;
        let mut offset = meta_len;
        let mut tensors = BTreeMap::new();
        for (name, dtype, shape) in meta.tensors {
            let n =
                checked_nbytes(&shape, dtype).map_err(|e| bad(format!("tensor {name:?}: {e}")))?;
            let data = offset
                .checked_add(n)
                .and_then(|end| payload.get(offset..end))
                .ok_or_else(|| bad(format!("tensor {name:?} runs past the end of the file")))?;
            tensors.insert(name, Tensor::from_bytes(shape, dtype, data)?);
            offset += n;
        }
        if offset != payload.len() {
            return Err(bad(format!(
                "{} unexpected bytes after the tensors",
                payload.len() - offset
            )));
        }
        Ok(RankState { config, tensors })
    }

    /// Collective over `group`: waits for every member, then removes the run directory.
    pub fn remove(self, group: &GroupCoordinator<'_>) -> Result<()> {
        group.barrier()?;
        group.main_only(|| {
            fs::remove_dir_all(&self.dir).map_err(|e| io_err(&self.dir, "cannot remove", e))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Run tokens drawn back to back are all different, and no part of them
    /// rises with the clock (the old tokens began with the time in ns).
    #[test]
    fn run_tokens_come_from_the_os_not_the_clock() {
        let tokens: Vec<[u8; 16]> = (0..32)
            .map(|_| new_token(Path::new("/tmp")).unwrap())
            .collect();
        let distinct: std::collections::BTreeSet<_> = tokens.iter().collect();
        assert_eq!(distinct.len(), tokens.len());
        for half in [0..8, 8..16] {
            let words: Vec<u64> = tokens
                .iter()
                .map(|t| u64::from_le_bytes(t[half.clone()].try_into().unwrap()))
                .collect();
            assert!(
                words.windows(2).any(|w| w[0] > w[1]),
                "bytes {half:?} only rise"
            );
        }
    }
}
