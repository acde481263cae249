//! Binary framing of peer-link messages.
//!
//! ```text
//! frame := len:u32le  type:u8  epoch:u64le  node:u8  seq:u64le  body  crc:u32le
//! ```
//!
//! `len` counts the bytes after itself (type through crc). `crc` is CRC32C over everything
//! before it, `len` included. Integers are little-endian; data payloads are length-prefixed
//! (u32) and must be exactly `blocks * block_size` long (checked by the core, which knows the
//! block size). [`decode`] never panics: any input yields a message, "need more bytes", or a
//! [`DecodeError`].

use bytes::{BufMut, Bytes};

use crate::meta::Generations;
use crate::wire::*;

/// Wire protocol version (in [`Hello`]).
pub const VERSION: u16 = 2;
/// The largest frame accepted (length field), 64 MiB.
pub const MAX_FRAME: u32 = 64 << 20;
/// Bytes before the body: length, type, epoch, node, sequence.
const HEAD: usize = 4 + 1 + 8 + 1 + 8;

/// Why a frame was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    #[error("frame length {0} out of range")]
    Length(u32),
    #[error("frame checksum mismatch")]
    Checksum,
    #[error("unknown message type {0}")]
    UnknownType(u8),
    #[error("message body truncated")]
    Truncated,
    #[error("{0} trailing bytes after the message body")]
    Trailing(usize),
    #[error("invalid field value in {0}")]
    Invalid(&'static str),
}

fn type_code(body: &Body) -> u8 {
    match body {
        Body::Hello(_) => 1,
        Body::Bitmap(_) => 2,
        Body::BitmapEnd(_) => 3,
        Body::Write(_) => 4,
        Body::WriteAck(_) => 5,
        Body::Heartbeat(_) => 6,
        Body::HeartbeatAck(_) => 7,
        Body::Flush(_) => 8,
        Body::FlushAck(_) => 9,
        Body::ResyncData(_) => 10,
        Body::ResyncAck(_) => 11,
        Body::ResyncDone(_) => 12,
        Body::Shared(_) => 13,
        Body::SharedAck(_) => 14,
        Body::Caw(_) => 15,
        Body::CawResult(_) => 16,
        Body::Suspect(_) => 17,
        Body::ResyncSums(_) => 18,
        Body::ResyncDiffer(_) => 19,
    }
}

fn put_gens(out: &mut Vec<u8>, g: &Generations) {
    out.put_u64_le(g.current);
    out.put_u64_le(g.bitmap);
    out.put_u64_le(g.history[0]);
    out.put_u64_le(g.history[1]);
}

/// Payloads at least this long are not copied by [`encode_split`]: the sender points at them
/// (a vectored write). Shorter ones cost less to copy than another piece of the write.
pub const SPLIT_MIN: usize = 16 << 10;

/// Where large payloads go by reference (each with the offset in the output where it
/// belongs), when they do.
type Split<'a> = Option<&'a mut Vec<(usize, Bytes)>>;

fn put_data(out: &mut Vec<u8>, split: &mut Split<'_>, data: &Bytes) {
    out.put_u32_le(data.len() as u32);
    match split {
        Some(split) if data.len() >= SPLIT_MIN => split.push((out.len(), data.clone())),
        _ => out.extend_from_slice(data),
    }
}

/// Append the frame of `msg` to `out`.
pub fn encode(msg: &Message, out: &mut Vec<u8>) {
    encode_into(msg, out, None);
}

/// Append the frame of `msg` to `out`, except its payloads of at least [`SPLIT_MIN`] bytes:
/// each is pushed to `split` with the offset in `out` where it belongs, and the bytes on the
/// wire are `out` with every payload inserted at its offset (in order). The frame's length
/// and checksum cover the payloads as if they had been copied: [`decode`] reads the same frame.
pub fn encode_split(msg: &Message, out: &mut Vec<u8>, split: &mut Vec<(usize, Bytes)>) {
    encode_into(msg, out, Some(split));
}

