//! The breaks an operation on an open file starts: byte-range locks, renames and deletes
//! (waiting for the acknowledgments), and which opens are stat opens.

use std::sync::Arc;
use std::time::Duration;

use smb_proto::msg::oplock::LEASE_BREAK_ACK_REQUIRED;
use smb_proto::msg::{FileId, OplockBreak};
use tokio::sync::mpsc::unbounded_channel;

use super::*;
use crate::fs::lease::{H, R, W};
use crate::fs::oplock::tests::{
    holder, key, lease_owner, next_break, requester, server, with_holder, FILE, GUID, READ,
    SHARE_ALL,
};
use crate::fs::oplock::{acknowledge_lease, expire_breaks, start_breaks, Owner, Step};

#[test]
fn a_lock_breaks_read_leases_of_other_keys_to_none() {
    let s = server();
    let (tx, mut rx) = unbounded_channel();
    // Open 1 locks under key 1 (RH); key 2 holds RH, key 3 R.
    with_holder(&s, SHARE_ALL, holder(lease_owner(1, false), R | H, 1, &tx));
    if let Some(st) = s.files.lock().get_mut(&FILE) {
        st.holders
            .push(holder(lease_owner(2, false), R | H, 2, &tx));
        st.holders.push(holder(lease_owner(3, false), R, 3, &tx));
    }
    break_on_lock(&s, FILE, 1);
    assert_eq!(
        next_break(&mut rx),
        OplockBreak::LeaseNotification {
            new_epoch: 0,
            flags: LEASE_BREAK_ACK_REQUIRED,
            lease_key: key(2),
            current_lease_state: R | H,
            new_lease_state: 0,
        }
    );
    assert_eq!(
        next_break(&mut rx),
        OplockBreak::LeaseNotification {
            new_epoch: 0,
            flags: 0,
            lease_key: key(3),
            current_lease_state: R,
            new_lease_state: 0,
        }
    );
    // The locker's own key keeps RH.
    assert!(rx.try_recv().is_err());
    // Another lock: key 2 still breaking, key 3 has nothing left; key 1 is the locker's.
    break_on_lock(&s, FILE, 1);
    assert!(rx.try_recv().is_err());
    // A lock from key 3's open breaks key 1.
    break_on_lock(&s, FILE, 3);
    assert!(matches!(
        next_break(&mut rx),
        OplockBreak::LeaseNotification { lease_key, new_lease_state: 0, .. } if lease_key == key(1)
    ));
}

#[test]
fn a_lock_breaks_level_ii_oplocks_the_lockers_own_too_but_not_batch() {
    let s = server();
    let (tx, mut rx) = unbounded_channel();
    with_holder(&s, SHARE_ALL, holder(Owner::Oplock { open: 1 }, R, 1, &tx));
    break_on_lock(&s, FILE, 1);
    assert_eq!(
        next_break(&mut rx),
        OplockBreak::Oplock {
            oplock_level: 0,
            file_id: FileId {
                persistent: 1,
                volatile: 1,
            },
        }
    );
    assert!(s
        .files
        .lock()
        .get(&FILE)
        .is_some_and(|st| st.holders.is_empty()));
    // An open alone with a batch oplock keeps it when it locks.
    if let Some(st) = s.files.lock().get_mut(&FILE) {
        st.holders
            .push(holder(Owner::Oplock { open: 1 }, R | H | W, 1, &tx));
    }
    break_on_lock(&s, FILE, 1);
    assert!(rx.try_recv().is_err());
}

