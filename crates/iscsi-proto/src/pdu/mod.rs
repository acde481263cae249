//! iSCSI PDUs: the opcode newtype, the `Pdu` enum over every message, and their BHS layouts.

mod bhs;
mod direct;
mod framer;
mod types;

pub use direct::DataInHead;
pub use framer::{EncodedPdu, Framer, PduError, BHS_LEN, MAX_AHS_LEN};
pub use types::*;

use bytes::Bytes;

/// The 6-bit opcode of a PDU (RFC 7143 11.2.1.2). Unknown values are kept so they can be rejected.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Opcode(pub u8);

impl Opcode {
    pub const NOP_OUT: Opcode = Opcode(0x00);
    pub const SCSI_COMMAND: Opcode = Opcode(0x01);
    pub const TASK_MGMT_REQUEST: Opcode = Opcode(0x02);
    pub const LOGIN_REQUEST: Opcode = Opcode(0x03);
    pub const TEXT_REQUEST: Opcode = Opcode(0x04);
    pub const DATA_OUT: Opcode = Opcode(0x05);
    pub const LOGOUT_REQUEST: Opcode = Opcode(0x06);
    pub const SNACK_REQUEST: Opcode = Opcode(0x10);
    pub const NOP_IN: Opcode = Opcode(0x20);
    pub const SCSI_RESPONSE: Opcode = Opcode(0x21);
    pub const TASK_MGMT_RESPONSE: Opcode = Opcode(0x22);
    pub const LOGIN_RESPONSE: Opcode = Opcode(0x23);
    pub const TEXT_RESPONSE: Opcode = Opcode(0x24);
    pub const DATA_IN: Opcode = Opcode(0x25);
    pub const LOGOUT_RESPONSE: Opcode = Opcode(0x26);
    pub const R2T: Opcode = Opcode(0x31);
    pub const ASYNC_MESSAGE: Opcode = Opcode(0x32);
    pub const REJECT: Opcode = Opcode(0x3f);

    /// True for opcodes an initiator sends.
    pub fn is_initiator_opcode(self) -> bool {
        self.0 & 0x20 == 0
    }
}

/// Every PDU, initiator and target side.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Pdu {
    NopOut(NopOut),
    ScsiCommand(ScsiCommand),
    TaskMgmtRequest(TaskMgmtRequest),
    LoginRequest(LoginRequest),
    TextRequest(TextRequest),
    DataOut(DataOut),
    LogoutRequest(LogoutRequest),
    SnackRequest(SnackRequest),
    NopIn(NopIn),
    ScsiResponse(ScsiResponse),
    TaskMgmtResponse(TaskMgmtResponse),
    LoginResponse(LoginResponse),
    TextResponse(TextResponse),
    DataIn(DataIn),
    LogoutResponse(LogoutResponse),
    R2t(R2t),
    AsyncMessage(AsyncMessage),
    Reject(Reject),
    /// A well-framed PDU whose opcode is not defined; answered with Reject (11.17.1).
    Unknown {
        opcode: Opcode,
        header: Box<[u8; BHS_LEN]>,
        data: Bytes,
    },
}

impl Pdu {
    /// The opcode this PDU is sent with.
    pub fn opcode(&self) -> Opcode {
        match self {
            Pdu::NopOut(_) => Opcode::NOP_OUT,
            Pdu::ScsiCommand(_) => Opcode::SCSI_COMMAND,
            Pdu::TaskMgmtRequest(_) => Opcode::TASK_MGMT_REQUEST,
            Pdu::LoginRequest(_) => Opcode::LOGIN_REQUEST,
            Pdu::TextRequest(_) => Opcode::TEXT_REQUEST,
            Pdu::DataOut(_) => Opcode::DATA_OUT,
            Pdu::LogoutRequest(_) => Opcode::LOGOUT_REQUEST,
            Pdu::SnackRequest(_) => Opcode::SNACK_REQUEST,
            Pdu::NopIn(_) => Opcode::NOP_IN,
            Pdu::ScsiResponse(_) => Opcode::SCSI_RESPONSE,
            Pdu::TaskMgmtResponse(_) => Opcode::TASK_MGMT_RESPONSE,
            Pdu::LoginResponse(_) => Opcode::LOGIN_RESPONSE,
            Pdu::TextResponse(_) => Opcode::TEXT_RESPONSE,
            Pdu::DataIn(_) => Opcode::DATA_IN,
            Pdu::LogoutResponse(_) => Opcode::LOGOUT_RESPONSE,
            Pdu::R2t(_) => Opcode::R2T,
            Pdu::AsyncMessage(_) => Opcode::ASYNC_MESSAGE,
            Pdu::Reject(_) => Opcode::REJECT,
            Pdu::Unknown { opcode, .. } => *opcode,
        }
    }

    /// The data segment carried by this PDU (empty for PDUs that have none).
    pub fn data(&self) -> &Bytes {
        static EMPTY: Bytes = Bytes::new();
        match self {
            Pdu::NopOut(p) => &p.data,
            Pdu::ScsiCommand(p) => &p.data,
            Pdu::LoginRequest(p) => &p.data,
            Pdu::TextRequest(p) => &p.data,
            Pdu::DataOut(p) => &p.data,
            Pdu::NopIn(p) => &p.data,
            Pdu::ScsiResponse(p) => &p.data,
            Pdu::LoginResponse(p) => &p.data,
            Pdu::TextResponse(p) => &p.data,
            Pdu::DataIn(p) => &p.data,
            Pdu::AsyncMessage(p) => &p.data,
            Pdu::Reject(p) => &p.data,
            Pdu::Unknown { data, .. } => data,
            Pdu::TaskMgmtRequest(_)
            | Pdu::LogoutRequest(_)
            | Pdu::SnackRequest(_)
            | Pdu::TaskMgmtResponse(_)
            | Pdu::LogoutResponse(_)
            | Pdu::R2t(_) => &EMPTY,
        }
    }

    /// The Initiator Task Tag, where the PDU has one.
    pub fn itt(&self) -> Option<u32> {
        match self {
            Pdu::NopOut(p) => Some(p.itt),
            Pdu::ScsiCommand(p) => Some(p.itt),
            Pdu::TaskMgmtRequest(p) => Some(p.itt),
            Pdu::LoginRequest(p) => Some(p.itt),
            Pdu::TextRequest(p) => Some(p.itt),
            Pdu::DataOut(p) => Some(p.itt),
            Pdu::LogoutRequest(p) => Some(p.itt),
            Pdu::SnackRequest(p) => Some(p.itt),
            Pdu::NopIn(p) => Some(p.itt),
            Pdu::ScsiResponse(p) => Some(p.itt),
            Pdu::TaskMgmtResponse(p) => Some(p.itt),
            Pdu::LoginResponse(p) => Some(p.itt),
            Pdu::TextResponse(p) => Some(p.itt),
            Pdu::DataIn(p) => Some(p.itt),
            Pdu::LogoutResponse(p) => Some(p.itt),
            Pdu::R2t(p) => Some(p.itt),
            Pdu::AsyncMessage(_) | Pdu::Reject(_) | Pdu::Unknown { .. } => None,
        }
    }
}
