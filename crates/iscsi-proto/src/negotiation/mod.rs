//! Operational parameter negotiation, target side (RFC 7143 6.2 and 13): the key table, the
//! negotiated session and connection parameters, and our offered values.
//!
//! Each key has a scope (LO leading-only, SW session-wide, CO connection-only), a use (IO login
//! only, ALL, FFPO full-feature only) and a result function (min, max, OR, AND, list choice,
//! declarative). The [`Negotiator`] applies them one login request at a time.

mod negotiator;

pub use negotiator::Negotiator;

/// RFC 7143 13.12: MaxRecvDataSegmentLength default, also the login-phase segment limit.
pub const DEFAULT_MAX_RECV_DATA_SEGMENT_LENGTH: u32 = 8192;
/// RFC 7143 13.12-13.14: data lengths are 512 to 2^24-1.
pub const MIN_DATA_LENGTH: u64 = 512;
pub const MAX_DATA_LENGTH: u64 = (1 << 24) - 1;

/// SessionType (RFC 7143 13.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SessionType {
    Discovery,
    /// RFC 7143 13.3: "the default is Normal".
    #[default]
    Normal,
}

/// A digest algorithm for HeaderDigest / DataDigest (RFC 7143 13.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Digest {
    None,
    Crc32c,
}

impl Digest {
    pub fn name(self) -> &'static str {
        match self {
            Digest::None => "None",
            Digest::Crc32c => "CRC32C",
        }
    }

    fn from_name(s: &str) -> Option<Digest> {
        match s {
            "None" => Some(Digest::None),
            "CRC32C" => Some(Digest::Crc32c),
            _ => None,
        }
    }
}

/// The values this target offers or accepts. Where the initiator proposes a value the result
/// function combines it with ours; keys it never proposes keep their RFC 7143 defaults.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TargetDefaults {
    /// What we accept per PDU (declared to the initiator).
    pub max_recv_data_segment_length: u32,
    pub max_burst_length: u32,
    pub first_burst_length: u32,
    pub max_connections: u16,
    pub immediate_data: bool,
    pub initial_r2t: bool,
    pub max_outstanding_r2t: u16,
    pub default_time2wait: u16,
    pub default_time2retain: u16,
    pub data_pdu_in_order: bool,
    pub data_sequence_in_order: bool,
    pub error_recovery_level: u8,
    /// Header digests we allow (the initiator's first allowed choice wins).
    pub header_digests: Vec<Digest>,
    pub data_digests: Vec<Digest>,
    /// TargetAlias sent in the first response of a normal session.
    pub target_alias: Option<String>,
    /// Commands the initiator may have outstanding: login responses open the CmdSN window to
    /// MaxCmdSN = ExpCmdSN + queue_depth - 1.
    pub queue_depth: u32,
}

impl Default for TargetDefaults {
    fn default() -> Self {
        TargetDefaults {
            max_recv_data_segment_length: 262_144,
            max_burst_length: 1_048_576,
            first_burst_length: 262_144,
            max_connections: 32,
            immediate_data: true,
            initial_r2t: false,
            max_outstanding_r2t: 16,
            default_time2wait: 2,
            default_time2retain: 20,
            // We can take data in any order, but OR means the initiator's Yes wins anyway.
            data_pdu_in_order: false,
            data_sequence_in_order: false,
            error_recovery_level: 0,
            header_digests: vec![Digest::None, Digest::Crc32c],
            data_digests: vec![Digest::None, Digest::Crc32c],
            target_alias: None,
            queue_depth: 128,
        }
    }
}

/// Session-wide results of the leading login.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionParams {
    pub session_type: SessionType,
    pub initiator_name: String,
    pub initiator_alias: Option<String>,
    pub target_name: Option<String>,
    pub max_connections: u16,
    pub initial_r2t: bool,
    pub immediate_data: bool,
    pub max_burst_length: u32,
    pub first_burst_length: u32,
    pub default_time2wait: u16,
    pub default_time2retain: u16,
    pub max_outstanding_r2t: u16,
    pub data_pdu_in_order: bool,
    pub data_sequence_in_order: bool,
    pub error_recovery_level: u8,
}

impl Default for SessionParams {
    /// The RFC 7143 13.x defaults, which hold for every key not negotiated.
    fn default() -> Self {
        SessionParams {
            session_type: SessionType::Normal,
            initiator_name: String::new(),
            initiator_alias: None,
            target_name: None,
            max_connections: 1,
            initial_r2t: true,
            immediate_data: true,
            max_burst_length: 262_144,
            first_burst_length: 65_536,
            default_time2wait: 2,
            default_time2retain: 20,
            max_outstanding_r2t: 1,
            data_pdu_in_order: true,
            data_sequence_in_order: true,
            error_recovery_level: 0,
        }
    }
}

/// Per-connection results.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectionParams {
    pub header_digest: bool,
    pub data_digest: bool,
    /// Largest data segment we accept (what we declared).
    pub max_recv_data_segment_length: u32,
    /// The initiator's MaxRecvDataSegmentLength: the limit for what we send.
    pub max_xmit_data_segment_length: u32,
}

