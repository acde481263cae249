//! The break machinery against an in-memory file table: notifications, acknowledgments,
//! timeouts, delivery on another channel, and granting.

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::AtomicBool;

use smb_proto::crypto::{PreauthHash, SessionKeys, SigningAlgorithm};
use smb_proto::msg::create_ctx::{Lease, LEASE_FLAG_BREAK_IN_PROGRESS};
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver};

use super::*;
use crate::fs::grant::{grant, GrantRequest};
use crate::fs::lease::{H, OPLOCK_BATCH, OPLOCK_LEVEL_II, R, W};
use crate::state::{Session, SessionState};

pub(crate) const FILE: FileKey = (1, 2);
pub(crate) const GUID: [u8; 16] = [7; 16];
pub(crate) const SHARE_ALL: u32 = 7;
pub(crate) const READ: u32 = 0x0012_0089;

pub(crate) fn server() -> Server {
    Server::new(
        crate::config::SmbConfig::new(Path::new("/nonexistent")),
        Vec::new(),
        crate::users::Users::new(),
    )
}

pub(crate) fn key(n: u8) -> [u8; 16] {
    [n; 16]
}

pub(crate) fn holder(owner: Owner, state: u32, open: u64, tx: &UnboundedSender<Vec<u8>>) -> Holder {
    Holder {
        owner,
        opens: vec![open],
        state,
        epoch: 1,
        breaking: None,
        session_id: 77,
        tx: tx.clone(),
    }
}

pub(crate) fn lease_owner(n: u8, v2: bool) -> Owner {
    Owner::Lease {
        client_guid: GUID,
        key: key(n),
        v2,
        parent: None,
    }
}

/// File FILE with one open (id 1, read access, sharing `share`) holding `h`.
pub(crate) fn with_holder(server: &Server, share: u32, h: Holder) {
    let mut files = server.files.lock();
    let st = files.entry(FILE).or_default();
    st.entries.push(ShareEntry {
        open: 1,
        access: READ,
        share_access: share,
    });
    st.holders.push(h);
}

pub(crate) fn requester(lease_key: Option<u8>, access: u32, share: u32) -> Requester {
    Requester {
        client_guid: GUID,
        lease_key: lease_key.map(key),
        access,
        share_access: share,
        overwrite: false,
        delete_on_close: false,
    }
}

pub(crate) fn next_break(rx: &mut UnboundedReceiver<Vec<u8>>) -> OplockBreak {
    let frame = rx.try_recv().expect("a break notification");
    let msg = frame.get(4..).expect("prefix");
    let h = Header::decode(msg).expect("header");
    assert_eq!(h.command, Command::OplockBreak);
    assert_eq!(h.message_id, u64::MAX);
    OplockBreak::decode(msg).expect("body")
}

#[test]
fn lease_break_waits_for_its_acknowledgment() {
    let s = server();
    let (tx, mut rx) = unbounded_channel();
    with_holder(
        &s,
        SHARE_ALL,
        holder(lease_owner(1, true), R | H | W, 1, &tx),
    );
    s.leases.lock().insert((GUID, key(1)), FILE);
    let req = requester(Some(2), READ, SHARE_ALL);
    assert!(matches!(start_breaks(&s, FILE, &req), Step::Wait { .. }));
    assert_eq!(
        next_break(&mut rx),
        OplockBreak::LeaseNotification {
            new_epoch: 2,
            flags: LEASE_BREAK_ACK_REQUIRED,
            lease_key: key(1),
            current_lease_state: R | H | W,
            new_lease_state: R | H,
        }
    );
    // Asking again sends nothing new and still waits.
    assert!(matches!(start_breaks(&s, FILE, &req), Step::Wait { .. }));
    assert!(rx.try_recv().is_err());
    // The holder's own key is not broken.
    assert!(matches!(
        start_breaks(&s, FILE, &requester(Some(1), READ, SHARE_ALL)),
        Step::Proceed
    ));
    let mut out = Vec::new();
    assert_eq!(
        acknowledge_lease(&s, GUID, key(1), R | H | W, &mut out).err(),
        Some(REQUEST_NOT_ACCEPTED)
    );
    assert_eq!(
        acknowledge_lease(&s, GUID, key(9), R, &mut out).err(),
        Some(NtStatus::OBJECT_NAME_NOT_FOUND)
    );
    acknowledge_lease(&s, GUID, key(1), R | H, &mut out).expect("ack");
    assert!(matches!(start_breaks(&s, FILE, &req), Step::Proceed));
    // Not breaking any more: a second acknowledgment is refused.
    assert_eq!(
        acknowledge_lease(&s, GUID, key(1), R, &mut out).err(),
        Some(UNSUCCESSFUL)
    );
}

