//! Bounds-checked little-endian reading and writing. Every read returns an error instead of
//! panicking when the input is short.

use crate::error::DecodeError;

pub(crate) struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
    what: &'static str,
}

impl<'a> Reader<'a> {
    pub(crate) fn new(buf: &'a [u8], what: &'static str) -> Self {
        Self { buf, pos: 0, what }
    }

    /// A reader starting at `pos` of `buf`.
    pub(crate) fn at(buf: &'a [u8], pos: usize, what: &'static str) -> Self {
        Self { buf, pos, what }
    }

    pub(crate) fn bytes(&mut self, n: usize) -> Result<&'a [u8], DecodeError> {
        let end = self
            .pos
            .checked_add(n)
            .ok_or(DecodeError::OutOfBounds(self.what))?;
        let s = self.buf.get(self.pos..end).ok_or(DecodeError::Truncated {
            what: self.what,
            need: end,
            have: self.buf.len(),
        })?;
        self.pos = end;
        Ok(s)
    }

    pub(crate) fn array<const N: usize>(&mut self) -> Result<[u8; N], DecodeError> {
        let s = self.bytes(N)?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }

    pub(crate) fn u8(&mut self) -> Result<u8, DecodeError> {
        Ok(self.array::<1>()?[0])
    }
    pub(crate) fn u16(&mut self) -> Result<u16, DecodeError> {
        Ok(u16::from_le_bytes(self.array()?))
    }
    pub(crate) fn u32(&mut self) -> Result<u32, DecodeError> {
        Ok(u32::from_le_bytes(self.array()?))
    }
    pub(crate) fn u64(&mut self) -> Result<u64, DecodeError> {
        Ok(u64::from_le_bytes(self.array()?))
    }
    pub(crate) fn skip(&mut self, n: usize) -> Result<(), DecodeError> {
        self.bytes(n).map(|_| ())
    }
    pub(crate) fn pos(&self) -> usize {
        self.pos
    }
}

/// `buf[offset..offset + len]`, or an error naming `what`.
pub(crate) fn slice<'a>(
    buf: &'a [u8],
    offset: usize,
    len: usize,
    what: &'static str,
) -> Result<&'a [u8], DecodeError> {
    let end = offset
        .checked_add(len)
        .ok_or(DecodeError::OutOfBounds(what))?;
    buf.get(offset..end).ok_or(DecodeError::OutOfBounds(what))
}

/// A buffer given by (offset from the header start, length): an empty one may carry any offset;
/// a non-empty one must start at or after the fixed part of the body and stay inside `msg`.
pub(crate) fn buffer<'a>(
    msg: &'a [u8],
    offset: usize,
    len: usize,
    min_offset: usize,
    what: &'static str,
) -> Result<&'a [u8], DecodeError> {
    if len == 0 {
        return Ok(&[]);
    }
    if offset < min_offset {
        return Err(DecodeError::OutOfBounds(what));
    }
    slice(msg, offset, len, what)
}

pub(crate) fn put_u16(out: &mut Vec<u8>, v: u16) {
    out.extend_from_slice(&v.to_le_bytes());
}
pub(crate) fn put_u32(out: &mut Vec<u8>, v: u32) {
    out.extend_from_slice(&v.to_le_bytes());
}
pub(crate) fn put_u64(out: &mut Vec<u8>, v: u64) {
    out.extend_from_slice(&v.to_le_bytes());
}
pub(crate) fn pad_to(out: &mut Vec<u8>, base: usize, align: usize) {
    while !(out.len() - base).is_multiple_of(align) {
        out.push(0);
    }
}
/// Overwrites a little-endian u16/u32 at `at`, used to patch offsets after the payload is laid
/// out. `at` always lies inside bytes this crate wrote itself.
pub(crate) fn patch_u16(out: &mut [u8], at: usize, v: u16) {
    if let Some(s) = out.get_mut(at..at + 2) {
        s.copy_from_slice(&v.to_le_bytes());
    }
}
pub(crate) fn patch_u32(out: &mut [u8], at: usize, v: u32) {
    if let Some(s) = out.get_mut(at..at + 4) {
        s.copy_from_slice(&v.to_le_bytes());
    }
}

/// UTF-16LE bytes of `s`.
pub fn utf16le(s: &str) -> Vec<u8> {
    s.encode_utf16().flat_map(u16::to_le_bytes).collect()
}

/// Decodes UTF-16LE; odd lengths and unpaired surrogates are errors.
pub fn from_utf16le(b: &[u8], what: &'static str) -> Result<String, DecodeError> {
    if !b.len().is_multiple_of(2) {
        return Err(DecodeError::Invalid(what));
    }
    let units: Vec<u16> = b
        .chunks_exact(2)
        .map(|c| u16::from_le_bytes(c.try_into().unwrap_or([0, 0])))
        .collect();
    String::from_utf16(&units).map_err(|_| DecodeError::Invalid(what))
}
