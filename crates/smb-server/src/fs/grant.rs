//! Granting a lease or an oplock to a new open (MS-SMB2 3.3.5.9.8 and 3.3.5.9.11 for leases,
//! 3.3.5.9 for oplocks), and the RqLs response context.

use smb_proto::msg::create_ctx::{
    Lease, LEASE_FLAG_BREAK_IN_PROGRESS, LEASE_FLAG_PARENT_LEASE_KEY_SET,
};
use tokio::sync::mpsc::UnboundedSender;

use super::lease::{self, OPLOCK_LEASE, OPLOCK_NONE};
use super::oplock::{Holder, Owner};
use crate::state::{FileKey, FileState, LeaseIndex};

/// What a CREATE asks for: the oplock level and the lease context.
pub struct GrantRequest<'a> {
    pub requested_oplock: u8,
    pub lease: Option<Lease>,
    pub client_guid: [u8; 16],
    pub session_id: u64,
    pub tx: &'a UnboundedSender<Vec<u8>>,
    pub is_dir: bool,
}

/// What the CREATE response carries: the oplock level and the lease context to answer.
#[derive(Debug, Default)]
pub struct Granted {
    pub oplock_level: u8,
    pub lease: Option<Lease>,
}

/// Grants caching to the new open `open_id` (its share-mode entry is already in `st`): a
/// lease when asked for with SMB2_OPLOCK_LEVEL_LEASE and an RqLs context, else an oplock.
/// Directories get neither (directory leases are not offered). `index` is the server's map
/// of lease keys to files.
pub fn grant(
    st: &mut FileState,
    key: FileKey,
    open_id: u64,
    g: &GrantRequest<'_>,
    index: &mut LeaseIndex,
) -> Granted {
    if g.is_dir {
        return Granted::default();
    }
    let others_write = |holders: &[Holder], skip: Option<usize>| {
        holders
            .iter()
            .enumerate()
            .any(|(i, h)| Some(i) != skip && h.state & lease::W != 0)
    };
    match (g.requested_oplock, g.lease) {
        (OPLOCK_LEASE, Some(asked)) => {
            let lkey = asked.key();
            let same = st
                .holders
                .iter()
                .position(|h| h.is_lease(&g.client_guid, &lkey));
            let shared = st.entries.iter().any(|e| {
                e.open != open_id
                    && !super::open::lease_stat_open(e.access)
                    && !same
                        .and_then(|i| st.holders.get(i))
                        .is_some_and(|h| h.opens.contains(&e.open))
            });
            // Other leases with caching count as sharing the file, even through stat opens.
            let shared = shared
                || st
                    .holders
                    .iter()
                    .enumerate()
                    .any(|(i, h)| Some(i) != same && h.state != 0);
            let mut wanted = lease::normalize(match asked {
                Lease::V1 { state, .. } | Lease::V2 { state, .. } => state,
            });
            // Beside an oplock a lease gets read caching at most (as Windows does).
            if st
                .holders
                .iter()
                .any(|h| matches!(h.owner, Owner::Oplock { .. }))
            {
                wanted &= lease::R;
            }
            let blocked = others_write(&st.holders, same);
            let (holder, flags) = match same.and_then(|i| st.holders.get_mut(i)) {
                Some(h) => {
                    h.opens.push(open_id);
                    // Breaks keep going to the connection the lease was granted on while it
                    // lives (MS-SMB2 3.3.4.7); another channel of its session otherwise.
                    if h.tx.is_closed() {
                        h.tx = g.tx.clone();
                        h.session_id = g.session_id;
                    }
                    if h.breaking.is_some() {
                        (h, LEASE_FLAG_BREAK_IN_PROGRESS)
                    } else {
                        let new = if blocked {
                            h.state
                        } else {
                            lease::upgrade(h.state, wanted, shared)
                        };
                        if new != h.state {
                            h.state = new;
                            h.epoch = h.epoch.wrapping_add(1);
                        }
                        (h, 0)
                    }
                }
                None => {
                    let (v2, parent, epoch) = match asked {
                        Lease::V1 { .. } => (false, None, 0),
                        Lease::V2 {
                            flags,
                            parent_key,
                            epoch,
                            ..
                        } => (
                            true,
                            (flags & LEASE_FLAG_PARENT_LEASE_KEY_SET != 0).then_some(parent_key),
                            epoch.wrapping_add(1),
                        ),
                    };
                    index.insert((g.client_guid, lkey), key);
                    st.holders.push(Holder {
                        owner: Owner::Lease {
                            client_guid: g.client_guid,
                            key: lkey,
                            v2,
                            parent,
                        },
                        opens: vec![open_id],
                        state: if blocked {
                            0
                        } else {
                            lease::grant(wanted, shared)
                        },
                        epoch,
                        breaking: None,
                        session_id: g.session_id,
                        tx: g.tx.clone(),
                    });
                    let i = st.holders.len() - 1;
                    match st.holders.get_mut(i) {
                        Some(h) => (h, 0),
                        None => return Granted::default(),
                    }
                }
            };
            Granted {
                oplock_level: OPLOCK_LEASE,
                lease: Some(response_context(holder, flags)),
            }
        }
        (level, _) if lease::oplock_state(level) != 0 => {
            let shared = st
                .entries
                .iter()
                .any(|e| e.open != open_id && !super::open::oplock_stat_open(e.access));
            // Beside a lease with write or handle caching an oplock gets nothing.
            let state = if st
                .holders
                .iter()
                .any(|h| h.state & (lease::W | lease::H) != 0)
            {
                0
            } else {
                lease::grant(lease::oplock_state(level), shared)
            };
            let level = lease::oplock_level(state);
            if level != OPLOCK_NONE {
                st.holders.push(Holder {
                    owner: Owner::Oplock { open: open_id },
                    opens: vec![open_id],
                    state,
                    epoch: 0,
                    breaking: None,
                    session_id: g.session_id,
                    tx: g.tx.clone(),
                });
            }
            Granted {
                oplock_level: level,
                lease: None,
            }
        }
        _ => Granted::default(),
    }
}

/// The RqLs response context of a lease (MS-SMB2 2.2.14.2.10, 2.2.14.2.11).
fn response_context(h: &Holder, flags: u32) -> Lease {
    match h.owner {
        Owner::Lease {
            key,
            v2: true,
            parent,
            ..
        } => Lease::V2 {
            key,
            state: h.state,
            flags: flags | parent.map_or(0, |_| LEASE_FLAG_PARENT_LEASE_KEY_SET),
            parent_key: parent.unwrap_or_default(),
            epoch: h.epoch,
        },
        Owner::Lease { key, .. } => Lease::V1 {
            key,
            state: h.state,
            flags,
        },
        Owner::Oplock { .. } => Lease::V1 {
            key: [0; 16],
            state: 0,
            flags: 0,
        },
    }
}