#[test]
fn sharing_violation_breaks_handle_caching_and_read_only_breaks_need_no_ack() {
    let s = server();
    let (tx, mut rx) = unbounded_channel();
    // The holder shares nothing: the new open conflicts, so H goes.
    with_holder(&s, 0, holder(lease_owner(1, false), R | H, 1, &tx));
    assert!(matches!(
        start_breaks(&s, FILE, &requester(None, READ, SHARE_ALL)),
        Step::Wait { .. }
    ));
    assert!(matches!(
        next_break(&mut rx),
        OplockBreak::LeaseNotification {
            new_epoch: 0,
            new_lease_state: R,
            ..
        }
    ));
    expire_breaks(&s, FILE, Instant::now() + BREAK_TIMEOUT);
    // R alone breaks to none on an overwrite without an acknowledgment.
    let mut over = requester(None, READ, SHARE_ALL);
    over.overwrite = true;
    assert!(matches!(start_breaks(&s, FILE, &over), Step::Proceed));
    assert!(matches!(
        next_break(&mut rx),
        OplockBreak::LeaseNotification {
            flags: 0,
            current_lease_state: R,
            new_lease_state: 0,
            ..
        }
    ));
}

#[test]
fn an_unacknowledged_break_times_out_to_its_target() {
    let s = server();
    let (tx, _rx) = unbounded_channel();
    with_holder(&s, SHARE_ALL, holder(lease_owner(1, false), R | W, 1, &tx));
    let req = requester(None, READ, SHARE_ALL);
    let Step::Wait { deadline, .. } = start_breaks(&s, FILE, &req) else {
        panic!("no wait");
    };
    expire_breaks(&s, FILE, deadline - Duration::from_secs(1));
    assert!(matches!(start_breaks(&s, FILE, &req), Step::Wait { .. }));
    expire_breaks(&s, FILE, deadline);
    assert!(matches!(start_breaks(&s, FILE, &req), Step::Proceed));
    assert_eq!(
        s.files.lock().get(&FILE).map(|f| f.holders[0].state),
        Some(R)
    );
}

#[test]
fn break_goes_to_another_channel_when_the_holder_connection_is_gone() {
    let s = server();
    let (gone_tx, gone_rx) = unbounded_channel();
    drop(gone_rx);
    let (other_tx, mut other_rx) = unbounded_channel();
    s.add_session(Arc::new(Session {
        id: 77,
        user: "alice".into(),
        dialect: 0x0311,
        client_guid: GUID,
        signing: SigningAlgorithm::AesCmac,
        cipher: None,
        keys: SessionKeys::derive_311(&[1; 16], &PreauthHash::default(), None),
        session_key: [1; 16],
        signing_required: false,
        state: parking_lot::Mutex::new(SessionState {
            channels: 1,
            channel_tx: vec![gone_tx.clone(), other_tx],
            ..SessionState::default()
        }),
        closed: AtomicBool::new(false),
        binds: Default::default(),
        channels_lost: Default::default(),
    }));
    with_holder(
        &s,
        SHARE_ALL,
        holder(Owner::Oplock { open: 1 }, R | H | W, 1, &gone_tx),
    );
    let req = requester(None, READ, SHARE_ALL);
    assert!(matches!(start_breaks(&s, FILE, &req), Step::Wait { .. }));
    let fid = FileId {
        persistent: 1,
        volatile: 1,
    };
    assert_eq!(
        next_break(&mut other_rx),
        OplockBreak::Oplock {
            oplock_level: OPLOCK_LEVEL_II,
            file_id: fid
        }
    );
}

#[tokio::test]
async fn a_waiting_create_proceeds_on_the_acknowledgment() {
    let s = Arc::new(server());
    let (tx, mut rx) = unbounded_channel();
    with_holder(
        &s,
        SHARE_ALL,
        holder(lease_owner(1, false), R | H | W, 1, &tx),
    );
    s.leases.lock().insert((GUID, key(1)), FILE);
    let waiter = {
        let s = s.clone();
        tokio::spawn(async move {
            wait_for_breaks(&s, FILE, &requester(None, READ, SHARE_ALL), None).await;
        })
    };
    // The notification is the waiter's first step; then it waits for the acknowledgment.
    let frame = rx.recv().await.expect("notification");
    assert!(frame.len() > 4);
    assert!(!waiter.is_finished());
    acknowledge_lease(&s, GUID, key(1), R | H, &mut Vec::new()).expect("ack");
    tokio::time::timeout(Duration::from_secs(10), waiter)
        .await
        .expect("the waiter ends on the acknowledgment")
        .expect("join");
}

