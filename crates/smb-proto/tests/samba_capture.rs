//! A real SMB 3.1.1 session between smbclient 4.17.12 and smbd 4.17.12 (Debian 12), captured
//! with tcpdump on loopback and cut into transport frames. Files in `tests/data/*.frames`: per
//! frame a tag byte ('C' from the client, 'S' from the server), a 32-bit big-endian length and
//! the frame, client frames first. User "lanesuser", password "Passw0rd!".
//!
//! `samba-signed`: signing required; put of 26 and 66000 bytes, ls, allinfo, get of the 66000
//! bytes (two credits), mkdir, rename, del, rmdir. `samba-encrypted`: encryption required;
//! put, ls, get, del.
//!
//! Nothing here is compared with this crate's own earlier output: the NTLM check, the MIC and
//! both mechListMICs, every signature and every decryption are checked against what Samba and
//! smbclient computed and put on the wire.

mod common;

use common::frames::*;

use smb_proto::credits::{CreditPolicy, CreditWindow};
use smb_proto::crypto::transform::{decrypt, TransformHeader, TRANSFORM_PROTOCOL_ID};
use smb_proto::crypto::{Cipher, SigningAlgorithm, SigningKey};
use smb_proto::msg::*;
use smb_proto::{split_compound, Command, Header, NtStatus};

#[test]
fn every_request_and_response_of_the_signed_session_decodes() {
    let c = signed();
    let (requests, responses) = check_all_decode(&c.client, &c.server);
    assert_eq!(requests, 64);
    assert_eq!(responses, 65, "one interim STATUS_PENDING response");
}

/// The 66000-byte WRITE and READ: the payload is a view into the frame, the charge is two.
#[test]
fn large_write_and_read_of_the_signed_session() {
    let c = signed();
    let mut writes = Vec::new();
    for f in &c.client {
        let h = Header::decode(f).unwrap();
        if let Ok(Request::Write(w)) = Request::decode(&h, f) {
            writes.push((
                h.credit_charge,
                w.data.len(),
                Request::Write(w.clone()).payload_size(),
            ));
        }
    }
    assert_eq!(writes, vec![(1, 26, 26), (2, 66000, 66000)]);
    let read = c
        .server
        .iter()
        .find(|f| Header::decode(f).unwrap().command == Command::Read)
        .unwrap();
    let r = ReadResponse::decode(read).unwrap();
    assert_eq!(r.data.len(), 66000);
    let big_write = c.client.iter().find(|f| f.len() > 66000).unwrap();
    let h = Header::decode(big_write).unwrap();
    let Request::Write(w) = Request::decode(&h, big_write).unwrap() else {
        panic!()
    };
    assert_eq!(w.data, r.data, "what was written is what was read back");
}

/// The client's MessageIds and CreditCharges against a window fed with the server's grants.
#[test]
fn credits_follow_the_real_exchange() {
    let c = signed();
    let mut w = CreditWindow::new(CreditPolicy {
        max_outstanding: 8192,
        max_window: 16384,
    });
    let mut responses = c
        .server
        .iter()
        .map(|f| Header::decode(f).unwrap())
        .peekable();
    for f in &c.client {
        for e in split_compound(f).unwrap() {
            let req = Request::decode(&e.header, e.bytes).unwrap();
            let charged = w
                .consume(
                    e.header.message_id,
                    e.header.credit_charge,
                    req.payload_size(),
                    true,
                )
                .unwrap_or_else(|err| panic!("{:?}: {err}", e.header.command));
            assert_eq!(charged, u64::from(e.header.credit_charge.max(1)));
            while let Some(r) = responses.next_if(|r| r.message_id == e.header.message_id) {
                assert_eq!(w.grant(r.credits), r.credits);
            }
        }
    }
    assert!(responses.next().is_none());
    // Replaying the first request is a reused MessageId.
    assert!(w.consume(0, 0, 0, true).is_err());
}

