//! SMB 3.1.1 message signing (MS-SMB2 3.1.4.1): AES-128-CMAC (RFC 4493) or AES-128-GMAC over
//! the whole message with the Signature field taken as zero. The GMAC nonce is the MessageId
//! (8 bytes, little-endian) followed by 4 bytes whose bit 0 is set for a response
//! (SMB2_FLAGS_SERVER_TO_REDIR) and bit 1 for a CANCEL request.
//!
//! Neither algorithm copies the message: CMAC is fed in three pieces, and GMAC is computed as
//! GHASH over the message (the 48-byte header prefix and the zeroed signature are whole GHASH
//! blocks) XOR E(K, J0), which is AES-GCM with an empty plaintext (NIST SP800-38D).

use aes::cipher::{generic_array::GenericArray, BlockEncrypt, KeyInit};
use aes::Aes128;
use cmac::{Cmac, Mac};
use ghash::universal_hash::UniversalHash;
use ghash::GHash;
use subtle::ConstantTimeEq;

use super::CryptoError;
use crate::header::{Flags, FLAGS_OFFSET, HEADER_LEN, SIGNATURE_OFFSET};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SigningAlgorithm {
    AesCmac,
    AesGmac,
}

impl SigningAlgorithm {
    /// From the SIGNING_CAPABILITIES id (1 = AES-CMAC, 2 = AES-GMAC); HMAC-SHA256 (0) belongs
    /// to the 2.x dialects and is not offered.
    pub fn from_u16(v: u16) -> Option<Self> {
        match v {
            1 => Some(Self::AesCmac),
            2 => Some(Self::AesGmac),
            _ => None,
        }
    }
    pub fn to_u16(self) -> u16 {
        match self {
            Self::AesCmac => 1,
            Self::AesGmac => 2,
        }
    }
}

/// A signing key with its algorithm.
#[derive(Clone, PartialEq, Eq)]
pub struct SigningKey {
    pub algorithm: SigningAlgorithm,
    key: [u8; 16],
}

impl std::fmt::Debug for SigningKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SigningKey({:?})", self.algorithm)
    }
}

const ZERO_SIG: [u8; 16] = [0; 16];

fn parts(msg: &[u8]) -> Result<(&[u8], &[u8]), CryptoError> {
    if msg.len() < HEADER_LEN {
        return Err(CryptoError::Malformed("message shorter than a header"));
    }
    let (head, rest) = msg.split_at(SIGNATURE_OFFSET);
    Ok((head, rest.split_at(16).1))
}

impl SigningKey {
    pub fn new(algorithm: SigningAlgorithm, key: [u8; 16]) -> Self {
        SigningKey { algorithm, key }
    }

    /// The signature of `msg` (header first), its Signature field taken as zero.
    pub fn compute(&self, msg: &[u8]) -> Result<[u8; 16], CryptoError> {
        let (head, body) = parts(msg)?;
        match self.algorithm {
            SigningAlgorithm::AesCmac => {
                let mut mac = <Cmac<Aes128> as Mac>::new_from_slice(&self.key)
                    .map_err(|_| CryptoError::Malformed("key length"))?;
                mac.update(head);
                mac.update(&ZERO_SIG);
                mac.update(body);
                Ok(mac.finalize().into_bytes().into())
            }
            SigningAlgorithm::AesGmac => Ok(self.gmac(head, body)),
        }
    }

    fn gmac(&self, head: &[u8], body: &[u8]) -> [u8; 16] {
        let nonce = gmac_nonce(head);
        let aes = Aes128::new(GenericArray::from_slice(&self.key));
        let mut h = GenericArray::default();
        aes.encrypt_block(&mut h);
        let mut gh = GHash::new(&h);
        gh.update_padded(head);
        gh.update_padded(&ZERO_SIG);
        gh.update_padded(body);
        let aad_bits = ((head.len() + 16 + body.len()) as u64).wrapping_mul(8);
        let mut lens = [0u8; 16];
        lens[..8].copy_from_slice(&aad_bits.to_be_bytes());
        gh.update(&[GenericArray::from(lens)]);
        let s = gh.finalize();
        let mut j0 = [0u8; 16];
        j0[..12].copy_from_slice(&nonce);
        j0[15] = 1;
        let mut ek = GenericArray::from(j0);
        aes.encrypt_block(&mut ek);
        let mut tag = [0u8; 16];
        for ((t, a), b) in tag.iter_mut().zip(s.iter()).zip(ek.iter()) {
            *t = a ^ b;
        }
        tag
    }

    /// Sets SMB2_FLAGS_SIGNED and writes the signature into `msg`.
    pub fn sign(&self, msg: &mut [u8]) -> Result<(), CryptoError> {
        if msg.len() < HEADER_LEN {
            return Err(CryptoError::Malformed("message shorter than a header"));
        }
        if let Some(f) = msg.get_mut(FLAGS_OFFSET..FLAGS_OFFSET + 4) {
            let v = u32::from_le_bytes((&*f).try_into().unwrap_or([0; 4])) | Flags::SIGNED;
            f.copy_from_slice(&v.to_le_bytes());
        }
        let sig = self.compute(msg)?;
        if let Some(s) = msg.get_mut(SIGNATURE_OFFSET..SIGNATURE_OFFSET + 16) {
            s.copy_from_slice(&sig);
        }
        Ok(())
    }

    /// Checks the signature carried in `msg`, in constant time.
    pub fn verify(&self, msg: &[u8]) -> bool {
        let Ok(sig) = self.compute(msg) else {
            return false;
        };
        msg.get(SIGNATURE_OFFSET..SIGNATURE_OFFSET + 16)
            .is_some_and(|carried| bool::from(carried.ct_eq(&sig)))
    }
}

/// The 12-byte GMAC nonce from a header's first 48 bytes.
fn gmac_nonce(head: &[u8]) -> [u8; 12] {
    let get = |r: std::ops::Range<usize>| head.get(r).unwrap_or(&[]);
    let mut nonce = [0u8; 12];
    nonce[..8].copy_from_slice(get(24..32));
    let flags = u32::from_le_bytes(get(16..20).try_into().unwrap_or([0; 4]));
    let command = u16::from_le_bytes(get(12..14).try_into().unwrap_or([0; 2]));
    let mut bits = 0u32;
    if flags & Flags::SERVER_TO_REDIR != 0 {
        bits |= 1;
    }
    if command == 0x000C {
        bits |= 2;
    }
    nonce[8..].copy_from_slice(&bits.to_le_bytes());
    nonce
}