fn encode_into(msg: &Message, out: &mut Vec<u8>, mut split: Split<'_>) {
    let first_split = split.as_ref().map_or(0, |s| s.len());
    let start = out.len();
    out.put_u32_le(0); // length, patched below
    out.put_u8(type_code(&msg.body));
    out.put_u64_le(msg.header.epoch);
    out.put_u8(msg.header.node);
    out.put_u64_le(msg.header.seq);
    match &msg.body {
        Body::Hello(h) => {
            out.put_u16_le(h.version);
            put_gens(out, &h.gens);
            out.put_u8(u8::from(h.outdated) | u8::from(h.alone) << 1 | u8::from(h.booted) << 2);
            out.put_u64_le(h.lun_blocks);
            out.put_u32_le(h.block_size);
            out.put_u32_le(h.region_blocks);
            out.put_u64_le(h.next_wseq);
        }
        Body::Bitmap(Bitmap { first_word, words })
        | Body::Suspect(Suspect { first_word, words }) => {
            out.put_u64_le(*first_word);
            out.put_u32_le(words.len() as u32);
            for w in words {
                out.put_u64_le(*w);
            }
        }
        Body::ResyncSums(r) => {
            out.put_u64_le(r.lba);
            out.put_u32_le(r.blocks);
            put_data(out, &mut split, &r.sums);
        }
        Body::ResyncDiffer(r) => {
            out.put_u64_le(r.lba);
            out.put_u32_le(r.blocks);
            put_data(out, &mut split, &r.differ);
        }
        Body::BitmapEnd(b) => out.put_u64_le(b.set_bits),
        Body::Write(w) => {
            out.put_u64_le(w.wseq);
            out.put_u64_le(w.seen);
            out.put_u64_le(w.lba);
            out.put_u32_le(w.blocks);
            out.put_u8(u8::from(w.fua));
            put_data(out, &mut split, &w.data);
        }
        Body::WriteAck(a) => {
            out.put_u64_le(a.wseq);
            out.put_u8(match a.status {
                WriteStatus::Applied => 0,
                WriteStatus::Superseded => 1,
                WriteStatus::Retry => 2,
            });
            out.put_u64_le(a.fence);
        }
        Body::Heartbeat(h) => out.put_u64_le(h.sent_at),
        Body::HeartbeatAck(h) => out.put_u64_le(h.echo),
        Body::Flush(f) => out.put_u64_le(f.id),
        Body::FlushAck(f) => out.put_u64_le(f.id),
        Body::ResyncData(r) => {
            out.put_u64_le(r.lba);
            out.put_u32_le(r.blocks);
            put_data(out, &mut split, &r.data);
        }
        Body::ResyncAck(r) => {
            out.put_u64_le(r.lba);
            out.put_u32_le(r.blocks);
        }
        Body::ResyncDone(d) => put_gens(out, &d.gens),
        Body::Shared(s) => {
            out.put_u64_le(s.id);
            out.put_u8(match s.kind {
                SharedKind::Change => 0,
                SharedKind::Snapshot => 1,
                SharedKind::Notice => 2,
            });
            out.put_u64_le(s.base);
            put_data(out, &mut split, &s.payload);
        }
        Body::SharedAck(a) => {
            out.put_u64_le(a.id);
            out.put_u8(u8::from(a.accepted));
        }
        Body::Caw(c) => {
            out.put_u64_le(c.id);
            out.put_u64_le(c.lba);
            out.put_u32_le(c.blocks);
            out.put_u8(u8::from(c.fua));
            put_data(out, &mut split, &c.verify);
            put_data(out, &mut split, &c.write);
        }
        Body::CawResult(r) => {
            out.put_u64_le(r.id);
            let (status, offset) = match r.status {
                CawStatus::Written => (0, 0),
                CawStatus::Miscompare(i) => (1, i),
                CawStatus::Refused => (2, 0),
            };
            out.put_u8(status);
            out.put_u64_le(offset);
        }
    }
    let payloads = split.as_deref().map_or(&[][..], |s| &s[first_split..]);
    let outside: usize = payloads.iter().map(|(_, d)| d.len()).sum();
    let len = (out.len() - start - 4 + outside + 4) as u32;
    out[start..start + 4].copy_from_slice(&len.to_le_bytes());
    // The checksum runs over the frame in wire order: each payload where it belongs.
    let (mut crc, mut at) = (0, start);
    for (offset, data) in payloads {
        crc = crc32c::crc32c_append(crc, &out[at..*offset]);
        crc = crc32c::crc32c_append(crc, data);
        at = *offset;
    }
    let crc = crc32c::crc32c_append(crc, &out[at..]);
    out.put_u32_le(crc);
}

