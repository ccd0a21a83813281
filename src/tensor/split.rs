//! Index math shared by the data planes: moving blocks along one dimension of a
//! row-major tensor. Byte-level and dtype-agnostic so the host plane and a device
//! plane's pack/unpack kernels agree on one definition.
//!
//! `split_dim` and `concat_dim_into` are inverses: `split_dim` lays the `parts` equal
//! slices along `dim` out as contiguous blocks (slice `p` is block `p`);
//! `concat_dim_into` takes contiguous blocks and concatenates them along `dim`.

/// (outer count, bytes of one `dim`-slice row below `dim`) for a shape.
fn outer_inner(shape: &[usize], dim: usize, elem: usize) -> (usize, usize) {
    let outer: usize = shape[..dim].iter().product();
    let inner: usize = shape[dim + 1..].iter().product::<usize>() * elem;
    (outer, inner)
}

/// One strided 2-D byte copy: `height` rows of `width` bytes, row `i` read at
/// `src_offset + i·src_pitch` and written at `dst_offset + i·dst_pitch`.
///
/// Both planes execute the same copies: the host with `copy_from_slice`
/// ([`Copy2d::apply`]), the device with `cuMemcpy2DAsync`. So the pack/unpack
/// around `all_to_all_4d`, `all_gather` and `reduce_scatter` has one definition.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Copy2d {
    /// First byte read.
    pub src_offset: usize,
    /// First byte written.
    pub dst_offset: usize,
    /// Bytes per row.
    pub width: usize,
    /// Number of rows.
    pub height: usize,
    /// Distance between rows in the source.
    pub src_pitch: usize,
    /// Distance between rows in the destination.
    pub dst_pitch: usize,
}

impl Copy2d {
    /// A plain copy of `len` contiguous bytes (one row).
    pub fn bytes(src_offset: usize, dst_offset: usize, len: usize) -> Copy2d {
        Copy2d {
            src_offset,
            dst_offset,
            width: len,
            height: 1,
            src_pitch: len,
            dst_pitch: len,
        }
    }

    /// The copy back: what it wrote is read, and written where it was read
    /// (the unpack of a pack, as `reduce_scatter_v` packs by the gather's plan).
    pub fn reversed(&self) -> Copy2d {
        Copy2d {
            src_offset: self.dst_offset,
            dst_offset: self.src_offset,
            src_pitch: self.dst_pitch,
            dst_pitch: self.src_pitch,
            ..*self
        }
    }

    /// Runs the copy on host memory.
    pub fn apply(&self, src: &[u8], dst: &mut [u8]) {
        for row in 0..self.height {
            let from = self.src_offset + row * self.src_pitch;
            let to = self.dst_offset + row * self.dst_pitch;
            dst[to..to + self.width].copy_from_slice(&src[from..from + self.width]);
        }
    }
}

/// The copies that pack a tensor of `shape` into `parts` contiguous blocks
/// along `dim` (one copy per block); see [`split_dim`].
pub fn split_dim_copies(shape: &[usize], dim: usize, parts: usize, elem: usize) -> Vec<Copy2d> {
    let (outer, inner) = outer_inner(shape, dim, elem);
    let chunk = shape[dim] / parts * inner;
    let row = shape[dim] * inner;
    (0..parts)
        .map(|p| Copy2d {
            src_offset: p * chunk,
            dst_offset: p * outer * chunk,
            width: chunk,
            height: outer,
            src_pitch: row,
            dst_pitch: chunk,
        })
        .collect()
}

/// The copies that concatenate `parts` contiguous blocks of `block_shape`
/// along `dim` (one copy per block); see [`concat_dim_into`].
pub fn concat_dim_copies(
    block_shape: &[usize],
    dim: usize,
    parts: usize,
    elem: usize,
) -> Vec<Copy2d> {
    concat_uneven_copies(block_shape, dim, &vec![block_shape[dim]; parts], elem)
}

/// The copies that concatenate contiguous blocks along `dim`, block `p`
/// having `counts[p]` slices there and `shape`'s other dims (one copy per
/// block): the unpack of an all-gather with uneven counts.
pub fn concat_uneven_copies(
    shape: &[usize],
    dim: usize,
    counts: &[usize],
    elem: usize,
) -> Vec<Copy2d> {
    let (outer, inner) = outer_inner(shape, dim, elem);
    let row = counts.iter().sum::<usize>() * inner;
    let mut at = (0, 0);
    counts
        .iter()
        .map(|n| {
            let width = n * inner;
            let copy = Copy2d {
                src_offset: at.0,
                dst_offset: at.1,
                width,
                height: outer,
                src_pitch: width,
                dst_pitch: row,
            };
            at = (at.0 + width * outer, at.1 + width);
            copy
        })
        .collect()
}

/// Packs `src` (shape `shape`) into `parts` contiguous blocks, block `p` holding
/// indices `[p·n/parts, (p+1)·n/parts)` of dimension `dim` (`n = shape[dim]`).
/// The caller guarantees `parts` divides `shape[dim]`.
pub fn split_dim(src: &[u8], shape: &[usize], dim: usize, parts: usize, elem: usize) -> Vec<u8> {
    let mut out = vec![0u8; src.len()];
    split_dim_into(src, shape, dim, parts, elem, &mut out);
    out
}

/// [`split_dim`] into a caller's buffer of `src.len()` bytes.
pub fn split_dim_into(
    src: &[u8],
    shape: &[usize],
    dim: usize,
    parts: usize,
    elem: usize,
    out: &mut [u8],
) {
    for c in split_dim_copies(shape, dim, parts, elem) {
        c.apply(src, out);
    }
}

