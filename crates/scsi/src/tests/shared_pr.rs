//! Reservations shared through a [`PrStore`]: two logical units (two gateways) over one
//! in-memory store, a lost compare-and-set redone on the newer state, bounded retries.

use super::*;
use parking_lot::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

/// A store in memory; `race` is another gateway's change landing just before the next
/// `store_if`, which then reports Conflict.
#[derive(Default)]
struct MemStore {
    state: Mutex<(Option<String>, u64)>,
    subs: Mutex<Vec<PrChangeFn>>,
    race: Mutex<Option<String>>,
    always_conflict: bool,
    conflicts: AtomicUsize,
    stores: AtomicUsize,
    /// Gateways of one storage (RBD): a change that takes access away waits for commands
    /// under way on the others.
    drains: bool,
    /// The SPC-2 RESERVE holder is part of the shared state.
    legacy: bool,
    /// `store_if` fails with this kind of error.
    fails: Option<std::io::ErrorKind>,
}

impl PrStore for MemStore {
    fn load(&self) -> std::io::Result<(Option<String>, u64)> {
        Ok(self.state.lock().clone())
    }
    fn store_if(&self, version: u64, text: &str) -> std::io::Result<StoreResult> {
        if let Some(kind) = self.fails {
            return Err(std::io::Error::new(kind, "the store refused"));
        }
        let mut st = self.state.lock();
        if let Some(other) = self.race.lock().take() {
            *st = (Some(other), st.1 + 1);
        }
        if st.1 != version || self.always_conflict {
            self.conflicts.fetch_add(1, Ordering::SeqCst);
            return Ok(StoreResult::Conflict);
        }
        *st = (Some(text.to_string()), version + 1);
        self.stores.fetch_add(1, Ordering::SeqCst);
        Ok(StoreResult::Stored(version + 1))
    }
    fn announce(&self, version: u64, text: &str) -> std::io::Result<()> {
        for s in self.subs.lock().iter() {
            let _ = s(Some(text), version);
        }
        Ok(())
    }
    fn subscribe(&self, on_change: PrChangeFn) {
        self.subs.lock().push(on_change);
    }
    fn drains_on_reset(&self) -> bool {
        self.drains
    }
    fn shares_legacy(&self) -> bool {
        self.legacy
    }
}

fn gateway(store: &Arc<MemStore>) -> LunMap {
    let dev: Arc<dyn BlockDevice> = Arc::new(MemoryDevice::new(BLOCKS * 512));
    let tpgs = Arc::new(TargetPortGroups::one_per_port(2));
    let cfg = LunConfig {
        pr_store: Some(store.clone()),
        ..config(dev)
    };
    LunMap::new(vec![(0, Arc::new(LogicalUnit::new(cfg, tpgs).unwrap()))])
}

/// One gateway over `store`; a host logs in (its unit attention taken) and registers key 0xA.
/// Returns the gateway, the host's nexus and the registration's outcome.
fn register_on_one_gateway(store: &Arc<MemStore>) -> (LunMap, Nexus, ScsiOutcome) {
    let g = gateway(store);
    let a = nexus(1, "iqn.a", 1);
    g.nexus_added(&a);
    run(&g, &a, &[0; 6], &[], 0);
    let (c, d) = pr_out(0, 0, 0, 0xA, 0);
    let o = run(&g, &a, &c, &d, 0).0;
    (g, a, o)
}

fn generation(d: &[u8]) -> u32 {
    u32::from_be_bytes([d[0], d[1], d[2], d[3]])
}

