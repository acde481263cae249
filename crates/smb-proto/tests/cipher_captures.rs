//! Short smbclient 4.17.12 / smbd 4.17.12 sessions (put, get, del of 26 bytes), one per
//! algorithm smbclient was limited to: encryption with AES-256-GCM, AES-256-CCM and AES-128-CCM,
//! and signing with AES-128-CMAC. Keys come from this crate's preauth hash and key schedule;
//! the ciphertexts and signatures are Samba's. This is the 256-bit key derivation (L = 256)
//! checked against a real peer.

mod common;

use common::frames::*;
use smb_proto::crypto::transform::{decrypt, TRANSFORM_PROTOCOL_ID};
use smb_proto::crypto::{Cipher, SigningAlgorithm, SigningKey};
use smb_proto::msg::{Message, ReadResponse, Request};
use smb_proto::{split_compound, Command, Header};

const TEXT: &[u8] = b"hello from the lanes test\n";

fn encrypted_session(bytes: &[u8], want: Cipher) {
    let c = load(bytes);
    let s = sign_in(&c);
    assert_eq!(s.cipher, Some(want));
    assert_eq!(s.keys.c2s_cipher.as_bytes().len(), want.key_len());
    let mut client = Vec::new();
    let mut server = Vec::new();
    for (frames, key, out) in [
        (&c.client, s.keys.c2s_cipher.as_bytes(), &mut client),
        (&c.server, s.keys.s2c_cipher.as_bytes(), &mut server),
    ] {
        for f in frames
            .iter()
            .filter(|f| f.starts_with(&TRANSFORM_PROTOCOL_ID))
        {
            let mut buf = f.clone();
            let (_, plain) = decrypt(want, key, &mut buf).unwrap();
            out.push(plain.to_vec());
        }
    }
    assert_eq!((client.len(), server.len()), (18, 18));
    check_all_decode(&client, &server);
    assert!(client.iter().any(|m| {
        let h = Header::decode(m).unwrap();
        matches!(Request::decode(&h, m), Ok(Request::Write(w)) if w.data == TEXT)
    }));
    assert!(server.iter().any(|m| {
        let h = Header::decode(m).unwrap();
        h.command == Command::Read && ReadResponse::decode(m).unwrap().data == TEXT
    }));
}

#[test]
fn aes_256_gcm_session() {
    encrypted_session(
        include_bytes!("data/samba-aes256gcm.frames"),
        Cipher::Aes256Gcm,
    );
}

#[test]
fn aes_256_ccm_session() {
    encrypted_session(
        include_bytes!("data/samba-aes256ccm.frames"),
        Cipher::Aes256Ccm,
    );
}

#[test]
fn aes_128_ccm_session() {
    encrypted_session(
        include_bytes!("data/samba-aes128ccm.frames"),
        Cipher::Aes128Ccm,
    );
}

#[test]
fn aes_128_cmac_signed_session() {
    let c = load(include_bytes!("data/samba-cmac.frames"));
    let s = sign_in(&c);
    assert_eq!(s.signing, SigningAlgorithm::AesCmac);
    let key = SigningKey::new(s.signing, s.keys.signing);
    let gmac = SigningKey::new(SigningAlgorithm::AesGmac, s.keys.signing);
    let mut verified = 0;
    for f in c.client.iter().chain(&c.server) {
        for e in split_compound(f).unwrap() {
            if e.header.flags.is_signed() {
                assert!(key.verify(e.bytes), "{:?}", e.header.command);
                assert!(!gmac.verify(e.bytes));
                verified += 1;
            }
        }
    }
    assert_eq!(verified, 21 + 21 - 5);
}
