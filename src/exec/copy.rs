//! Byte copies on the host data paths.
//!
//! glibc copies mid-sized blocks (a few KiB up to about 1 MiB) with
//! `rep movsb`, which on some CPUs runs an order of magnitude slower when
//! source and destination sit at different offsets within a cache line: on
//! an AMD Zen 3 host, 256 KiB took 90–100 µs (2.7 GB/s) with the
//! destination 4, 16 or 24 bytes off the source's alignment, against 7 µs
//! with both aligned or with a plain AVX loop at any offset. A buffer from
//! `malloc` (16 bytes past a page) against a page-aligned shared window is
//! that case on every call. Elsewhere `memcpy` is the faster of the two:
//! on an AMD Zen 5 host it copied 64 KiB into the window 1.35× faster than
//! the loop, and the host collectives of 64 KiB–4 MiB ran 1.1–1.7× faster
//! with it (docs/bench-log/2026-11-27-to-29.md, "Copies that disagree
//! within a line"). So each process times both once
//! ([`misaligned_by_memcpy`]) and copies whose ends disagree within a line
//! take the faster, but for a streamed broadcast's, which keep the loop
//! ([`copy_by_loop`]).

use crate::parse::parse_whole_size;

/// Shorter copies stay with `memcpy`: below its `rep movsb` threshold
/// (docs/BENCHMARKS.md, "Tuned constants").
const LOOP_FROM: usize = 1024;

/// `dst.copy_from_slice(src)`; when the two are not equally aligned within
/// a cache line, by the faster of `memcpy` and the vector loop as timed at
/// start-up ([`misaligned_by_memcpy`]). Panics if the lengths differ.
pub(crate) fn copy_bytes(dst: &mut [u8], src: &[u8]) {
    assert_eq!(dst.len(), src.len(), "copy between slices of one length");
    #[cfg(target_arch = "x86_64")]
    if src.len() >= LOOP_FROM
        && (dst.as_ptr() as usize ^ src.as_ptr() as usize) & 63 != 0
        && !misaligned_by_memcpy()
    {
        // SAFETY: only true where AVX is present; lengths are equal.
        unsafe { copy_avx(dst, src) };
        return;
    }
    dst.copy_from_slice(src);
}

/// [`copy_bytes`], but by the vector loop whenever the ends disagree
/// within a line (and AVX is there), whatever [`misaligned_by_memcpy`]
/// found: for a streamed broadcast, where `rep movsb` fell into a mode
/// 2.4× slower in most runs at 2-8 MiB on the host where `memcpy` won the
/// start-up timing (the root writing slots while its reader copies the
/// ones before).
pub(crate) fn copy_by_loop(dst: &mut [u8], src: &[u8]) {
    assert_eq!(dst.len(), src.len(), "copy between slices of one length");
    #[cfg(target_arch = "x86_64")]
    if src.len() >= LOOP_FROM
        && (dst.as_ptr() as usize ^ src.as_ptr() as usize) & 63 != 0
        && std::arch::is_x86_feature_detected!("avx")
    {
        // SAFETY: AVX is present (checked just above); lengths are equal.
        unsafe { copy_avx(dst, src) };
        return;
    }
    dst.copy_from_slice(src);
}

/// Whether copies whose ends disagree within a cache line keep `memcpy`
/// on this CPU: timed against the vector loop the first time it is asked
/// (about 50 µs; the runtime asks at start-up, before any call). Always
/// true without AVX.
pub(crate) fn misaligned_by_memcpy() -> bool {
    static BY_MEMCPY: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *BY_MEMCPY.get_or_init(memcpy_keeps_up)
}

