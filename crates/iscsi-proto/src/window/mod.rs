//! Sequence windows of the full-feature phase: the CmdSN window (RFC 7143 3.2.2.1), ordered
//! delivery of commands arriving over several connections, and the Data-Out/R2T bookkeeping of
//! one write (RFC 7143 3.2.4.3, 11.7, 11.8).

mod data_out;
mod orderer;

pub use data_out::{DataOutError, DataOutProgress, DataOutTracker, R2tRequest, WriteParams};
pub use orderer::{Arrival, CommandOrderer};

use crate::serial;

/// The command window the target advertises: commands numbered `exp_cmd_sn..=max_cmd_sn` may be
/// sent. `max_cmd_sn == exp_cmd_sn - 1` means the window is closed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CmdSnWindow {
    pub exp_cmd_sn: u32,
    pub max_cmd_sn: u32,
}

/// Where a CmdSN falls relative to the window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WindowCheck {
    /// Inside `exp_cmd_sn..=max_cmd_sn`.
    InWindow,
    /// Immediate commands are delivered at once and do not consume a CmdSN (RFC 7143 3.2.2.1).
    Immediate,
    /// Below ExpCmdSN: an old duplicate. Silently ignored.
    Stale,
    /// Inside the window but that CmdSN is already queued. Silently ignored.
    Duplicate,
    /// Beyond MaxCmdSN. Silently ignored.
    Beyond,
}

impl CmdSnWindow {
    /// A window of `depth` commands starting at `exp_cmd_sn` (depth 0 = closed).
    pub fn new(exp_cmd_sn: u32, depth: u32) -> Self {
        CmdSnWindow {
            exp_cmd_sn,
            max_cmd_sn: exp_cmd_sn.wrapping_add(depth).wrapping_sub(1),
        }
    }

    /// Commands the window admits (0 when closed).
    pub fn size(&self) -> u32 {
        self.max_cmd_sn
            .wrapping_sub(self.exp_cmd_sn)
            .wrapping_add(1)
            & 0x7fff_ffff
    }

    /// RFC 7143 3.2.2.1: "For non-immediate commands, the CmdSN field can take any value from
    /// ExpCmdSN to MaxCmdSN inclusive. The target MUST silently ignore any non-immediate command
    /// outside of this range or non-immediate duplicates within the range."
    pub fn check(&self, cmd_sn: u32, immediate: bool) -> WindowCheck {
        if immediate {
            WindowCheck::Immediate
        } else if serial::lt(cmd_sn, self.exp_cmd_sn) {
            WindowCheck::Stale
        } else if serial::gt(cmd_sn, self.max_cmd_sn) {
            WindowCheck::Beyond
        } else {
            WindowCheck::InWindow
        }
    }

    /// The command numbered ExpCmdSN was taken: slide the window start by one.
    pub fn advance(&mut self) {
        self.exp_cmd_sn = self.exp_cmd_sn.wrapping_add(1);
    }

    /// Opens the window by `n` more commands (MaxCmdSN never moves backwards).
    pub fn open(&mut self, n: u32) {
        self.max_cmd_sn = self.max_cmd_sn.wrapping_add(n);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn window_checks_with_wrap() {
        let w = CmdSnWindow::new(0xffff_fffe, 4);
        assert_eq!(w.max_cmd_sn, 1);
        assert_eq!(w.size(), 4);
        assert_eq!(w.check(0xffff_fffe, false), WindowCheck::InWindow);
        assert_eq!(w.check(1, false), WindowCheck::InWindow);
        assert_eq!(w.check(2, false), WindowCheck::Beyond);
        assert_eq!(w.check(0xffff_fffd, false), WindowCheck::Stale);
        assert_eq!(w.check(2, true), WindowCheck::Immediate);
        let closed = CmdSnWindow::new(10, 0);
        assert_eq!(closed.max_cmd_sn, 9);
        assert_eq!(closed.size(), 0);
        assert_eq!(closed.check(10, false), WindowCheck::Beyond);
        let mut w = CmdSnWindow::new(5, 1);
        w.advance();
        assert_eq!(w.check(5, false), WindowCheck::Stale);
        assert_eq!(w.check(6, false), WindowCheck::Beyond);
        w.open(1);
        assert_eq!(w.check(6, false), WindowCheck::InWindow);
    }
}