/// The frame of `msg` as a new vector.
pub fn encode_to_vec(msg: &Message) -> Vec<u8> {
    let mut v = Vec::new();
    encode(msg, &mut v);
    v
}

/// A bounds-checked reader over a frame body; data payloads are zero-copy slices of `buf`.
struct Reader<'a> {
    buf: &'a Bytes,
    pos: usize,
    end: usize,
}

impl Reader<'_> {
    fn take(&mut self, n: usize) -> Result<&[u8], DecodeError> {
        if self.end - self.pos < n {
            return Err(DecodeError::Truncated);
        }
        let s = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }
    fn u8(&mut self) -> Result<u8, DecodeError> {
        Ok(self.take(1)?[0])
    }
    fn u16(&mut self) -> Result<u16, DecodeError> {
        let mut b = [0; 2];
        b.copy_from_slice(self.take(2)?);
        Ok(u16::from_le_bytes(b))
    }
    fn u32(&mut self) -> Result<u32, DecodeError> {
        let mut b = [0; 4];
        b.copy_from_slice(self.take(4)?);
        Ok(u32::from_le_bytes(b))
    }
    fn u64(&mut self) -> Result<u64, DecodeError> {
        let mut b = [0; 8];
        b.copy_from_slice(self.take(8)?);
        Ok(u64::from_le_bytes(b))
    }
    fn flag(&mut self, what: &'static str) -> Result<bool, DecodeError> {
        match self.u8()? {
            0 => Ok(false),
            1 => Ok(true),
            _ => Err(DecodeError::Invalid(what)),
        }
    }
    fn gens(&mut self) -> Result<Generations, DecodeError> {
        Ok(Generations {
            current: self.u64()?,
            bitmap: self.u64()?,
            history: [self.u64()?, self.u64()?],
        })
    }
    fn data(&mut self) -> Result<Bytes, DecodeError> {
        let n = self.u32()? as usize;
        if self.end - self.pos < n {
            return Err(DecodeError::Truncated);
        }
        let d = self.buf.slice(self.pos..self.pos + n);
        self.pos += n;
        Ok(d)
    }
}