#[test]
fn lost_race_is_redone_on_the_newer_state_and_announced() {
    let store = Arc::new(MemStore::default());
    let (ga, gb) = (gateway(&store), gateway(&store));
    let a = nexus(1, "iqn.a", 1);
    let b = nexus(2, "iqn.b", 2);
    for (g, n) in [(&ga, &a), (&gb, &b)] {
        g.nexus_added(n);
        run(g, n, &[0; 6], &[], 0);
    }
    let (c, d) = pr_out(0, 0, 0, 0xA, 0);
    assert_eq!(run(&ga, &a, &c, &d, 0).0.status, 0);
    // Host b registers through gateway B just before host a's RESERVE reaches the store.
    *store.race.lock() = Some(
        "lanes-pr 1\ngeneration 2\nreg 000000000000000a 800000000001 1 0 iqn.a\n\
         reg 000000000000000b 800000000002 2 0 iqn.b\naptpl 0\n"
            .into(),
    );
    let (c, d) = pr_out(1, 1, 0xA, 0, 0);
    assert_eq!(run(&ga, &a, &c, &d, 0).0.status, 0);
    assert_eq!(store.conflicts.load(Ordering::SeqCst), 1);
    // Gateway B's conflict check knows the reservation from the announcement alone.
    let write = [0x2A, 0, 0, 0, 0, 1, 0, 0, 1, 0];
    assert_eq!(
        run(&gb, &b, &write, &[0; 512], 0).0.status,
        status::RESERVATION_CONFLICT
    );
    // The redone RESERVE kept b's registration: both keys, through either gateway.
    for g in [&ga, &gb] {
        let (o, d) = run(g, &b, &[0x5E, 0, 0, 0, 0, 0, 0, 1, 0, 0], &[], 256);
        assert_eq!(o.status, 0);
        assert_eq!(generation(&d), 2);
        assert_eq!(u32::from_be_bytes([d[4], d[5], d[6], d[7]]), 16);
        assert_eq!(u64::from_be_bytes(d[8..16].try_into().unwrap()), 0xA);
        assert_eq!(u64::from_be_bytes(d[16..24].try_into().unwrap()), 0xB);
        let (_, d) = run(g, &b, &[0x5E, 1, 0, 0, 0, 0, 0, 1, 0, 0], &[], 256);
        assert_eq!(u64::from_be_bytes(d[8..16].try_into().unwrap()), 0xA);
        assert_eq!(d[21], 1);
    }
    // b preempts a through B; gateway A sees it without asking the store.
    let (c, d) = pr_out(4, 1, 0xB, 0xA, 0);
    assert_eq!(run(&gb, &b, &c, &d, 0).0.status, 0);
    assert_eq!(
        run(&ga, &a, &write, &[0; 512], 0).0.status,
        status::RESERVATION_CONFLICT
    );
    let (c, d) = pr_out(2, 1, 0xB, 0, 0);
    assert_eq!(run(&gb, &b, &c, &d, 0).0.status, 0);
    assert_eq!(run(&ga, &a, &write, &[0; 512], 0).0.status, 0);
}

/// An SPC-2 RESERVE through gateway A is a conflict for host b at gateway B at once, and a
/// RELEASE through A frees it there at once: both are announced, since each gateway checks
/// commands against its own copy of the state.
#[test]
fn spc2_reservations_are_announced_to_the_other_gateways() {
    let store = Arc::new(MemStore {
        legacy: true,
        ..MemStore::default()
    });
    let (ga, gb) = (gateway(&store), gateway(&store));
    let a = nexus(1, "iqn.a", 1);
    let b = nexus(2, "iqn.b", 2);
    for (g, n) in [(&ga, &a), (&gb, &b)] {
        g.nexus_added(n);
        run(g, n, &[0; 6], &[], 0);
    }
    let (reserve, release) = ([0x16, 0, 0, 0, 0, 0], [0x17, 0, 0, 0, 0, 0]);
    let write = [0x2A, 0, 0, 0, 0, 1, 0, 0, 1, 0];
    assert_eq!(run(&ga, &a, &reserve, &[], 0).0.status, 0);
    assert_eq!(
        run(&gb, &b, &write, &[0; 512], 0).0.status,
        status::RESERVATION_CONFLICT
    );
    assert_eq!(
        run(&gb, &b, &reserve, &[], 0).0.status,
        status::RESERVATION_CONFLICT
    );
    assert_eq!(run(&ga, &a, &write, &[0; 512], 0).0.status, 0);
    assert_eq!(run(&ga, &a, &release, &[], 0).0.status, 0);
    assert_eq!(run(&gb, &b, &reserve, &[], 0).0.status, 0);
    assert_eq!(
        run(&ga, &a, &write, &[0; 512], 0).0.status,
        status::RESERVATION_CONFLICT
    );
}

#[test]
fn endless_conflicts_end_in_an_error() {
    let store = Arc::new(MemStore {
        always_conflict: true,
        ..Default::default()
    });
    let (g, a, o) = register_on_one_gateway(&store);
    assert_eq!(o.status, status::CHECK_CONDITION);
    assert_eq!(
        store.conflicts.load(Ordering::SeqCst),
        crate::pr_store::STORE_ATTEMPTS
    );
    assert_eq!(store.stores.load(Ordering::SeqCst), 0);
    let (_, d) = run(&g, &a, &[0x5E, 0, 0, 0, 0, 0, 0, 1, 0, 0], &[], 256);
    assert_eq!(u32::from_be_bytes([d[4], d[5], d[6], d[7]]), 0);
}

