//! Cutting one large request into block-aligned pieces, so that a single stream of large reads
//! at queue depth 1 still keeps every path busy.

/// How to cut one request of `len` bytes at `offset`: pieces `(offset, len)` that are
/// contiguous, cover exactly `[offset, offset + len)`, start and end on multiples of `align`
/// (the block size), number at most `parts`, and are none smaller than `min_piece`. A request of
/// at most `threshold` bytes is one piece, and so is one that cannot be cut under these rules
/// (unaligned, too small, or `parts` <= 1).
///
/// The pieces are computed as they are iterated: no allocation, whatever the count.
pub fn split(
    offset: u64,
    len: u64,
    parts: usize,
    align: u64,
    threshold: u64,
    min_piece: u64,
) -> Pieces {
    let whole = Pieces {
        next: offset,
        block: 1,
        base: len,
        left: 1,
        long_left: 0,
    };
    if len <= threshold || parts <= 1 {
        return whole;
    }
    let align = align.max(1);
    if !offset.is_multiple_of(align)
        || !len.is_multiple_of(align)
        || offset.checked_add(len).is_none()
    {
        return whole;
    }
    let blocks = len / align;
    // Smallest piece in whole blocks; the bigger of min_piece and one block.
    let min_blocks = min_piece.div_ceil(align).max(1);
    let count = (blocks / min_blocks).min(u64::try_from(parts).unwrap_or(u64::MAX));
    if count <= 1 {
        return whole;
    }
    // `blocks % count` pieces of base + 1 blocks first, then base-block pieces: sizes differ by at most one
    // block, and the smallest (base blocks) is at least min_blocks because count <= blocks / min.
    Pieces {
        next: offset,
        block: align,
        base: blocks / count,
        left: count,
        long_left: blocks % count,
    }
}

/// The pieces of one request, produced by [`split`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pieces {
    next: u64,
    /// Unit of the sizes below, in bytes.
    block: u64,
    /// Size of a short piece, in `block`s.
    base: u64,
    /// Pieces still to come.
    left: u64,
    /// How many of the remaining pieces are one block longer than `base`.
    long_left: u64,
}

impl Iterator for Pieces {
    type Item = (u64, u64);

    fn next(&mut self) -> Option<(u64, u64)> {
        if self.left == 0 {
            return None;
        }
        let blocks = if self.long_left > 0 {
            self.long_left -= 1;
            self.base + 1
        } else {
            self.base
        };
        // Cannot overflow: split() checked offset + len, and the pieces sum to len.
        let len = blocks.saturating_mul(self.block);
        let piece = (self.next, len);
        self.next = self.next.saturating_add(len);
        self.left -= 1;
        Some(piece)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let n = usize::try_from(self.left).unwrap_or(usize::MAX);
        (n, Some(n))
    }
}

impl ExactSizeIterator for Pieces {}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const KIB: u64 = 1024;
    const MIB: u64 = 1024 * KIB;

    fn pieces(
        offset: u64,
        len: u64,
        parts: usize,
        align: u64,
        threshold: u64,
        min: u64,
    ) -> Vec<(u64, u64)> {
        split(offset, len, parts, align, threshold, min).collect()
    }

    #[test]
    fn small_request_is_one_piece() {
        assert_eq!(
            pieces(4096, 128 * KIB, 4, 512, 128 * KIB, 64 * KIB),
            [(4096, 128 * KIB)]
        );
        assert_eq!(pieces(0, 0, 4, 512, 0, 0), [(0, 0)]);
        assert_eq!(split(0, 8 * MIB, 1, 512, 0, 0).len(), 1);
    }

    #[test]
    fn large_request_is_cut_evenly() {
        assert_eq!(
            pieces(MIB, 4 * MIB, 4, 4096, 256 * KIB, 64 * KIB),
            [(MIB, MIB), (2 * MIB, MIB), (3 * MIB, MIB), (4 * MIB, MIB)]
        );
        // 10 blocks over 3 parts: 4 + 3 + 3.
        assert_eq!(
            pieces(0, 10 * 512, 3, 512, 0, 512),
            [(0, 2048), (2048, 1536), (3584, 1536)]
        );
    }

    #[test]
    fn min_piece_limits_the_count() {
        // 256 KiB with 64 KiB minimum: 4 pieces even though 8 are allowed.
        assert_eq!(split(0, 256 * KIB, 8, 512, 0, 64 * KIB).len(), 4);
        // 100 KiB with 64 KiB minimum: cannot make two, so one.
        assert_eq!(pieces(0, 100 * KIB, 8, 512, 0, 64 * KIB), [(0, 100 * KIB)]);
    }

    #[test]
    fn unaligned_or_overflowing_request_is_one_piece() {
        assert_eq!(pieces(100, MIB, 4, 512, 0, 0), [(100, MIB)]);
        assert_eq!(pieces(0, MIB + 1, 4, 512, 0, 0), [(0, MIB + 1)]);
        assert_eq!(
            pieces(u64::MAX - 511, 1024, 2, 512, 0, 0),
            [(u64::MAX - 511, 1024)]
        );
        // align 0 is treated as 1.
        assert_eq!(split(0, 10, 2, 0, 0, 0).len(), 2);
    }

    proptest! {
        #[test]
        fn pieces_cover_the_request(
            offset_blocks in 0u64..1 << 40,
            len_blocks in 0u64..1 << 16,
            parts in 0usize..10,
            align in prop::sample::select(vec![1u64, 512, 4096]),
            threshold in 0u64..4 * MIB,
            min_piece in 0u64..MIB,
        ) {
            let (offset, len) = (offset_blocks * align, len_blocks * align);
            let got = pieces(offset, len, parts, align, threshold, min_piece);
            prop_assert!(!got.is_empty());
            prop_assert!(got.len() <= parts.max(1));
            let mut next = offset;
            for &(o, l) in &got {
                prop_assert_eq!(o, next);
                prop_assert_eq!(o % align, 0);
                prop_assert_eq!(l % align, 0);
                if got.len() > 1 {
                    prop_assert!(l >= min_piece && l > 0, "{:?}", got);
                }
                next = o + l;
            }
            prop_assert_eq!(next, offset + len);
            if len <= threshold {
                prop_assert_eq!(got.len(), 1);
            }
        }
    }
}