#[test]
fn grants_follow_the_other_opens() {
    let (tx, _rx) = unbounded_channel();
    let mut st = FileState::default();
    let mut index = HashMap::new();
    let entry = |open| ShareEntry {
        open,
        access: READ,
        share_access: SHARE_ALL,
    };
    let ask = |n: u8, state: u32| GrantRequest {
        requested_oplock: lease::OPLOCK_LEASE,
        lease: Some(Lease::V2 {
            key: key(n),
            state,
            flags: 0,
            parent_key: [0; 16],
            epoch: 0x4711,
        }),
        client_guid: GUID,
        session_id: 77,
        tx: &tx,
        is_dir: false,
    };
    st.entries.push(entry(1));
    let g = grant(&mut st, FILE, 1, &ask(1, R | H | W), &mut index);
    assert_eq!(g.oplock_level, lease::OPLOCK_LEASE);
    assert!(matches!(g.lease, Some(Lease::V2 { state, epoch: 0x4712, .. }) if state == R | H | W));
    assert_eq!(index.get(&(GUID, key(1))), Some(&FILE));
    // An oplock asked for beside a lease with write caching gets none.
    st.entries.push(entry(3));
    let oplock = GrantRequest {
        requested_oplock: OPLOCK_BATCH,
        lease: None,
        ..ask(3, 0)
    };
    assert_eq!(grant(&mut st, FILE, 3, &oplock, &mut index).oplock_level, 0);
    // Once that lease is broken to RH, a second key gets RH (no write caching beside other
    // opens); a batch oplock request beside handle caching gets nothing.
    if let Some(h) = st.holders.first_mut() {
        h.state = R | H;
    }
    st.entries.push(entry(2));
    let g = grant(&mut st, FILE, 2, &ask(2, R | H | W), &mut index);
    assert!(matches!(g.lease, Some(Lease::V2 { state, .. }) if state == R | H));
    st.entries.push(entry(6));
    assert_eq!(
        grant(
            &mut st,
            FILE,
            6,
            &GrantRequest {
                requested_oplock: OPLOCK_BATCH,
                lease: None,
                ..ask(6, 0)
            },
            &mut index
        )
        .oplock_level,
        0
    );
    // A break in progress is reported to a new open under the same key.
    if let Some(h) = st.holders.first_mut() {
        h.breaking = Some((R | H, Instant::now()));
    }
    st.entries.push(entry(4));
    let g = grant(&mut st, FILE, 4, &ask(1, R | H | W), &mut index);
    assert!(
        matches!(g.lease, Some(Lease::V2 { flags, .. }) if flags & LEASE_FLAG_BREAK_IN_PROGRESS != 0)
    );
    // Directories get nothing; the lease goes with its last open.
    let dir = GrantRequest {
        is_dir: true,
        ..ask(5, R)
    };
    assert!(grant(&mut st, FILE, 5, &dir, &mut index).lease.is_none());
    drop_open(&mut st, 1, &mut index);
    assert!(index.contains_key(&(GUID, key(1))));
    drop_open(&mut st, 4, &mut index);
    assert!(!index.contains_key(&(GUID, key(1))));
}

#[test]
fn a_write_breaks_the_read_caching_of_other_keys_only() {
    let s = server();
    let (tx, mut rx) = unbounded_channel();
    with_holder(&s, SHARE_ALL, holder(lease_owner(1, false), R, 1, &tx));
    if let Some(st) = s.files.lock().get_mut(&FILE) {
        st.holders.push(holder(lease_owner(2, false), R, 2, &tx));
    }
    break_readers(&s, FILE, 1);
    assert!(matches!(
        next_break(&mut rx),
        OplockBreak::LeaseNotification { lease_key, flags: 0, new_lease_state: 0, .. } if lease_key == key(2)
    ));
    assert!(rx.try_recv().is_err());
}

#[test]
fn a_rename_or_delete_breaks_the_handle_caching_of_other_keys() {
    let s = server();
    let (tx, mut rx) = unbounded_channel();
    with_holder(&s, SHARE_ALL, holder(lease_owner(1, false), R | H, 1, &tx));
    if let Some(st) = s.files.lock().get_mut(&FILE) {
        st.holders
            .push(holder(lease_owner(2, false), R | H, 2, &tx));
        st.holders.push(holder(lease_owner(3, false), R, 3, &tx));
    }
    break_handles(&s, FILE, 1);
    assert_eq!(
        next_break(&mut rx),
        OplockBreak::LeaseNotification {
            new_epoch: 0,
            flags: LEASE_BREAK_ACK_REQUIRED,
            lease_key: key(2),
            current_lease_state: R | H,
            new_lease_state: R,
        }
    );
    // Key 3 has no handle caching, key 1 is the actor's: nothing for them.
    assert!(rx.try_recv().is_err());
    // A CREATE from another key now waits for key 2's acknowledgment.
    assert!(matches!(
        start_breaks(&s, FILE, &requester(Some(4), READ, SHARE_ALL)),
        Step::Wait { .. }
    ));
}