#[test]
fn a_preempt_and_abort_elsewhere_completes_only_after_commands_under_way_here_end() {
    let store = Arc::new(MemStore {
        drains: true,
        ..Default::default()
    });
    let (ga, gb) = (gateway(&store), Arc::new(gateway(&store)));
    let a = nexus(1, "iqn.a", 1);
    let b = nexus(2, "iqn.b", 2);
    ga.nexus_added(&a);
    run(&ga, &a, &[0; 6], &[], 0);
    gb.nexus_added(&b);
    run(&gb, &b, &[0; 6], &[], 0);
    let (c, d) = pr_out(0, 0, 0, 0xA, 0);
    assert_eq!(run(&ga, &a, &c, &d, 0).0.status, 0);
    let (c, d) = pr_out(0, 0, 0, 0xB, 0);
    assert_eq!(run(&gb, &b, &c, &d, 0).0.status, 0);
    let lu_a = ga.get(0).unwrap().clone();
    // A command of host a under way on gateway A (past its conflict check).
    let under_way = lu_a.drain.enter();
    let preempt = |gb: Arc<LunMap>, b: Nexus, action: u8, sa_key: u64| {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let (c, d) = pr_out(action, 1, 0xB, sa_key, 0);
            let _ = tx.send(run(&gb, &b, &c, &d, 0).0.status);
        });
        rx
    };
    let done = preempt(gb.clone(), b.clone(), 5, 0xA);
    assert!(
        done.recv_timeout(std::time::Duration::from_millis(300))
            .is_err(),
        "PREEMPT AND ABORT through B answered while a's command still runs on A"
    );
    drop(under_way);
    assert_eq!(
        done.recv_timeout(std::time::Duration::from_secs(10)),
        Ok(0),
        "answered GOOD once A's command ended"
    );
    // Gateway A knows a's key is gone: READ KEYS lists b's alone.
    let (o, d) = run(&ga, &a, &[0x5E, 0, 0, 0, 0, 0, 0, 1, 0, 0], &[], 256);
    assert_eq!(o.status, 0);
    assert_eq!(u32::from_be_bytes([d[4], d[5], d[6], d[7]]), 8);
    assert_eq!(u64::from_be_bytes(d[8..16].try_into().unwrap()), 0xB);
    // A change that takes nothing away (b's key registered again as is) waits for nobody,
    // well within the 5 s a drain would allow.
    let _under_way = lu_a.drain.enter();
    let (c, d) = pr_out(0, 0, 0xB, 0xB, 0);
    let (tx, rx) = std::sync::mpsc::channel();
    let (gb2, b2) = (gb.clone(), b.clone());
    std::thread::spawn(move || {
        let _ = tx.send(run(&gb2, &b2, &c, &d, 0).0.status);
    });
    assert_eq!(rx.recv_timeout(std::time::Duration::from_secs(3)), Ok(0));
    // Nor does b changing its key (REGISTER AND IGNORE EXISTING KEY with a new one).
    let (c, d) = pr_out(6, 0, 0, 0xBB, 0);
    let (tx, rx) = std::sync::mpsc::channel();
    let (gb2, b2) = (gb.clone(), b.clone());
    std::thread::spawn(move || {
        let _ = tx.send(run(&gb2, &b2, &c, &d, 0).0.status);
    });
    assert_eq!(rx.recv_timeout(std::time::Duration::from_secs(3)), Ok(0));
}

#[test]
fn a_store_out_of_reach_sends_the_host_to_another_path() {
    // A replica that lost its epoch (NotConnected): NOT READY, TARGET PORT IN UNAVAILABLE
    // STATE, which multipath hosts retry elsewhere; any other store failure: HARDWARE ERROR.
    for (kind, sense) in [
        (std::io::ErrorKind::NotConnected, (2, 0x04, 0x0C)),
        (std::io::ErrorKind::Other, (4, 0x44, 0)),
    ] {
        let store = Arc::new(MemStore {
            fails: Some(kind),
            ..MemStore::default()
        });
        let (_, _, o) = register_on_one_gateway(&store);
        assert_eq!(o.status, status::CHECK_CONDITION, "{kind:?}");
        let s = o.sense.expect("sense data");
        assert_eq!((s.key, s.asc, s.ascq), sense, "{kind:?}");
        assert_eq!(store.stores.load(Ordering::SeqCst), 0);
    }
}
