//! Full-feature Text Requests on a connection: `iscsi_proto::text_exchange` does the keys and
//! the continuation; the connection supplies what SendTargets may show.

use super::{header_of, next_tag, Connection};
use crate::limits::{count_keys, Limit};
use iscsi_proto::pdu::{reject_reason, Pdu, TextRequest};
use iscsi_proto::text_exchange::{answer_keys, TextContext, TextInput, TextResponder};
use tracing::debug;

impl Connection {
    /// Answers a Text Request (RFC 7143 11.10): gathers the initiator's pieces, answers the
    /// keys, and hands out a long answer piece by piece.
    pub(crate) fn text_request(&mut self, req: TextRequest) {
        let peer = self.peer;
        let limits = &self.server.limits;
        if !self.text_exchange.admit(req.itt, limits.config.text_rounds) {
            // RFC 7143 11.17.1: reason 0x0b resets the negotiation; the pieces held so far
            // are dropped with it.
            limits.log.hit(peer.ip(), Limit::TextRounds, || {
                let max = limits.config.text_rounds;
                format!("text exchange from {peer} took over {max} requests; reset")
            });
            self.text = TextResponder::new(self.params.max_xmit_data_segment_length);
            let header = header_of(&Pdu::TextRequest(req), &self.framer);
            self.reject(reject_reason::NEGOTIATION_RESET, &header);
            return;
        }
        let ttt = next_tag(&mut self.next_ttt);
        let response = match self.text.receive(&req, ttt) {
            Ok(TextInput::Send(resp)) => resp,
            Ok(TextInput::Request(keys))
                if count_keys(&keys) > limits.config.text_keys
                    || keys.len() > limits.config.text_bytes =>
            {
                limits.log.hit(peer.ip(), Limit::TextSize, || {
                    format!("Text Request from {peer} over text-keys/text-bytes; rejected")
                });
                let header = header_of(&Pdu::TextRequest(req), &self.framer);
                self.reject(reject_reason::PROTOCOL_ERROR, &header);
                return;
            }
            Ok(TextInput::Request(keys)) => {
                let targets = crate::text::visible_targets(&self.server, &self.session, self.local);
                let ctx = TextContext {
                    session_type: self.session.params.session_type,
                    current_target: self.session.target.as_ref().map(|t| t.name.as_str()),
                    targets: &targets,
                    max_recv_data_segment_length: self.params.max_recv_data_segment_length,
                };
                match answer_keys(&keys, &ctx) {
                    Ok(answer) => {
                        if let Some(max) = answer.max_xmit_data_segment_length {
                            self.text.set_max_xmit(max);
                        }
                        self.text.respond(&req, answer.text, ttt)
                    }
                    Err(e) => {
                        debug!("bad Text Request: {e}");
                        let header = header_of(&Pdu::TextRequest(req), &self.framer);
                        self.reject(reject_reason::PROTOCOL_ERROR, &header);
                        return;
                    }
                }
            }
            Err(e) => {
                debug!("bad Text Request: {e}");
                let header = header_of(&Pdu::TextRequest(req), &self.framer);
                self.reject(e.reject_reason(), &header);
                return;
            }
        };
        self.send(Pdu::TextResponse(response));
    }
}