/// Concatenates `parts` contiguous blocks, each of shape `block_shape`, along
/// `dim`, into `out` (`blocks.len()` bytes; the result has shape `block_shape`
/// with `dim` multiplied by `parts`).
pub fn concat_dim_into(
    blocks: &[u8],
    block_shape: &[usize],
    dim: usize,
    parts: usize,
    elem: usize,
    out: &mut [u8],
) {
    for c in concat_dim_copies(block_shape, dim, parts, elem) {
        c.apply(blocks, out);
    }
}

/// Whether moving blocks along `dim` of `shape` is the identity on bytes
/// (every dimension before `dim` has size 1), so a plane can skip packing.
pub fn is_contiguous_split(shape: &[usize], dim: usize) -> bool {
    shape[..dim].iter().all(|n| *n == 1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn concat_dim(
        blocks: &[u8],
        block_shape: &[usize],
        dim: usize,
        parts: usize,
        elem: usize,
    ) -> Vec<u8> {
        let mut out = vec![0u8; blocks.len()];
        concat_dim_into(blocks, block_shape, dim, parts, elem, &mut out);
        out
    }

    /// Reference: element at multi-index `idx` of a row-major shape.
    fn flat(shape: &[usize], idx: &[usize]) -> usize {
        idx.iter().zip(shape).fold(0, |acc, (i, n)| acc * n + i)
    }

    fn unflat(shape: &[usize], mut f: usize) -> Vec<usize> {
        let mut idx = vec![0; shape.len()];
        for d in (0..shape.len()).rev() {
            idx[d] = f % shape[d];
            f /= shape[d];
        }
        idx
    }

    #[test]
    fn copies_are_strided_rows() {
        // [2, 4, 3] bytes split in 2 along dim 1: block p takes rows of 2·3 bytes
        // at stride 4·3, packed densely.
        let c = split_dim_copies(&[2, 4, 3], 1, 2, 1);
        assert_eq!(
            c[1],
            Copy2d {
                src_offset: 6,
                dst_offset: 12,
                width: 6,
                height: 2,
                src_pitch: 12,
                dst_pitch: 6
            }
        );
        let j = concat_dim_copies(&[2, 2, 3], 1, 2, 1);
        assert_eq!((j[1].src_offset, j[1].dst_offset), (12, 6));
        assert_eq!((j[1].src_pitch, j[1].dst_pitch), (6, 12));
    }

    #[test]
    fn uneven_blocks_concatenate_along_a_dim() {
        // Blocks of [2, 1] and [2, 2] bytes joined along dim 1 into [2, 3].
        let blocks = [1u8, 2, 3, 4, 5, 6];
        let mut out = [0u8; 6];
        for c in concat_uneven_copies(&[2, 3], 1, &[1, 2], 1) {
            c.apply(&blocks, &mut out);
        }
        assert_eq!(out, [1, 3, 4, 2, 5, 6]);
        // A zero count is a block with nothing in it.
        let mut out = [0u8; 6];
        for c in concat_uneven_copies(&[2, 3], 1, &[0, 3, 0], 1) {
            c.apply(&blocks, &mut out);
        }
        assert_eq!(out, blocks);
        // Reversed, the same plan packs the tensor back into its blocks.
        let joined = [1u8, 3, 4, 2, 5, 6];
        let mut packed = [0u8; 6];
        for c in concat_uneven_copies(&[2, 3], 1, &[1, 2], 1) {
            c.reversed().apply(&joined, &mut packed);
        }
        assert_eq!(packed, blocks);
    }

    proptest! {
        #[test]
        fn split_matches_index_definition(
            shape in proptest::collection::vec(1usize..5, 1..5),
            dim_seed in 0usize..8,
            parts in 1usize..4,
        ) {
            let dim = dim_seed % shape.len();
            let mut shape = shape;
            shape[dim] *= parts;
            let n: usize = shape.iter().product();
            let src: Vec<u8> = (0..n).map(|i| (i % 251) as u8).collect();
            let packed = split_dim(&src, &shape, dim, parts, 1);
            let mut block_shape = shape.clone();
            block_shape[dim] /= parts;
            let bn: usize = block_shape.iter().product();
            for (f, value) in src.iter().enumerate() {
                let idx = unflat(&shape, f);
                let p = idx[dim] / block_shape[dim];
                let mut bidx = idx.clone();
                bidx[dim] %= block_shape[dim];
                prop_assert_eq!(packed[p * bn + flat(&block_shape, &bidx)], *value);
            }
            prop_assert_eq!(concat_dim(&packed, &block_shape, dim, parts, 1), src);
        }

        #[test]
        fn concat_then_split_is_identity_for_wide_elements(
            shape in proptest::collection::vec(1usize..4, 1..4),
            dim_seed in 0usize..8,
            parts in 1usize..4,
            elem in 1usize..9,
        ) {
            let dim = dim_seed % shape.len();
            let n: usize = shape.iter().product::<usize>() * parts * elem;
            let blocks: Vec<u8> = (0..n).map(|i| (i * 7 % 256) as u8).collect();
            let joined = concat_dim(&blocks, &shape, dim, parts, elem);
            let mut full = shape.clone();
            full[dim] *= parts;
            prop_assert_eq!(split_dim(&joined, &full, dim, parts, elem), blocks);
        }
    }
}
