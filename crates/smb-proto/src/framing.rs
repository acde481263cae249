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
