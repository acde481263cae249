//! Full-feature Text Request handling, target side (RFC 7143 6.2, 11.10, 11.11, Appendix C):
//! SendTargets answers, the few keys negotiable after login, and long answers split over
//! several Text Responses with the C bit and a target transfer tag.
//!
//! Two steps, both sans-IO:
//! 1. [`TextResponder::receive`] turns each Text Request into either a complete request text
//!    (the initiator's own C=1 pieces are gathered) or a response to send at once (the next
//!    piece of a long answer, or the empty acknowledgement of an initiator piece).
//! 2. For a complete text, [`answer_keys`] builds the answer and [`TextResponder::respond`]
//!    sends its first piece.
//!
//! StatSN, ExpCmdSN and MaxCmdSN of the responses are left 0 for the connection to fill in.

use crate::negotiation::{classify, KeyClass, SessionType};
use crate::pdu::{TextRequest, TextResponse, RESERVED_TAG};
use crate::text::{self, TextBuilder, TextError, NOT_UNDERSTOOD, REJECT};
use bytes::{Bytes, BytesMut};
use std::net::SocketAddr;

/// Most request text gathered from C=1 pieces.
pub const MAX_REQUEST_TEXT: usize = 64 * 1024;

/// A target and the portals it is reachable on: (address, target portal group tag).
pub type TargetPortals = (String, Vec<(SocketAddr, u16)>);

/// What the initiator did wrong; the connection answers with a Reject PDU of `reason()`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TextExchangeError {
    /// RFC 7143 11.10.4: the TTT must be 0xffffffff or the one we handed out.
    #[error("Text Request with unknown target transfer tag {0:#x}")]
    UnknownTransferTag(u32),
    #[error("request text over {MAX_REQUEST_TEXT} bytes")]
    TooLong,
    #[error("bad request text: {0}")]
    Text(#[from] TextError),
}

impl TextExchangeError {
    /// The Reject reason (RFC 7143 11.17.1).
    pub fn reject_reason(&self) -> u8 {
        match self {
            TextExchangeError::UnknownTransferTag(_) => {
                crate::pdu::reject_reason::INVALID_PDU_FIELD
            }
            _ => crate::pdu::reject_reason::PROTOCOL_ERROR,
        }
    }
}

/// The result of [`TextResponder::receive`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TextInput {
    /// A complete request: answer it (e.g. with [`answer_keys`]) and call `respond`.
    Request(Bytes),
    /// Send this response; nothing else to do.
    Send(TextResponse),
}

/// The rest of an answer waiting for the initiator's empty continuation request.
#[derive(Debug, Clone)]
struct Pending {
    itt: u32,
    ttt: u32,
    lun: u64,
    rest: Bytes,
}

/// Per-connection Text Request/Response state.
#[derive(Debug, Clone)]
pub struct TextResponder {
    /// The initiator's MaxRecvDataSegmentLength: the largest piece we send.
    max_xmit: usize,
    pending: Option<Pending>,
    /// Initiator text gathered from C=1 requests, with their ITT and our acknowledging TTT.
    gathering: Option<(u32, u32, BytesMut)>,
}

impl TextResponder {
    pub fn new(max_xmit_data_segment_length: u32) -> Self {
        TextResponder {
            max_xmit: usize::try_from(max_xmit_data_segment_length.max(512)).unwrap_or(8192),
            pending: None,
            gathering: None,
        }
    }

    /// A new MaxRecvDataSegmentLength from the initiator (declared in the full-feature phase).
    pub fn set_max_xmit(&mut self, max_xmit_data_segment_length: u32) {
        self.max_xmit = usize::try_from(max_xmit_data_segment_length.max(512)).unwrap_or(8192);
    }

    /// Feeds one Text Request. `next_ttt` is a fresh target transfer tag the responder may use
    /// (the connection's tag allocator; never 0xffffffff).
    pub fn receive(
        &mut self,
        req: &TextRequest,
        next_ttt: u32,
    ) -> Result<TextInput, TextExchangeError> {
        if req.ttt != RESERVED_TAG {
            if let Some(p) = self
                .pending
                .take_if(|p| p.ttt == req.ttt && p.itt == req.itt)
            {
                // RFC 7143 11.10.4: an empty request with our TTT asks for the next piece.
                return Ok(TextInput::Send(self.piece(p.itt, p.lun, p.rest, next_ttt)));
            }
            let gathering_ttt = self.gathering.as_ref().map(|(itt, ttt, _)| (*itt, *ttt));
            if gathering_ttt != Some((req.itt, req.ttt)) {
                return Err(TextExchangeError::UnknownTransferTag(req.ttt));
            }
        } else {
            // RFC 7143 11.10.4: a new request (TTT 0xffffffff) ends any pending exchange.
            self.pending = None;
            if self
                .gathering
                .as_ref()
                .is_some_and(|(itt, _, _)| *itt != req.itt)
            {
                self.gathering = None;
            }
        }
        let (itt, ttt, mut buf) =
            self.gathering
                .take()
                .unwrap_or((req.itt, next_ttt, BytesMut::new()));
        if buf.len() + req.data.len() > MAX_REQUEST_TEXT {
            return Err(TextExchangeError::TooLong);
        }
        buf.extend_from_slice(&req.data);
        if req.continue_bit {
            // More text follows: acknowledge with an empty response carrying our TTT.
            let ack = TextResponse {
                final_bit: false,
                continue_bit: false,
                lun: req.lun,
                itt,
                ttt,
                ..TextResponse::default()
            };
            self.gathering = Some((itt, ttt, buf));
            return Ok(TextInput::Send(ack));
        }
        Ok(TextInput::Request(buf.freeze()))
    }