#[test]
fn stat_opens_differ_for_leases_and_oplocks() {
    const READ_CONTROL: u32 = 0x0002_0000;
    const SYNC_ATTRS: u32 = 0x0010_0000 | 0x0080 | 0x0100;
    const READ_EA: u32 = 0x0008;
    const WRITE_DAC: u32 = 0x0004_0000;
    let lease_file = |access: u32| {
        let s = server();
        let (tx, _rx) = unbounded_channel();
        with_holder(
            &s,
            SHARE_ALL,
            holder(lease_owner(1, false), R | H | W, 1, &tx),
        );
        matches!(
            start_breaks(&s, FILE, &requester(None, access, SHARE_ALL)),
            Step::Proceed
        )
    };
    let oplock_file = |access: u32| {
        let s = server();
        let (tx, _rx) = unbounded_channel();
        with_holder(
            &s,
            SHARE_ALL,
            holder(Owner::Oplock { open: 1 }, R | H | W, 1, &tx),
        );
        matches!(
            start_breaks(&s, FILE, &requester(None, access, SHARE_ALL)),
            Step::Proceed
        )
    };
    // (access, no break of a lease, no break of an oplock)
    for (access, lease_stat, oplock_stat) in [
        (SYNC_ATTRS, true, true),
        (READ_CONTROL, true, false),
        (READ_CONTROL | SYNC_ATTRS, true, false),
        (READ_EA, false, false),
        (WRITE_DAC, false, false),
        (READ, false, false),
    ] {
        assert_eq!(lease_file(access), lease_stat, "lease {access:#x}");
        assert_eq!(oplock_file(access), oplock_stat, "oplock {access:#x}");
    }
}

#[test]
fn a_rename_or_delete_waits_for_the_handle_breaks_it_starts() {
    let s = server();
    let (tx, mut rx) = unbounded_channel();
    // Open 1 renames under key 1 (RH); key 2 holds RH on the same connection.
    with_holder(&s, SHARE_ALL, holder(lease_owner(1, false), R | H, 1, &tx));
    if let Some(st) = s.files.lock().get_mut(&FILE) {
        st.holders
            .push(holder(lease_owner(2, false), R | H, 2, &tx));
    }
    s.leases.lock().insert((GUID, key(2)), FILE);
    assert!(matches!(
        start_handle_breaks(&s, FILE, 1),
        Step::Wait { .. }
    ));
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
    // Still waiting, nothing sent again.
    assert!(matches!(
        start_handle_breaks(&s, FILE, 1),
        Step::Wait { .. }
    ));
    assert!(rx.try_recv().is_err());
    acknowledge_lease(&s, GUID, key(2), R, &mut Vec::new()).expect("ack");
    assert!(matches!(start_handle_breaks(&s, FILE, 1), Step::Proceed));
    // The actor's own key keeps its handle caching.
    assert!(rx.try_recv().is_err());
}

#[test]
fn a_batch_oplock_breaks_to_level_ii_before_a_rename() {
    let s = server();
    let (tx, mut rx) = unbounded_channel();
    with_holder(
        &s,
        SHARE_ALL,
        holder(Owner::Oplock { open: 1 }, R | H | W, 1, &tx),
    );
    let Step::Wait { deadline, .. } = start_handle_breaks(&s, FILE, 2) else {
        panic!("the rename waits for the batch oplock's acknowledgment");
    };
    assert_eq!(
        next_break(&mut rx),
        OplockBreak::Oplock {
            oplock_level: crate::fs::lease::OPLOCK_LEVEL_II,
            file_id: FileId {
                persistent: 1,
                volatile: 1,
            },
        }
    );
    // Not acknowledged: the timeout counts as the acknowledgment.
    expire_breaks(&s, FILE, deadline);
    assert!(matches!(start_handle_breaks(&s, FILE, 2), Step::Proceed));
    // The holder's own rename waits for nothing.
    let s = server();
    with_holder(
        &s,
        SHARE_ALL,
        holder(Owner::Oplock { open: 1 }, R | H | W, 1, &tx),
    );
    assert!(matches!(start_handle_breaks(&s, FILE, 1), Step::Proceed));
    assert!(rx.try_recv().is_err());
}

#[tokio::test]
async fn a_waiting_rename_proceeds_on_the_acknowledgment() {
    let s = Arc::new(server());
    let (tx, mut rx) = unbounded_channel();
    with_holder(&s, SHARE_ALL, holder(lease_owner(2, false), R | H, 2, &tx));
    s.leases.lock().insert((GUID, key(2)), FILE);
    let waiter = {
        let s = s.clone();
        tokio::spawn(async move {
            let step = || start_handle_breaks(&s, FILE, 1);
            crate::fs::oplock::wait_until_acknowledged(&s, FILE, None, step).await;
        })
    };
    let frame = rx.recv().await.expect("notification");
    assert!(frame.len() > 4);
    acknowledge_lease(&s, GUID, key(2), R, &mut Vec::new()).expect("ack");
    tokio::time::timeout(Duration::from_secs(10), waiter)
        .await
        .expect("the waiter ends on the acknowledgment")
        .expect("join");
}

