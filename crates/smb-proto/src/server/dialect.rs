//! Which dialect a NEGOTIATE settles on and what each dialect brings (MS-SMB2 3.3.5.3.1,
//! 3.3.5.4): the highest dialect both sides speak within the server's range, the capabilities
//! that dialect may carry, its signing algorithm, and the answer to an SMB1 multi-protocol
//! NEGOTIATE.

use crate::crypto::SigningAlgorithm;
use crate::msg::negotiate::{
    CAP_DFS, CAP_ENCRYPTION, CAP_LARGE_MTU, CAP_LEASING, CAP_MULTI_CHANNEL, DIALECT_202,
    DIALECT_210, DIALECT_300, DIALECT_302, DIALECT_311,
};

/// Every dialect the server speaks, highest first.
pub const DIALECTS: [u16; 5] = [
    DIALECT_311,
    DIALECT_302,
    DIALECT_300,
    DIALECT_210,
    DIALECT_202,
];

/// Whether `dialect` is one of the SMB 3.x family (3.0, 3.0.2, 3.1.1).
pub fn is_smb3(dialect: u16) -> bool {
    matches!(dialect, DIALECT_300 | DIALECT_302 | DIALECT_311)
}

/// The highest dialect of `offered` the server speaks within `min..=max`, or None.
pub fn select(offered: &[u16], min: u16, max: u16) -> Option<u16> {
    DIALECTS
        .iter()
        .copied()
        .find(|d| (min..=max).contains(d) && offered.contains(d))
}

/// The dialect a name such as "2.0.2", "2.1", "3.0", "3.0.2" or "3.1.1" stands for.
pub fn from_name(name: &str) -> Option<u16> {
    DIALECTS.iter().copied().find(|d| name_of(*d) == name)
}

/// The name of a dialect ("3.1.1", "2.0.2", ...), "-" for none and "other" for the rest.
pub fn name_of(dialect: u16) -> &'static str {
    match dialect {
        DIALECT_311 => "3.1.1",
        DIALECT_302 => "3.0.2",
        DIALECT_300 => "3.0",
        DIALECT_210 => "2.1",
        DIALECT_202 => "2.0.2",
        0 => "-",
        _ => "other",
    }
}

/// The capabilities the NEGOTIATE response of `dialect` carries: the server's, less what the
/// dialect does not have. 2.0.2 has none but DFS; 2.1 adds LEASING and LARGE_MTU; 3.0 and
/// 3.0.2 add MULTI_CHANNEL and ENCRYPTION (the latter only when `encryption`: the server has
/// AES-128-CCM and the client asked for it); 3.1.1 negotiates ciphers by context, so
/// ENCRYPTION is never set there.
pub fn capabilities(dialect: u16, server: u32, encryption: bool) -> u32 {
    let allowed = match dialect {
        DIALECT_202 => CAP_DFS,
        DIALECT_210 => CAP_DFS | CAP_LEASING | CAP_LARGE_MTU,
        DIALECT_300 | DIALECT_302 => {
            let base = CAP_DFS | CAP_LEASING | CAP_LARGE_MTU | CAP_MULTI_CHANNEL;
            if encryption {
                base | CAP_ENCRYPTION
            } else {
                base
            }
        }
        _ => !CAP_ENCRYPTION,
    };
    server & allowed
}

/// The signing algorithm of a dialect below 3.1.1 (3.1.1 negotiates it): HMAC-SHA256 for
/// 2.x, AES-128-CMAC for 3.0 and 3.0.2 (MS-SMB2 3.1.4.1).
pub fn fixed_signing(dialect: u16) -> SigningAlgorithm {
    if is_smb3(dialect) {
        SigningAlgorithm::AesCmac
    } else {
        SigningAlgorithm::HmacSha256
    }
}

/// The largest READ, WRITE or transact of a dialect: 64 KiB for 2.0.2, which has no
/// multi-credit requests.
pub fn max_io(dialect: u16, server: u32) -> u32 {
    if dialect == DIALECT_202 {
        server.min(65536)
    } else {
        server
    }
}

/// The answer to an SMB1 multi-protocol NEGOTIATE (MS-SMB2 3.3.5.3.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Smb1Answer {
    /// "SMB 2.???" was offered and the server speaks 2.1 or higher: an SMB2 NEGOTIATE
    /// response with dialect 0x02FF; the client then sends an SMB2 NEGOTIATE.
    Wildcard,
    /// Only "SMB 2.002" fits: the connection is negotiated at 2.0.2 with this answer.
    Smb202,
    /// Nothing the server speaks: the connection ends.
    Refuse,
}

