//! The one SMB1 message an SMB2-only server still meets: a client's multi-protocol NEGOTIATE
//! (MS-CIFS 2.2.4.52.1). When it offers "SMB 2.???", the server answers with an SMB2 NEGOTIATE
//! response for dialect 0x02FF and the client starts over in SMB2 (MS-SMB2 3.3.5.3.1).

use crate::error::DecodeError;
use crate::wire::Reader;

pub const SMB1_PROTOCOL_ID: [u8; 4] = [0xFF, b'S', b'M', b'B'];
const SMB_COM_NEGOTIATE: u8 = 0x72;

/// Whether `frame` starts like an SMB1 message.
pub fn is_smb1(frame: &[u8]) -> bool {
    frame.starts_with(&SMB1_PROTOCOL_ID)
}

/// The dialect strings of an SMB1 NEGOTIATE request, without their 0x02 markers and NULs.
pub fn negotiate_dialects(frame: &[u8]) -> Result<Vec<&[u8]>, DecodeError> {
    let mut r = Reader::new(frame, "SMB1 NEGOTIATE");
    if r.array::<4>()? != SMB1_PROTOCOL_ID {
        return Err(DecodeError::BadProtocolId);
    }
    if r.u8()? != SMB_COM_NEGOTIATE {
        return Err(DecodeError::Invalid("SMB1 message other than NEGOTIATE"));
    }
    r.skip(27)?;
    if r.u8()? != 0 {
        return Err(DecodeError::Invalid("SMB1 NEGOTIATE WordCount is not 0"));
    }
    let count = r.u16()? as usize;
    let mut bytes = r.bytes(count)?;
    let mut out = Vec::new();
    while let Some((&marker, rest)) = bytes.split_first() {
        if marker != 0x02 {
            return Err(DecodeError::Invalid("SMB1 dialect without its 0x02 marker"));
        }
        let end = rest
            .iter()
            .position(|b| *b == 0)
            .ok_or(DecodeError::Invalid("SMB1 dialect without its NUL"))?;
        let (name, tail) = rest.split_at(end);
        out.push(name);
        bytes = tail.get(1..).unwrap_or(&[]);
    }
    Ok(out)
}

/// True when the dialects include "SMB 2.???", the wildcard that lets the server move the
/// client to SMB2 with a 0x02FF NEGOTIATE response.
pub fn offers_smb2_wildcard(dialects: &[&[u8]]) -> bool {
    dialects.contains(&&b"SMB 2.???"[..])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn negotiate(dialects: &[&str]) -> Vec<u8> {
        let mut bytes = Vec::new();
        for d in dialects {
            bytes.push(2);
            bytes.extend_from_slice(d.as_bytes());
            bytes.push(0);
        }
        let mut m = SMB1_PROTOCOL_ID.to_vec();
        m.push(0x72);
        m.extend_from_slice(&[0; 27]);
        m.push(0);
        m.extend_from_slice(&(bytes.len() as u16).to_le_bytes());
        m.extend_from_slice(&bytes);
        m
    }

    #[test]
    fn multi_protocol_negotiate() {
        let m = negotiate(&["NT LM 0.12", "SMB 2.002", "SMB 2.???"]);
        assert!(is_smb1(&m));
        let d = negotiate_dialects(&m).unwrap();
        assert_eq!(d, vec![&b"NT LM 0.12"[..], b"SMB 2.002", b"SMB 2.???"]);
        assert!(offers_smb2_wildcard(&d));
        let old = negotiate(&["NT LM 0.12"]);
        assert!(!offers_smb2_wildcard(&negotiate_dialects(&old).unwrap()));
        let mut bad = m.clone();
        bad.pop();
        bad[33] -= 1;
        assert!(negotiate_dialects(&bad).is_err());
        assert!(negotiate_dialects(&m[..20]).is_err());
    }
}
