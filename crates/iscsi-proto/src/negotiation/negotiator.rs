//! The target-side negotiator: answers the initiator's keys with the RFC 7143 13.x result
//! functions and accumulates the session and connection parameters.

use super::*;
use crate::text::{self, TextBuilder, IRRELEVANT, NOT_UNDERSTOOD, REJECT};

/// Negotiation state of one login (one connection). Keys are fed one request at a time with
/// [`Negotiator::negotiate`]; [`Negotiator::finish`] yields the results.
#[derive(Debug, Clone)]
pub struct Negotiator {
    defaults: TargetDefaults,
    /// False on a connection added to an existing session (TSIH != 0): leading-only keys do not
    /// apply there.
    leading: bool,
    session: SessionParams,
    connection: ConnectionParams,
    /// Keys already negotiated or declared in this login (RFC 7143 6.2: at most once).
    seen: Vec<String>,
    /// Whether our MaxRecvDataSegmentLength declaration has gone out.
    declared_mrdsl: bool,
}

/// Upper bound on distinct keys remembered for duplicate detection; beyond it the login is
/// refused as renegotiation (no real initiator sends more than ~30 keys).
const MAX_SEEN_KEYS: usize = 128;

impl Negotiator {
    pub fn new(defaults: TargetDefaults, leading: bool) -> Self {
        let connection = ConnectionParams {
            max_recv_data_segment_length: defaults.max_recv_data_segment_length,
            ..ConnectionParams::default()
        };
        Negotiator {
            defaults,
            leading,
            session: SessionParams::default(),
            connection,
            seen: Vec::new(),
            declared_mrdsl: false,
        }
    }

    /// The session parameters as negotiated so far (identity included).
    pub fn session(&self) -> &SessionParams {
        &self.session
    }

    pub fn connection(&self) -> &ConnectionParams {
        &self.connection
    }

    pub fn is_leading(&self) -> bool {
        self.leading
    }

    /// Records a key as negotiated; a second time is an initiator error (RFC 7143 6.2).
    fn first_time(&mut self, key: &str) -> Result<(), NegotiationError> {
        if self.seen.iter().any(|k| k == key) || self.seen.len() >= MAX_SEEN_KEYS {
            return Err(NegotiationError::Renegotiated(key.to_owned()));
        }
        self.seen.push(key.to_owned());
        Ok(())
    }

