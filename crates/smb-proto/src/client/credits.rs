//! A channel's message ids and credits seen from the client (MS-SMB2 3.2.4.1.5, 3.2.5.1.4):
//! each request takes as many consecutive ids as its CreditCharge, which with large MTU is one
//! per started 64 KiB of payload; every response (interim ones included) grants new credits.

use crate::credits::charge_for;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientCredits {
    next_message_id: u64,
    available: u64,
    large_mtu: bool,
}

impl Default for ClientCredits {
    fn default() -> Self {
        Self::new()
    }
}

impl ClientCredits {
    /// A new connection: one credit, for the NEGOTIATE with MessageId 0.
    pub fn new() -> Self {
        ClientCredits {
            next_message_id: 0,
            available: 1,
            large_mtu: false,
        }
    }

    /// After a NEGOTIATE that settled SMB2_GLOBAL_CAP_LARGE_MTU.
    pub fn set_large_mtu(&mut self, on: bool) {
        self.large_mtu = on;
    }

    pub fn available(&self) -> u64 {
        self.available
    }

    /// The CreditCharge for a request moving `payload` bytes (the larger of what it sends and
    /// what it asks for).
    pub fn charge(&self, payload: u64) -> u16 {
        if self.large_mtu {
            u16::try_from(charge_for(payload)).unwrap_or(u16::MAX)
        } else {
            1
        }
    }

    /// Takes the ids and credits for one request: `Some((message_id, credit_charge))`, or None
    /// when the server has not granted enough credits yet.
    pub fn take(&mut self, payload: u64) -> Option<(u64, u16)> {
        let charge = self.charge(payload);
        let need = u64::from(charge);
        if self.available < need {
            return None;
        }
        self.available -= need;
        let id = self.next_message_id;
        self.next_message_id = id.checked_add(need)?;
        Some((id, charge))
    }

    /// The CreditRequest for a request charging `charge`: the charge back plus 64 more while
    /// the channel holds fewer than `target` credits, so a pipelined channel ramps up quickly
    /// and then holds steady.
    pub fn request_for(&self, charge: u16, target: u64) -> u16 {
        if self.available < target {
            charge.saturating_add(64)
        } else {
            charge
        }
    }

    /// Gives back credits taken for a request that was never sent.
    pub fn give_back(&mut self, charge: u16) {
        self.available += u64::from(charge);
    }

    /// Adds the CreditResponse of a response.
    pub fn grant(&mut self, granted: u16) {
        self.available = self.available.saturating_add(u64::from(granted));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_advance_by_the_charge_and_credits_run_out() {
        let mut c = ClientCredits::new();
        assert_eq!(c.take(0), Some((0, 1)));
        assert_eq!(c.take(0), None);
        c.grant(20);
        c.set_large_mtu(true);
        assert_eq!(c.take(1 << 20), Some((1, 16)));
        assert_eq!(c.take(65537), Some((17, 2)));
        assert_eq!(c.available(), 2);
        assert_eq!(c.take(3 * 65536), None);
        assert_eq!(c.take(1), Some((19, 1)));
        c.give_back(1);
        assert_eq!(c.available(), 2);
        assert_eq!(c.request_for(16, 512), 80, "ramps up below the target");
        assert_eq!(c.request_for(16, 2), 16, "holds steady at it");
    }
}
