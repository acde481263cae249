//! Data-In read straight into the command's buffer: an initiator that has a Data-In's header
//! but not yet its (large) data segment takes the header off first, reads the segment from the
//! socket into the buffer the command's data ends up in, then has the padding and data digest
//! checked here. Every byte crosses user space once instead of twice (socket buffer, then the
//! command's buffer). Still sans-IO: the caller does the reading.

use super::bhs;
use super::framer::{pad4, segment_length};
use super::{DataIn, Framer, Opcode, Pdu, PduError, BHS_LEN};
use bytes::{Buf, Bytes, BytesMut};

/// A Data-In whose header has been taken off the receive buffer; its data segment comes next.
#[derive(Debug)]
pub struct DataInHead {
    /// The PDU, with empty `data`.
    pub pdu: DataIn,
    /// Bytes of data segment to read into the command's buffer.
    pub segment: usize,
    /// Bytes that follow the segment: padding, then the data digest when negotiated.
    pub trailer: usize,
    /// The header as received, for error reports.
    pub header: [u8; BHS_LEN],
}

impl Framer {
    /// When `buf` starts with the whole header of a Data-In whose data segment is at least
    /// `min_segment` bytes and not all buffered yet, splits the header (and its digest) off and
    /// returns it. `Ok(None)` leaves `buf` as it was: not a Data-In, a small or already
    /// buffered segment, or not enough bytes yet (then [`Framer::decode`] does the work).
    pub fn split_data_in_head(
        &self,
        buf: &mut BytesMut,
        min_segment: usize,
    ) -> Result<Option<DataInHead>, PduError> {
        let hd = if self.header_digest { 4 } else { 0 };
        let Some(h) = buf.get(..BHS_LEN) else {
            return Ok(None);
        };
        let mut header = [0u8; BHS_LEN];
        header.copy_from_slice(h);
        let segment = segment_length(&header);
        let plain = Opcode(header[0] & 0x3f) == Opcode::DATA_IN && header[4] == 0;
        if !plain
            || segment < min_segment.max(1)
            || segment > self.max_recv_data_segment_length
            || buf.len() < BHS_LEN + hd
        {
            return Ok(None);
        }
        let dd = if self.data_digest { 4 } else { 0 };
        let trailer = pad4(segment) - segment + dd;
        if buf.len() >= BHS_LEN + hd + segment + trailer {
            return Ok(None);
        }
        let head = buf.split_to(BHS_LEN);
        if self.header_digest && crc32c::crc32c(&head) != buf.get_u32_le() {
            return Err(PduError::HeaderDigest);
        }
        match bhs::decode(&header, &[], Bytes::new()) {
            Ok(Pdu::DataIn(pdu)) => Ok(Some(DataInHead {
                pdu,
                segment,
                trailer,
                header,
            })),
            Ok(_) => Err(PduError::Malformed {
                reason: "not a Data-In",
                header: Box::new(header),
            }),
            Err(reason) => Err(PduError::Malformed {
                reason,
                header: Box::new(header),
            }),
        }
    }

