//! SP800-108 counter-mode KDF with HMAC-SHA256 and the key schedules of each dialect
//! (MS-SMB2 3.1.4.2, 3.3.5.5.3): 3.1.1 from the preauth hash, 3.0 and 3.0.2 from fixed labels
//! and contexts, 2.x signing with the session key itself.

use hmac::{Hmac, Mac};
use sha2::Sha256;

use super::preauth::PreauthHash;
use super::transform::Cipher;

pub const LABEL_SIGNING: &[u8] = b"SMBSigningKey\0";
pub const LABEL_C2S_CIPHER: &[u8] = b"SMBC2SCipherKey\0";
pub const LABEL_S2C_CIPHER: &[u8] = b"SMBS2CCipherKey\0";
pub const LABEL_APPLICATION: &[u8] = b"SMBAppKey\0";

/// SMB 3.0 and 3.0.2: label and context of each key.
pub const LABEL_30_SIGNING: &[u8] = b"SMB2AESCMAC\0";
pub const CONTEXT_30_SIGNING: &[u8] = b"SmbSign\0";
pub const LABEL_30_APPLICATION: &[u8] = b"SMB2APP\0";
pub const CONTEXT_30_APPLICATION: &[u8] = b"SmbRpc\0";
pub const LABEL_30_CIPHER: &[u8] = b"SMB2AESCCM\0";
/// The server encrypts with the key of this context (Session.EncryptionKey).
pub const CONTEXT_30_SERVER_OUT: &[u8] = b"ServerOut\0";
/// The server decrypts with the key of this context (Session.DecryptionKey).
pub const CONTEXT_30_SERVER_IN: &[u8] = b"ServerIn \0";

/// KDF in counter mode (SP800-108 5.1) with HMAC-SHA256 as PRF, r = 32, the counter before
/// the fixed input: `K(i) = HMAC(Ko, [i]_32 || fixed)`, concatenated to `out.len()` bytes.
pub fn kdf_counter_fixed(key: &[u8], fixed: &[u8], out: &mut [u8]) {
    for (i, chunk) in out.chunks_mut(32).enumerate() {
        // HMAC takes keys of any length, so new_from_slice cannot fail.
        let Ok(mut mac) = Hmac::<Sha256>::new_from_slice(key) else {
            return;
        };
        mac.update(&(i as u32 + 1).to_be_bytes());
        mac.update(fixed);
        let block = mac.finalize().into_bytes();
        chunk.copy_from_slice(block.get(..chunk.len()).unwrap_or(&[]));
    }
}

/// The SMB form (MS-SMB2 3.1.4.2): fixed input = `Label || 0x00 || Context || [L]_32`, with
/// L = 8 * out.len().
pub fn kdf_counter_hmac_sha256(key: &[u8], label: &[u8], context: &[u8], out: &mut [u8]) {
    let l_bits = (out.len() as u32).wrapping_mul(8);
    let mut fixed = Vec::with_capacity(label.len() + context.len() + 5);
    fixed.extend_from_slice(label);
    fixed.push(0);
    fixed.extend_from_slice(context);
    fixed.extend_from_slice(&l_bits.to_be_bytes());
    kdf_counter_fixed(key, &fixed, out);
}

/// A cipher key of 16 or 32 bytes.
#[derive(Clone, PartialEq, Eq)]
pub struct CipherKey {
    bytes: [u8; 32],
    len: usize,
}

impl CipherKey {
    pub fn new(key: &[u8]) -> Option<Self> {
        if key.len() != 16 && key.len() != 32 {
            return None;
        }
        let mut bytes = [0u8; 32];
        bytes.get_mut(..key.len())?.copy_from_slice(key);
        Some(CipherKey {
            bytes,
            len: key.len(),
        })
    }
    pub fn as_bytes(&self) -> &[u8] {
        self.bytes.get(..self.len).unwrap_or(&[])
    }
}

impl std::fmt::Debug for CipherKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "CipherKey({} bytes)", self.len)
    }
}

/// The keys of an SMB 3.1.1 session (or, for `signing`, of one channel of it).
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct SessionKeys {
    pub signing: [u8; 16],
    /// Client-to-server: the server decrypts with it.
    pub c2s_cipher: CipherKey,
    /// Server-to-client: the server encrypts with it.
    pub s2c_cipher: CipherKey,
    pub application: [u8; 16],
}

