//! CHAP for iSCSI login, target side (RFC 1994, RFC 7143 12.1.3), one-way and mutual, with the
//! CHAP_A algorithm values 5 (MD5), 6 (SHA-1), 7 (SHA-256) and 8 (SHA3-256) (RFC 7143 and the
//! IANA "PPP Authentication Algorithms" registry as used by RFC 7143bis).
//!
//! Sans-IO: the caller supplies random bytes for identifiers and challenges. Secrets never
//! appear in `Debug` output, and responses are compared in constant time.

use crate::text::{self, TextBuilder};
use md5::Md5;
#[cfg(test)]
use sha2::Digest as _;

use subtle::ConstantTimeEq;

/// A CHAP hash algorithm, by its CHAP_A value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChapAlgorithm {
    Md5,
    Sha1,
    Sha256,
    Sha3_256,
}

impl ChapAlgorithm {
    pub const ALL: [ChapAlgorithm; 4] = [
        ChapAlgorithm::Sha3_256,
        ChapAlgorithm::Sha256,
        ChapAlgorithm::Sha1,
        ChapAlgorithm::Md5,
    ];

    pub fn from_code(code: u8) -> Option<Self> {
        match code {
            5 => Some(ChapAlgorithm::Md5),
            6 => Some(ChapAlgorithm::Sha1),
            7 => Some(ChapAlgorithm::Sha256),
            8 => Some(ChapAlgorithm::Sha3_256),
            _ => None,
        }
    }

    pub fn code(self) -> u8 {
        match self {
            ChapAlgorithm::Md5 => 5,
            ChapAlgorithm::Sha1 => 6,
            ChapAlgorithm::Sha256 => 7,
            ChapAlgorithm::Sha3_256 => 8,
        }
    }

    pub fn digest_len(self) -> usize {
        match self {
            ChapAlgorithm::Md5 => 16,
            ChapAlgorithm::Sha1 => 20,
            ChapAlgorithm::Sha256 | ChapAlgorithm::Sha3_256 => 32,
        }
    }

    /// Length of the challenges we send: the digest length, and never under 16 bytes.
    pub fn challenge_len(self) -> usize {
        self.digest_len().max(16)
    }

    /// RFC 1994 4.1: Response = H(Identifier || secret || Challenge).
    pub fn response(self, identifier: u8, secret: &[u8], challenge: &[u8]) -> Vec<u8> {
        fn run<D: sha2::Digest>(id: u8, secret: &[u8], challenge: &[u8]) -> Vec<u8> {
            let mut h = D::new();
            h.update([id]);
            h.update(secret);
            h.update(challenge);
            h.finalize().to_vec()
        }
        match self {
            ChapAlgorithm::Md5 => run::<Md5>(identifier, secret, challenge),
            ChapAlgorithm::Sha1 => run::<sha1::Sha1>(identifier, secret, challenge),
            ChapAlgorithm::Sha256 => run::<sha2::Sha256>(identifier, secret, challenge),
            ChapAlgorithm::Sha3_256 => run::<sha3::Sha3_256>(identifier, secret, challenge),
        }
    }

    /// Constant-time check of a received response.
    pub fn verify(self, identifier: u8, secret: &[u8], challenge: &[u8], response: &[u8]) -> bool {
        let expected = self.response(identifier, secret, challenge);
        expected.len() == response.len() && bool::from(expected.ct_eq(response))
    }
}

/// What the target demands of an initiator (and proves back for mutual CHAP).
#[derive(Clone, PartialEq, Eq)]
pub struct ChapCredentials {
    /// The CHAP_N the initiator must present.
    pub user: String,
    /// The secret the initiator's CHAP_R is computed with.
    pub secret: Vec<u8>,
    /// For mutual CHAP: our CHAP_N and the secret we answer the initiator's challenge with.
    pub mutual: Option<(String, Vec<u8>)>,
    /// CHAP_A values we accept, in our preference order (empty = all four, strongest first).
    pub algorithms: Vec<u8>,
}