impl Default for ConnectionParams {
    fn default() -> Self {
        ConnectionParams {
            header_digest: false,
            data_digest: false,
            max_recv_data_segment_length: DEFAULT_MAX_RECV_DATA_SEGMENT_LENGTH,
            max_xmit_data_segment_length: DEFAULT_MAX_RECV_DATA_SEGMENT_LENGTH,
        }
    }
}

impl ConnectionParams {
    /// The framer for the full-feature phase of this connection.
    pub fn framer(&self) -> crate::Framer {
        crate::Framer {
            header_digest: self.header_digest,
            data_digest: self.data_digest,
            max_recv_data_segment_length: usize::try_from(self.max_recv_data_segment_length)
                .unwrap_or(usize::MAX),
        }
    }
}

/// The stage a key arrives in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    SecurityNegotiation,
    OperationalNegotiation,
    FullFeature,
}

/// What a key is, for the phase rules.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyClass {
    /// AuthMethod and the authentication method keys (RFC 7143 12): security stage only.
    Security,
    /// InitiatorName, InitiatorAlias, TargetName, SessionType: declarations, any login stage.
    Identity,
    /// Keys only the target sends (TargetAlias, TargetAddress, TargetPortalGroupTag).
    TargetOnly,
    /// RFC 7143 13.x operational keys.
    Operational,
    /// SendTargets (RFC 7143 13.3, "Use: FFPO").
    FullFeatureOnly,
    /// X- / X# extension keys and anything else: answered NotUnderstood (RFC 7143 6.2).
    Unknown,
}

/// Classifies a key by name (keys are case-sensitive, RFC 7143 6.1).
pub fn classify(key: &str) -> KeyClass {
    match key {
        "AuthMethod" | "CHAP_A" | "CHAP_I" | "CHAP_C" | "CHAP_N" | "CHAP_R" => KeyClass::Security,
        k if k.starts_with("SRP_") || k.starts_with("KRB_") || k.starts_with("SPKM_") => {
            KeyClass::Security
        }
        "InitiatorName" | "InitiatorAlias" | "TargetName" | "SessionType" => KeyClass::Identity,
        "TargetAlias" | "TargetAddress" | "TargetPortalGroupTag" => KeyClass::TargetOnly,
        "SendTargets" => KeyClass::FullFeatureOnly,
        "HeaderDigest"
        | "DataDigest"
        | "MaxConnections"
        | "InitialR2T"
        | "ImmediateData"
        | "MaxRecvDataSegmentLength"
        | "MaxBurstLength"
        | "FirstBurstLength"
        | "DefaultTime2Wait"
        | "DefaultTime2Retain"
        | "MaxOutstandingR2T"
        | "DataPDUInOrder"
        | "DataSequenceInOrder"
        | "ErrorRecoveryLevel"
        | "OFMarker"
        | "IFMarker"
        | "OFMarkInt"
        | "IFMarkInt"
        | "iSCSIProtocolLevel"
        | "TaskReporting" => KeyClass::Operational,
        _ => KeyClass::Unknown,
    }
}

/// RFC 7143 13 "Use: LO": keys negotiated only on the leading connection of a session.
pub fn is_leading_only(key: &str) -> bool {
    matches!(
        key,
        "MaxConnections"
            | "InitialR2T"
            | "ImmediateData"
            | "MaxBurstLength"
            | "FirstBurstLength"
            | "DefaultTime2Wait"
            | "DefaultTime2Retain"
            | "MaxOutstandingR2T"
            | "DataPDUInOrder"
            | "DataSequenceInOrder"
            | "ErrorRecoveryLevel"
            | "iSCSIProtocolLevel"
            | "TaskReporting"
    )
}

/// RFC 7143 13 "Irrelevant when: SessionType=Discovery".
pub fn is_irrelevant_for_discovery(key: &str) -> bool {
    matches!(
        key,
        "MaxConnections"
            | "InitialR2T"
            | "ImmediateData"
            | "MaxBurstLength"
            | "FirstBurstLength"
            | "MaxOutstandingR2T"
            | "DataPDUInOrder"
            | "DataSequenceInOrder"
            | "TaskReporting"
    )
}

/// A negotiation the target cannot answer with a key: the login fails with this status.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NegotiationError {
    /// RFC 7143 6.2: "An attempt to renegotiate/redeclare parameters not specifically allowed
    /// MUST be detected ... the target MUST respond with Login reject (initiator error)".
    #[error("key {0} negotiated twice")]
    Renegotiated(String),
    /// A key sent in a stage that does not allow it (security key in the operational stage,
    /// operational key before authentication, a target-only key from the initiator).
    #[error("key {key} not allowed in {phase:?}")]
    WrongPhase { key: String, phase: Phase },
    /// SessionType with a value other than Discovery/Normal (RFC 7143 13.3).
    #[error("unsupported SessionType {0}")]
    SessionTypeNotSupported(String),
    /// A declaration that must be well-formed is not (e.g. empty InitiatorName).
    #[error("invalid value for {0}")]
    InvalidDeclaration(String),
}
