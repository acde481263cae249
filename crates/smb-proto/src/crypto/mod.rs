//! Preauth integrity, the SMB 3.1.1 key schedule, signing and encryption.

pub mod kdf;
pub mod preauth;
pub mod signing;
pub mod transform;

pub use kdf::{kdf_counter_hmac_sha256, SessionKeys};
pub use preauth::PreauthHash;
pub use signing::{SigningAlgorithm, SigningKey};
pub use transform::{Cipher, TransformHeader};

/// A crypto operation that failed: a tag or signature mismatch, or a bad length.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CryptoError {
    #[error("authentication tag does not match")]
    BadTag,
    #[error("{0}")]
    Malformed(&'static str),
}