    /// Sends the first piece of `answer` to the complete request `req`; the rest, if any,
    /// waits for the initiator's continuation requests.
    pub fn respond(&mut self, req: &TextRequest, answer: Bytes, next_ttt: u32) -> TextResponse {
        self.piece(req.itt, req.lun, answer, next_ttt)
    }

    fn piece(&mut self, itt: u32, lun: u64, mut rest: Bytes, ttt: u32) -> TextResponse {
        if rest.len() <= self.max_xmit {
            self.pending = None;
            // RFC 7143 11.11.4: the last response has F=1 and TTT 0xffffffff.
            return TextResponse {
                final_bit: true,
                continue_bit: false,
                lun,
                itt,
                ttt: RESERVED_TAG,
                data: rest,
                ..TextResponse::default()
            };
        }
        let head = rest.split_to(self.max_xmit);
        self.pending = Some(Pending {
            itt,
            ttt,
            lun,
            rest,
        });
        // RFC 7143 11.11.2: C=1 says the text continues; F must then be 0.
        TextResponse {
            final_bit: false,
            continue_bit: true,
            lun,
            itt,
            ttt,
            data: head,
            ..TextResponse::default()
        }
    }

    /// True while part of an answer waits for the initiator.
    pub fn has_pending(&self) -> bool {
        self.pending.is_some()
    }
}

/// What the session knows when answering full-feature keys.
#[derive(Debug, Clone, Copy)]
pub struct TextContext<'a> {
    pub session_type: SessionType,
    /// The target of a Normal session.
    pub current_target: Option<&'a str>,
    /// Targets this initiator may see, with their portals.
    pub targets: &'a [TargetPortals],
    /// Our MaxRecvDataSegmentLength, declared back when the initiator declares its own.
    pub max_recv_data_segment_length: u32,
}

/// The answer to a full-feature Text Request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TextAnswer {
    pub text: Bytes,
    /// The initiator declared a new MaxRecvDataSegmentLength: update the send limit.
    pub max_xmit_data_segment_length: Option<u32>,
}

/// Answers the keys of a full-feature Text Request.
pub fn answer_keys(request: &[u8], ctx: &TextContext<'_>) -> Result<TextAnswer, TextError> {
    let pairs = text::parse(request)?;
    let mut out = TextBuilder::new();
    let mut max_xmit = None;
    for (key, value) in pairs {
        match (classify(key), key) {
            (_, "SendTargets") => send_targets(value, ctx, &mut out),
            (_, "MaxRecvDataSegmentLength") => {
                // "Use: ALL" (RFC 7143 13.12): declarative in the full-feature phase too.
                match text::parse_number_in(value, 512, (1 << 24) - 1) {
                    Ok(n) => {
                        max_xmit = u32::try_from(n).ok();
                        out.push_number(key, u64::from(ctx.max_recv_data_segment_length));
                    }
                    Err(_) => {
                        out.push(key, REJECT);
                    }
                }
            }
            // "Use: ALL" declarations that need no answer.
            (_, "InitiatorAlias") => {}
            (KeyClass::Unknown, _) => {
                out.push(key, NOT_UNDERSTOOD);
            }
            // Login-only keys (RFC 7143 13: "Use: IO"/"LO") cannot be renegotiated here.
            _ => {
                out.push(key, REJECT);
            }
        }
    }
    Ok(TextAnswer {
        text: out.finish(),
        max_xmit_data_segment_length: max_xmit,
    })
}

/// RFC 7143 Appendix C / 13.3: `All` (discovery sessions only), a target name, or empty for
/// the session's own target; each target as TargetName then its TargetAddress lines.
fn send_targets(value: &str, ctx: &TextContext<'_>, out: &mut TextBuilder) {
    // Appendix C reserves `All` for discovery sessions; like common targets we answer it in
    // normal sessions too, so a host can learn every path from the session it already has.
    let wanted: Option<&str> = match value {
        "All" => None,
        "" => match ctx.current_target {
            Some(t) => Some(t),
            None => return,
        },
        name => Some(name),
    };
    for (name, portals) in ctx.targets {
        if wanted.is_some_and(|w| w != name) {
            continue;
        }
        out.push("TargetName", name);
        for (addr, tpgt) in portals {
            // SocketAddr's Display already brackets IPv6 addresses ("[2001:db8::1]:3260").
            out.push("TargetAddress", &format!("{addr},{tpgt}"));
        }
    }
}

#[cfg(test)]
#[path = "text_exchange_tests.rs"]
mod tests;
