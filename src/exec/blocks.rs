//! Where the blocks of a block exchange lie in a buffer: equal strided
//! blocks ([`BlockLayout`]), uneven contiguous ones ([`Spans`]), or
//! sub-blocks anywhere ([`Gathered`], a node's share of a group's blocks).
//! Every executor reads and writes blocks through [`Blocks`], so one
//! exchange serves alltoall, all_to_all_4d's strided blocks and the uneven
//! ops alike.

use super::copy::copy_bytes;
use std::ops::Range;

/// A byte copy between slices of one length: plain or streaming stores.
pub(crate) type Copier = fn(&mut [u8], &[u8]);

/// Where one rank's block of an all-to-all lies in a buffer: `count` runs of
/// `run` bytes, `stride` bytes apart, and the next rank's block `extent`
/// bytes further on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct BlockLayout {
    pub count: usize,
    pub run: usize,
    pub stride: usize,
    pub extent: usize,
}

impl BlockLayout {
    /// Block `r` of `parts` along `dim` of a row-major tensor of `shape`
    /// with `elem`-byte elements.
    pub(crate) fn along(shape: &[usize], dim: usize, parts: usize, elem: usize) -> BlockLayout {
        let outer: usize = shape[..dim].iter().product();
        let inner: usize = shape[dim + 1..].iter().product::<usize>() * elem;
        let run = shape[dim] / parts * inner;
        BlockLayout {
            count: outer,
            run,
            stride: shape[dim] * inner,
            extent: run,
        }
    }
}

/// Where the blocks of an all-to-all lie in one rank's buffer: equal
/// blocks laid out by a [`BlockLayout`], or uneven contiguous [`Spans`].
/// Generic, not an enum, so the equal case compiles as it did alone.
pub(crate) trait Blocks: Copy {
    /// Bytes of block `r`.
    fn len(&self, r: usize) -> usize;

    /// Where block `r` starts in the buffer. Relative to it, a block's runs
    /// lie alike on every rank: equal layouts are the same everywhere, and
    /// spans are contiguous.
    fn start(&self, r: usize) -> usize;

    /// The runs of bytes `off..off + len` of block `r`: `(position in the
    /// buffer, position in the range, length)`.
    fn runs(&self, r: usize, off: usize, len: usize)
        -> impl Iterator<Item = (usize, usize, usize)>;

    /// Bytes `off..off + dst.len()` of block `r` of `buf` into `dst`.
    #[inline(always)]
    fn read(&self, buf: &[u8], r: usize, off: usize, dst: &mut [u8]) {
        for (at, to, len) in self.runs(r, off, dst.len()) {
            copy_bytes(&mut dst[to..to + len], &buf[at..at + len]);
        }
    }

    /// `src` into bytes `off..off + src.len()` of block `r` of `buf`.
    #[inline(always)]
    fn write(&self, buf: &mut [u8], r: usize, off: usize, src: &[u8]) {
        self.write_by(copy_bytes, buf, r, off, src);
    }

    /// [`Self::write`] by `copy`: [`stream_bytes`](super::copy::stream_bytes)
    /// for an output larger than the cache.
    #[inline(always)]
    fn write_by(&self, copy: Copier, buf: &mut [u8], r: usize, off: usize, src: &[u8]) {
        for (at, from, len) in self.runs(r, off, src.len()) {
            copy(&mut buf[at..at + len], &src[from..from + len]);
        }
    }

    /// Bytes `off..off + len` of block `r` of `src` (laid out by `self`)
    /// into the same bytes of block `at` of `dst` (laid out by `to`), with
    /// no copy between.
    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    fn copy_to<B: Blocks>(
        &self,
        src: &[u8],
        r: usize,
        to: B,
        dst: &mut [u8],
        at: usize,
        off: usize,
        len: usize,
    ) {
        self.copy_to_by(copy_bytes, src, r, (to, dst, at), off, len);
    }

    /// [`Self::copy_to`] by `copy` (as [`Self::write_by`]).
    #[inline(always)]
    fn copy_to_by<B: Blocks>(
        &self,
        copy: Copier,
        src: &[u8],
        r: usize,
        (to, dst, at): (B, &mut [u8], usize),
        off: usize,
        len: usize,
    ) {
        for (from, pos, run) in self.runs(r, off, len) {
            to.write_by(copy, dst, at, off + pos, &src[from..from + run]);
        }
    }
}

