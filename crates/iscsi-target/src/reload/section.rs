//! Other services of the process that a reload reconfigures too (the SMB server's shares and
//! users): each reads its part of the same file and checks it while nothing has changed yet,
//! and is switched over after the iSCSI side, so a reload still applies fully or not at all.

use std::path::Path;

/// A service with a part of the configuration file that a reload applies.
pub trait ReloadSection: Send + Sync {
    /// Reads and checks this service's part of `file`, opening what it needs; changes
    /// nothing. `Err` is the whole message (file, line and key where there are).
    fn prepare(&self, file: &Path) -> Result<Box<dyn PreparedSection>, String>;
}

/// A checked change of one service, ready to switch over.
pub trait PreparedSection: Send {
    /// What switching over changes, one line each (empty: nothing).
    fn changes(&self) -> Vec<String>;
    /// Switches over. Infallible: everything that could fail was done in `prepare`.
    fn commit(self: Box<Self>);
}
