//! CHAP credentials: secrets that never print, algorithm preferences, and their rules.

use std::fmt;

use base64::Engine as _;

/// Shortest accepted CHAP secret. RFC 7143 12.1.3: a secret with fewer than 96 random bits may
/// only be used over IPsec, which lanes does not do, so shorter secrets are refused outright.
pub const MIN_SECRET_LENGTH: usize = 12;
/// Longest accepted CHAP secret (open-iscsi and most targets stop at 255/256 bytes).
pub const MAX_SECRET_LENGTH: usize = 255;

/// A CHAP secret. Its `Debug` and `Display` print `***`, so it cannot leak into logs.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(Vec<u8>);

impl Secret {
    pub fn new(bytes: Vec<u8>) -> Secret {
        Secret(bytes)
    }

    /// The secret bytes, for computing CHAP responses only.
    pub fn expose(&self) -> &[u8] {
        &self.0
    }

    /// Decodes a configured secret: `0x…` is hex and `0b…` is base64 (the binary-value
    /// encodings of RFC 7143 5.1); anything else is taken as the bytes of the text itself.
    pub fn decode(text: &str) -> Result<Secret, String> {
        let bytes = if let Some(hex) = text.strip_prefix("0x").or(text.strip_prefix("0X")) {
            decode_hex(hex).ok_or("`0x` secret is not valid hex (even number of 0-9a-f digits)")?
        } else if let Some(b64) = text.strip_prefix("0b").or(text.strip_prefix("0B")) {
            base64::engine::general_purpose::STANDARD
                .decode(b64)
                .map_err(|_| "`0b` secret is not valid base64".to_string())?
        } else {
            text.as_bytes().to_vec()
        };
        if bytes.len() < MIN_SECRET_LENGTH {
            return Err(format!(
                "secret is {} bytes; CHAP secrets must be at least {MIN_SECRET_LENGTH} bytes \
                 (RFC 7143 12.1.3: 96 random bits)",
                bytes.len()
            ));
        }
        if bytes.len() > MAX_SECRET_LENGTH {
            return Err(format!(
                "secret is {} bytes, longer than {MAX_SECRET_LENGTH}",
                bytes.len()
            ));
        }
        Ok(Secret(bytes))
    }
}

fn decode_hex(hex: &str) -> Option<Vec<u8>> {
    if hex.is_empty() || !hex.len().is_multiple_of(2) {
        return None;
    }
    let digit = |b: u8| (b as char).to_digit(16);
    hex.as_bytes()
        .chunks(2)
        .map(|pair| Some((digit(pair[0])? * 16 + digit(pair[1])?) as u8))
        .collect()
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("***")
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("***")
    }
}

/// CHAP digest algorithms with their CHAP_A numbers (RFC 7143 12.1.3, RFC 1994, IANA PPP
/// authentication algorithms).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ChapAlgorithm {
    Md5 = 5,
    Sha1 = 6,
    Sha256 = 7,
    #[serde(rename = "sha3-256")]
    Sha3_256 = 8,
}

impl ChapAlgorithm {
    /// Every algorithm, strongest first: the default offer.
    pub const STRONGEST_FIRST: [ChapAlgorithm; 4] = [
        ChapAlgorithm::Sha3_256,
        ChapAlgorithm::Sha256,
        ChapAlgorithm::Sha1,
        ChapAlgorithm::Md5,
    ];

    /// The CHAP_A value.
    pub fn number(self) -> u8 {
        self as u8
    }

    pub fn from_number(number: u8) -> Option<ChapAlgorithm> {
        ChapAlgorithm::STRONGEST_FIRST
            .into_iter()
            .find(|a| a.number() == number)
    }
}

/// CHAP credentials for one direction or both.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChapConfig {
    /// CHAP_N the initiator must present.
    pub user: String,
    pub secret: Secret,
    /// Mutual CHAP: the name and secret the target answers the initiator's challenge with.
    pub mutual_user: Option<String>,
    pub mutual_secret: Option<Secret>,
    /// CHAP_A values accepted, most preferred first.
    pub algorithms: Vec<ChapAlgorithm>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_never_print() {
        let secret = Secret::decode("correct horse battery").unwrap();
        assert_eq!(format!("{secret} {secret:?}"), "*** ***");
        let chap = ChapConfig {
            user: "u".into(),
            secret: secret.clone(),
            mutual_user: None,
            mutual_secret: Some(secret),
            algorithms: ChapAlgorithm::STRONGEST_FIRST.to_vec(),
        };
        assert!(!format!("{chap:?}").contains("horse"));
    }

    #[test]
    fn decodes_encodings() {
        assert_eq!(
            Secret::decode("0x000102030405060708090a0b")
                .unwrap()
                .expose(),
            &[0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11]
        );
        assert_eq!(
            Secret::decode("0bAAECAwQFBgcICQoL").unwrap().expose(),
            &[0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11]
        );
        assert!(Secret::decode("short").is_err());
        assert!(Secret::decode("0x0g0102030405060708090a0b").is_err());
        assert!(Secret::decode("0x123").is_err());
        assert!(Secret::decode("0b!!!!").is_err());
        assert!(Secret::decode(&"x".repeat(256)).is_err());
    }

    #[test]
    fn algorithm_numbers() {
        assert_eq!(ChapAlgorithm::Md5.number(), 5);
        assert_eq!(ChapAlgorithm::Sha3_256.number(), 8);
        assert_eq!(ChapAlgorithm::from_number(7), Some(ChapAlgorithm::Sha256));
        assert_eq!(ChapAlgorithm::from_number(9), None);
    }
}
