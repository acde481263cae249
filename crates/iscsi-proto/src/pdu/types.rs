//! One struct per iSCSI PDU (RFC 7143 section 11), with the fields of its Basic Header Segment.
//!
//! Sequence numbers are plain `u32` compared with serial arithmetic (RFC 1982) elsewhere.
//! Data segments stay `Bytes` so a payload is never copied between socket and store.

use bytes::Bytes;

/// Initiator Task Tag value reserved to mean "no task" (RFC 7143 11.2.1.8).
pub const RESERVED_TAG: u32 = 0xffff_ffff;

/// Task attributes of a SCSI Command (RFC 7143 11.3.1.2).
pub mod task_attr {
    pub const UNTAGGED: u8 = 0;
    pub const SIMPLE: u8 = 1;
    pub const ORDERED: u8 = 2;
    pub const HEAD_OF_QUEUE: u8 = 3;
    pub const ACA: u8 = 4;
}

/// NOP-Out (11.18): ping from the initiator, or the answer to a target's NOP-In.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct NopOut {
    pub immediate: bool,
    pub lun: u64,
    pub itt: u32,
    pub ttt: u32,
    pub cmd_sn: u32,
    pub exp_stat_sn: u32,
    pub data: Bytes,
}

/// SCSI Command (11.3).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ScsiCommand {
    pub immediate: bool,
    /// F bit: no unsolicited Data-Out PDUs follow.
    pub final_bit: bool,
    pub read: bool,
    pub write: bool,
    pub attr: u8,
    pub lun: u64,
    pub itt: u32,
    pub expected_data_length: u32,
    pub cmd_sn: u32,
    pub exp_stat_sn: u32,
    /// The 16 CDB bytes of the BHS; longer CDBs continue in `extended_cdb`.
    pub cdb: [u8; 16],
    /// Extended CDB AHS (type 1): CDB bytes beyond the 16th.
    pub extended_cdb: Option<Bytes>,
    /// Bidirectional Read Expected Data Transfer Length AHS (type 2).
    pub bidi_read_length: Option<u32>,
    /// Immediate data.
    pub data: Bytes,
}

/// SCSI Response (11.4).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ScsiResponse {
    pub bidi_overflow: bool,
    pub bidi_underflow: bool,
    pub overflow: bool,
    pub underflow: bool,
    /// 0x00 command completed at target, 0x01 target failure.
    pub response: u8,
    pub status: u8,
    pub itt: u32,
    pub snack_tag: u32,
    pub stat_sn: u32,
    pub exp_cmd_sn: u32,
    pub max_cmd_sn: u32,
    pub exp_data_sn: u32,
    pub bidi_residual: u32,
    pub residual: u32,
    /// Sense data with its 2-byte SenseLength prefix (11.4.7), or empty.
    pub data: Bytes,
}

/// Task Management Function Request (11.5).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TaskMgmtRequest {
    pub immediate: bool,
    pub function: u8,
    pub lun: u64,
    pub itt: u32,
    pub referenced_task_tag: u32,
    pub cmd_sn: u32,
    pub exp_stat_sn: u32,
    pub ref_cmd_sn: u32,
    pub exp_data_sn: u32,
}

/// Task management function codes (11.5.1).
pub mod tmf {
    pub const ABORT_TASK: u8 = 1;
    pub const ABORT_TASK_SET: u8 = 2;
    pub const CLEAR_ACA: u8 = 3;
    pub const CLEAR_TASK_SET: u8 = 4;
    pub const LOGICAL_UNIT_RESET: u8 = 5;
    pub const TARGET_WARM_RESET: u8 = 6;
    pub const TARGET_COLD_RESET: u8 = 7;
    pub const TASK_REASSIGN: u8 = 8;
}

/// Task management responses (11.6.1).
pub mod tmf_response {
    pub const COMPLETE: u8 = 0;
    pub const TASK_DOES_NOT_EXIST: u8 = 1;
    pub const LUN_DOES_NOT_EXIST: u8 = 2;
    pub const TASK_STILL_ALLEGIANT: u8 = 3;
    pub const REASSIGNMENT_NOT_SUPPORTED: u8 = 4;
    pub const NOT_SUPPORTED: u8 = 5;
    pub const AUTHORIZATION_FAILED: u8 = 6;
    pub const REJECTED: u8 = 255;
}

/// Task Management Function Response (11.6).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TaskMgmtResponse {
    pub response: u8,
    pub itt: u32,
    pub stat_sn: u32,
    pub exp_cmd_sn: u32,
    pub max_cmd_sn: u32,
}

/// Login stages (11.12.3).
pub mod stage {
    pub const SECURITY_NEGOTIATION: u8 = 0;
    pub const LOGIN_OPERATIONAL_NEGOTIATION: u8 = 1;
    pub const FULL_FEATURE_PHASE: u8 = 3;
}

/// Login Request (11.12).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct LoginRequest {
    pub transit: bool,
    pub continue_bit: bool,
    pub csg: u8,
    pub nsg: u8,
    pub version_max: u8,
    pub version_min: u8,
    pub isid: [u8; 6],
    pub tsih: u16,
    pub itt: u32,
    pub cid: u16,
    pub cmd_sn: u32,
    pub exp_stat_sn: u32,
    pub data: Bytes,
}

