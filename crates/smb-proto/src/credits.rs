//! The server's credit window (MS-SMB2 3.3.1.1, 3.3.5.2.3, 3.3.5.2.5): which MessageIds the
//! client may use, the CreditCharge check for large-MTU requests, and how many credits to grant.
//!
//! Granted ids are `[low, high)`; received ids inside it are marked used, and `low` moves past
//! the used prefix. The window never grows past `max_window` ids, so a client that leaves a hole
//! cannot make the bitmap grow without bound: it runs out of credits instead.

use std::collections::VecDeque;

use crate::error::Answer;
use crate::status::NtStatus;

/// One credit covers 64 KiB of payload.
pub const CREDIT_UNIT: u64 = 65536;

/// CANCEL takes no MessageId of its own: it names the request it cancels, so the window does
/// not charge it (MS-SMB2 3.3.5.2.3).
pub fn is_charged(command: crate::header::Command) -> bool {
    command != crate::header::Command::Cancel
}

/// Credits a payload of `len` bytes costs with large MTU: ceil(len / 64 KiB), at least 1.
pub fn charge_for(len: u64) -> u64 {
    len.div_ceil(CREDIT_UNIT).max(1)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum CreditError {
    #[error("MessageId {0} is outside the granted window")]
    OutOfWindow(u64),
    #[error("MessageId {0} was already used")]
    Reused(u64),
    #[error("CreditCharge {charge} is too small for a {len}-byte payload")]
    ChargeTooSmall { charge: u16, len: u64 },
}

impl CreditError {
    /// A bad sequence number ends the connection (MS-SMB2 3.3.5.2.3); a CreditCharge that does
    /// not cover the payload is answered with STATUS_INVALID_PARAMETER (3.3.5.2.5).
    pub fn answer(&self) -> Answer {
        match self {
            CreditError::OutOfWindow(_) | CreditError::Reused(_) => Answer::Disconnect,
            CreditError::ChargeTooSmall { .. } => Answer::Status(NtStatus::INVALID_PARAMETER),
        }
    }
}

/// Grant policy limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CreditPolicy {
    /// Most credits the client may hold at once.
    pub max_outstanding: u64,
    /// Most ids the window may span (granted, used or not, above the lowest unused).
    pub max_window: u64,
}

impl Default for CreditPolicy {
    fn default() -> Self {
        CreditPolicy {
            max_outstanding: 512,
            max_window: 8192,
        }
    }
}

#[derive(Debug, Clone)]
pub struct CreditWindow {
    low: u64,
    high: u64,
    /// used[i] tells whether id low + i was received; its length is high - low.
    used: VecDeque<bool>,
    used_count: u64,
    policy: CreditPolicy,
}

impl CreditWindow {
    /// A new connection: MessageId 0 (the first NEGOTIATE) is granted.
    pub fn new(policy: CreditPolicy) -> Self {
        CreditWindow {
            low: 0,
            high: 1,
            used: VecDeque::from([false]),
            used_count: 0,
            policy,
        }
    }

    /// Credits granted and not yet used.
    pub fn outstanding(&self) -> u64 {
        (self.high - self.low) - self.used_count
    }
    /// The lowest MessageId not yet received.
    pub fn low(&self) -> u64 {
        self.low
    }
    /// One past the highest MessageId granted.
    pub fn high(&self) -> u64 {
        self.high
    }

    /// Charges a request: `credit_charge` from its header, `payload` the larger of what it sends
    /// and what it asks back. With large MTU the charge must cover ceil(payload / 64 KiB);
    /// without it every request costs one credit. Marks the ids used.
    pub fn consume(
        &mut self,
        message_id: u64,
        credit_charge: u16,
        payload: u64,
        large_mtu: bool,
    ) -> Result<u64, CreditError> {
        let charge = if large_mtu {
            let need = charge_for(payload);
            if (credit_charge == 0 && payload > CREDIT_UNIT)
                || (credit_charge > 0 && need > u64::from(credit_charge))
            {
                return Err(CreditError::ChargeTooSmall {
                    charge: credit_charge,
                    len: payload,
                });
            }
            u64::from(credit_charge.max(1))
        } else {
            1
        };
        let end = message_id
            .checked_add(charge)
            .ok_or(CreditError::OutOfWindow(message_id))?;
        if message_id < self.low {
            // Everything below `low` has been received.
            return Err(CreditError::Reused(message_id));
        }
        if end > self.high {
            return Err(CreditError::OutOfWindow(message_id));
        }
        let start = (message_id - self.low) as usize;
        let span = self.used.range(start..start + charge as usize);
        if span.clone().any(|u| *u) {
            return Err(CreditError::Reused(message_id));
        }
        for i in start..start + charge as usize {
            if let Some(u) = self.used.get_mut(i) {
                *u = true;
            }
        }
        self.used_count += charge;
        while self.used.front() == Some(&true) {
            self.used.pop_front();
            self.low += 1;
            self.used_count -= 1;
        }
        Ok(charge)
    }

