//! The caching-state rules shared by leases and oplocks, as pure functions (no locks, no I/O),
//! so they are tested here deterministically. A lease state is a set of R (read), H (handle)
//! and W (write) caching; an oplock is treated as the lease state it stands for: level II is R,
//! exclusive RW, batch RWH (MS-SMB2 3.3.1.4, MS-FSA 2.1.5.17).

use smb_proto::msg::oplock::{LEASE_HANDLE, LEASE_READ, LEASE_WRITE};

pub const R: u32 = LEASE_READ;
pub const H: u32 = LEASE_HANDLE;
pub const W: u32 = LEASE_WRITE;

pub const OPLOCK_NONE: u8 = 0x00;
pub const OPLOCK_LEVEL_II: u8 = 0x01;
pub const OPLOCK_EXCLUSIVE: u8 = 0x08;
pub const OPLOCK_BATCH: u8 = 0x09;
pub const OPLOCK_LEASE: u8 = 0xFF;

/// The lease states a server grants on a file are R, RH, RW and RHW; a request without R
/// (H, W, HW) is granted none (MS-SMB2 3.3.5.9.8: the state must include READ caching).
pub fn normalize(requested: u32) -> u32 {
    let s = requested & (R | H | W);
    if s & R == 0 {
        0
    } else {
        s
    }
}

/// The lease state an oplock level stands for.
pub fn oplock_state(level: u8) -> u32 {
    match level {
        OPLOCK_LEVEL_II => R,
        OPLOCK_EXCLUSIVE => R | W,
        OPLOCK_BATCH => R | W | H,
        _ => 0,
    }
}

/// The oplock level for a state: an oplock cannot hold H without W, so RH is level II.
pub fn oplock_level(state: u32) -> u8 {
    if state & R == 0 {
        OPLOCK_NONE
    } else if state & W == 0 {
        OPLOCK_LEVEL_II
    } else if state & H != 0 {
        OPLOCK_BATCH
    } else {
        OPLOCK_EXCLUSIVE
    }
}

/// What a new open of the file asks of the caching held by another lease key or oplock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Contender {
    /// The open asks for no data access (attributes only): it breaks nothing.
    pub stat_open: bool,
    /// Its share mode conflicts with the holder's opens: handle caching must go, so the
    /// holder can close them.
    pub sharing_violation: bool,
    /// SUPERSEDE, OVERWRITE or OVERWRITE_IF: the data changes, read caching goes too.
    pub overwrite: bool,
    /// FILE_DELETE_ON_CLOSE: the file is to go, handle caching goes (as for a delete set
    /// through SET_INFO), so the holder closes the handles it keeps (smb2.lease.unlink).
    pub delete: bool,
}

/// The state a holder is broken to before a contending open proceeds (MS-FSA 2.1.5.1.2): W
/// goes when the open will share the file, H (alone) when its share mode conflicts with the
/// holder's opens, everything on an overwrite; attribute-only opens break nothing.
pub fn break_to(held: u32, c: Contender) -> u32 {
    if c.stat_open && !c.overwrite {
        return held;
    }
    // On a sharing violation only handle caching matters: the holder may close its handles
    // so the open succeeds; without one the open fails and write caching can stay.
    let mut s = if c.sharing_violation {
        held & !H
    } else {
        held & !W
    };
    if c.delete {
        s &= !H;
    }
    if c.overwrite {
        s = 0;
    }
    s
}

/// The target of an oplock break: level II or none.
pub fn oplock_break_to(held: u32, c: Contender) -> u32 {
    let s = break_to(held, c);
    if s & R != 0 && s != held {
        R
    } else {
        s
    }
}

/// A lease break needs an acknowledgment unless only read caching is lost (MS-SMB2 3.3.4.7:
/// a break from R alone is not acknowledged).
pub fn lease_break_needs_ack(held: u32) -> bool {
    held & (H | W) != 0
}

/// An exclusive or batch oplock break is acknowledged; a level II break is not.
pub fn oplock_break_needs_ack(held: u32) -> bool {
    held & W != 0
}

/// The state granted to an open asking for `requested` (already normalized), when other opens
/// of the file that are not under its lease key exist (`shared`): write caching only for an
/// open alone on the file.
pub fn grant(requested: u32, shared: bool) -> u32 {
    if shared {
        requested & !W
    } else {
        requested
    }
}

/// The state of an existing lease when another open under its key asks for `requested`
/// (normalized): a request that holds everything the lease has and more upgrades it to the
/// request, anything else leaves it as it is (MS-SMB2 3.3.5.9.8); so does a request for write
/// caching while other opens share the file (Windows grants such an upgrade wholly or not).
pub fn upgrade(current: u32, requested: u32, shared: bool) -> u32 {
    let superset = requested & current == current && requested != current;
    if superset && grant(requested, shared) == requested {
        requested
    } else {
        current
    }
}

/// The state another lease key's or oplock's holder keeps when an open writes to the file or
/// changes its size: none (MS-FSA 2.1.5.4: level II oplocks and read leases break to none,
/// handle caching with them, as Windows does).
pub fn break_on_write(_held: u32) -> u32 {
    0
}