/// Login Response (11.13).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct LoginResponse {
    pub transit: bool,
    pub continue_bit: bool,
    pub csg: u8,
    pub nsg: u8,
    pub version_max: u8,
    pub version_active: u8,
    pub isid: [u8; 6],
    pub tsih: u16,
    pub itt: u32,
    pub stat_sn: u32,
    pub exp_cmd_sn: u32,
    pub max_cmd_sn: u32,
    pub status_class: u8,
    pub status_detail: u8,
    pub data: Bytes,
}

/// Text Request (11.10).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TextRequest {
    pub immediate: bool,
    pub final_bit: bool,
    pub continue_bit: bool,
    pub lun: u64,
    pub itt: u32,
    pub ttt: u32,
    pub cmd_sn: u32,
    pub exp_stat_sn: u32,
    pub data: Bytes,
}

/// Text Response (11.11).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TextResponse {
    pub final_bit: bool,
    pub continue_bit: bool,
    pub lun: u64,
    pub itt: u32,
    pub ttt: u32,
    pub stat_sn: u32,
    pub exp_cmd_sn: u32,
    pub max_cmd_sn: u32,
    pub data: Bytes,
}

/// SCSI Data-Out (11.7).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct DataOut {
    pub final_bit: bool,
    pub lun: u64,
    pub itt: u32,
    pub ttt: u32,
    pub exp_stat_sn: u32,
    pub data_sn: u32,
    pub buffer_offset: u32,
    pub data: Bytes,
}

/// SCSI Data-In (11.7).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct DataIn {
    pub final_bit: bool,
    pub acknowledge: bool,
    pub overflow: bool,
    pub underflow: bool,
    /// S bit: this PDU carries the command's status (phase collapse).
    pub status_present: bool,
    pub status: u8,
    pub lun: u64,
    pub itt: u32,
    pub ttt: u32,
    pub stat_sn: u32,
    pub exp_cmd_sn: u32,
    pub max_cmd_sn: u32,
    pub data_sn: u32,
    pub buffer_offset: u32,
    pub residual: u32,
    pub data: Bytes,
}

/// Logout Request (11.14).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct LogoutRequest {
    pub immediate: bool,
    /// 0 close session, 1 close connection, 2 remove connection for recovery.
    pub reason: u8,
    pub itt: u32,
    pub cid: u16,
    pub cmd_sn: u32,
    pub exp_stat_sn: u32,
}

/// Logout Response (11.15).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct LogoutResponse {
    pub response: u8,
    pub itt: u32,
    pub stat_sn: u32,
    pub exp_cmd_sn: u32,
    pub max_cmd_sn: u32,
    pub time2wait: u16,
    pub time2retain: u16,
}

/// SNACK Request (11.16).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SnackRequest {
    pub snack_type: u8,
    pub lun: u64,
    pub itt: u32,
    pub ttt: u32,
    pub exp_stat_sn: u32,
    pub beg_run: u32,
    pub run_length: u32,
}

/// Ready To Transfer (11.8).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct R2t {
    pub lun: u64,
    pub itt: u32,
    pub ttt: u32,
    pub stat_sn: u32,
    pub exp_cmd_sn: u32,
    pub max_cmd_sn: u32,
    pub r2t_sn: u32,
    pub buffer_offset: u32,
    pub desired_length: u32,
}

/// Asynchronous Message (11.9).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct AsyncMessage {
    pub lun: u64,
    pub stat_sn: u32,
    pub exp_cmd_sn: u32,
    pub max_cmd_sn: u32,
    pub event: u8,
    pub vendor_code: u8,
    pub parameter1: u16,
    pub parameter2: u16,
    pub parameter3: u16,
    pub data: Bytes,
}

/// Reject reasons (11.17.1).
pub mod reject_reason {
    pub const DATA_DIGEST_ERROR: u8 = 0x02;
    pub const SNACK_REJECT: u8 = 0x03;
    pub const PROTOCOL_ERROR: u8 = 0x04;
    pub const COMMAND_NOT_SUPPORTED: u8 = 0x05;
    pub const IMMEDIATE_COMMAND_REJECT: u8 = 0x06;
    pub const TASK_IN_PROGRESS: u8 = 0x07;
    pub const INVALID_DATA_ACK: u8 = 0x08;
    pub const INVALID_PDU_FIELD: u8 = 0x09;
    pub const LONG_OPERATION_REJECT: u8 = 0x0a;
    pub const NEGOTIATION_RESET: u8 = 0x0b;
    pub const WAITING_FOR_LOGOUT: u8 = 0x0c;
}

/// Reject (11.17): carries the complete header of the rejected PDU as data.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Reject {
    pub reason: u8,
    pub stat_sn: u32,
    pub exp_cmd_sn: u32,
    pub max_cmd_sn: u32,
    pub data_sn_or_r2t_sn: u32,
    pub data: Bytes,
}

/// NOP-In (11.19).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct NopIn {
    pub lun: u64,
    pub itt: u32,
    pub ttt: u32,
    pub stat_sn: u32,
    pub exp_cmd_sn: u32,
    pub max_cmd_sn: u32,
    pub data: Bytes,
}