#[test]
fn which_set_infos_rename_or_delete() {
    use smb_proto::msg::SetInfoRequest;
    let req = |class: u8, buffer: &'static [u8]| SetInfoRequest {
        info_type: smb_proto::msg::info::INFO_FILE,
        file_info_class: class,
        additional_information: 0,
        file_id: FileId {
            persistent: 0,
            volatile: 0,
        },
        buffer,
    };
    assert!(renames_or_deletes(&req(10, &[0; 24])));
    assert!(renames_or_deletes(&req(13, &[1])));
    assert!(!renames_or_deletes(&req(13, &[0])));
    assert!(!renames_or_deletes(&req(13, &[])));
    assert!(renames_or_deletes(&req(64, &[1, 0, 0, 0])));
    assert!(!renames_or_deletes(&req(64, &[2, 0, 0, 0])));
    assert!(!renames_or_deletes(&req(20, &[0; 8])));
}

#[test]
fn a_write_breaks_the_writers_own_level_ii_oplock_but_not_its_batch() {
    let s = server();
    let (tx, mut rx) = unbounded_channel();
    with_holder(&s, SHARE_ALL, holder(Owner::Oplock { open: 1 }, R, 1, &tx));
    break_readers(&s, FILE, 1);
    assert!(matches!(
        next_break(&mut rx),
        OplockBreak::Oplock {
            oplock_level: 0,
            ..
        }
    ));
    // Gone: an acknowledgment would find no oplock (INVALID_OPLOCK_PROTOCOL).
    assert!(s
        .files
        .lock()
        .get(&FILE)
        .is_some_and(|st| st.holders.is_empty()));
    if let Some(st) = s.files.lock().get_mut(&FILE) {
        st.holders
            .push(holder(Owner::Oplock { open: 1 }, R | H | W, 1, &tx));
        st.holders.push(holder(lease_owner(1, false), R, 1, &tx));
    }
    // Its own batch oplock and its own lease stay.
    break_readers(&s, FILE, 1);
    assert!(rx.try_recv().is_err());
}

#[test]
fn a_create_that_meets_a_pending_delete_breaks_nothing() {
    let s = server();
    let (tx, mut rx) = unbounded_channel();
    with_holder(
        &s,
        SHARE_ALL,
        holder(Owner::Oplock { open: 1 }, R | H | W, 1, &tx),
    );
    if let Some(st) = s.files.lock().get_mut(&FILE) {
        st.delete_pending = true;
    }
    assert!(matches!(
        start_breaks(&s, FILE, &requester(None, READ, SHARE_ALL)),
        Step::Proceed
    ));
    assert!(rx.try_recv().is_err());
}

#[test]
fn a_delete_on_close_create_breaks_handle_caching_and_waits() {
    let s = server();
    let (tx, mut rx) = unbounded_channel();
    with_holder(&s, SHARE_ALL, holder(lease_owner(1, false), R | H, 1, &tx));
    // A plain open beside RH breaks nothing.
    assert!(matches!(
        start_breaks(&s, FILE, &requester(None, 0x0001_0000, SHARE_ALL)),
        Step::Proceed
    ));
    assert!(rx.try_recv().is_err());
    let mut unlink = requester(None, 0x0001_0000, SHARE_ALL);
    unlink.delete_on_close = true;
    assert!(matches!(start_breaks(&s, FILE, &unlink), Step::Wait { .. }));
    assert_eq!(
        next_break(&mut rx),
        OplockBreak::LeaseNotification {
            new_epoch: 0,
            flags: LEASE_BREAK_ACK_REQUIRED,
            lease_key: key(1),
            current_lease_state: R | H,
            new_lease_state: R,
        }
    );
}
