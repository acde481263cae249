//! The SHA-512 preauth integrity hash chain (MS-SMB2 3.3.5.4, 3.3.5.5):
//! H(i) = SHA-512(H(i-1) || message), H(0) = 64 zero bytes. The connection's chain covers the
//! NEGOTIATE request and response; each session's chain starts from the connection's value and
//! covers its SESSION_SETUP requests and responses up to (not including) the final response.

use sha2::{Digest, Sha512};

#[derive(Clone, Copy, PartialEq, Eq)]
pub struct PreauthHash(pub [u8; 64]);

impl Default for PreauthHash {
    fn default() -> Self {
        PreauthHash([0; 64])
    }
}

impl std::fmt::Debug for PreauthHash {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PreauthHash(")?;
        self.0.iter().try_for_each(|b| write!(f, "{b:02x}"))?;
        write!(f, ")")
    }
}

impl PreauthHash {
    /// Folds one whole message (header first, as on the wire, without the transport prefix) in.
    pub fn update(&mut self, message: &[u8]) {
        let mut h = Sha512::new();
        h.update(self.0);
        h.update(message);
        self.0.copy_from_slice(&h.finalize());
    }

    /// The same, for a message that goes out as several slices.
    pub fn update_vectored(&mut self, parts: &[&[u8]]) {
        let mut h = Sha512::new();
        h.update(self.0);
        parts.iter().for_each(|p| h.update(p));
        self.0.copy_from_slice(&h.finalize());
    }
}
