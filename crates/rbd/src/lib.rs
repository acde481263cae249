//! LUNs stored as Ceph RBD images.
//!
//! librados and librbd are loaded when an RBD LUN is opened (`librados.so.2`, `librbd.so.1`
//! from Debian's `librados2` and `librbd1`), so building lanes needs no Ceph headers and a
//! machine without Ceph runs every other kind of LUN. [`RbdDevice`] is a
//! [`blockstore::BlockDevice`] over one image, with librbd's cache off (every gateway must see
//! every other gateway's writes) and partial discards zeroed (so UNMAP reads back zeros).
//!
//! Several gateways may write one image at once only without the exclusive-lock feature (with
//! it, librbd passes the lock back and forth between writers); [`RbdDevice::open`] refuses an
//! image that has it, naming the command that disables it.
//!
//! [`RadosPrStore`] keeps a LUN's persistent reservations in a RADOS object beside the image,
//! shared by every gateway (compare-and-set on the object's version, watch/notify to tell the
//! others).

mod device;
mod ffi;
mod incarnation;
mod port_groups;
mod pr_store;

pub use device::{
    parse_watch_timeout, RbdDevice, RbdSource, DEFAULT_WATCH_TIMEOUT_S, WATCH_TIMEOUT_RANGE,
};
pub use pr_store::{pr_object_name, RadosPrStore};

/// Why an image could not be opened or used.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot load {library} (install Debian's librados2 and librbd1): {reason}")]
    Load { library: String, reason: String },
    #[error("{call} failed for {what}: {errno_text}")]
    Call {
        call: &'static str,
        what: String,
        errno: i32,
        errno_text: String,
    },
    #[error(
        "{image} has the exclusive-lock feature, which makes gateways take the lock from each \
         other on every write; disable it (with what depends on it) first: \
         rbd feature disable {image} {features}"
    )]
    ExclusiveLock { image: String, features: String },
    #[error("{0}")]
    Invalid(String),
}

/// Text for a negative errno from librados/librbd.
pub(crate) fn errno_text(errno: i32) -> String {
    std::io::Error::from_raw_os_error(errno).to_string()
}
