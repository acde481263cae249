//! One connection's client-side state up to its NEGOTIATE (MS-SMB2 3.2.4.2.2, 3.2.5.2) and the
//! response-signature rule afterwards. The connection's preauth hash takes the NEGOTIATE
//! request and response exactly as they went over the wire; every SESSION_SETUP on the
//! connection (a new session or a binding) starts from it.
//!
//! ```text
//! Start --sent_negotiate--> AwaitNegotiate --on_negotiate_response--> Negotiated
//! ```

use super::negotiate::{negotiate_request, settle, ClientNegotiateConfig, ClientNegotiated};
use super::ClientError;
use crate::crypto::{PreauthHash, SigningKey};
use crate::msg::{Message as _, NegotiateResponse};
use crate::{Header, NtStatus};

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClientConnection {
    Start(ClientNegotiateConfig),
    AwaitNegotiate {
        offer: ClientNegotiateConfig,
        preauth: PreauthHash,
    },
    Negotiated {
        negotiated: ClientNegotiated,
        preauth: PreauthHash,
    },
}

impl ClientConnection {
    pub fn new(offer: ClientNegotiateConfig) -> Self {
        ClientConnection::Start(offer)
    }

    /// The NEGOTIATE body to send, with the caller's 32 random salt bytes.
    pub fn negotiate_body(&self, salt: &[u8]) -> Result<Vec<u8>, ClientError> {
        let ClientConnection::Start(offer) = self else {
            return Err(ClientError::Protocol("NEGOTIATE sent twice"));
        };
        let mut body = Vec::with_capacity(128);
        negotiate_request(offer, salt).encode(&mut body);
        Ok(body)
    }

    /// Records the NEGOTIATE request as sent (header first, no transport prefix).
    pub fn sent_negotiate(&mut self, message: &[u8]) -> Result<(), ClientError> {
        let ClientConnection::Start(offer) = self else {
            return Err(ClientError::Protocol("NEGOTIATE sent twice"));
        };
        let mut preauth = PreauthHash::default();
        preauth.update(message);
        *self = ClientConnection::AwaitNegotiate {
            offer: offer.clone(),
            preauth,
        };
        Ok(())
    }

    /// Takes the NEGOTIATE response (header first) and settles the connection.
    pub fn on_negotiate_response(
        &mut self,
        message: &[u8],
    ) -> Result<&ClientNegotiated, ClientError> {
        let ClientConnection::AwaitNegotiate { offer, preauth } = self else {
            return Err(ClientError::Protocol("NEGOTIATE response out of order"));
        };
        let h = Header::decode(message)?;
        if h.nt_status() != NtStatus::SUCCESS {
            return Err(ClientError::Status(h.nt_status()));
        }
        let negotiated = settle(offer, &NegotiateResponse::decode(message)?)?;
        let mut preauth = *preauth;
        preauth.update(message);
        *self = ClientConnection::Negotiated {
            negotiated,
            preauth,
        };
        match self {
            ClientConnection::Negotiated { negotiated, .. } => Ok(negotiated),
            _ => Err(ClientError::Protocol("NEGOTIATE response out of order")),
        }
    }

    pub fn negotiated(&self) -> Option<&ClientNegotiated> {
        match self {
            ClientConnection::Negotiated { negotiated, .. } => Some(negotiated),
            _ => None,
        }
    }

    /// The preauth hash a SESSION_SETUP on this connection starts from.
    pub fn preauth(&self) -> Option<PreauthHash> {
        match self {
            ClientConnection::Negotiated { preauth, .. } => Some(*preauth),
            _ => None,
        }
    }
}

