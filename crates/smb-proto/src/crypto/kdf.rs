//! SP800-108 counter-mode KDF with HMAC-SHA256 and the SMB 3.1.1 key schedule
//! (MS-SMB2 3.1.4.2, 3.3.5.5.3).

use hmac::{Hmac, Mac};
use sha2::Sha256;

use super::preauth::PreauthHash;
use super::transform::Cipher;

pub const LABEL_SIGNING: &[u8] = b"SMBSigningKey\0";
pub const LABEL_C2S_CIPHER: &[u8] = b"SMBC2SCipherKey\0";
pub const LABEL_S2C_CIPHER: &[u8] = b"SMBS2CCipherKey\0";
pub const LABEL_APPLICATION: &[u8] = b"SMBAppKey\0";

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
}
