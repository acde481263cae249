//! Framing: splits whole PDUs off a receive buffer and lays PDUs out for one vectored write.
//!
//! RFC 7143 11.2: a PDU is BHS (48) + AHS (TotalAHSLength * 4) + HeaderDigest + DataSegment
//! (padded to 4) + DataDigest. Lengths are checked against the negotiated limits as soon as the
//! BHS is in, so an oversized segment is refused before anything is buffered for it.

use super::bhs::{self, Header};
use super::Pdu;
use bytes::{Buf, Bytes, BytesMut};

/// Length of the Basic Header Segment.
pub const BHS_LEN: usize = 48;
/// TotalAHSLength is one byte of 4-byte words.
pub const MAX_AHS_LEN: usize = 255 * 4;

/// What can be wrong with bytes received from the peer.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PduError {
    /// RFC 7143 7.8: a header digest error means the PDU boundaries can no longer be trusted;
    /// the connection is dropped.
    #[error("header digest mismatch")]
    HeaderDigest,
    /// RFC 7143 7.8: the PDU is discarded and answered with Reject (reason 0x02).
    #[error("data digest mismatch")]
    DataDigest { header: Box<[u8; BHS_LEN]> },
    /// RFC 7143 13.12: a segment larger than MaxRecvDataSegmentLength is a protocol error.
    #[error("data segment of {len} bytes exceeds MaxRecvDataSegmentLength {max}")]
    DataSegmentTooLong {
        len: usize,
        max: usize,
        header: Box<[u8; BHS_LEN]>,
    },
    /// A field whose value makes the PDU meaningless.
    #[error("malformed PDU: {reason}")]
    Malformed {
        reason: &'static str,
        header: Box<[u8; BHS_LEN]>,
    },
}

impl PduError {
    /// The offending header, for the Reject PDU's data segment, when it is known.
    pub fn header(&self) -> Option<&[u8; BHS_LEN]> {
        match self {
            PduError::HeaderDigest => None,
            PduError::DataDigest { header }
            | PduError::DataSegmentTooLong { header, .. }
            | PduError::Malformed { header, .. } => Some(header),
        }
    }
}

/// A PDU laid out for one vectored write: `header`, then `data`, then `trailer`.
#[derive(Debug, Clone)]
pub struct EncodedPdu {
    /// BHS + AHS + header digest.
    pub header: Bytes,
    /// The data segment as given (shared, not copied).
    pub data: Bytes,
    trailer: [u8; 8],
    trailer_len: usize,
}

impl EncodedPdu {
    /// Padding of the data segment plus its data digest, if any.
    pub fn trailer(&self) -> &[u8] {
        self.trailer.get(..self.trailer_len).unwrap_or_default()
    }

    /// Total bytes on the wire.
    pub fn wire_len(&self) -> usize {
        self.header.len() + self.data.len() + self.trailer_len
    }
}

/// Per-connection framing parameters, updated as negotiation completes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Framer {
    pub header_digest: bool,
    pub data_digest: bool,
    /// Largest data segment we accept (our declared MaxRecvDataSegmentLength).
    pub max_recv_data_segment_length: usize,
}

impl Default for Framer {
    /// Login-phase framing: no digests, 8192-byte segments (RFC 7143 13.12).
    fn default() -> Self {
        Framer {
            header_digest: false,
            data_digest: false,
            max_recv_data_segment_length: 8192,
        }
    }
}

pub(super) fn pad4(n: usize) -> usize {
    (n + 3) & !3
}

impl Framer {
    /// Bytes still needed before `decode` can make progress (at least 1 when it returned None).
    pub fn bytes_needed(&self, buf: &[u8]) -> usize {
        let Some(h) = buf.get(..BHS_LEN) else {
            return BHS_LEN - buf.len();
        };
        let total = self.total_len(h);
        total.saturating_sub(buf.len()).max(1)
    }

    fn total_len(&self, h: &[u8]) -> usize {
        let ahs = usize::from(h.get(4).copied().unwrap_or(0)) * 4;
        let dsl = segment_length(h);
        let hd = if self.header_digest { 4 } else { 0 };
        let dd = if self.data_digest && dsl > 0 { 4 } else { 0 };
        BHS_LEN + ahs + hd + pad4(dsl) + dd
    }

