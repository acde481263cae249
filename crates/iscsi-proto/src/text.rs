//! Text data segments (RFC 7143 6.1): `key=value` pairs separated by NUL, and the value grammar
//! of RFC 7143 5.1 (numbers, booleans, lists, binary values, the reserved constants).
//!
//! Parsing borrows from the segment; building appends to one `BytesMut`. Nothing here knows what
//! a key means: that is `negotiation`'s job.

use base64::Engine as _;
use bytes::{BufMut, Bytes, BytesMut};

/// RFC 7143 6.1: "key names ... MUST NOT exceed 63 bytes".
pub const MAX_KEY_LEN: usize = 63;
/// RFC 7143 5.1: "the maximum length of an individual value ... is 255 bytes".
pub const MAX_VALUE_LEN: usize = 255;
/// Binary values of the authentication keys (CHAP_C, CHAP_R, SRP_*, KRB_*, SPKM_*) may be long
/// (RFC 7143 12.1: large-binary-value); we accept encodings up to 8192 bytes.
pub const MAX_LONG_VALUE_LEN: usize = 8192;

/// The reserved answer for a value outside the allowed range or set (RFC 7143 6.2).
pub const REJECT: &str = "Reject";
/// The reserved answer for a key that does not apply in this negotiation (RFC 7143 6.2).
pub const IRRELEVANT: &str = "Irrelevant";
/// The reserved answer for a key the acceptor does not know (RFC 7143 6.2).
pub const NOT_UNDERSTOOD: &str = "NotUnderstood";
/// The reserved value "None" (AuthMethod, digests).
pub const NONE: &str = "None";

/// What can be wrong with a text data segment from the peer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TextError {
    #[error("key=value pair without '='")]
    MissingEquals,
    #[error("empty key")]
    EmptyKey,
    #[error("key of {0} bytes exceeds 63")]
    KeyTooLong(usize),
    #[error("key contains a character outside the RFC 7143 6.1 key alphabet")]
    InvalidKey,
    #[error("value of key {key} is {len} bytes long")]
    ValueTooLong { key: String, len: usize },
    #[error("text is not UTF-8")]
    NotUtf8,
    /// RFC 7143 6.2: a key MUST NOT be sent more than once in a negotiation sequence.
    #[error("key {0} appears more than once")]
    DuplicateKey(String),
    #[error("more than {0} key=value pairs")]
    TooManyPairs(usize),
}

/// Upper bound on pairs in one segment, so a hostile peer cannot make us allocate per NUL.
pub const MAX_PAIRS: usize = 1024;

/// True for keys whose values are large binary values (RFC 7143 12.1.x).
pub fn is_long_value_key(key: &str) -> bool {
    matches!(key, "CHAP_C" | "CHAP_R")
        || key.starts_with("SRP_")
        || key.starts_with("KRB_")
        || key.starts_with("SPKM_")
}

/// RFC 7143 6.1: keys are built of letters, digits, `.`, `-`, `+`, `@`, `_`, `#`, `:`
/// (the `X#` and `X-` extension prefixes included).
fn valid_key(key: &str) -> bool {
    key.bytes().all(|b| {
        b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b'+' | b'@' | b'_' | b'#' | b':')
    })
}

/// Parses a complete text segment into `(key, value)` pairs, rejecting a repeated key.
///
/// RFC 7143 6.1: "every key=value pair, including the last or only pair ... MUST be followed by
/// one null (0x00) delimiter". We tolerate a missing final NUL and empty runs between NULs
/// (padding some initiators leave), since neither changes the meaning.
pub fn parse(data: &[u8]) -> Result<Vec<(&str, &str)>, TextError> {
    let pairs = parse_allow_repeats(data)?;
    for (i, (key, _)) in pairs.iter().enumerate() {
        if pairs
            .get(..i)
            .unwrap_or_default()
            .iter()
            .any(|(k, _)| k == key)
        {
            return Err(TextError::DuplicateKey((*key).to_owned()));
        }
    }
    Ok(pairs)
}

/// Like [`parse`], but keeps repeated keys (SendTargets answers repeat TargetName/TargetAddress).
pub fn parse_allow_repeats(data: &[u8]) -> Result<Vec<(&str, &str)>, TextError> {
    let text = std::str::from_utf8(data).map_err(|_| TextError::NotUtf8)?;
    let mut out = Vec::new();
    for item in text.split('\0').filter(|s| !s.is_empty()) {
        if out.len() >= MAX_PAIRS {
            return Err(TextError::TooManyPairs(MAX_PAIRS));
        }
        let (key, value) = item.split_once('=').ok_or(TextError::MissingEquals)?;
        if key.is_empty() {
            return Err(TextError::EmptyKey);
        }
        if key.len() > MAX_KEY_LEN {
            return Err(TextError::KeyTooLong(key.len()));
        }
        if !valid_key(key) {
            return Err(TextError::InvalidKey);
        }
        let max = if is_long_value_key(key) {
            MAX_LONG_VALUE_LEN
        } else {
            MAX_VALUE_LEN
        };
        if value.len() > max {
            return Err(TextError::ValueTooLong {
                key: key.to_owned(),
                len: value.len(),
            });
        }
        out.push((key, value));
    }
    Ok(out)
}

