//! Whether a connection may bind to a session (MS-SMB2 3.3.5.5.2), with the statuses Windows
//! answers (as smbtorture's smb2.session bind_negative tests check them): the checks that
//! depend only on what the session and the new connection negotiated.

use crate::crypto::{Cipher, SigningAlgorithm};
use crate::server::dialect;
use crate::status::NtStatus;

/// What the session being bound to negotiated on its first connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BoundSession {
    pub dialect: u16,
    pub signing: SigningAlgorithm,
    pub cipher: Option<Cipher>,
}

/// What the binding connection negotiated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BindingChannel {
    pub dialect: u16,
    pub signing: SigningAlgorithm,
    pub cipher: Option<Cipher>,
    /// Whether the binding request is signed.
    pub signed: bool,
}

/// The checks in Windows' order:
/// 1. an unsigned binding request: INVALID_PARAMETER;
/// 2. signing algorithms: an AES-GMAC session takes AES-GMAC channels only
///    (REQUEST_OUT_OF_SEQUENCE, whatever the channel's dialect), an AES-GMAC channel joins
///    AES-GMAC sessions only (NOT_SUPPORTED, whatever the session's dialect); AES-CMAC and
///    HMAC-SHA256 mix;
/// 3. a 2.x connection cannot bind (no multichannel there): REQUEST_NOT_ACCEPTED;
/// 4. the channel's dialect must be the session's (a 2.x session cannot be bound to from a
///    3.x connection), and so must its cipher: INVALID_PARAMETER.
pub fn check(session: &BoundSession, channel: &BindingChannel) -> Result<(), NtStatus> {
    if !channel.signed {
        return Err(NtStatus::INVALID_PARAMETER);
    }
    if session.signing != channel.signing {
        if session.signing == SigningAlgorithm::AesGmac {
            return Err(NtStatus::REQUEST_OUT_OF_SEQUENCE);
        }
        if channel.signing == SigningAlgorithm::AesGmac {
            return Err(NtStatus::NOT_SUPPORTED);
        }
    }
    if !dialect::is_smb3(channel.dialect) {
        return Err(NtStatus::REQUEST_NOT_ACCEPTED);
    }
    if session.dialect != channel.dialect || session.cipher != channel.cipher {
        return Err(NtStatus::INVALID_PARAMETER);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use SigningAlgorithm::*;

    fn s(dialect: u16, signing: SigningAlgorithm) -> BoundSession {
        BoundSession {
            dialect,
            signing,
            cipher: None,
        }
    }
    fn c(dialect: u16, signing: SigningAlgorithm) -> BindingChannel {
        BindingChannel {
            dialect,
            signing,
            cipher: None,
            signed: true,
        }
    }

    /// The smb2.session bind_negative tests across dialects, with the status each expects.
    #[test]
    fn binding_across_dialects() {
        let cases = [
            // bind_negative_smb202: 2.0.2 to 2.0.2.
            (
                s(0x0202, HmacSha256),
                c(0x0202, HmacSha256),
                Err(NtStatus::REQUEST_NOT_ACCEPTED),
            ),
            // smb210s/d: 2.1 to 2.1.
            (
                s(0x0210, HmacSha256),
                c(0x0210, HmacSha256),
                Err(NtStatus::REQUEST_NOT_ACCEPTED),
            ),
            // smb2to3s/d: a 2.1 session, a 3.1.1 AES-CMAC channel.
            (
                s(0x0210, HmacSha256),
                c(0x0311, AesCmac),
                Err(NtStatus::INVALID_PARAMETER),
            ),
            // smb3to2s/d: a 3.1.1 AES-CMAC session, a 2.1 channel.
            (
                s(0x0311, AesCmac),
                c(0x0210, HmacSha256),
                Err(NtStatus::REQUEST_NOT_ACCEPTED),
            ),
            // smb3to3s/d: a 3.0.2 session, a 3.1.1 AES-CMAC channel.
            (
                s(0x0302, AesCmac),
                c(0x0311, AesCmac),
                Err(NtStatus::INVALID_PARAMETER),
            ),
            // smb3signC30toGs/d: a 3.0.x session, a 3.1.1 AES-GMAC channel.
            (
                s(0x0300, AesCmac),
                c(0x0311, AesGmac),
                Err(NtStatus::NOT_SUPPORTED),
            ),
            (
                s(0x0302, AesCmac),
                c(0x0311, AesGmac),
                Err(NtStatus::NOT_SUPPORTED),
            ),
            // smb3signH2XtoGs/d: a 2.x session, a 3.1.1 AES-GMAC channel.
            (
                s(0x0210, HmacSha256),
                c(0x0311, AesGmac),
                Err(NtStatus::NOT_SUPPORTED),
            ),
            // smb3signGtoC30s/d: a 3.1.1 AES-GMAC session, a 3.0.x channel.
            (
                s(0x0311, AesGmac),
                c(0x0302, AesCmac),
                Err(NtStatus::REQUEST_OUT_OF_SEQUENCE),
            ),
            // smb3signGtoH2Xs/d: a 3.1.1 AES-GMAC session, a 2.x channel.
            (
                s(0x0311, AesGmac),
                c(0x0210, HmacSha256),
                Err(NtStatus::REQUEST_OUT_OF_SEQUENCE),
            ),
            // The same dialect binds: 3.0, 3.0.2, 3.1.1 (AES-CMAC and HMAC-SHA256 mix there).
            (s(0x0300, AesCmac), c(0x0300, AesCmac), Ok(())),
            (s(0x0302, AesCmac), c(0x0302, AesCmac), Ok(())),
            (s(0x0311, AesGmac), c(0x0311, AesGmac), Ok(())),
            (s(0x0311, HmacSha256), c(0x0311, AesCmac), Ok(())),
            // 3.0 to 3.0.2 is another dialect.
            (
                s(0x0300, AesCmac),
                c(0x0302, AesCmac),
                Err(NtStatus::INVALID_PARAMETER),
            ),
        ];
        for (i, (session, channel, want)) in cases.into_iter().enumerate() {
            assert_eq!(
                check(&session, &channel),
                want,
                "case {i}: {session:?} {channel:?}"
            );
        }
    }

    #[test]
    fn unsigned_requests_and_ciphers() {
        let mut ch = c(0x0300, AesCmac);
        ch.signed = false;
        assert_eq!(
            check(&s(0x0300, AesCmac), &ch),
            Err(NtStatus::INVALID_PARAMETER)
        );
        let mut session = s(0x0300, AesCmac);
        session.cipher = Some(Cipher::Aes128Ccm);
        assert_eq!(
            check(&session, &c(0x0300, AesCmac)),
            Err(NtStatus::INVALID_PARAMETER)
        );
        let mut ch = c(0x0300, AesCmac);
        ch.cipher = Some(Cipher::Aes128Ccm);
        assert_eq!(check(&session, &ch), Ok(()));
    }
}