/// Decode one frame from the start of `buf`: `Ok(None)` if more bytes are needed, else the
/// message and the number of bytes it took.
pub fn decode(buf: &Bytes) -> Result<Option<(Message, usize)>, DecodeError> {
    if buf.len() < 4 {
        return Ok(None);
    }
    let len = u32::from_le_bytes([buf[0], buf[1], buf[2], buf[3]]);
    if (len as usize) < HEAD - 4 + 4 || len > MAX_FRAME {
        return Err(DecodeError::Length(len));
    }
    let total = 4 + len as usize;
    if buf.len() < total {
        return Ok(None);
    }
    let crc_at = total - 4;
    let want = u32::from_le_bytes([
        buf[crc_at],
        buf[crc_at + 1],
        buf[crc_at + 2],
        buf[crc_at + 3],
    ]);
    if crc32c::crc32c(&buf[..crc_at]) != want {
        return Err(DecodeError::Checksum);
    }
    let mut r = Reader {
        buf,
        pos: 4,
        end: crc_at,
    };
    let ty = r.u8()?;
    let header = Header {
        epoch: r.u64()?,
        node: r.u8()?,
        seq: r.u64()?,
    };
    let body = match ty {
        1 => {
            let version = r.u16()?;
            let gens = r.gens()?;
            let flags = r.u8()?;
            if flags > 7 {
                return Err(DecodeError::Invalid("Hello flags"));
            }
            Body::Hello(Hello {
                version,
                gens,
                outdated: flags & 1 != 0,
                alone: flags & 2 != 0,
                booted: flags & 4 != 0,
                lun_blocks: r.u64()?,
                block_size: r.u32()?,
                region_blocks: r.u32()?,
                next_wseq: r.u64()?,
            })
        }
        2 | 17 => {
            let first_word = r.u64()?;
            let n = r.u32()? as usize;
            if n > (r.end - r.pos) / 8 {
                return Err(DecodeError::Truncated);
            }
            let mut words = Vec::with_capacity(n);
            for _ in 0..n {
                words.push(r.u64()?);
            }
            if ty == 2 {
                Body::Bitmap(Bitmap { first_word, words })
            } else {
                Body::Suspect(Suspect { first_word, words })
            }
        }
        3 => Body::BitmapEnd(BitmapEnd { set_bits: r.u64()? }),
        4 => Body::Write(Write {
            wseq: r.u64()?,
            seen: r.u64()?,
            lba: r.u64()?,
            blocks: r.u32()?,
            fua: r.flag("Write fua")?,
            data: r.data()?,
        }),
        5 => Body::WriteAck(WriteAck {
            wseq: r.u64()?,
            status: match r.u8()? {
                0 => WriteStatus::Applied,
                1 => WriteStatus::Superseded,
                2 => WriteStatus::Retry,
                _ => return Err(DecodeError::Invalid("WriteAck status")),
            },
            fence: r.u64()?,
        }),
        6 => Body::Heartbeat(Heartbeat { sent_at: r.u64()? }),
        7 => Body::HeartbeatAck(HeartbeatAck { echo: r.u64()? }),
        8 => Body::Flush(Flush { id: r.u64()? }),
        9 => Body::FlushAck(FlushAck { id: r.u64()? }),
        10 => Body::ResyncData(ResyncData {
            lba: r.u64()?,
            blocks: r.u32()?,
            data: r.data()?,
        }),
        11 => Body::ResyncAck(ResyncAck {
            lba: r.u64()?,
            blocks: r.u32()?,
        }),
        12 => Body::ResyncDone(ResyncDone { gens: r.gens()? }),
        13 => Body::Shared(Shared {
            id: r.u64()?,
            kind: match r.u8()? {
                0 => SharedKind::Change,
                1 => SharedKind::Snapshot,
                2 => SharedKind::Notice,
                _ => return Err(DecodeError::Invalid("Shared kind")),
            },
            base: r.u64()?,
            payload: r.data()?,
        }),
        14 => Body::SharedAck(SharedAck {
            id: r.u64()?,
            accepted: r.flag("SharedAck accepted")?,
        }),
        15 => Body::Caw(Caw {
            id: r.u64()?,
            lba: r.u64()?,
            blocks: r.u32()?,
            fua: r.flag("Caw fua")?,
            verify: r.data()?,
            write: r.data()?,
        }),
        16 => {
            let id = r.u64()?;
            let status = r.u8()?;
            let offset = r.u64()?;
            let status = match (status, offset) {
                (0, 0) => CawStatus::Written,
                (1, i) => CawStatus::Miscompare(i),
                (2, 0) => CawStatus::Refused,
                _ => return Err(DecodeError::Invalid("CawResult status")),
            };
            Body::CawResult(CawResult { id, status })
        }
        18 => Body::ResyncSums(ResyncSums {
            lba: r.u64()?,
            blocks: r.u32()?,
            sums: r.data()?,
        }),
        19 => Body::ResyncDiffer(ResyncDiffer {
            lba: r.u64()?,
            blocks: r.u32()?,
            differ: r.data()?,
        }),
        t => return Err(DecodeError::UnknownType(t)),
    };
    if r.pos != r.end {
        return Err(DecodeError::Trailing(r.end - r.pos));
    }
    Ok(Some((Message { header, body }, total)))
}

#[cfg(test)]
mod tests;
