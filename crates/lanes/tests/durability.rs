//! What an acknowledged write survives, shown with the volatile-cache test harness: `lanes
//! serve` keeps writes in process memory until a flush, so kill -9 loses exactly what a power
//! loss would (kill -9 of the plain file backend cannot show it: the page cache survives).
//! A write made durable (FUA, SYNCHRONIZE CACHE, or write cache off) must come back after the
//! restart; a cached write that was never synchronized must not (the harness has teeth).

use bytes::Bytes;
use lanes_initiator::{LoginOptions, Session};
use lanes_test_support::config::ConfigToml;
use lanes_test_support::serve::{ServeChild, ServeCommand};
use rustix::process::Signal;
use std::path::Path;
use std::time::Duration;

const TARGET: &str = "iqn.2026-11.test:durability";

fn serve(dir: &Path, volatile: bool) -> ServeChild {
    let cache = format!("volatile-cache = {volatile}");
    let config = ConfigToml::new(dir.display(), TARGET)
        .lun("cached.img", "16M", &format!("write-cache = true\n{cache}"))
        .lun("sync.img", "16M", &format!("write-cache = false\n{cache}"))
        .build();
    let file = dir.join("lanes.toml");
    std::fs::write(&file, config).unwrap();
    ServeCommand::new(env!("CARGO_BIN_EXE_lanes"))
        .arg("--config")
        .arg(&file)
        .start()
}

fn block(tag: u8) -> Bytes {
    Bytes::from(vec![tag; 4096])
}

/// The byte a block is filled with (`None`: mixed), so a failure prints one number.
fn filled(data: &[u8]) -> Option<u8> {
    let first = *data.first()?;
    data.iter().all(|b| *b == first).then_some(first)
}

async fn login(served: &ServeChild, lun: u64) -> Session {
    let options = LoginOptions {
        lun,
        ..LoginOptions::new("iqn.2026-11.test:durability-host")
    };
    let session = Session::login(served.portal, TARGET, &options)
        .await
        .expect("login");
    // The first command after login reports the power-on unit attention.
    let _ = session.test_unit_ready().await;
    session
}

#[test]
fn durable_writes_survive_a_power_loss_and_unsynchronized_ones_do_not() {
    let dir = tempfile::tempdir().unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let mut served = serve(dir.path(), true);
    rt.block_on(async {
        let cached = login(&served, 0).await;
        let sync = login(&served, 1).await;
        // LUN 0, write cache on: A plain, C plain + SYNCHRONIZE CACHE (which also makes A
        // durable), then B with FUA and D plain after the last synchronization.
        cached.write_fua(0, block(0xA1), false).await.unwrap();
        cached.write_fua(200, block(0xC3), false).await.unwrap();
        cached.synchronize_cache().await.unwrap();
        cached.write_fua(100, block(0xB2), true).await.unwrap();
        cached.write_fua(300, block(0xD4), false).await.unwrap();
        // Before the power loss everything reads back, D included (from the cache).
        assert_eq!(filled(&cached.read(300, 8).await.unwrap()), Some(0xD4));
        // LUN 1, write cache off: every acknowledged write is durable.
        sync.write_fua(0, block(0xE5), false).await.unwrap();
    });
    // Power loss.
    served.stop(Signal::Kill, Duration::from_secs(10));
    drop(served);

    let served = serve(dir.path(), false);
    rt.block_on(async {
        let cached = login(&served, 0).await;
        let sync = login(&served, 1).await;
        assert_eq!(
            cached.read(0, 8).await.unwrap(),
            block(0xA1),
            "A (synchronized by C's SYNCHRONIZE CACHE)"
        );
        assert_eq!(cached.read(100, 8).await.unwrap(), block(0xB2), "B (FUA)");
        assert_eq!(
            cached.read(200, 8).await.unwrap(),
            block(0xC3),
            "C (SYNCHRONIZE CACHE)"
        );
        assert_eq!(
            cached.read(300, 8).await.unwrap(),
            Bytes::from(vec![0u8; 4096]),
            "D was never made durable: a power loss takes it (or the harness is not simulating one)"
        );
        assert_eq!(
            sync.read(0, 8).await.unwrap(),
            block(0xE5),
            "E (write cache off)"
        );
    });
}