    /// Handles the identity declarations (InitiatorName, InitiatorAlias, TargetName,
    /// SessionType) of one request. Called before [`Self::negotiate`] so that SessionType is known
    /// when the operational keys of the same request are answered.
    pub fn declare_identity(&mut self, pairs: &[(&str, &str)]) -> Result<(), NegotiationError> {
        for &(key, value) in pairs {
            if classify(key) != KeyClass::Identity {
                continue;
            }
            self.first_time(key)?;
            match key {
                "InitiatorName" => {
                    // RFC 7143 13.6 / 4.2.7: iSCSI names are non-empty, at most 223 bytes.
                    if value.is_empty() || value.len() > 223 {
                        return Err(NegotiationError::InvalidDeclaration(key.to_owned()));
                    }
                    self.session.initiator_name = value.to_owned();
                }
                "TargetName" => {
                    if value.is_empty() || value.len() > 223 {
                        return Err(NegotiationError::InvalidDeclaration(key.to_owned()));
                    }
                    self.session.target_name = Some(value.to_owned());
                }
                "InitiatorAlias" => self.session.initiator_alias = Some(value.to_owned()),
                "SessionType" => {
                    self.session.session_type = match value {
                        "Normal" => SessionType::Normal,
                        "Discovery" => SessionType::Discovery,
                        other => {
                            return Err(NegotiationError::SessionTypeNotSupported(other.to_owned()))
                        }
                    }
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// Answers the non-security, non-identity keys of one login request into `out`.
    /// Security keys are the login machine's; identity keys went to [`Self::declare_identity`].
    pub fn negotiate(
        &mut self,
        phase: Phase,
        pairs: &[(&str, &str)],
        out: &mut TextBuilder,
    ) -> Result<(), NegotiationError> {
        let mut first_burst = None;
        for &(key, value) in pairs {
            match classify(key) {
                KeyClass::Identity | KeyClass::Security => continue,
                KeyClass::TargetOnly => {
                    return Err(NegotiationError::WrongPhase {
                        key: key.to_owned(),
                        phase,
                    })
                }
                KeyClass::FullFeatureOnly => {
                    // RFC 7143 13.3 SendTargets is "Use: FFPO"; during login it has no meaning.
                    self.first_time(key)?;
                    out.push(key, IRRELEVANT);
                }
                KeyClass::Unknown => {
                    // RFC 7143 6.2: "the answer for a key not understood MUST be
                    // key=NotUnderstood" (X- and X# extension keys included).
                    self.first_time(key)?;
                    out.push(key, NOT_UNDERSTOOD);
                }
                KeyClass::Operational => {
                    if phase == Phase::SecurityNegotiation {
                        // RFC 7143 6.3: operational parameters are negotiated only after the
                        // security stage; before it we treat them as an initiator error.
                        return Err(NegotiationError::WrongPhase {
                            key: key.to_owned(),
                            phase,
                        });
                    }
                    self.first_time(key)?;
                    if key == "FirstBurstLength" {
                        // Answered last: it depends on MaxBurstLength, InitialR2T and
                        // ImmediateData, which may come later in the same request.
                        first_burst = Some(value);
                        continue;
                    }
                    self.answer(key, value, out);
                }
            }
        }
        if let Some(value) = first_burst {
            self.answer("FirstBurstLength", value, out);
        }
        if phase == Phase::OperationalNegotiation && !self.declared_mrdsl {
            // Declarative (RFC 7143 13.12): we tell the initiator what we accept whether or not
            // it declared its own.
            self.declared_mrdsl = true;
            out.push_number(
                "MaxRecvDataSegmentLength",
                u64::from(self.defaults.max_recv_data_segment_length),
            );
        }
        Ok(())
    }

    /// One operational key, already checked for phase and duplication.
    fn answer(&mut self, key: &str, value: &str, out: &mut TextBuilder) {
        let discovery = self.session.session_type == SessionType::Discovery;
        if discovery && is_irrelevant_for_discovery(key) {
            out.push(key, IRRELEVANT);
            return;
        }
        if !self.leading && is_leading_only(key) {
            // RFC 7143 13: LO keys "can only be used in the leading connection"; on another
            // connection the key does not apply, and 6.2 lets the responder say "Irrelevant".
            out.push(key, IRRELEVANT);
            return;
        }
        let d = &self.defaults;
        let s = &mut self.session;
        let answer: Result<String, ()> = match key {
            "HeaderDigest" | "DataDigest" => {
                let allowed = if key == "HeaderDigest" {
                    &d.header_digests
                } else {
                    &d.data_digests
                };
                // RFC 7143 6.2.1: the acceptor picks the first value of the originator's list
                // it supports; values it does not understand are ignored.
                match text::parse_list(value)
                    .filter_map(Digest::from_name)
                    .find(|v| allowed.contains(v))
                {
                    Some(chosen) => {
                        let on = chosen == Digest::Crc32c;
                        if key == "HeaderDigest" {
                            self.connection.header_digest = on;
                        } else {
                            self.connection.data_digest = on;
                        }
                        Ok(chosen.name().to_owned())
                    }
                    None => Err(()),
                }
            }
            "MaxConnections" => number(value, 1, 65_535).map(|n| {
                let v = n.min(u64::from(d.max_connections));
                s.max_connections = u16::try_from(v).unwrap_or(1);
                v.to_string()
            }),
            "InitialR2T" => boolean(value).map(|b| {
                s.initial_r2t = b || d.initial_r2t;
                text::format_bool(s.initial_r2t).to_owned()
            }),
            "ImmediateData" => boolean(value).map(|b| {
                s.immediate_data = b && d.immediate_data;
                text::format_bool(s.immediate_data).to_owned()
            }),
            "DataPDUInOrder" => boolean(value).map(|b| {
                s.data_pdu_in_order = b || d.data_pdu_in_order;
                text::format_bool(s.data_pdu_in_order).to_owned()
            }),
            "DataSequenceInOrder" => boolean(value).map(|b| {
                s.data_sequence_in_order = b || d.data_sequence_in_order;
                text::format_bool(s.data_sequence_in_order).to_owned()
            }),
            "MaxRecvDataSegmentLength" => {
                // Declarative, per direction: theirs limits what we send; ours is declared back.
                number(value, MIN_DATA_LENGTH, MAX_DATA_LENGTH).map(|n| {
                    self.connection.max_xmit_data_segment_length = u32::try_from(n).unwrap_or(8192);
                    self.declared_mrdsl = true;
                    d.max_recv_data_segment_length.to_string()
                })
            }
            "MaxBurstLength" => number(value, MIN_DATA_LENGTH, MAX_DATA_LENGTH).map(|n| {
                let v = n.min(u64::from(d.max_burst_length));
                s.max_burst_length = u32::try_from(v).unwrap_or(262_144);
                s.first_burst_length = s.first_burst_length.min(s.max_burst_length);
                v.to_string()
            }),
            "FirstBurstLength" => {
                // RFC 7143 13.14: irrelevant when InitialR2T=Yes and ImmediateData=No.
                if s.initial_r2t && !s.immediate_data {
                    Ok(IRRELEVANT.to_owned())
                } else {
                    number(value, MIN_DATA_LENGTH, MAX_DATA_LENGTH).map(|n| {
                        // "FirstBurstLength MUST NOT exceed MaxBurstLength."
                        let v = n
                            .min(u64::from(d.first_burst_length))
                            .min(u64::from(s.max_burst_length));
                        s.first_burst_length = u32::try_from(v).unwrap_or(65_536);
                        v.to_string()
                    })
                }
            }
            "DefaultTime2Wait" => number(value, 0, 3600).map(|n| {
                let v = n.max(u64::from(d.default_time2wait));
                s.default_time2wait = u16::try_from(v).unwrap_or(2);
                v.to_string()
            }),
            "DefaultTime2Retain" => number(value, 0, 3600).map(|n| {
                let v = n.min(u64::from(d.default_time2retain));
                s.default_time2retain = u16::try_from(v).unwrap_or(20);
                v.to_string()
            }),
            "MaxOutstandingR2T" => number(value, 1, 65_535).map(|n| {
                let v = n.min(u64::from(d.max_outstanding_r2t));
                s.max_outstanding_r2t = u16::try_from(v).unwrap_or(1);
                v.to_string()
            }),
            "ErrorRecoveryLevel" => number(value, 0, 2).map(|n| {
                let v = n.min(u64::from(d.error_recovery_level));
                s.error_recovery_level = u8::try_from(v).unwrap_or(0);
                v.to_string()
            }),
            // RFC 7143 13.25 obsoletes markers; we never use them. Boolean AND -> No.
            "OFMarker" | "IFMarker" => boolean(value).map(|_| "No".to_owned()),
            "OFMarkInt" | "IFMarkInt" => Ok(IRRELEVANT.to_owned()),
            // RFC 7143 13.24 / RFC 7144 2.1: result is the minimum. Level 1 is RFC 7143; level 2
            // adds RFC 7144 features (new TMFs, FastAbort) that we do not offer.
            "iSCSIProtocolLevel" => number(value, 0, 31).map(|n| n.min(1).to_string()),
            // RFC 7144 2.2: a list; we implement only the RFC 3720 semantics.
            "TaskReporting" => {
                if text::parse_list(value).any(|v| v == "RFC3720") {
                    Ok("RFC3720".to_owned())
                } else {
                    Err(())
                }
            }
            _ => Ok(NOT_UNDERSTOOD.to_owned()),
        };
        // RFC 7143 6.2: an out-of-range or unacceptable value is answered "Reject" and the
        // parameter keeps its default.
        out.push(key, answer.as_deref().unwrap_or(REJECT));
    }

    /// The negotiated parameters. FirstBurstLength is clamped to MaxBurstLength in case the
    /// two were settled in separate requests in an order that broke the invariant.
    pub fn finish(self) -> (SessionParams, ConnectionParams) {
        let mut session = self.session;
        session.first_burst_length = session.first_burst_length.min(session.max_burst_length);
        (session, self.connection)
    }
}

fn number(value: &str, lo: u64, hi: u64) -> Result<u64, ()> {
    text::parse_number_in(value, lo, hi).map_err(|_| ())
}

fn boolean(value: &str) -> Result<bool, ()> {
    text::parse_bool(value).map_err(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(n: &mut Negotiator, phase: Phase, pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        let mut out = TextBuilder::new();
        n.declare_identity(pairs).unwrap();
        n.negotiate(phase, pairs, &mut out).unwrap();
        let bytes = out.finish();
        text::parse(&bytes)
            .unwrap()
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect()
    }

    fn get<'a>(answers: &'a [(String, String)], key: &str) -> &'a str {
        answers
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
            .unwrap()
    }

    #[test]
    fn result_functions() {
        let mut n = Negotiator::new(TargetDefaults::default(), true);
        let a = run(
            &mut n,
            Phase::OperationalNegotiation,
            &[
                ("HeaderDigest", "CRC32C,None"),
                ("DataDigest", "MD5,None"),
                ("MaxConnections", "64"),
                ("InitialR2T", "No"),
                ("ImmediateData", "Yes"),
                ("FirstBurstLength", "0x1000000"),
                ("MaxBurstLength", "16776192"),
                ("MaxRecvDataSegmentLength", "65536"),
                ("DefaultTime2Wait", "0"),
                ("DefaultTime2Retain", "60"),
                ("MaxOutstandingR2T", "1"),
                ("ErrorRecoveryLevel", "2"),
                ("IFMarker", "Yes"),
                ("OFMarkInt", "2048~2048"),
                ("X-com.example.Foo", "1"),
                ("iSCSIProtocolLevel", "2"),
            ],
        );
        assert_eq!(get(&a, "HeaderDigest"), "CRC32C");
        assert_eq!(get(&a, "DataDigest"), "None");
        assert_eq!(get(&a, "MaxConnections"), "32");
        assert_eq!(get(&a, "InitialR2T"), "No");
        assert_eq!(get(&a, "ImmediateData"), "Yes");
        assert_eq!(get(&a, "MaxBurstLength"), "1048576");
        assert_eq!(get(&a, "FirstBurstLength"), "Reject"); // 2^24 is out of range
        assert_eq!(get(&a, "MaxRecvDataSegmentLength"), "262144");
        assert_eq!(get(&a, "DefaultTime2Wait"), "2");
        assert_eq!(get(&a, "DefaultTime2Retain"), "20");
        assert_eq!(get(&a, "MaxOutstandingR2T"), "1");
        assert_eq!(get(&a, "ErrorRecoveryLevel"), "0");
        assert_eq!(get(&a, "IFMarker"), "No");
        assert_eq!(get(&a, "OFMarkInt"), "Irrelevant");
        assert_eq!(get(&a, "X-com.example.Foo"), "NotUnderstood");
        assert_eq!(get(&a, "iSCSIProtocolLevel"), "1");
        let (s, c) = n.finish();
        assert!(c.header_digest && !c.data_digest);
        assert_eq!(c.max_xmit_data_segment_length, 65536);
        assert_eq!(c.max_recv_data_segment_length, 262_144);
        assert_eq!(s.first_burst_length, 65_536); // the RFC default, since ours was rejected
        assert!(!s.initial_r2t && s.immediate_data);
    }

    #[test]
    fn first_burst_is_bounded_by_max_burst_and_irrelevant_without_unsolicited_data() {
        let mut n = Negotiator::new(TargetDefaults::default(), true);
        let a = run(
            &mut n,
            Phase::OperationalNegotiation,
            &[("FirstBurstLength", "262144"), ("MaxBurstLength", "4096")],
        );
        assert_eq!(get(&a, "FirstBurstLength"), "4096");
        let mut n = Negotiator::new(TargetDefaults::default(), true);
        let a = run(
            &mut n,
            Phase::OperationalNegotiation,
            &[
                ("InitialR2T", "Yes"),
                ("ImmediateData", "No"),
                ("FirstBurstLength", "4096"),
            ],
        );
        assert_eq!(get(&a, "FirstBurstLength"), "Irrelevant");
    }

    #[test]
    fn phase_scope_and_duplicates() {
        let mut n = Negotiator::new(TargetDefaults::default(), true);
        let mut out = TextBuilder::new();
        assert!(matches!(
            n.negotiate(
                Phase::SecurityNegotiation,
                &[("MaxBurstLength", "512")],
                &mut out
            ),
            Err(NegotiationError::WrongPhase { .. })
        ));
        let mut n = Negotiator::new(TargetDefaults::default(), true);
        run(
            &mut n,
            Phase::OperationalNegotiation,
            &[("MaxBurstLength", "512")],
        );
        assert_eq!(
            n.negotiate(
                Phase::OperationalNegotiation,
                &[("MaxBurstLength", "512")],
                &mut out
            ),
            Err(NegotiationError::Renegotiated("MaxBurstLength".into()))
        );
        let mut n = Negotiator::new(TargetDefaults::default(), false);
        let a = run(
            &mut n,
            Phase::OperationalNegotiation,
            &[("MaxBurstLength", "512"), ("HeaderDigest", "None")],
        );
        assert_eq!(get(&a, "MaxBurstLength"), "Irrelevant");
        assert_eq!(get(&a, "HeaderDigest"), "None");
        let mut n = Negotiator::new(TargetDefaults::default(), true);
        let a = run(
            &mut n,
            Phase::OperationalNegotiation,
            &[
                ("SessionType", "Discovery"),
                ("MaxConnections", "1"),
                ("HeaderDigest", "None"),
            ],
        );
        assert_eq!(get(&a, "MaxConnections"), "Irrelevant");
        assert_eq!(n.session().session_type, SessionType::Discovery);
        let mut n = Negotiator::new(TargetDefaults::default(), true);
        assert!(n.declare_identity(&[("SessionType", "Bogus")]).is_err());
        assert!(n.declare_identity(&[("InitiatorName", "")]).is_err());
    }
}