impl std::fmt::Debug for ChapCredentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChapCredentials")
            .field("user", &self.user)
            .field("secret", &"<redacted>")
            .field(
                "mutual",
                &self.mutual.as_ref().map(|(user, _)| (user, "<redacted>")),
            )
            .field("algorithms", &self.algorithms)
            .finish()
    }
}

/// Why CHAP failed; every variant ends the login with "authentication failure" (0x0201).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ChapError {
    #[error("no acceptable CHAP_A in the initiator's list")]
    NoAcceptableAlgorithm,
    #[error("missing {0}")]
    MissingKey(&'static str),
    #[error("{0} is not a valid binary or numeric value")]
    BadEncoding(&'static str),
    #[error("CHAP_N does not name the configured user")]
    WrongName,
    #[error("CHAP_R does not match")]
    WrongResponse,
    #[error("initiator asked for mutual CHAP, none configured")]
    MutualNotConfigured,
    /// RFC 7143 12.1.3: the target "MUST NOT" accept a challenge equal to the one it sent
    /// (a reflection attack would make us compute the initiator's answer).
    #[error("initiator reflected our challenge")]
    ReflectedChallenge,
    #[error("initiator challenge has a bad length ({0} bytes)")]
    BadChallengeLength(usize),
}

/// Longest challenge we answer in mutual CHAP (RFC 7143 12.1.3 bounds binary values at 1024).
const MAX_INITIATOR_CHALLENGE: usize = 1024;

/// Target state after sending CHAP_A / CHAP_I / CHAP_C, waiting for CHAP_N / CHAP_R.
#[derive(Clone, PartialEq, Eq)]
pub struct ChapChallenge {
    credentials: ChapCredentials,
    algorithm: ChapAlgorithm,
    identifier: u8,
    challenge: Vec<u8>,
}

impl std::fmt::Debug for ChapChallenge {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChapChallenge")
            .field("credentials", &self.credentials)
            .field("algorithm", &self.algorithm)
            .field("identifier", &self.identifier)
            .finish_non_exhaustive()
    }
}

fn value<'a>(pairs: &[(&str, &'a str)], key: &'static str) -> Option<&'a str> {
    pairs.iter().find(|(k, _)| *k == key).map(|(_, v)| *v)
}

/// Answers the initiator's CHAP_A list: picks the first of our preferred algorithms that the
/// initiator offers, and writes CHAP_A, CHAP_I and CHAP_C into `out`.
pub fn start(
    credentials: ChapCredentials,
    pairs: &[(&str, &str)],
    random: &mut dyn FnMut(&mut [u8]),
    out: &mut TextBuilder,
) -> Result<ChapChallenge, ChapError> {
    let offered = value(pairs, "CHAP_A").ok_or(ChapError::MissingKey("CHAP_A"))?;
    let offered: Vec<u8> = text::parse_list(offered)
        .filter_map(|v| text::parse_number(v).ok())
        .filter_map(|n| u8::try_from(n).ok())
        .collect();
    let ours: Vec<u8> = if credentials.algorithms.is_empty() {
        ChapAlgorithm::ALL.iter().map(|a| a.code()).collect()
    } else {
        credentials.algorithms.clone()
    };
    let algorithm = ours
        .iter()
        .filter(|code| offered.contains(code))
        .find_map(|code| ChapAlgorithm::from_code(*code))
        .ok_or(ChapError::NoAcceptableAlgorithm)?;
    let mut identifier = [0u8; 1];
    random(&mut identifier);
    let mut challenge = vec![0u8; algorithm.challenge_len()];
    random(&mut challenge);
    out.push_number("CHAP_A", u64::from(algorithm.code()));
    out.push_number("CHAP_I", u64::from(identifier[0]));
    out.push("CHAP_C", &text::encode_hex(&challenge));
    Ok(ChapChallenge {
        credentials,
        algorithm,
        identifier: identifier[0],
        challenge,
    })
}

