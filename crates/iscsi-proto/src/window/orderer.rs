//! `CommandOrderer`: releases commands strictly in CmdSN order although, with several
//! connections in a session (MC/S), they may arrive in any order (RFC 7143 3.2.2.1: "commands
//! ... are delivered to the SCSI layer in the order of CmdSN").

use super::{CmdSnWindow, WindowCheck};
use std::collections::VecDeque;

/// What became of a command handed to [`CommandOrderer::push`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Arrival<T> {
    /// Held until every lower CmdSN has arrived; collect with [`CommandOrderer::pop_ready`].
    Queued,
    /// An immediate command: execute it now, it bypasses ordering.
    Immediate(T),
    /// Outside the window or a duplicate: RFC 7143 3.2.2.1 says to ignore it silently.
    Ignored(T, WindowCheck),
}

/// Orders the commands of one session. Memory is bounded by the window: at most `depth`
/// commands are held, and MaxCmdSN advances only as released commands complete, so the
/// initiator can never have more than `depth` commands queued or running.
#[derive(Debug)]
pub struct CommandOrderer<T> {
    window: CmdSnWindow,
    depth: u32,
    /// `slots[i]` holds the command numbered ExpCmdSN + i.
    slots: VecDeque<Option<T>>,
    /// Commands released by `pop_ready` and not yet reported complete.
    in_flight: u32,
}

impl<T> CommandOrderer<T> {
    /// `exp_cmd_sn` comes from the login (the leading Login Request's CmdSN); `depth` is the
    /// most commands the session may have queued or running.
    pub fn new(exp_cmd_sn: u32, depth: u32) -> Self {
        let depth = depth.clamp(1, 1 << 16);
        CommandOrderer {
            window: CmdSnWindow::new(exp_cmd_sn, depth),
            depth,
            slots: VecDeque::new(),
            in_flight: 0,
        }
    }

    /// The window to advertise in every response (ExpCmdSN, MaxCmdSN).
    pub fn window(&self) -> CmdSnWindow {
        self.window
    }

    /// Commands held waiting for a lower CmdSN.
    pub fn queued(&self) -> usize {
        self.slots.iter().filter(|s| s.is_some()).count()
    }

    pub fn in_flight(&self) -> u32 {
        self.in_flight
    }

    /// Offers a command that arrived on any connection of the session.
    pub fn push(&mut self, cmd_sn: u32, immediate: bool, command: T) -> Arrival<T> {
        match self.window.check(cmd_sn, immediate) {
            WindowCheck::Immediate => Arrival::Immediate(command),
            WindowCheck::InWindow => {
                let Ok(index) = usize::try_from(cmd_sn.wrapping_sub(self.window.exp_cmd_sn)) else {
                    return Arrival::Ignored(command, WindowCheck::Beyond);
                };
                while self.slots.len() <= index {
                    self.slots.push_back(None);
                }
                match self.slots.get_mut(index) {
                    Some(slot @ None) => {
                        *slot = Some(command);
                        Arrival::Queued
                    }
                    _ => Arrival::Ignored(command, WindowCheck::Duplicate),
                }
            }
            other => Arrival::Ignored(command, other),
        }
    }

    /// The next command in CmdSN order, if it has arrived. Each release advances ExpCmdSN;
    /// call [`complete`](Self::complete) when it finishes so the window reopens.
    pub fn pop_ready(&mut self) -> Option<T> {
        if !matches!(self.slots.front(), Some(Some(_))) {
            return None;
        }
        let command = self.slots.pop_front().flatten()?;
        self.window.advance();
        self.in_flight = self.in_flight.saturating_add(1);
        Some(command)
    }

    /// A released command has finished: MaxCmdSN moves up by one.
    pub fn complete(&mut self) {
        if self.in_flight > 0 {
            self.in_flight -= 1;
            self.window.open(1);
        }
    }

    /// Configured depth.
    pub fn depth(&self) -> u32 {
        self.depth
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn releases_in_order_across_arrival_order() {
        let mut o = CommandOrderer::new(10, 4);
        assert_eq!(o.push(12, false, "c"), Arrival::Queued);
        assert_eq!(o.push(11, false, "b"), Arrival::Queued);
        assert_eq!(o.pop_ready(), None);
        assert_eq!(o.push(10, true, "imm"), Arrival::Immediate("imm"));
        assert_eq!(o.push(10, false, "a"), Arrival::Queued);
        assert_eq!(
            o.push(11, false, "dup"),
            Arrival::Ignored("dup", WindowCheck::Duplicate)
        );
        assert_eq!(
            o.push(14, false, "far"),
            Arrival::Ignored("far", WindowCheck::Beyond)
        );
        assert_eq!(o.pop_ready(), Some("a"));
        assert_eq!(o.pop_ready(), Some("b"));
        assert_eq!(o.pop_ready(), Some("c"));
        assert_eq!(o.pop_ready(), None);
        assert_eq!(
            o.push(9, false, "old"),
            Arrival::Ignored("old", WindowCheck::Stale)
        );
        // Three in flight: only CmdSN 13 fits until something completes.
        assert_eq!(
            o.window(),
            CmdSnWindow {
                exp_cmd_sn: 13,
                max_cmd_sn: 13
            }
        );
        assert_eq!(
            o.push(14, false, "e"),
            Arrival::Ignored("e", WindowCheck::Beyond)
        );
        o.complete();
        assert_eq!(o.window().max_cmd_sn, 14);
        assert_eq!(o.push(14, false, "e"), Arrival::Queued);
        assert_eq!(o.queued(), 1);
    }

    #[test]
    fn wraps_around() {
        let mut o = CommandOrderer::new(u32::MAX, 2);
        assert_eq!(o.push(0, false, 2), Arrival::Queued);
        assert_eq!(o.push(u32::MAX, false, 1), Arrival::Queued);
        assert_eq!(o.pop_ready(), Some(1));
        assert_eq!(o.pop_ready(), Some(2));
        assert_eq!(o.window().exp_cmd_sn, 1);
    }
}