impl Blocks for BlockLayout {
    #[inline(always)]
    fn len(&self, _: usize) -> usize {
        self.count * self.run
    }

    #[inline(always)]
    fn start(&self, r: usize) -> usize {
        r * self.extent
    }

    #[inline(always)]
    fn runs(
        &self,
        r: usize,
        off: usize,
        len: usize,
    ) -> impl Iterator<Item = (usize, usize, usize)> {
        let l = *self;
        unit_runs(off, len, l.run, move |row| r * l.extent + row * l.stride)
    }
}

/// The runs of bytes `off..off + len` of a block made of `unit`-byte
/// pieces, piece `k` starting at `place(k)` in the buffer: `(position in
/// the buffer, position in the range, length)`.
#[inline(always)]
fn unit_runs(
    off: usize,
    len: usize,
    unit: usize,
    place: impl Fn(usize) -> usize,
) -> impl Iterator<Item = (usize, usize, usize)> {
    let mut done = 0;
    std::iter::from_fn(move || {
        (done < len).then(|| {
            let pos = off + done;
            let (k, col) = (pos / unit, pos % unit);
            let run = (unit - col).min(len - done);
            let item = (place(k) + col, done, run);
            done += run;
            item
        })
    })
}

/// Uneven contiguous blocks: block `r` is the bytes `self.0[r]`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Spans<'a>(pub &'a [Range<usize>]);

impl Blocks for Spans<'_> {
    #[inline(always)]
    fn len(&self, r: usize) -> usize {
        self.0[r].len()
    }

    #[inline(always)]
    fn start(&self, r: usize) -> usize {
        self.0[r].start
    }

    #[inline(always)]
    fn runs(
        &self,
        r: usize,
        off: usize,
        len: usize,
    ) -> impl Iterator<Item = (usize, usize, usize)> {
        (len > 0)
            .then(|| (self.0[r].start + off, 0, len))
            .into_iter()
    }
}

/// Blocks made of equal sub-blocks placed anywhere: block `r` is the
/// `per` sub-blocks of `sub` bytes at indices `order[r * per..][..per]`
/// (a node's share of a group's blocks, in the group's order).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Gathered<'a> {
    pub sub: usize,
    pub per: usize,
    pub order: &'a [usize],
}

impl Blocks for Gathered<'_> {
    #[inline(always)]
    fn len(&self, _: usize) -> usize {
        self.per * self.sub
    }

    #[inline(always)]
    fn start(&self, r: usize) -> usize {
        self.order[r * self.per] * self.sub
    }

    fn runs(
        &self,
        r: usize,
        off: usize,
        len: usize,
    ) -> impl Iterator<Item = (usize, usize, usize)> {
        let g = *self;
        unit_runs(off, len, g.sub, move |k| g.order[r * g.per + k] * g.sub)
    }
}

#[cfg(test)]
mod tests {
    use super::{BlockLayout, Blocks};

    #[test]
    fn gathered_blocks_take_their_sub_blocks_in_order() {
        // Sub-blocks of 3 bytes; block 0 is sub-blocks 2 and 0, block 1 is 1 and 3.
        let g = super::Gathered {
            sub: 3,
            per: 2,
            order: &[2, 0, 1, 3],
        };
        let runs: Vec<_> = g.runs(0, 1, 4).collect();
        assert_eq!(runs, [(7, 0, 2), (0, 2, 2)]);
        let buf: Vec<u8> = (0..12).collect();
        let mut got = [0u8; 6];
        g.read(&buf, 1, 0, &mut got);
        assert_eq!(got, [3, 4, 5, 9, 10, 11]);
    }

    #[test]
    fn block_layouts_follow_the_dim() {
        // [B=2, S=3, H=4, D=5] f32, 2 parts along H: 6 runs of 2·5·4 bytes, 80 apart.
        let l = BlockLayout::along(&[2, 3, 4, 5], 2, 2, 4);
        assert_eq!((l.count, l.run, l.stride, l.extent), (6, 40, 80, 40));
        // Along the first dim a block is one contiguous run.
        let l = BlockLayout::along(&[4, 3], 0, 2, 8);
        assert_eq!((l.count, l.run, l.stride, l.extent), (1, 48, 96, 48));
    }
}