impl SessionKeys {
    /// Derives the 3.1.1 keys from the authentication's session key and the session's final
    /// preauth hash. `Session.SessionKey` is the first 16 bytes of `session_key` (zero-padded);
    /// for the AES-256 ciphers the cipher keys are 256 bits and derived from the full key
    /// (MS-SMB2 3.3.5.5.3).
    pub fn derive_311(session_key: &[u8], preauth: &PreauthHash, cipher: Option<Cipher>) -> Self {
        let mut short = [0u8; 16];
        for (d, s) in short.iter_mut().zip(session_key) {
            *d = *s;
        }
        let ctx = preauth.0.as_slice();
        let mut signing = [0u8; 16];
        kdf_counter_hmac_sha256(&short, LABEL_SIGNING, ctx, &mut signing);
        let mut application = [0u8; 16];
        kdf_counter_hmac_sha256(&short, LABEL_APPLICATION, ctx, &mut application);
        let wide = cipher.is_some_and(Cipher::is_256);
        let (ko, len): (&[u8], usize) = if wide {
            (session_key, 32)
        } else {
            (&short, 16)
        };
        let mut c2s = [0u8; 32];
        let mut s2c = [0u8; 32];
        kdf_counter_hmac_sha256(ko, LABEL_C2S_CIPHER, ctx, c2s.split_at_mut(len).0);
        kdf_counter_hmac_sha256(ko, LABEL_S2C_CIPHER, ctx, s2c.split_at_mut(len).0);
        SessionKeys {
            signing,
            c2s_cipher: CipherKey { bytes: c2s, len },
            s2c_cipher: CipherKey { bytes: s2c, len },
            application,
        }
    }

    /// The keys of a session of `dialect`: 3.1.1 as `derive_311`, 3.0 and 3.0.2 as
    /// `derive_30`, 2.0.2 and 2.1 as `derive_2x`.
    pub fn derive(
        dialect: u16,
        session_key: &[u8],
        preauth: &PreauthHash,
        cipher: Option<Cipher>,
    ) -> Self {
        match dialect {
            0x0311 => Self::derive_311(session_key, preauth, cipher),
            0x0300 | 0x0302 => Self::derive_30(session_key),
            _ => Self::derive_2x(session_key),
        }
    }

    /// SMB 3.0 and 3.0.2: every key from `Session.SessionKey` (the first 16 bytes, zero-padded)
    /// with a fixed label and context; AES-128-CCM keys.
    pub fn derive_30(session_key: &[u8]) -> Self {
        let short = session_key_16(session_key);
        let key = |label: &[u8], context: &[u8]| {
            let mut k = [0u8; 16];
            kdf_counter_hmac_sha256(&short, label, context, &mut k);
            k
        };
        let cipher = |context: &[u8]| {
            let mut bytes = [0u8; 32];
            bytes[..16].copy_from_slice(&key(LABEL_30_CIPHER, context));
            CipherKey { bytes, len: 16 }
        };
        SessionKeys {
            signing: key(LABEL_30_SIGNING, CONTEXT_30_SIGNING),
            c2s_cipher: cipher(CONTEXT_30_SERVER_IN),
            s2c_cipher: cipher(CONTEXT_30_SERVER_OUT),
            application: key(LABEL_30_APPLICATION, CONTEXT_30_APPLICATION),
        }
    }

    /// SMB 2.0.2 and 2.1: HMAC-SHA256 signing keyed with `Session.SessionKey` itself, which is
    /// also the application key; no encryption (the cipher keys are zero and never used: such
    /// a session has no cipher).
    pub fn derive_2x(session_key: &[u8]) -> Self {
        let short = session_key_16(session_key);
        let none = CipherKey {
            bytes: [0; 32],
            len: 16,
        };
        SessionKeys {
            signing: short,
            c2s_cipher: none.clone(),
            s2c_cipher: none,
            application: short,
        }
    }

    /// The signing key of a channel bound to a session of `dialect` (MS-SMB2 3.3.5.5.3): the
    /// session's derivation from the binding's own session key (and, for 3.1.1, its own
    /// preauth hash).
    pub fn channel_signing_key_for(
        dialect: u16,
        session_key: &[u8],
        binding_preauth: &PreauthHash,
    ) -> [u8; 16] {
        match dialect {
            0x0311 => Self::channel_signing_key(session_key, binding_preauth),
            _ => Self::derive(dialect, session_key, binding_preauth, None).signing,
        }
    }

    /// A channel signing key for session binding (MS-SMB2 3.3.5.5.3): the same derivation with
    /// the binding's own preauth hash.
    pub fn channel_signing_key(session_key: &[u8], binding_preauth: &PreauthHash) -> [u8; 16] {
        let mut short = [0u8; 16];
        for (d, s) in short.iter_mut().zip(session_key) {
            *d = *s;
        }
        let mut k = [0u8; 16];
        kdf_counter_hmac_sha256(&short, LABEL_SIGNING, &binding_preauth.0, &mut k);
        k
    }
}

