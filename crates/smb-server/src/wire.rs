//! Little-endian writers, UTF-16LE names and FILETIME conversion for the bodies this crate
//! lays out itself (information classes, directory entries).

use std::time::{SystemTime, UNIX_EPOCH};

pub fn put_u16(out: &mut Vec<u8>, v: u16) {
    out.extend_from_slice(&v.to_le_bytes());
}
pub fn put_u32(out: &mut Vec<u8>, v: u32) {
    out.extend_from_slice(&v.to_le_bytes());
}
pub fn put_u64(out: &mut Vec<u8>, v: u64) {
    out.extend_from_slice(&v.to_le_bytes());
}
pub fn patch_u32(out: &mut [u8], at: usize, v: u32) {
    if let Some(s) = out.get_mut(at..at + 4) {
        s.copy_from_slice(&v.to_le_bytes());
    }
}
pub fn pad8(out: &mut Vec<u8>, base: usize) {
    while !(out.len() - base).is_multiple_of(8) {
        out.push(0);
    }
}

/// Appends `s` as UTF-16LE and returns the byte count.
pub fn put_utf16(out: &mut Vec<u8>, s: &str) -> usize {
    let before = out.len();
    for u in s.encode_utf16() {
        out.extend_from_slice(&u.to_le_bytes());
    }
    out.len() - before
}

/// Decodes UTF-16LE; None for odd lengths or unpaired surrogates.
pub fn from_utf16(b: &[u8]) -> Option<String> {
    if !b.len().is_multiple_of(2) {
        return None;
    }
    let units: Vec<u16> = b
        .chunks_exact(2)
        .map(|c| {
            u16::from_le_bytes([
                c.first().copied().unwrap_or(0),
                c.get(1).copied().unwrap_or(0),
            ])
        })
        .collect();
    String::from_utf16(&units).ok()
}

pub fn u64_at(b: &[u8], at: usize) -> Option<u64> {
    b.get(at..at + 8)
        .map(|s| u64::from_le_bytes(s.try_into().unwrap_or([0; 8])))
}
pub fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    b.get(at..at + 4)
        .map(|s| u32::from_le_bytes(s.try_into().unwrap_or([0; 4])))
}

/// 100 ns intervals between 1601-01-01 and 1970-01-01.
const EPOCH_DIFF: u64 = 116_444_736_000_000_000;

/// A FILETIME from seconds and nanoseconds since the Unix epoch (0 for times before 1601).
pub fn filetime(secs: i64, nsec: i64) -> u64 {
    let t = i128::from(secs) * 10_000_000 + i128::from(nsec) / 100 + i128::from(EPOCH_DIFF);
    u64::try_from(t).unwrap_or(0)
}

/// The inverse of [`filetime`]: (seconds, nanoseconds) since the Unix epoch.
pub fn from_filetime(ft: u64) -> (i64, i64) {
    let rel = i128::from(ft) - i128::from(EPOCH_DIFF);
    let secs = rel.div_euclid(10_000_000);
    let nsec = rel.rem_euclid(10_000_000) * 100;
    (
        i64::try_from(secs).unwrap_or(0),
        i64::try_from(nsec).unwrap_or(0),
    )
}

pub fn now_filetime() -> u64 {
    let d = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    filetime(
        i64::try_from(d.as_secs()).unwrap_or(0),
        i64::from(d.subsec_nanos()),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filetime_round_trip() {
        assert_eq!(filetime(0, 0), EPOCH_DIFF);
        let ft = filetime(1_700_000_000, 123_456_700);
        assert_eq!(from_filetime(ft), (1_700_000_000, 123_456_700));
        assert_eq!(filetime(-20_000_000_000, 0), 0);
    }

    #[test]
    fn utf16() {
        let mut v = Vec::new();
        assert_eq!(put_utf16(&mut v, "aé"), 4);
        assert_eq!(from_utf16(&v).as_deref(), Some("aé"));
        assert_eq!(from_utf16(&[0x61]), None);
    }
}