/// What to answer an SMB1 NEGOTIATE listing `dialects` with, the server speaking
/// `min..=max`.
pub fn smb1_answer(dialects: &[&[u8]], min: u16, max: u16) -> Smb1Answer {
    let has = |name: &[u8]| dialects.contains(&name);
    if has(b"SMB 2.???") && max >= DIALECT_210 {
        Smb1Answer::Wildcard
    } else if has(b"SMB 2.002") && (min..=max).contains(&DIALECT_202) {
        Smb1Answer::Smb202
    } else {
        Smb1Answer::Refuse
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ALL: u16 = DIALECT_202;
    const TOP: u16 = DIALECT_311;

    #[test]
    fn the_highest_common_dialect_within_the_range() {
        // Every single dialect on its own, and every list with each one missing.
        for d in DIALECTS {
            assert_eq!(select(&[d], ALL, TOP), Some(d));
            let rest: Vec<u16> = DIALECTS.iter().copied().filter(|x| *x != d).collect();
            assert_eq!(select(&rest, ALL, TOP), rest.first().copied());
        }
        // The client's order does not matter.
        assert_eq!(
            select(&[0x0202, 0x0311, 0x0210, 0x0300, 0x0302], ALL, TOP),
            Some(0x0311)
        );
        assert_eq!(select(&[0x0202, 0x0210, 0x0300], ALL, TOP), Some(0x0300));
        // Unknown dialects (the wildcard, 0x0222, SMB 3.1.2 to come) are never chosen.
        assert_eq!(select(&[0x02FF, 0x0222, 0x0312], ALL, TOP), None);
        assert_eq!(select(&[0x02FF, 0x0210], ALL, TOP), Some(0x0210));
        // A raised minimum refuses older clients; a lowered maximum caps newer ones.
        assert_eq!(select(&[0x0202, 0x0210], DIALECT_300, TOP), None);
        assert_eq!(
            select(&[0x0202, 0x0210, 0x0302], DIALECT_300, TOP),
            Some(0x0302)
        );
        assert_eq!(select(&DIALECTS, ALL, DIALECT_300), Some(0x0300));
        assert_eq!(select(&DIALECTS, DIALECT_311, TOP), Some(0x0311));
        assert_eq!(select(&[0x0302], DIALECT_311, TOP), None);
        assert_eq!(select(&[], ALL, TOP), None);
    }

    #[test]
    fn capabilities_by_dialect() {
        let server = CAP_DFS | CAP_LEASING | CAP_LARGE_MTU | CAP_MULTI_CHANNEL | CAP_ENCRYPTION;
        assert_eq!(capabilities(DIALECT_202, server, true), CAP_DFS);
        assert_eq!(
            capabilities(DIALECT_210, server, true),
            CAP_DFS | CAP_LEASING | CAP_LARGE_MTU
        );
        for d in [DIALECT_300, DIALECT_302] {
            assert_eq!(capabilities(d, server, true), server);
            assert_eq!(capabilities(d, server, false), server & !CAP_ENCRYPTION);
        }
        assert_eq!(
            capabilities(DIALECT_311, server, true),
            server & !CAP_ENCRYPTION
        );
        // Nothing the server does not have.
        assert_eq!(
            capabilities(DIALECT_300, CAP_LARGE_MTU, true),
            CAP_LARGE_MTU
        );
        assert_eq!(fixed_signing(DIALECT_202), SigningAlgorithm::HmacSha256);
        assert_eq!(fixed_signing(DIALECT_210), SigningAlgorithm::HmacSha256);
        assert_eq!(fixed_signing(DIALECT_300), SigningAlgorithm::AesCmac);
        assert_eq!(fixed_signing(DIALECT_302), SigningAlgorithm::AesCmac);
        assert_eq!(max_io(DIALECT_202, 1 << 23), 65536);
        assert_eq!(max_io(DIALECT_210, 1 << 23), 1 << 23);
    }

    #[test]
    fn names() {
        for d in DIALECTS {
            assert_eq!(from_name(name_of(d)), Some(d));
        }
        assert_eq!(from_name("2.02"), None);
        assert_eq!(from_name("3.1"), None);
        assert_eq!(name_of(0), "-");
        assert_eq!(name_of(0x02FF), "other");
    }

    #[test]
    fn smb1_multi_protocol_answers() {
        let both: [&[u8]; 3] = [b"NT LM 0.12", b"SMB 2.002", b"SMB 2.???"];
        let only202: [&[u8]; 2] = [b"NT LM 0.12", b"SMB 2.002"];
        let only_wild: [&[u8]; 1] = [b"SMB 2.???"];
        let none: [&[u8]; 1] = [b"NT LM 0.12"];
        assert_eq!(smb1_answer(&both, ALL, TOP), Smb1Answer::Wildcard);
        assert_eq!(
            smb1_answer(&only_wild, DIALECT_311, TOP),
            Smb1Answer::Wildcard
        );
        assert_eq!(smb1_answer(&only202, ALL, TOP), Smb1Answer::Smb202);
        // A server of 2.0.2 alone answers 0x0202 even to the wildcard.
        assert_eq!(smb1_answer(&both, ALL, DIALECT_202), Smb1Answer::Smb202);
        assert_eq!(smb1_answer(&only202, DIALECT_210, TOP), Smb1Answer::Refuse);
        assert_eq!(
            smb1_answer(&only_wild, ALL, DIALECT_202),
            Smb1Answer::Refuse
        );
        assert_eq!(smb1_answer(&none, ALL, TOP), Smb1Answer::Refuse);
    }
}