impl ChapChallenge {
    pub fn algorithm(&self) -> ChapAlgorithm {
        self.algorithm
    }

    /// The challenge we sent (tests, and initiators built on this crate).
    pub fn challenge(&self) -> (u8, &[u8]) {
        (self.identifier, &self.challenge)
    }

    /// Checks CHAP_N / CHAP_R; for mutual CHAP (CHAP_I and CHAP_C present) writes our CHAP_N
    /// and CHAP_R into `out`. Returns the authenticated user name.
    pub fn verify(
        self,
        pairs: &[(&str, &str)],
        out: &mut TextBuilder,
    ) -> Result<String, ChapError> {
        let name = value(pairs, "CHAP_N").ok_or(ChapError::MissingKey("CHAP_N"))?;
        let response = value(pairs, "CHAP_R").ok_or(ChapError::MissingKey("CHAP_R"))?;
        let response =
            text::decode_binary(response).map_err(|_| ChapError::BadEncoding("CHAP_R"))?;
        // Check the response before the name so a wrong user costs the same work as a wrong
        // secret; both end the same way.
        let ok = self.algorithm.verify(
            self.identifier,
            &self.credentials.secret,
            &self.challenge,
            &response,
        );
        let name_ok = bool::from(name.as_bytes().ct_eq(self.credentials.user.as_bytes()));
        if !ok {
            return Err(ChapError::WrongResponse);
        }
        if !name_ok {
            return Err(ChapError::WrongName);
        }
        let mutual_id = value(pairs, "CHAP_I");
        let mutual_challenge = value(pairs, "CHAP_C");
        match (mutual_id, mutual_challenge) {
            (None, None) => {}
            (Some(_), None) => return Err(ChapError::MissingKey("CHAP_C")),
            (None, Some(_)) => return Err(ChapError::MissingKey("CHAP_I")),
            (Some(id), Some(challenge)) => {
                let (our_name, our_secret) = self
                    .credentials
                    .mutual
                    .as_ref()
                    .ok_or(ChapError::MutualNotConfigured)?;
                let id = text::parse_number_in(id, 0, 255)
                    .ok()
                    .and_then(|n| u8::try_from(n).ok())
                    .ok_or(ChapError::BadEncoding("CHAP_I"))?;
                let challenge =
                    text::decode_binary(challenge).map_err(|_| ChapError::BadEncoding("CHAP_C"))?;
                if challenge.is_empty() || challenge.len() > MAX_INITIATOR_CHALLENGE {
                    return Err(ChapError::BadChallengeLength(challenge.len()));
                }
                if challenge == self.challenge {
                    return Err(ChapError::ReflectedChallenge);
                }
                let answer = self.algorithm.response(id, our_secret, &challenge);
                out.push("CHAP_N", our_name);
                out.push("CHAP_R", &text::encode_hex(&answer));
            }
        }
        Ok(self.credentials.user)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn creds(mutual: bool) -> ChapCredentials {
        ChapCredentials {
            user: "alice".into(),
            secret: b"secret-secret".to_vec(),
            mutual: mutual.then(|| ("target".into(), b"target-secret".to_vec())),
            algorithms: vec![],
        }
    }

    fn counter() -> impl FnMut(&mut [u8]) {
        let mut n = 0u8;
        move |buf: &mut [u8]| {
            for b in buf {
                n = n.wrapping_add(1);
                *b = n;
            }
        }
    }

    #[test]
    fn known_md5_vector() {
        // RFC 1994 style: MD5(0x01 || "secret" || 16 bytes 0x00..0x0f).
        let challenge: Vec<u8> = (0u8..16).collect();
        let r = ChapAlgorithm::Md5.response(1, b"secret", &challenge);
        assert_eq!(r.len(), 16);
        let mut h = Md5::new();
        h.update([1u8]);
        h.update(b"secret");
        h.update(&challenge);
        assert_eq!(r, h.finalize().to_vec());
        assert!(ChapAlgorithm::Md5.verify(1, b"secret", &challenge, &r));
        assert!(!ChapAlgorithm::Md5.verify(2, b"secret", &challenge, &r));
        assert!(!ChapAlgorithm::Md5.verify(1, b"secret", &challenge, &r[..15]));
    }

    #[test]
    fn one_way_and_mutual_each_algorithm() {
        for alg in ChapAlgorithm::ALL {
            let mut out = TextBuilder::new();
            let code = alg.code().to_string();
            let ch = start(creds(true), &[("CHAP_A", &code)], &mut counter(), &mut out).unwrap();
            assert_eq!(ch.algorithm(), alg);
            assert_eq!(ch.challenge().1.len(), alg.challenge_len());
            let (id, c) = ch.challenge();
            let r = text::encode_base64(&alg.response(id, b"secret-secret", c));
            let mut out = TextBuilder::new();
            let user = ch
                .clone()
                .verify(
                    &[
                        ("CHAP_N", "alice"),
                        ("CHAP_R", &r),
                        ("CHAP_I", "7"),
                        ("CHAP_C", "0x0102"),
                    ],
                    &mut out,
                )
                .unwrap();
            assert_eq!(user, "alice");
            let bytes = out.finish();
            let answer = text::parse(&bytes).unwrap();
            let expected = text::encode_hex(&alg.response(7, b"target-secret", &[1, 2]));
            assert_eq!(
                answer,
                vec![("CHAP_N", "target"), ("CHAP_R", expected.as_str())]
            );
        }
    }

    #[test]
    fn failures() {
        let mut out = TextBuilder::new();
        assert_eq!(
            start(
                creds(false),
                &[("CHAP_A", "99,4")],
                &mut counter(),
                &mut out
            )
            .unwrap_err(),
            ChapError::NoAcceptableAlgorithm
        );
        let ch = start(creds(false), &[("CHAP_A", "5")], &mut counter(), &mut out).unwrap();
        let (id, c) = ch.challenge();
        let good = text::encode_hex(&ChapAlgorithm::Md5.response(id, b"secret-secret", c));
        let bad = text::encode_hex(&ChapAlgorithm::Md5.response(id, b"wrong", c));
        let reflected = text::encode_hex(c);
        let v = |pairs: &[(&str, &str)]| ch.clone().verify(pairs, &mut TextBuilder::new());
        assert_eq!(
            v(&[("CHAP_N", "alice"), ("CHAP_R", &bad)]),
            Err(ChapError::WrongResponse)
        );
        assert_eq!(
            v(&[("CHAP_N", "bob"), ("CHAP_R", &good)]),
            Err(ChapError::WrongName)
        );
        assert_eq!(
            v(&[("CHAP_N", "alice")]),
            Err(ChapError::MissingKey("CHAP_R"))
        );
        assert_eq!(
            v(&[
                ("CHAP_N", "alice"),
                ("CHAP_R", &good),
                ("CHAP_I", "1"),
                ("CHAP_C", "0x01")
            ]),
            Err(ChapError::MutualNotConfigured)
        );
        let mutual = start(creds(true), &[("CHAP_A", "5")], &mut counter(), &mut out).unwrap();
        assert_eq!(
            mutual.verify(
                &[
                    ("CHAP_N", "alice"),
                    ("CHAP_R", &good),
                    ("CHAP_I", "1"),
                    ("CHAP_C", &reflected)
                ],
                &mut TextBuilder::new()
            ),
            Err(ChapError::ReflectedChallenge)
        );
    }

    #[test]
    fn debug_hides_secrets() {
        let s = format!("{:?}", creds(true));
        assert!(!s.contains("secret-secret") && !s.contains("target-secret"));
        assert!(s.contains("alice"));
    }
}
