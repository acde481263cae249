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
}

impl PrStore for MemStore {
    fn load(&self) -> std::io::Result<(Option<String>, u64)> {
        Ok(self.state.lock().clone())
    }
    fn store_if(&self, version: u64, text: &str) -> std::io::Result<StoreResult> {
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
            s(Some(text), version);
        }
        Ok(())
    }
    fn subscribe(&self, on_change: PrChangeFn) {
        self.subs.lock().push(on_change);
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

#[test]
fn endless_conflicts_end_in_an_error() {
    let store = Arc::new(MemStore {
        always_conflict: true,
        ..Default::default()
    });
    let g = gateway(&store);
    let a = nexus(1, "iqn.a", 1);
    g.nexus_added(&a);
    run(&g, &a, &[0; 6], &[], 0);
    let (c, d) = pr_out(0, 0, 0, 0xA, 0);
    let (o, _) = run(&g, &a, &c, &d, 0);
    assert_eq!(o.status, status::CHECK_CONDITION);
    assert_eq!(
        store.conflicts.load(Ordering::SeqCst),
        crate::pr_store::STORE_ATTEMPTS
    );
    assert_eq!(store.stores.load(Ordering::SeqCst), 0);
    let (_, d) = run(&g, &a, &[0x5E, 0, 0, 0, 0, 0, 0, 1, 0, 0], &[], 256);
    assert_eq!(u32::from_be_bytes([d[4], d[5], d[6], d[7]]), 0);
}
