//! A small strict DER reader and writer for the SPNEGO tokens: single-byte tags, definite
//! lengths in minimal form, nothing past the end of the enclosing value.

use crate::error::DecodeError;

const WHAT: &str = "DER";

/// Reads one TLV from the front of `buf`: (tag, value, rest).
pub fn read_tlv(buf: &[u8]) -> Result<(u8, &[u8], &[u8]), DecodeError> {
    let (&tag, rest) = buf
        .split_first()
        .ok_or(DecodeError::Invalid("DER: empty"))?;
    if tag & 0x1F == 0x1F {
        return Err(DecodeError::Invalid("DER: multi-byte tag"));
    }
    let (&first, mut rest) = rest
        .split_first()
        .ok_or(DecodeError::Invalid("DER: no length"))?;
    let len = if first < 0x80 {
        usize::from(first)
    } else {
        let n = usize::from(first & 0x7F);
        if n == 0 || n > 4 {
            return Err(DecodeError::Invalid("DER: indefinite or oversized length"));
        }
        let (bytes, r) = rest
            .split_at_checked(n)
            .ok_or(DecodeError::OutOfBounds(WHAT))?;
        rest = r;
        if bytes.first() == Some(&0) {
            return Err(DecodeError::Invalid("DER: length not minimal"));
        }
        let len = bytes.iter().fold(0usize, |a, b| (a << 8) | usize::from(*b));
        if len < 0x80 {
            return Err(DecodeError::Invalid("DER: length not minimal"));
        }
        len
    };
    let (value, rest) = rest
        .split_at_checked(len)
        .ok_or(DecodeError::OutOfBounds(WHAT))?;
    Ok((tag, value, rest))
}

/// Reads a TLV that must carry `tag` and be the whole of `buf`.
pub fn expect_only(buf: &[u8], tag: u8) -> Result<&[u8], DecodeError> {
    let (t, v, rest) = read_tlv(buf)?;
    if t != tag || !rest.is_empty() {
        return Err(DecodeError::Invalid(
            "DER: unexpected tag or trailing bytes",
        ));
    }
    Ok(v)
}

/// Encodes one TLV.
pub fn tlv(tag: u8, value: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(value.len() + 6);
    out.push(tag);
    let len = value.len();
    if len < 0x80 {
        out.push(len as u8);
    } else {
        let bytes = (len as u32).to_be_bytes();
        let skip = bytes.iter().take_while(|b| **b == 0).count();
        let used = bytes.get(skip..).unwrap_or(&[]);
        out.push(0x80 | used.len() as u8);
        out.extend_from_slice(used);
    }
    out.extend_from_slice(value);
    out
}
