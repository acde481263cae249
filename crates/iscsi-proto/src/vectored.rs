//! Many encoded PDUs out with one vectored write: a cursor over their chunks (headers, data
//! segments, trailers) that lays what is left of them into `IoSlice`s and moves on by what the
//! socket took. Still sans-IO: the driver makes the write call.

use crate::pdu::EncodedPdu;
use bytes::{Bytes, BytesMut};
use std::io::IoSlice;

/// Slices per write call: well under IOV_MAX (1024), and enough for a wake-up's PDUs.
pub const MAX_SLICES: usize = 64;

/// Where a vectored write of `chunks` stands: chunks before `index` are written, and `skip`
/// bytes of chunk `index`.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct ChunkCursor {
    index: usize,
    skip: usize,
}

impl ChunkCursor {
    /// Whether every chunk of `chunks` has been written.
    pub fn done(&self, chunks: &[Bytes]) -> bool {
        self.index >= chunks.len()
    }

    /// Lays the unwritten bytes of `chunks`, up to `out.len()` slices, into `out`; returns how
    /// many slices it filled.
    pub fn slices<'a>(&self, chunks: &'a [Bytes], out: &mut [IoSlice<'a>]) -> usize {
        let mut n = 0;
        for (i, (c, slot)) in chunks
            .iter()
            .skip(self.index)
            .zip(out.iter_mut())
            .enumerate()
        {
            let from = if i == 0 { self.skip } else { 0 };
            *slot = IoSlice::new(c.get(from..).unwrap_or_default());
            n += 1;
        }
        n
    }

    /// Moves on by `written` bytes, as a write of the slices from [`ChunkCursor::slices`] took.
    pub fn advance(&mut self, chunks: &[Bytes], mut written: usize) {
        while let Some(c) = chunks.get(self.index) {
            let left = c.len().saturating_sub(self.skip);
            if written >= left {
                written -= left;
                self.index += 1;
                self.skip = 0;
            } else {
                self.skip += written;
                break;
            }
        }
    }
}

impl EncodedPdu {
    /// Pushes the PDU's parts that are not empty onto `chunks` for one vectored write: the
    /// header, the data segment as given (shared, not copied), and the trailer, whose few
    /// bytes go into `trailers` first (split off, so one buffer serves a whole batch).
    pub fn push_chunks(self, chunks: &mut Vec<Bytes>, trailers: &mut BytesMut) {
        if !self.trailer().is_empty() {
            trailers.extend_from_slice(self.trailer());
        }
        let trailer = (!self.trailer().is_empty()).then(|| trailers.split().freeze());
        chunks.push(self.header);
        if !self.data.is_empty() {
            chunks.push(self.data);
        }
        chunks.extend(trailer);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn written_with(chunks: &[Bytes], takes: &[usize], max: usize) -> Vec<u8> {
        let mut cursor = ChunkCursor::default();
        let mut out = Vec::new();
        let mut takes = takes.iter().copied().cycle();
        while !cursor.done(chunks) {
            let mut slices = [IoSlice::new(&[]); MAX_SLICES];
            let n = cursor.slices(chunks, &mut slices[..max]);
            let offered: Vec<u8> = slices[..n].iter().flat_map(|s| s.iter().copied()).collect();
            let took = takes.next().unwrap_or(1).min(offered.len());
            out.extend_from_slice(&offered[..took]);
            cursor.advance(chunks, took);
        }
        out
    }

    /// Whatever the socket takes at each call, and however few slices a call may carry, the
    /// bytes go out once each and in order, empty chunks included.
    #[test]
    fn partial_writes_resume_where_they_stopped() {
        let chunks: Vec<Bytes> = vec![
            Bytes::from_static(b"header-1"),
            Bytes::from((0..200u8).collect::<Vec<u8>>()),
            Bytes::new(),
            Bytes::from_static(b"pad"),
            Bytes::from_static(b"header-2"),
        ];
        let all: Vec<u8> = chunks.iter().flat_map(|c| c.iter().copied()).collect();
        for takes in [&[usize::MAX][..], &[1], &[7, 3], &[8, 200, 1], &[0, 5]] {
            for max in [1, 2, MAX_SLICES] {
                let takes: Vec<usize> = takes.iter().map(|&t| t.max(1)).collect();
                assert_eq!(
                    written_with(&chunks, &takes, max),
                    all,
                    "{takes:?}, {max} slices"
                );
            }
        }
        assert!(ChunkCursor::default().done(&[]));
    }

    /// An encoded PDU's chunks are its bytes on the wire: header, data, padding and digest,
    /// with nothing empty pushed.
    #[test]
    fn encoded_pdus_push_their_wire_bytes() {
        use crate::pdu::{DataOut, Framer, Pdu};
        let framer = Framer {
            data_digest: true,
            ..Framer::default()
        };
        let mut scratch = BytesMut::new();
        let mut trailers = BytesMut::new();
        let mut chunks = Vec::new();
        for len in [0usize, 5, 8] {
            let pdu = Pdu::DataOut(DataOut {
                final_bit: true,
                lun: 0,
                itt: 1,
                ttt: 2,
                exp_stat_sn: 3,
                data_sn: 0,
                buffer_offset: 0,
                data: Bytes::from(vec![7u8; len]),
            });
            let wire = framer.encode_to_vec(&pdu);
            chunks.clear();
            framer
                .encode(&pdu, &mut scratch)
                .push_chunks(&mut chunks, &mut trailers);
            let pushed: Vec<u8> = chunks.iter().flat_map(|c| c.iter().copied()).collect();
            assert_eq!(pushed, wire, "{len} data bytes");
            assert!(chunks.iter().all(|c| !c.is_empty()));
            assert_eq!(chunks.len(), if len == 0 { 1 } else { 3 });
        }
    }
}