    /// Grants credits for a response: what the client asked for, at least one when it would
    /// otherwise hold none, within `max_outstanding` and `max_window`. Returns CreditResponse.
    pub fn grant(&mut self, requested: u16) -> u16 {
        let outstanding = self.outstanding();
        let want = u64::from(requested).max(u64::from(outstanding == 0));
        let room_credits = self.policy.max_outstanding.saturating_sub(outstanding);
        let room_window = self.policy.max_window.saturating_sub(self.high - self.low);
        let g = want
            .min(room_credits)
            .min(room_window)
            .min(u64::from(u16::MAX));
        self.high += g;
        self.used.extend(std::iter::repeat_n(false, g as usize));
        g as u16
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sequence_and_grants() {
        let mut w = CreditWindow::new(CreditPolicy::default());
        assert_eq!(w.consume(0, 0, 0, true), Ok(1));
        assert_eq!(w.outstanding(), 0);
        assert_eq!(w.grant(0), 1, "never leaves the client without credits");
        assert_eq!(w.grant(10), 10);
        assert_eq!(w.outstanding(), 11);
        // Out of order is fine inside the window.
        assert_eq!(w.consume(5, 1, 100, true), Ok(1));
        assert_eq!(w.consume(1, 4, 4 * 65536, true), Ok(4));
        assert_eq!(w.low(), 6);
        assert_eq!(w.consume(3, 1, 0, true), Err(CreditError::Reused(3)));
        assert_eq!(w.consume(12, 1, 0, true), Err(CreditError::OutOfWindow(12)));
        assert_eq!(
            w.consume(u64::MAX, 2, 0, true),
            Err(CreditError::OutOfWindow(u64::MAX))
        );
        assert_eq!(w.consume(11, 2, 0, true), Err(CreditError::OutOfWindow(11)));
        assert_eq!(w.consume(10, 2, 0, true), Ok(2));
        assert_eq!(CreditError::Reused(3).answer(), Answer::Disconnect);
    }

    #[test]
    fn charge_must_cover_the_payload() {
        let mut w = CreditWindow::new(CreditPolicy::default());
        w.grant(100);
        let e = w.consume(0, 1, 65537, true).unwrap_err();
        assert_eq!(e.answer(), Answer::Status(NtStatus::INVALID_PARAMETER));
        assert!(w.consume(0, 0, 65537, true).is_err());
        assert_eq!(w.consume(0, 0, 65536, true), Ok(1));
        assert_eq!(w.consume(1, 2, 65537, true), Ok(2));
        assert_eq!(charge_for(0), 1);
        assert_eq!(charge_for(8 << 20), 128);
        // Without large MTU every request costs one.
        assert_eq!(w.consume(3, 0, 1 << 20, false), Ok(1));
    }

    #[test]
    fn a_hole_bounds_the_window() {
        let policy = CreditPolicy {
            max_outstanding: 8,
            max_window: 16,
        };
        let mut w = CreditWindow::new(policy);
        w.grant(8);
        // The client never uses id 0 but spends everything else and keeps asking.
        let mut next = 1;
        for _ in 0..10 {
            while next < w.high() {
                w.consume(next, 1, 0, true).unwrap();
                next += 1;
            }
            w.grant(8);
        }
        assert_eq!(w.low(), 0);
        assert!(w.high() - w.low() <= 16);
        assert_eq!(w.outstanding(), 1);
    }
}
