//! NTSTATUS values the protocol layer names (MS-ERREF 2.3).

/// A 32-bit NTSTATUS as carried in the SMB2 header's Status field.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct NtStatus(pub u32);

impl NtStatus {
    pub const SUCCESS: Self = Self(0x0000_0000);
    pub const PENDING: Self = Self(0x0000_0103);
    pub const NOTIFY_ENUM_DIR: Self = Self(0x0000_010C);
    pub const BUFFER_OVERFLOW: Self = Self(0x8000_0005);
    pub const NO_MORE_FILES: Self = Self(0x8000_0006);
    pub const INVALID_PARAMETER: Self = Self(0xC000_000D);
    pub const NO_SUCH_FILE: Self = Self(0xC000_000F);
    pub const MORE_PROCESSING_REQUIRED: Self = Self(0xC000_0016);
    pub const ACCESS_DENIED: Self = Self(0xC000_0022);
    pub const BUFFER_TOO_SMALL: Self = Self(0xC000_0023);
    pub const OBJECT_NAME_NOT_FOUND: Self = Self(0xC000_0034);
    pub const LOGON_FAILURE: Self = Self(0xC000_006D);
    pub const INSUFFICIENT_RESOURCES: Self = Self(0xC000_009A);
    pub const NOT_SUPPORTED: Self = Self(0xC000_00BB);
    pub const BAD_NETWORK_NAME: Self = Self(0xC000_00CC);
    pub const REQUEST_NOT_ACCEPTED: Self = Self(0xC000_00D0);
    pub const CANCELLED: Self = Self(0xC000_0120);
    pub const FILE_CLOSED: Self = Self(0xC000_0128);
    pub const USER_SESSION_DELETED: Self = Self(0xC000_0203);
    pub const NETWORK_SESSION_EXPIRED: Self = Self(0xC000_035C);
    pub const NETWORK_NAME_DELETED: Self = Self(0xC000_00C9);
    pub const INVALID_DEVICE_REQUEST: Self = Self(0xC000_0010);
    pub const ACCESS_DENIED_SIGNING: Self = Self(0xC000_A000);
    pub const FILE_NOT_AVAILABLE: Self = Self(0xC000_0467);
    pub const NO_PREAUTH_INTEGRITY_HASH_OVERLAP: Self = Self(0xC05D_0000);
    pub const REQUEST_OUT_OF_SEQUENCE: Self = Self(0xC000_042A);

    /// True for the error severity (the top two bits both set).
    pub fn is_error(self) -> bool {
        self.0 >> 30 == 3
    }
}