    /// Splits one complete PDU off the front of `buf`. `Ok(None)`: more bytes are needed.
    /// On `Err` the bytes of the bad PDU have been consumed where its length was trustworthy.
    pub fn decode(&self, buf: &mut BytesMut) -> Result<Option<Pdu>, PduError> {
        let Some(hslice) = buf.get(..BHS_LEN) else {
            return Ok(None);
        };
        let mut header: Header = [0u8; BHS_LEN];
        header.copy_from_slice(hslice);
        let dsl = segment_length(&header);
        if dsl > self.max_recv_data_segment_length {
            return Err(PduError::DataSegmentTooLong {
                len: dsl,
                max: self.max_recv_data_segment_length,
                header: Box::new(header),
            });
        }
        let total = self.total_len(&header);
        if buf.len() < total {
            return Ok(None);
        }
        let ahs_len = usize::from(header[4]) * 4;
        let head_len = BHS_LEN + ahs_len;
        let head = buf.split_to(head_len);
        if self.header_digest {
            let got = buf.get_u32_le();
            if crc32c::crc32c(&head) != got {
                return Err(PduError::HeaderDigest);
            }
        }
        let mut data = buf.split_to(pad4(dsl));
        if self.data_digest && dsl > 0 {
            let got = buf.get_u32_le();
            if crc32c::crc32c(&data) != got {
                return Err(PduError::DataDigest {
                    header: Box::new(header),
                });
            }
        }
        data.truncate(dsl);
        let ahs = head.get(BHS_LEN..).unwrap_or_default();
        bhs::decode(&header, ahs, data.freeze())
            .map(Some)
            .map_err(|reason| PduError::Malformed {
                reason,
                header: Box::new(header),
            })
    }

    /// Lays out `pdu` for sending. `scratch` is a reusable buffer the header is split from, so
    /// steady-state encoding allocates nothing once it has grown.
    pub fn encode(&self, pdu: &Pdu, scratch: &mut BytesMut) -> EncodedPdu {
        let mut h: Header = [0u8; BHS_LEN];
        let mut ahs = BytesMut::new();
        bhs::encode(pdu, &mut h, &mut ahs);
        let data = pdu.data().clone();
        // TotalAHSLength in 4-byte words; DataSegmentLength 24 bits (11.2.1.5).
        h[4] = u8::try_from(ahs.len() / 4).unwrap_or(u8::MAX);
        let dsl = u32::try_from(data.len()).unwrap_or(u32::MAX) & 0x00ff_ffff;
        h[5..8].copy_from_slice(&dsl.to_be_bytes()[1..4]);
        scratch.clear();
        scratch.reserve(BHS_LEN + ahs.len() + 4);
        scratch.extend_from_slice(&h);
        scratch.extend_from_slice(&ahs);
        if self.header_digest {
            let crc = crc32c::crc32c(scratch);
            scratch.extend_from_slice(&crc.to_le_bytes());
        }
        let header = scratch.split().freeze();
        let mut trailer = [0u8; 8];
        let pad = pad4(data.len()) - data.len();
        let mut trailer_len = pad;
        if self.data_digest && !data.is_empty() {
            let zeros = [0u8; 3];
            let crc =
                crc32c::crc32c_append(crc32c::crc32c(&data), zeros.get(..pad).unwrap_or_default());
            if let Some(slot) = trailer.get_mut(pad..pad + 4) {
                slot.copy_from_slice(&crc.to_le_bytes());
            }
            trailer_len += 4;
        }
        EncodedPdu {
            header,
            data,
            trailer,
            trailer_len,
        }
    }

    /// Encodes into one contiguous buffer (tests, login phase).
    pub fn encode_to_vec(&self, pdu: &Pdu) -> Vec<u8> {
        let e = self.encode(pdu, &mut BytesMut::new());
        let mut v = Vec::with_capacity(e.wire_len());
        v.extend_from_slice(&e.header);
        v.extend_from_slice(&e.data);
        v.extend_from_slice(e.trailer());
        v
    }
}

pub(super) fn segment_length(h: &[u8]) -> usize {
    match h.get(5..8) {
        Some([a, b, c]) => (usize::from(*a) << 16) | (usize::from(*b) << 8) | usize::from(*c),
        _ => 0,
    }
}
