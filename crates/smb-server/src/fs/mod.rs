//! The file server over a share directory.

pub mod breaks;
pub mod dir;
pub mod durable;
pub mod grant;
pub mod info;
pub mod io;
pub mod lease;
pub mod lock;
pub mod open;
pub mod oplock;
pub mod path;
pub mod replay;
pub mod setinfo;
pub mod shortname;

use smb_proto::NtStatus;

/// NTSTATUS values the file server answers with (MS-ERREF 2.3).
pub mod status {
    use smb_proto::NtStatus;
    pub const INVALID_INFO_CLASS: NtStatus = NtStatus(0xC000_0003);
    pub const INFO_LENGTH_MISMATCH: NtStatus = NtStatus(0xC000_0004);
    pub const END_OF_FILE: NtStatus = NtStatus(0xC000_0011);
    pub const OBJECT_NAME_INVALID: NtStatus = NtStatus(0xC000_0033);
    pub const OBJECT_NAME_COLLISION: NtStatus = NtStatus(0xC000_0035);
    pub const OBJECT_PATH_NOT_FOUND: NtStatus = NtStatus(0xC000_003A);
    pub const OBJECT_PATH_SYNTAX_BAD: NtStatus = NtStatus(0xC000_003B);
    pub const SHARING_VIOLATION: NtStatus = NtStatus(0xC000_0043);
    pub const DELETE_PENDING: NtStatus = NtStatus(0xC000_0056);
    pub const LOCK_NOT_GRANTED: NtStatus = NtStatus(0xC000_0055);
    pub const FILE_LOCK_CONFLICT: NtStatus = NtStatus(0xC000_0054);
    pub const RANGE_NOT_LOCKED: NtStatus = NtStatus(0xC000_007E);
    pub const DISK_FULL: NtStatus = NtStatus(0xC000_007F);
    pub const FILE_IS_A_DIRECTORY: NtStatus = NtStatus(0xC000_00BA);
    pub const NOT_A_DIRECTORY: NtStatus = NtStatus(0xC000_0103);
    pub const DIRECTORY_NOT_EMPTY: NtStatus = NtStatus(0xC000_0101);
    pub const CANNOT_DELETE: NtStatus = NtStatus(0xC000_0121);
    pub const NOT_FOUND: NtStatus = NtStatus(0xC000_0225);
    pub const FS_DRIVER_REQUIRED: NtStatus = NtStatus(0xC000_019C);
    pub const NOT_SAME_DEVICE: NtStatus = NtStatus(0xC000_00D4);
    pub const NOTIFY_CLEANUP: NtStatus = NtStatus(0x0000_010B);
    pub const NOTIFY_ENUM_DIR: NtStatus = NtStatus(0x0000_010C);
}

/// Maps an I/O error from the server's filesystem to the status the client sees.
pub fn io_status(e: &std::io::Error) -> NtStatus {
    use std::io::ErrorKind as K;
    match e.raw_os_error() {
        Some(28) => return status::DISK_FULL,
        Some(39) => return status::DIRECTORY_NOT_EMPTY,
        Some(20) => return status::OBJECT_PATH_NOT_FOUND,
        Some(21) => return status::FILE_IS_A_DIRECTORY,
        Some(18) => return status::NOT_SAME_DEVICE,
        _ => {}
    }
    match e.kind() {
        K::NotFound => NtStatus::OBJECT_NAME_NOT_FOUND,
        K::PermissionDenied => NtStatus::ACCESS_DENIED,
        K::AlreadyExists => status::OBJECT_NAME_COLLISION,
        _ => NtStatus::INVALID_PARAMETER,
    }
}

/// Runs blocking filesystem work: on a multi-threaded runtime the worker hands its other tasks
/// to a peer while this one blocks; elsewhere it runs in place.
pub fn blocking<T>(f: impl FnOnce() -> T) -> T {
    match tokio::runtime::Handle::try_current() {
        Ok(h) if h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => {
            tokio::task::block_in_place(f)
        }
        _ => f(),
    }
}