/// Checks a response to a signed request (MS-SMB2 3.2.5.1.3): a signed response must verify
/// under the channel's key; an unsigned one is accepted only with an error status (servers
/// send some, such as STATUS_USER_SESSION_DELETED, unsigned), and interim STATUS_PENDING
/// responses are not checked.
pub fn check_response_signature(key: &SigningKey, message: &[u8]) -> Result<(), ClientError> {
    let h = Header::decode(message)?;
    if h.nt_status() == NtStatus::PENDING && h.tree_id().is_none() {
        return Ok(());
    }
    if h.flags.is_signed() {
        if key.verify(message) {
            return Ok(());
        }
        return Err(ClientError::BadSignature);
    }
    if h.nt_status().is_error() {
        return Ok(());
    }
    Err(ClientError::BadSignature)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::client::request_header;
    use crate::crypto::{Cipher, SigningAlgorithm};
    use crate::msg::negotiate::{CAP_LARGE_MTU, CAP_MULTI_CHANNEL};
    use crate::msg::{encode_message, NegotiateRequest};
    use crate::server::{negotiate, NegotiateConfig};
    use crate::Command;

    fn offer(signing: Vec<SigningAlgorithm>) -> ClientNegotiateConfig {
        ClientNegotiateConfig {
            client_guid: [1; 16],
            capabilities: CAP_LARGE_MTU | CAP_MULTI_CHANNEL,
            signing_required: true,
            signing,
            ciphers: vec![Cipher::Aes128Gcm, Cipher::Aes128Ccm],
        }
    }

    fn server(signing: Vec<SigningAlgorithm>) -> NegotiateConfig {
        NegotiateConfig {
            server_guid: [2; 16],
            capabilities: CAP_LARGE_MTU | CAP_MULTI_CHANNEL,
            max_transact_size: 1 << 23,
            max_read_size: 1 << 23,
            max_write_size: 1 << 23,
            server_start_time: 0,
            signing_required: false,
            min_dialect: 0x0202,
            max_dialect: 0x0311,
            ciphers: vec![Cipher::Aes128Ccm, Cipher::Aes128Gcm],
            signing,
        }
    }

    /// The client's NEGOTIATE through the server side and back; both preauth hashes agree.
    fn exchange(
        client: Vec<SigningAlgorithm>,
        srv: Vec<SigningAlgorithm>,
    ) -> (ClientConnection, PreauthHash) {
        let mut c = ClientConnection::new(offer(client));
        let body = c.negotiate_body(&[7; 32]).unwrap();
        let mut req = request_header(Command::Negotiate, 0, 0, 1, 0, 0)
            .to_bytes()
            .to_vec();
        req.extend_from_slice(&body);
        c.sent_negotiate(&req).unwrap();
        let decoded = NegotiateRequest::decode(&req).unwrap();
        let (_, resp) = negotiate(&decoded, &server(srv), &[9; 32], 0, &[]).unwrap();
        let h = Header::decode(&req).unwrap();
        let msg = encode_message(&Header::response_to(&h, NtStatus::SUCCESS, 1), &resp);
        let mut server_hash = PreauthHash::default();
        server_hash.update(&req);
        server_hash.update(&msg);
        c.on_negotiate_response(&msg).unwrap();
        (c, server_hash)
    }

    #[test]
    fn negotiate_settles_and_both_sides_hash_alike() {
        let gmac_first = vec![SigningAlgorithm::AesGmac, SigningAlgorithm::AesCmac];
        let (c, server_hash) = exchange(gmac_first.clone(), gmac_first);
        let n = c.negotiated().unwrap();
        assert_eq!(n.signing, SigningAlgorithm::AesGmac);
        assert_eq!(
            n.cipher,
            Some(Cipher::Aes128Ccm),
            "the server chooses by its own order"
        );
        assert!(n.large_mtu() && n.has(CAP_MULTI_CHANNEL));
        assert_eq!(c.preauth(), Some(server_hash));
        // A server without GMAC: CMAC.
        let (c, _) = exchange(
            vec![SigningAlgorithm::AesGmac, SigningAlgorithm::AesCmac],
            vec![SigningAlgorithm::AesCmac],
        );
        assert_eq!(c.negotiated().unwrap().signing, SigningAlgorithm::AesCmac);
        // The second NEGOTIATE is refused.
        let mut c = c;
        assert!(c.negotiate_body(&[0; 32]).is_err());
        assert!(c.sent_negotiate(&[]).is_err());
    }

    #[test]
    fn response_signatures() {
        let key = SigningKey::new(SigningAlgorithm::AesGmac, [5; 16]);
        let h = request_header(Command::Read, 3, 1, 1, 9, 1);
        let mut ok = Header::response_to(&h, NtStatus::SUCCESS, 1)
            .to_bytes()
            .to_vec();
        ok.extend_from_slice(&[0; 16]);
        assert_eq!(
            check_response_signature(&key, &ok),
            Err(ClientError::BadSignature)
        );
        key.sign(&mut ok).unwrap();
        assert_eq!(check_response_signature(&key, &ok), Ok(()));
        ok[70] ^= 1;
        assert_eq!(
            check_response_signature(&key, &ok),
            Err(ClientError::BadSignature)
        );
        let err = Header::response_to(&h, NtStatus::USER_SESSION_DELETED, 0).to_bytes();
        assert_eq!(check_response_signature(&key, &err), Ok(()));
        let pending = Header::pending_response_to(&h, 1, 0).to_bytes();
        assert_eq!(check_response_signature(&key, &pending), Ok(()));
    }
}
