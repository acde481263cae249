//! Direct TCP transport framing (MS-SMB2 2.1): a zero byte and a 24-bit big-endian length before
//! each SMB2 message (or transform / compression header).

use crate::error::DecodeError;

/// The direct-TCP framer, with the largest frame the server accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DirectTcp {
    pub max_frame: usize,
}

impl Default for DirectTcp {
    fn default() -> Self {
        // 8 MiB of data plus room for the header and a large compound.
        Self {
            max_frame: 8 * 1024 * 1024 + 64 * 1024,
        }
    }
}

impl DirectTcp {
    /// Finds the first complete frame in `buf`: `Ok(Some((consumed, frame)))` where `frame` is
    /// the message without the 4-byte prefix, `Ok(None)` when more bytes are needed. A frame
    /// larger than `max_frame` or a non-zero type byte is an error that ends the connection.
    pub fn decode<'a>(&self, buf: &'a [u8]) -> Result<Option<(usize, &'a [u8])>, DecodeError> {
        let Some(&[kind, a, b, c]) = buf.get(..4) else {
            return Ok(None);
        };
        if kind != 0 {
            return Err(DecodeError::FrameType(kind));
        }
        let len = (usize::from(a) << 16) | (usize::from(b) << 8) | usize::from(c);
        if len > self.max_frame {
            return Err(DecodeError::FrameTooLarge {
                len,
                max: self.max_frame,
            });
        }
        Ok(buf.get(4..4 + len).map(|f| (4 + len, f)))
    }

    /// The 4-byte prefix for a message of `len` bytes, or `None` if it does not fit 24 bits.
    pub fn prefix(len: usize) -> Option<[u8; 4]> {
        if len > 0x00FF_FFFF {
            return None;
        }
        let b = (len as u32).to_be_bytes();
        Some([0, b[1], b[2], b[3]])
    }
}

/// What a transport frame holds, by its protocol id: the server decrypts a transform frame
/// before splitting its plaintext into a chain, and answers an SMB1 NEGOTIATE with `smb1`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FrameKind {
    /// 0xFE 'SMB': an SMB2 message or chain.
    Smb2,
    /// 0xFD 'SMB': an encrypted message (TRANSFORM_HEADER).
    Transform,
    /// 0xFC 'SMB': a compressed message, which this crate does not negotiate.
    Compressed,
    /// 0xFF 'SMB': SMB1, in practice a multi-protocol NEGOTIATE.
    Smb1,
    Unknown,
}

impl FrameKind {
    pub fn of(frame: &[u8]) -> FrameKind {
        match frame.get(..4) {
            Some([0xFE, b'S', b'M', b'B']) => FrameKind::Smb2,
            Some([0xFD, b'S', b'M', b'B']) => FrameKind::Transform,
            Some([0xFC, b'S', b'M', b'B']) => FrameKind::Compressed,
            Some([0xFF, b'S', b'M', b'B']) => FrameKind::Smb1,
            _ => FrameKind::Unknown,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frame_kinds() {
        assert_eq!(FrameKind::of(b"\xfeSMB@"), FrameKind::Smb2);
        assert_eq!(FrameKind::of(b"\xfdSMB"), FrameKind::Transform);
        assert_eq!(FrameKind::of(b"\xfcSMB"), FrameKind::Compressed);
        assert_eq!(FrameKind::of(b"\xffSMBr"), FrameKind::Smb1);
        assert_eq!(FrameKind::of(b"\xfeSM"), FrameKind::Unknown);
    }
}
