//! The decoded form of every supported command and the operation codes they come from.

/// Fields shared by the READ/WRITE/VERIFY family.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockRange {
    /// First logical block.
    pub lba: u64,
    /// Number of logical blocks.
    pub blocks: u32,
    /// Force unit access.
    pub fua: bool,
}

/// One decoded command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[allow(missing_docs)]
pub enum Command {
    TestUnitReady,
    RequestSense {
        desc: bool,
        alloc: u32,
    },
    Inquiry {
        evpd: bool,
        page: u8,
        alloc: u32,
    },
    ReportLuns {
        select: u8,
        alloc: u32,
    },
    ReadCapacity10,
    ReadCapacity16 {
        alloc: u32,
    },
    Read(BlockRange),
    Write(BlockRange),
    WriteAndVerify {
        range: BlockRange,
        bytchk: bool,
    },
    Verify {
        range: BlockRange,
        bytchk: u8,
    },
    WriteSame {
        lba: u64,
        blocks: u32,
        unmap: bool,
        anchor: bool,
        ndob: bool,
    },
    Unmap {
        anchor: bool,
        param_len: u32,
    },
    CompareAndWrite(BlockRange),
    PreFetch {
        lba: u64,
        blocks: u32,
    },
    SynchronizeCache {
        lba: u64,
        blocks: u32,
    },
    ModeSense {
        ten: bool,
        dbd: bool,
        llbaa: bool,
        pc: u8,
        page: u8,
        subpage: u8,
        alloc: u32,
    },
    ModeSelect {
        ten: bool,
        pf: bool,
        sp: bool,
        param_len: u32,
    },
    StartStopUnit {
        loej: bool,
        start: bool,
    },
    PreventAllow {
        prevent: u8,
    },
    GetLbaStatus {
        lba: u64,
        alloc: u32,
    },
    Reserve,
    Release,
    PersistentReserveIn {
        action: u8,
        alloc: u32,
    },
    PersistentReserveOut {
        action: u8,
        scope: u8,
        kind: u8,
        param_len: u32,
    },
    ReportTargetPortGroups {
        extended: bool,
        alloc: u32,
    },
    SetTargetPortGroups {
        param_len: u32,
    },
    ReportSupportedOpcodes {
        rctd: bool,
        options: u8,
        opcode: u8,
        action: u16,
        alloc: u32,
    },
    ReportSupportedTmf {
        repd: bool,
        alloc: u32,
    },
    ExtendedCopy {
        param_len: u32,
    },
    ReceiveCopyResults {
        action: u8,
        list_id: u8,
        alloc: u32,
    },
}

/// Operation codes this crate knows.
#[allow(missing_docs)]
pub mod op {
    pub const TEST_UNIT_READY: u8 = 0x00;
    pub const REQUEST_SENSE: u8 = 0x03;
    pub const READ_6: u8 = 0x08;
    pub const WRITE_6: u8 = 0x0A;
    pub const INQUIRY: u8 = 0x12;
    pub const MODE_SELECT_6: u8 = 0x15;
    pub const RESERVE_6: u8 = 0x16;
    pub const RELEASE_6: u8 = 0x17;
    pub const MODE_SENSE_6: u8 = 0x1A;
    pub const START_STOP_UNIT: u8 = 0x1B;
    pub const PREVENT_ALLOW: u8 = 0x1E;
    pub const READ_CAPACITY_10: u8 = 0x25;
    pub const READ_10: u8 = 0x28;
    pub const WRITE_10: u8 = 0x2A;
    pub const WRITE_AND_VERIFY_10: u8 = 0x2E;
    pub const VERIFY_10: u8 = 0x2F;
    pub const PRE_FETCH_10: u8 = 0x34;
    pub const SYNCHRONIZE_CACHE_10: u8 = 0x35;
    pub const WRITE_SAME_10: u8 = 0x41;
    pub const UNMAP: u8 = 0x42;
    pub const MODE_SELECT_10: u8 = 0x55;
    pub const RESERVE_10: u8 = 0x56;
    pub const RELEASE_10: u8 = 0x57;
    pub const MODE_SENSE_10: u8 = 0x5A;
    pub const PERSISTENT_RESERVE_IN: u8 = 0x5E;
    pub const PERSISTENT_RESERVE_OUT: u8 = 0x5F;
    pub const EXTENDED_COPY: u8 = 0x83;
    pub const RECEIVE_COPY_RESULTS: u8 = 0x84;
    pub const READ_16: u8 = 0x88;
    pub const COMPARE_AND_WRITE: u8 = 0x89;
    pub const WRITE_16: u8 = 0x8A;
    pub const WRITE_AND_VERIFY_16: u8 = 0x8E;
    pub const VERIFY_16: u8 = 0x8F;
    pub const PRE_FETCH_16: u8 = 0x90;
    pub const SYNCHRONIZE_CACHE_16: u8 = 0x91;
    pub const WRITE_SAME_16: u8 = 0x93;
    pub const SERVICE_ACTION_IN_16: u8 = 0x9E;
    pub const REPORT_LUNS: u8 = 0xA0;
    pub const MAINTENANCE_IN: u8 = 0xA3;
    pub const MAINTENANCE_OUT: u8 = 0xA4;
    pub const READ_12: u8 = 0xA8;
    pub const WRITE_12: u8 = 0xAA;
    pub const WRITE_AND_VERIFY_12: u8 = 0xAE;
    pub const VERIFY_12: u8 = 0xAF;
}
