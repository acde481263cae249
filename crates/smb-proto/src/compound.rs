//! Compound chains (MS-SMB2 3.2.4.1.4, 3.3.5.2.7): several messages in one transport frame,
//! linked by NextCommand offsets.

use crate::error::DecodeError;
use crate::header::{Header, HEADER_LEN};

/// One message of a chain.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Element<'a> {
    pub header: Header,
    /// Offset of this message in the frame.
    pub offset: usize,
    /// The message, header first, up to the next one (padding included: the signature covers
    /// it); offsets inside the body are relative to its start.
    pub bytes: &'a [u8],
}

impl Element<'_> {
    pub fn is_related(&self) -> bool {
        self.header.flags.is_related()
    }
}

/// Splits a frame into its chained messages with strict checks: every NextCommand is a multiple
/// of 8, at least a header plus a StructureSize long, and leaves room for a whole header; the
/// last is 0. The first message may not be marked related. Errors carry the element index and
/// answer STATUS_INVALID_PARAMETER (a first header that is not SMB2 ends the connection).
pub fn split_compound(frame: &[u8]) -> Result<Vec<Element<'_>>, DecodeError> {
    match split_compound_partial(frame) {
        (els, None) => Ok(els),
        (_, Some(e)) => Err(e),
    }
}

/// The same, keeping the well-formed messages before a malformed one: the server processes
/// those and answers the bad one (and stops there) with the error's status.
pub fn split_compound_partial(frame: &[u8]) -> (Vec<Element<'_>>, Option<DecodeError>) {
    let mut out = Vec::new();
    let mut offset = 0usize;
    loop {
        let index = out.len();
        let fail = |reason| DecodeError::Compound { index, reason };
        let Some(rest) = frame.get(offset..) else {
            return (out, Some(fail("offset past the frame")));
        };
        let header = match Header::decode(rest) {
            Ok(h) => h,
            Err(e) if index == 0 => return (out, Some(e)),
            Err(_) => return (out, Some(fail("next message has no valid SMB2 header"))),
        };
        if index == 0 && header.flags.is_related() {
            return (
                out,
                Some(fail("first message of a chain is marked related")),
            );
        }
        let next = header.next_command as usize;
        if next == 0 {
            out.push(Element {
                header,
                offset,
                bytes: rest,
            });
            return (out, None);
        }
        let problem = if !next.is_multiple_of(8) {
            Some("NextCommand is not 8-byte aligned")
        } else if next < HEADER_LEN + 2 {
            Some("NextCommand overlaps this message's header")
        } else if rest.len() < next {
            Some("NextCommand points outside the frame")
        } else if rest.len() < next + HEADER_LEN {
            Some("NextCommand leaves no room for a header")
        } else {
            None
        };
        if let Some(reason) = problem {
            return (out, Some(fail(reason)));
        }
        out.push(Element {
            header,
            offset,
            bytes: rest.get(..next).unwrap_or(rest),
        });
        offset += next;
    }
}

/// Appends `msg` to a chain being built in `out`: pads the previous message to 8 bytes and
/// patches its NextCommand. `last_start` is the previous message's offset (None for the first).
pub fn append_to_chain(out: &mut Vec<u8>, last_start: Option<usize>, msg: &[u8]) -> usize {
    if let Some(prev) = last_start {
        while !(out.len() - prev).is_multiple_of(8) {
            out.push(0);
        }
        let next = (out.len() - prev) as u32;
        crate::wire::patch_u32(out, prev + crate::header::NEXT_COMMAND_OFFSET, next);
    }
    let start = out.len();
    out.extend_from_slice(msg);
    start
}

/// A response chain being built: each message padded to 8 bytes and linked by NextCommand.
#[derive(Debug, Clone, Default)]
pub struct ResponseChain {
    buf: Vec<u8>,
    starts: Vec<usize>,
}

impl ResponseChain {
    pub fn new() -> Self {
        Self::default()
    }

    /// Appends a whole message (header first; its NextCommand is set here).
    pub fn push(&mut self, msg: &[u8]) {
        let start = append_to_chain(&mut self.buf, self.starts.last().copied(), msg);
        self.starts.push(start);
    }

    pub fn is_empty(&self) -> bool {
        self.starts.is_empty()
    }

    /// The frame and each message's range in it (padding included, as the signature covers
    /// it). Sign each range after this, since NextCommand and padding are now final.
    pub fn finish(self) -> (Vec<u8>, Vec<std::ops::Range<usize>>) {
        let mut ranges = Vec::with_capacity(self.starts.len());
        for (i, s) in self.starts.iter().enumerate() {
            let end = self.starts.get(i + 1).copied().unwrap_or(self.buf.len());
            ranges.push(*s..end);
        }
        (self.buf, ranges)
    }
}

/// What a related operation inherits from the one before it (MS-SMB2 3.3.5.2.7.2): an all-ones
/// SessionId, TreeId or FileId in a related request stands for the previous one's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RelatedIds {
    pub session_id: u64,
    pub tree_id: u32,
    /// The FileId the previous operation used or created, if any.
    pub file_id: Option<crate::msg::FileId>,
}

impl RelatedIds {
    /// The SessionId and TreeId `header` acts on.
    pub fn ids_for(&self, header: &Header) -> (u64, Option<u32>) {
        let related = header.flags.is_related();
        let session = if related && header.session_id == u64::MAX {
            self.session_id
        } else {
            header.session_id
        };
        let tree = header.tree_id().map(|t| {
            if related && t == u32::MAX {
                self.tree_id
            } else {
                t
            }
        });
        (session, tree)
    }

    /// The FileId a request names, with the related substitution; None when it asks for the
    /// previous one and there is none (the server answers STATUS_INVALID_PARAMETER).
    pub fn file_id_for(
        &self,
        header: &Header,
        requested: crate::msg::FileId,
    ) -> Option<crate::msg::FileId> {
        if header.flags.is_related() && requested == crate::msg::FileId::RELATED {
            self.file_id
        } else {
            Some(requested)
        }
    }
}