/// Times 64 KiB copies (above glibc's `rep movsb` threshold, inside L2)
/// both ways between a line-aligned buffer and one 16 bytes past a line,
/// by `memcpy` and by the vector loop, alternating; true when `memcpy`'s
/// fastest round is no slower than the loop's. The rounds' minima: a
/// round that lost the core to another process only loses its turn.
fn memcpy_keeps_up() -> bool {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx") {
        const N: usize = 64 << 10;
        let a = vec![1u8; N + 128];
        let mut b = vec![2u8; N + 128];
        let (pa, pb) = (a.as_ptr().align_offset(64), b.as_ptr().align_offset(64));
        let mut round = |by_memcpy: bool| {
            let t = std::time::Instant::now();
            for (from, to) in [(16, 0), (0, 16)] {
                let src = &a[pa + from..][..N];
                let dst = &mut b[pb + to..][..N];
                match by_memcpy {
                    true => dst.copy_from_slice(src),
                    // SAFETY: AVX is present (checked above); equal lengths.
                    false => unsafe { copy_avx(dst, src) },
                }
                std::hint::black_box(dst);
            }
            t.elapsed()
        };
        let (mut by_memcpy, mut by_loop) = (std::time::Duration::MAX, std::time::Duration::MAX);
        for i in 0..9 {
            let (m, l) = (round(true), round(false));
            if i > 0 {
                (by_memcpy, by_loop) = (by_memcpy.min(m), by_loop.min(l));
            }
        }
        return by_memcpy <= by_loop;
    }
    true
}

/// The whole 128-byte steps of `src[from..]` into `dst[from..]`, each as
/// four unaligned 32-byte loads, then four stores (not a load/store pair
/// per step, so the loop is not turned back into a `memcpy` call);
/// streaming stores when `STREAM` (then `dst + from` must be 32-aligned).
/// Returns where the steps end.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx")]
unsafe fn avx_steps<const STREAM: bool>(dst: &mut [u8], src: &[u8], from: usize) -> usize {
    use std::arch::x86_64::{
        __m256i, _mm256_loadu_si256, _mm256_storeu_si256, _mm256_stream_si256,
    };
    let end = from + (src.len() - from) / 128 * 128;
    let (s, d) = (src.as_ptr(), dst.as_mut_ptr());
    for i in (from..end).step_by(128) {
        // SAFETY: i + 128 <= end <= both lengths; loads are unaligned, and
        // streamed stores land 32-aligned (the caller's promise).
        unsafe {
            let v = [0, 32, 64, 96].map(|k| _mm256_loadu_si256(s.add(i + k) as *const __m256i));
            for (k, x) in [0, 32, 64, 96].into_iter().zip(v) {
                let at = d.add(i + k) as *mut __m256i;
                if STREAM {
                    _mm256_stream_si256(at, x);
                } else {
                    _mm256_storeu_si256(at, x);
                }
            }
        }
    }
    end
}

/// [`avx_steps`] from the start, the tail by `memcpy`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx")]
unsafe fn copy_avx(dst: &mut [u8], src: &[u8]) {
    // SAFETY: AVX is enabled here; plain stores need no alignment.
    let end = unsafe { avx_steps::<false>(dst, src, 0) };
    dst[end..].copy_from_slice(&src[end..]);
}

/// `dst.copy_from_slice(src)` with non-temporal stores: for a destination
/// that will not be read again before the cache has turned over (the
/// output of a call larger than the last-level cache), it skips the read
/// of every destination line that a plain store makes first, a third of
/// such a copy's memory traffic. Falls back to [`copy_bytes`] without AVX.
pub(crate) fn stream_bytes(dst: &mut [u8], src: &[u8]) {
    assert_eq!(dst.len(), src.len(), "copy between slices of one length");
    #[cfg(target_arch = "x86_64")]
    if src.len() >= LOOP_FROM && std::arch::is_x86_feature_detected!("avx") {
        // SAFETY: AVX is present (checked just above); lengths are equal.
        unsafe { stream_avx(dst, src) };
        return;
    }
    copy_bytes(dst, src);
}

/// Aligns the destination to 32 bytes, streams whole 128-byte steps, copies
/// the tail, and fences: streaming stores are not ordered by the release
/// store that later publishes a step, nor by the caller's synchronisation.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx")]
unsafe fn stream_avx(dst: &mut [u8], src: &[u8]) {
    let head = dst.as_ptr().align_offset(32).min(dst.len());
    dst[..head].copy_from_slice(&src[..head]);
    // SAFETY: AVX is enabled here; dst + head is 32-aligned (or the end).
    let end = unsafe { avx_steps::<true>(dst, src, head) };
    dst[end..].copy_from_slice(&src[end..]);
    std::arch::x86_64::_mm_sfence();
}