/// "RHW"-style text of a state, for logs.
pub fn describe(state: u32) -> String {
    let mut s = String::new();
    for (bit, c) in [(R, 'R'), (H, 'H'), (W, 'W')] {
        if state & bit != 0 {
            s.push(c);
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn st(s: &str) -> u32 {
        s.chars().fold(0, |a, c| {
            a | match c {
                'R' => R,
                'H' => H,
                'W' => W,
                _ => 0,
            }
        })
    }

    const PLAIN: Contender = Contender {
        stat_open: false,
        sharing_violation: false,
        overwrite: false,
        delete: false,
    };

    #[test]
    fn only_states_with_read_caching_are_granted() {
        for (asked, got) in [
            ("", ""),
            ("R", "R"),
            ("H", ""),
            ("W", ""),
            ("RH", "RH"),
            ("RW", "RW"),
            ("HW", ""),
            ("RHW", "RHW"),
        ] {
            assert_eq!(normalize(st(asked)), st(got), "{asked}");
        }
        assert_eq!(normalize(0xF0 | R), R);
    }

    #[test]
    fn upgrades_need_a_superset() {
        // (held, asked by the same key, result) for an open alone on the file.
        let table = [
            ("", "", ""),
            ("", "R", "R"),
            ("", "RHW", "RHW"),
            ("R", "", "R"),
            ("R", "RH", "RH"),
            ("R", "RW", "RW"),
            ("RH", "R", "RH"),
            ("RH", "RW", "RH"),
            ("RH", "RHW", "RHW"),
            ("RW", "RH", "RW"),
            ("RW", "RHW", "RHW"),
            ("RHW", "RH", "RHW"),
        ];
        for (held, asked, want) in table {
            assert_eq!(
                upgrade(st(held), st(asked), false),
                st(want),
                "{held}+{asked}"
            );
        }
        // Another open on the file keeps an upgrade asking for write caching out entirely.
        assert_eq!(upgrade(st("R"), st("RHW"), true), st("R"));
        assert_eq!(upgrade(st("R"), st("RH"), true), st("RH"));
        assert_eq!(break_on_write(st("RH")), 0);
        assert_eq!(break_on_write(st("R")), 0);
    }

    #[test]
    fn contending_lease_breaks_write_and_gets_no_write() {
        // (held by key 1, asked by key 2, key 1 broken to, key 2 granted).
        let table = [
            ("R", "R", "R", "R"),
            ("R", "RH", "R", "RH"),
            ("R", "RW", "R", "R"),
            ("R", "RHW", "R", "RH"),
            ("RH", "R", "RH", "R"),
            ("RH", "RW", "RH", "R"),
            ("RH", "RHW", "RH", "RH"),
            ("RW", "R", "R", "R"),
            ("RW", "RH", "R", "RH"),
            ("RW", "RHW", "R", "RH"),
            ("RHW", "R", "RH", "R"),
            ("RHW", "RW", "RH", "R"),
            ("RHW", "RHW", "RH", "RH"),
        ];
        for (held, asked, broken, granted) in table {
            assert_eq!(break_to(st(held), PLAIN), st(broken), "{held} vs {asked}");
            assert_eq!(
                grant(normalize(st(asked)), true),
                st(granted),
                "{held} vs {asked}"
            );
        }
    }

    #[test]
    fn violations_overwrites_and_stat_opens() {
        let violation = Contender {
            sharing_violation: true,
            ..PLAIN
        };
        let overwrite = Contender {
            overwrite: true,
            ..PLAIN
        };
        let stat = Contender {
            stat_open: true,
            ..PLAIN
        };
        assert_eq!(break_to(st("RHW"), violation), st("RW"));
        assert_eq!(break_to(st("RW"), violation), st("RW"));
        assert_eq!(break_to(st("RH"), violation), st("R"));
        assert_eq!(break_to(st("RH"), overwrite), 0);
        assert_eq!(break_to(st("R"), overwrite), 0);
        assert_eq!(break_to(st("RHW"), stat), st("RHW"));
        let delete = Contender {
            delete: true,
            ..PLAIN
        };
        assert_eq!(break_to(st("RH"), delete), st("R"));
        assert_eq!(break_to(st("RHW"), delete), st("R"));
        assert_eq!(break_to(st("R"), delete), st("R"));
        assert_eq!(oplock_break_to(st("RHW"), delete), R);
        assert!(lease_break_needs_ack(st("RH")));
        assert!(!lease_break_needs_ack(st("R")));
    }

    #[test]
    fn oplocks_map_to_states() {
        for level in [OPLOCK_NONE, OPLOCK_LEVEL_II, OPLOCK_EXCLUSIVE, OPLOCK_BATCH] {
            assert_eq!(oplock_level(oplock_state(level)), level);
        }
        assert_eq!(oplock_level(st("RH")), OPLOCK_LEVEL_II);
        // Batch and exclusive break to level II, to none on an overwrite.
        assert_eq!(oplock_break_to(st("RHW"), PLAIN), R);
        assert_eq!(oplock_break_to(st("RW"), PLAIN), R);
        let overwrite = Contender {
            overwrite: true,
            ..PLAIN
        };
        assert_eq!(oplock_break_to(st("RHW"), overwrite), 0);
        // Level II is not broken by an open, only acknowledged breaks from W wait.
        assert_eq!(oplock_break_to(R, PLAIN), R);
        assert!(oplock_break_needs_ack(st("RW")));
        assert!(!oplock_break_needs_ack(R));
        // A second open gets level II at most.
        assert_eq!(
            oplock_level(grant(oplock_state(OPLOCK_BATCH), true)),
            OPLOCK_LEVEL_II
        );
        assert_eq!(describe(st("RHW")), "RHW");
    }
}