    /// Takes `head`'s trailer (padding and data digest) off the front of `buf`, and checks the
    /// digest against `segment`, the data read. `Ok(false)`: the trailer is not all buffered
    /// yet (nothing taken; read more and call again).
    pub fn finish_data_in(
        &self,
        head: &DataInHead,
        segment: &[u8],
        buf: &mut BytesMut,
    ) -> Result<bool, PduError> {
        if buf.len() < head.trailer {
            return Ok(false);
        }
        let dd = if self.data_digest { 4 } else { 0 };
        let pad = head.trailer - dd;
        if self.data_digest {
            // The digest covers the segment and its padding, as sent.
            let padding = buf.get(..pad).unwrap_or_default();
            let crc = crc32c::crc32c_append(crc32c::crc32c(segment), padding);
            buf.advance(pad);
            if crc != buf.get_u32_le() {
                return Err(PduError::DataDigest {
                    header: Box::new(head.header),
                });
            }
        } else {
            buf.advance(pad);
        }
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data_in(len: usize, itt: u32) -> Pdu {
        Pdu::DataIn(DataIn {
            final_bit: true,
            status_present: true,
            itt,
            ttt: 0xffff_ffff,
            buffer_offset: 4096,
            stat_sn: 7,
            data: Bytes::from((0..len).map(|i| (i * 7) as u8).collect::<Vec<u8>>()),
            ..Default::default()
        })
    }

    /// Whatever the digests and the segment's padding, a Data-In taken apart here gives the
    /// header, the segment and the trailer that the whole-PDU decoder gives.
    #[test]
    fn a_split_data_in_matches_the_whole_decode() {
        for (hd, dd) in [(false, false), (true, false), (false, true), (true, true)] {
            for len in [65_536, 65_537, 65_538, 65_539, 100_001] {
                let framer = Framer {
                    header_digest: hd,
                    data_digest: dd,
                    max_recv_data_segment_length: 262_144,
                };
                let pdu = data_in(len, 0x42);
                let wire = framer.encode_to_vec(&pdu);
                // Only the header and a little data have arrived.
                let mut buf = BytesMut::from(&wire[..BHS_LEN + 100]);
                let head = framer
                    .split_data_in_head(&mut buf, 65_536)
                    .expect("valid")
                    .expect("split");
                assert_eq!(head.segment, len);
                let Pdu::DataIn(whole) = framer
                    .decode(&mut BytesMut::from(&wire[..]))
                    .expect("decode")
                    .expect("pdu")
                else {
                    panic!("not a Data-In");
                };
                assert_eq!(
                    head.pdu,
                    DataIn {
                        data: Bytes::new(),
                        ..whole.clone()
                    }
                );
                let start = BHS_LEN + if hd { 4 } else { 0 };
                assert_eq!(&buf[..], &wire[start..BHS_LEN + 100]);
                let segment = &wire[start..start + len];
                assert_eq!(segment, &whole.data[..]);
                let mut rest = BytesMut::from(&wire[start + len..]);
                assert_eq!(rest.len(), head.trailer);
                if head.trailer > 0 {
                    let mut partial = BytesMut::from(&rest[..rest.len() - 1]);
                    assert!(!framer.finish_data_in(&head, segment, &mut partial).unwrap());
                }
                assert!(framer
                    .finish_data_in(&head, segment, &mut rest)
                    .expect("digest"));
                assert!(rest.is_empty());
                if dd {
                    let mut bad = segment.to_vec();
                    bad[10] ^= 1;
                    let mut rest = BytesMut::from(&wire[start + len..]);
                    assert!(framer.finish_data_in(&head, &bad, &mut rest).is_err());
                }
            }
        }
    }

    #[test]
    fn small_complete_or_other_pdus_are_left_to_decode() {
        let framer = Framer {
            header_digest: false,
            data_digest: false,
            max_recv_data_segment_length: 262_144,
        };
        let small = framer.encode_to_vec(&data_in(1000, 1));
        let mut buf = BytesMut::from(&small[..BHS_LEN + 10]);
        assert!(framer
            .split_data_in_head(&mut buf, 65_536)
            .unwrap()
            .is_none());
        assert_eq!(buf.len(), BHS_LEN + 10);
        let big = framer.encode_to_vec(&data_in(70_000, 1));
        let mut whole = BytesMut::from(&big[..]);
        assert!(framer
            .split_data_in_head(&mut whole, 65_536)
            .unwrap()
            .is_none());
        let mut short = BytesMut::from(&big[..20]);
        assert!(framer
            .split_data_in_head(&mut short, 65_536)
            .unwrap()
            .is_none());
        let nop = framer.encode_to_vec(&Pdu::NopIn(super::super::NopIn {
            data: Bytes::from(vec![1u8; 70_000]),
            ..Default::default()
        }));
        let mut buf = BytesMut::from(&nop[..BHS_LEN + 10]);
        assert!(framer
            .split_data_in_head(&mut buf, 65_536)
            .unwrap()
            .is_none());
    }
}