/// Bytes of the last-level cache of the CPU this thread runs on (the
/// highest cache level sysfs lists for it), or 32 MiB where sysfs says
/// nothing. Read once. `sysconf(_SC_LEVEL3_CACHE_SIZE)` is not used: on
/// the AMD guest that set the shared-memory executor's streaming threshold it
/// says 384 MiB, the whole socket's, where the two CPUs share 32 MiB.
pub(crate) fn last_level_cache() -> usize {
    static LLC: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *LLC.get_or_init(|| {
        // SAFETY: no arguments; returns -1 where unsupported.
        let cpu = unsafe { libc::sched_getcpu() }.max(0);
        cache_from_sysfs(&format!("/sys/devices/system/cpu/cpu{cpu}/cache")).unwrap_or(32 << 20)
    })
}

/// The size of the highest-level data or unified cache under `dir`
/// (sysfs's `index*/{level,type,size}`).
fn cache_from_sysfs(dir: &str) -> Option<usize> {
    let read = |p: std::path::PathBuf| std::fs::read_to_string(p).ok();
    std::fs::read_dir(dir)
        .ok()?
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("index"))
        .filter_map(|e| {
            let path = e.path();
            let kind = read(path.join("type"))?;
            if kind.trim() == "Instruction" {
                return None;
            }
            let level: u32 = read(path.join("level"))?.trim().parse().ok()?;
            // sysfs writes `32768K`: powers of 1024, as nccl-tests' sizes.
            let bytes = parse_whole_size(&read(path.join("size"))?).filter(|b| *b > 0)?;
            Some((level, bytes as usize))
        })
        .max()
        .map(|(_, bytes)| bytes)
}

/// `flat` cut into consecutive pieces of `lens` bytes, each its own vector
/// (the object gathers' result, one value per rank).
pub(crate) fn split_lens(flat: &[u8], lens: &[usize]) -> Vec<Vec<u8>> {
    let mut at = 0;
    lens.iter()
        .map(|n| {
            at += n;
            flat[at - n..at].to_vec()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::{cache_from_sysfs, copy_by_loop, copy_bytes, last_level_cache, stream_bytes};

    #[test]
    fn the_last_level_is_the_highest_non_instruction_cache() {
        let dir = std::env::temp_dir().join(format!("rankmesh-cache-{}", std::process::id()));
        for (i, level, kind, size) in [
            (0, 1, "Data", "48K"),
            (1, 1, "Instruction", "32K"),
            (2, 2, "Unified", "1M"),
            (3, 3, "Unified", "32768K"),
            (4, 4, "Instruction", "99M"),
            (5, 5, "Unified", "0K"),
        ] {
            let d = dir.join(format!("index{i}"));
            std::fs::create_dir_all(&d).unwrap();
            std::fs::write(d.join("level"), format!("{level}\n")).unwrap();
            std::fs::write(d.join("type"), format!("{kind}\n")).unwrap();
            std::fs::write(d.join("size"), format!("{size}\n")).unwrap();
        }
        // Level 5's "0K" is no cache; level 4 holds instructions.
        assert_eq!(cache_from_sysfs(dir.to_str().unwrap()), Some(32 << 20));
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(cache_from_sysfs("/nonexistent/cache"), None);
        assert!(last_level_cache() >= 1 << 20);
    }

    #[test]
    fn copies_every_length_at_every_relative_offset() {
        let src: Vec<u8> = (0..5000u32).map(|i| (i * 7 + 3) as u8).collect();
        for off in [0, 1, 16, 33, 64] {
            for len in [0, 1, 127, 1023, 1024, 1025, 1151, 4096, 4999 - off] {
                for copy in [copy_bytes, stream_bytes, copy_by_loop] {
                    let mut dst = vec![0u8; len + off + 1];
                    copy(&mut dst[off..off + len], &src[1..1 + len]);
                    assert_eq!(
                        &dst[off..off + len],
                        &src[1..1 + len],
                        "off {off} len {len}"
                    );
                    assert!(dst[..off].iter().all(|b| *b == 0) && dst[off + len] == 0);
                }
            }
        }
    }
}