/// Builds a text segment: each pair is written as `key=value\0`.
#[derive(Debug, Default, Clone)]
pub struct TextBuilder {
    buf: BytesMut,
}

impl TextBuilder {
    pub fn new() -> Self {
        Self::default()
    }

    /// Appends one `key=value` pair.
    pub fn push(&mut self, key: &str, value: &str) -> &mut Self {
        self.buf.reserve(key.len() + value.len() + 2);
        self.buf.put_slice(key.as_bytes());
        self.buf.put_u8(b'=');
        self.buf.put_slice(value.as_bytes());
        self.buf.put_u8(0);
        self
    }

    /// Appends a numeric value in decimal.
    pub fn push_number(&mut self, key: &str, value: u64) -> &mut Self {
        self.push(key, &value.to_string())
    }

    /// Appends `Yes` or `No`.
    pub fn push_bool(&mut self, key: &str, value: bool) -> &mut Self {
        self.push(key, format_bool(value))
    }

    pub fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }

    pub fn len(&self) -> usize {
        self.buf.len()
    }

    pub fn finish(self) -> Bytes {
        self.buf.freeze()
    }
}

/// Encodes pairs into one segment.
pub fn encode<K: AsRef<str>, V: AsRef<str>>(pairs: &[(K, V)]) -> Bytes {
    let mut b = TextBuilder::new();
    for (k, v) in pairs {
        b.push(k.as_ref(), v.as_ref());
    }
    b.finish()
}

/// What is wrong with a value (the answer is `Reject`, or a login error, depending on the key).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ValueError {
    #[error("not a number")]
    NotANumber,
    #[error("number out of range")]
    OutOfRange,
    #[error("not Yes or No")]
    NotABoolean,
    #[error("bad binary encoding")]
    BadBinary,
}

/// Parses a numerical value: decimal, `0x`/`0X` hex, or `0b`/`0B` base64 (RFC 7143 5.1), up to
/// 2^64-1.
pub fn parse_number(s: &str) -> Result<u64, ValueError> {
    if has_prefix(s, "0x") || has_prefix(s, "0b") {
        let bytes = decode_binary(s).map_err(|_| ValueError::NotANumber)?;
        let significant: &[u8] = {
            let first = bytes.iter().position(|b| *b != 0).unwrap_or(bytes.len());
            bytes.get(first..).unwrap_or_default()
        };
        if significant.len() > 8 {
            return Err(ValueError::OutOfRange);
        }
        return Ok(significant
            .iter()
            .fold(0u64, |acc, b| (acc << 8) | u64::from(*b)));
    }
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return Err(ValueError::NotANumber);
    }
    s.parse::<u64>().map_err(|_| ValueError::OutOfRange)
}

/// Parses a number that must lie in `lo..=hi` (RFC 7143 13: each numeric key has a range).
pub fn parse_number_in(s: &str, lo: u64, hi: u64) -> Result<u64, ValueError> {
    let n = parse_number(s)?;
    if n < lo || n > hi {
        return Err(ValueError::OutOfRange);
    }
    Ok(n)
}

/// `Yes` / `No` (RFC 7143 5.1: boolean-value, case-sensitive).
pub fn parse_bool(s: &str) -> Result<bool, ValueError> {
    match s {
        "Yes" => Ok(true),
        "No" => Ok(false),
        _ => Err(ValueError::NotABoolean),
    }
}

pub fn format_bool(v: bool) -> &'static str {
    if v {
        "Yes"
    } else {
        "No"
    }
}

/// The values of a list (RFC 7143 5.1: comma-separated, order is preference).
pub fn parse_list(s: &str) -> impl Iterator<Item = &str> {
    s.split(',')
}

fn has_prefix(s: &str, prefix: &str) -> bool {
    s.get(..2).is_some_and(|p| p.eq_ignore_ascii_case(prefix))
}

/// Decodes a binary value: `0x` hex (an odd digit count gets a leading zero) or `0b` base64
/// (RFC 7143 5.1, used by CHAP_C/CHAP_R).
pub fn decode_binary(s: &str) -> Result<Vec<u8>, ValueError> {
    let body = s.get(2..).ok_or(ValueError::BadBinary)?;
    if body.is_empty() {
        return Err(ValueError::BadBinary);
    }
    if has_prefix(s, "0x") {
        let digits: Vec<u8> = body
            .bytes()
            .map(hex_digit)
            .collect::<Option<_>>()
            .ok_or(ValueError::BadBinary)?;
        let mut out = Vec::with_capacity(digits.len().div_ceil(2));
        let mut iter = digits.iter().copied();
        if digits.len() % 2 == 1 {
            out.extend(iter.next());
        }
        while let (Some(hi), Some(lo)) = (iter.next(), iter.next()) {
            out.push((hi << 4) | lo);
        }
        Ok(out)
    } else if has_prefix(s, "0b") {
        base64::engine::general_purpose::STANDARD
            .decode(body)
            .map_err(|_| ValueError::BadBinary)
    } else {
        Err(ValueError::BadBinary)
    }
}