#[test]
fn signed_session_keys_and_every_signature_verify() {
    let c = signed();
    let s = sign_in(&c);
    let key = SigningKey::new(s.signing, s.keys.signing);
    let mut verified = 0;
    for f in c.client.iter().chain(&c.server) {
        for e in split_compound(f).unwrap() {
            if e.header.flags.is_signed() {
                assert!(
                    key.verify(e.bytes),
                    "{:?} mid {}",
                    e.header.command,
                    e.header.message_id
                );
                verified += 1;
                let mut bad = e.bytes.to_vec();
                *bad.last_mut().unwrap() ^= 0x80;
                assert!(!key.verify(&bad));
            } else {
                // Only the sign-in and the interim response go unsigned.
                assert!(
                    e.header.session_id == 0
                        || e.header.command == Command::SessionSetup
                        || e.header.nt_status() == NtStatus::PENDING,
                    "{:?} mid {} unsigned",
                    e.header.command,
                    e.header.message_id
                );
            }
        }
    }
    // Unsigned: NEGOTIATE both ways, the first two SESSION_SETUP requests, the interim
    // SESSION_SETUP response, and the STATUS_PENDING interim WRITE response.
    assert_eq!(verified, 64 + 65 - 5 - 1);
    // smbd chose AES-GMAC (from smbclient's SIGNING_CAPABILITIES): these are real GMAC
    // signatures, the async WRITE response's among them.
    assert_eq!(s.signing, SigningAlgorithm::AesGmac);
}

#[test]
fn encrypted_session_decrypts_and_decodes() {
    let c = encrypted();
    let s = sign_in(&c);
    let cipher = s.cipher.expect("a cipher was negotiated");
    assert_eq!(cipher, Cipher::Aes128Gcm);
    let mut plain_client = Vec::new();
    let mut plain_server = Vec::new();
    for (frames, key, out) in [
        (&c.client, s.keys.c2s_cipher.as_bytes(), &mut plain_client),
        (&c.server, s.keys.s2c_cipher.as_bytes(), &mut plain_server),
    ] {
        for f in frames
            .iter()
            .filter(|f| f.starts_with(&TRANSFORM_PROTOCOL_ID))
        {
            let th = TransformHeader::decode(f).unwrap();
            assert_eq!(th.session_id, s.session_id);
            let mut buf = f.clone();
            let (_, plain) = decrypt(cipher, key, &mut buf).unwrap();
            out.push(plain.to_vec());
            let mut bad = f.clone();
            bad[60] ^= 1;
            assert!(decrypt(cipher, key, &mut bad).is_err());
        }
    }
    assert_eq!(plain_client.len(), 25);
    assert_eq!(plain_server.len(), 25);
    let (requests, responses) = check_all_decode(&plain_client, &plain_server);
    assert!(requests >= 25 && responses >= 25);
    let text = b"hello from the lanes test\n";
    let wrote = plain_client.iter().any(|m| {
        let h = Header::decode(m).unwrap();
        matches!(Request::decode(&h, m), Ok(Request::Write(w)) if w.data == text)
    });
    let read = plain_server.iter().any(|m| {
        let h = Header::decode(m).unwrap();
        h.command == Command::Read && ReadResponse::decode(m).unwrap().data == text
    });
    assert!(wrote && read);
}

/// What smbd sent, decoded and encoded again, is byte for byte what smbd sent: the response
/// encoders lay out fields, offsets and padding as a real server does. (The one exception is
/// the interim STATUS_PENDING body, whose single ErrorData byte smbd sets to 0x21 where MS-SMB2
/// 2.2.2 asks for zero.)
#[test]
fn response_encoders_reproduce_smbd() {
    fn again<'a, M: Message<'a>>(m: &'a [u8]) -> Vec<u8> {
        let d = M::decode(m).unwrap();
        let mut out = m[..smb_proto::HEADER_LEN].to_vec();
        d.encode(&mut out);
        out
    }
    let c = signed();
    let mut checked = 0;
    for f in &c.server {
        for e in split_compound(f).unwrap() {
            let (h, m) = (&e.header, e.bytes);
            if h.nt_status() == NtStatus::PENDING {
                continue;
            }
            let ours = if h.status != 0 && h.nt_status() != NtStatus::MORE_PROCESSING_REQUIRED {
                again::<ErrorResponse>(m)
            } else {
                match h.command {
                    Command::Negotiate => again::<NegotiateResponse>(m),
                    Command::SessionSetup => again::<SessionSetupResponse>(m),
                    Command::TreeConnect => again::<TreeConnectResponse>(m),
                    Command::TreeDisconnect => again::<TreeDisconnectResponse>(m),
                    Command::Create => again::<CreateResponse>(m),
                    Command::Close => again::<CloseResponse>(m),
                    Command::Read => again::<ReadResponse>(m),
                    Command::Write => again::<WriteResponse>(m),
                    Command::QueryInfo => again::<QueryInfoResponse>(m),
                    Command::SetInfo => again::<SetInfoResponse>(m),
                    Command::QueryDirectory => again::<QueryDirectoryResponse>(m),
                    other => panic!("unexpected {other:?}"),
                }
            };
            assert_eq!(ours, m, "{:?} mid {}", h.command, h.message_id);
            checked += 1;
        }
    }
    assert_eq!(checked, 64);
}