/// `Session.SessionKey`: the first 16 bytes of the authentication's key, zero-padded.
fn session_key_16(session_key: &[u8]) -> [u8; 16] {
    let mut short = [0u8; 16];
    for (d, s) in short.iter_mut().zip(session_key) {
        *d = *s;
    }
    short
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(s: &str) -> Vec<u8> {
        let s: String = s.split_whitespace().collect();
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    /// NIST CAVP KBKDF vectors (KDFCTR_gen.rsp), [PRF=HMAC_SHA256] [CTRLOCATION=BEFORE_FIXED]
    /// [RLEN=32_BITS]: L = 128 (COUNT=0), L = 256, and L = 320 (two PRF blocks, COUNT=30).
    #[test]
    fn counter_mode_matches_nist_cavp() {
        let cases = [
            (
                "dd1d91b7d90b2bd3138533ce92b272fbf8a369316aefe242e659cc0ae238afe0",
                "01322b96b30acd197979444e468e1c5c6859bf1b1cf951b7e725303e237e46b8
                 64a145fab25e517b08f8683d0315bb2911d80a0e8aba17f3b413faac",
                "10621342bfb0fd40046c0e29f2cfdbf0",
            ),
            (
                "e204d6d466aad507ffaf6d6dab0a5b26152c9e21e764370464e360c8fbc765c6",
                "7b03b98d9f94b899e591f3ef264b71b193fba7043c7e953cde23bc5384bc1a62
                 93580115fae3495fd845dadbd02bd6455cf48d0f62b33e62364a3a80",
                "770dfab6a6a4a4bee0257ff335213f78d8287b4fd537d5c1fffa956910e7c779",
            ),
            (
                "c4bedbddb66493e7c7259a3bbbc25f8c7e0ca7fe284d92d431d9cd99a0d214ac",
                "1c69c54766791e315c2cc5c47ecd3ffab87d0d273dd920e70955814c220eacac
                 e6a5946542da3dfe24ff626b4897898cafb7db83bdff3c14fa46fd4b",
                "1da47638d6c9c4d04d74d4640bbd42ab814d9e8cc22f4326695239f96b0693f1
                 2d0dd1152cf44430",
            ),
        ];
        for (ki, fixed, ko) in cases {
            let want = hex(ko);
            let mut out = vec![0u8; want.len()];
            kdf_counter_fixed(&hex(ki), &hex(fixed), &mut out);
            assert_eq!(out, want);
        }
    }

    /// The 3.0 keys against an independent computation of the same KDF (Python's `hmac` and
    /// `hashlib`, L = 128, the labels and contexts of MS-SMB2 3.3.5.5.3) for the session key
    /// 10 11 .. 1f; a key longer than 16 bytes counts by its first 16. The 2.x keys are the
    /// session key itself. (Interoperability with Samba's client over 3.0, signed and
    /// encrypted, is in lanes-smb-server's smbclient tests.)
    #[test]
    fn smb30_and_smb2x_keys() {
        let sk: Vec<u8> = (0x10..0x20).collect();
        let k = SessionKeys::derive_30(&sk);
        assert_eq!(k.signing.to_vec(), hex("24f1f0fdb269db9836d70efbbb97413f"));
        assert_eq!(
            k.application.to_vec(),
            hex("fcdcc2c713f38db23189c653589890c7")
        );
        assert_eq!(
            k.s2c_cipher.as_bytes(),
            hex("fa192f82747e0174f720cdaea0e2f537")
        );
        assert_eq!(
            k.c2s_cipher.as_bytes(),
            hex("fe85e20ea4633a2437828b14d1833584")
        );
        let mut long = sk.clone();
        long.extend_from_slice(&[0xAA; 16]);
        assert_eq!(SessionKeys::derive_30(&long), k);
        let pre = PreauthHash::default();
        assert_eq!(SessionKeys::derive(0x0300, &sk, &pre, None), k);
        assert_eq!(SessionKeys::derive(0x0302, &sk, &pre, None), k);
        assert_eq!(
            SessionKeys::channel_signing_key_for(0x0302, &sk, &pre),
            k.signing
        );
        for d in [0x0202, 0x0210] {
            let k2 = SessionKeys::derive(d, &long, &pre, None);
            assert_eq!(k2.signing.to_vec(), sk);
            assert_eq!(k2.application.to_vec(), sk);
        }
        // 3.1.1 still goes through the preauth hash.
        assert_eq!(
            SessionKeys::derive(0x0311, &sk, &pre, None),
            SessionKeys::derive_311(&sk, &pre, None)
        );
        assert_ne!(SessionKeys::derive_311(&sk, &pre, None).signing, k.signing);
    }
}