fn hex_digit(b: u8) -> Option<u8> {
    char::from(b)
        .to_digit(16)
        .and_then(|d| u8::try_from(d).ok())
}

/// Encodes bytes as `0x` followed by lowercase hex.
pub fn encode_hex(bytes: &[u8]) -> String {
    use std::fmt::Write as _;
    let mut s = String::with_capacity(2 + bytes.len() * 2);
    s.push_str("0x");
    for b in bytes {
        let _ = write!(s, "{b:02x}");
    }
    s
}

/// Encodes bytes as `0b` followed by base64.
pub fn encode_base64(bytes: &[u8]) -> String {
    format!(
        "0b{}",
        base64::engine::general_purpose::STANDARD.encode(bytes)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_pairs_with_and_without_final_nul() {
        let p = parse(b"InitiatorName=iqn.a\0SessionType=Normal\0").unwrap();
        assert_eq!(
            p,
            vec![("InitiatorName", "iqn.a"), ("SessionType", "Normal")]
        );
        let p = parse(b"A=1\0B=2").unwrap();
        assert_eq!(p, vec![("A", "1"), ("B", "2")]);
        assert_eq!(parse(b"").unwrap(), vec![]);
        assert_eq!(parse(b"A=\0").unwrap(), vec![("A", "")]);
        assert_eq!(parse(b"A=x=y\0").unwrap(), vec![("A", "x=y")]);
    }

    #[test]
    fn rejects_bad_text() {
        assert_eq!(
            parse(b"A=1\0A=2\0"),
            Err(TextError::DuplicateKey("A".into()))
        );
        assert_eq!(parse(b"novalue\0"), Err(TextError::MissingEquals));
        assert_eq!(parse(b"=1\0"), Err(TextError::EmptyKey));
        assert_eq!(parse(b"A B=1\0"), Err(TextError::InvalidKey));
        assert_eq!(parse(b"A=\xff\0"), Err(TextError::NotUtf8));
        let long_key = format!("{}=1", "K".repeat(64));
        assert_eq!(parse(long_key.as_bytes()), Err(TextError::KeyTooLong(64)));
        let long_value = format!("K={}", "v".repeat(256));
        assert!(matches!(
            parse(long_value.as_bytes()),
            Err(TextError::ValueTooLong { .. })
        ));
        let chap = format!("CHAP_C=0x{}", "ab".repeat(1000));
        assert!(parse(chap.as_bytes()).is_ok());
        assert_eq!(parse_allow_repeats(b"A=1\0A=2\0").unwrap().len(), 2);
    }

    #[test]
    fn numbers() {
        assert_eq!(parse_number("8192"), Ok(8192));
        assert_eq!(parse_number("0x2000"), Ok(8192));
        assert_eq!(parse_number("0X200"), Ok(512));
        assert_eq!(parse_number("0bIAA="), Ok(8192));
        assert_eq!(parse_number("18446744073709551615"), Ok(u64::MAX));
        assert_eq!(
            parse_number("18446744073709551616"),
            Err(ValueError::OutOfRange)
        );
        assert_eq!(
            parse_number("0x010000000000000000"),
            Err(ValueError::OutOfRange)
        );
        assert_eq!(parse_number("-1"), Err(ValueError::NotANumber));
        assert_eq!(parse_number(""), Err(ValueError::NotANumber));
        assert_eq!(parse_number("0x"), Err(ValueError::NotANumber));
        assert_eq!(parse_number_in("0", 1, 10), Err(ValueError::OutOfRange));
    }

    #[test]
    fn booleans_lists_binary() {
        assert_eq!(parse_bool("Yes"), Ok(true));
        assert_eq!(parse_bool("no"), Err(ValueError::NotABoolean));
        assert_eq!(
            parse_list("CRC32C,None").collect::<Vec<_>>(),
            vec!["CRC32C", "None"]
        );
        assert_eq!(decode_binary("0x0abc").unwrap(), vec![0x0a, 0xbc]);
        assert_eq!(decode_binary("0xabc").unwrap(), vec![0x0a, 0xbc]);
        assert_eq!(decode_binary("0bAQID").unwrap(), vec![1, 2, 3]);
        assert!(decode_binary("0xzz").is_err());
        assert!(decode_binary("12").is_err());
        assert_eq!(encode_hex(&[0, 255]), "0x00ff");
        assert_eq!(
            decode_binary(&encode_base64(&[9, 8, 7])).unwrap(),
            vec![9, 8, 7]
        );
    }

    #[test]
    fn encode_roundtrip() {
        let bytes = encode(&[("A", "1"), ("TargetAlias", "disk one")]);
        assert_eq!(&bytes[..], b"A=1\0TargetAlias=disk one\0");
        assert_eq!(
            parse(&bytes).unwrap(),
            vec![("A", "1"), ("TargetAlias", "disk one")]
        );
    }
}
