//! `lanes bench smb://` and `lanes doctor smb://` logic against lanes' SMB server on loopback.

mod common;

use std::time::Duration;

use common::{start, PASS, USER};
use lanes_smb_client::bench::{self, BenchOptions, BenchPattern};
use lanes_smb_client::doctor::{advise, gather};
use lanes_smb_client::url::SmbUrl;

fn url(port: u16) -> SmbUrl {
    SmbUrl::parse(&format!("smb://{USER}@127.0.0.1:{port}/share")).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bench_runs_every_pattern_over_two_channels() {
    let srv = start().await;
    let opts = BenchOptions {
        url: url(srv.addrs[0].port()),
        password: PASS.into(),
        channels: 2,
        addresses: vec![],
        encrypt: false,
        patterns: [
            "1m-seqwrite",
            "1m-seqread",
            "4k-randread",
            "4k-randwrite",
            "64k-verify",
        ]
        .iter()
        .map(|p| BenchPattern::parse(p).unwrap())
        .collect(),
        duration: Duration::from_millis(300),
        size: 8 << 20,
        queue_depth: 4,
        cpu_seconds: || 0.0,
        channel_timeout: None,
    };
    let r = bench::run(&opts, |_| {}).await.unwrap();
    assert!(r.bind_failures.is_empty(), "{:?}", r.bind_failures);
    assert_eq!(r.channels.len(), 2);
    assert_eq!(r.file_size, 8 << 20);
    assert_eq!(
        std::fs::metadata(srv.share.join("lanes-bench.dat"))
            .unwrap()
            .len(),
        8 << 20
    );
    assert_eq!(r.results.len(), 5);
    for p in &r.results {
        let timeline: u64 = p.timeline.iter().sum();
        assert_eq!(
            timeline, p.bytes,
            "every completion is in the timeline: {p:?}"
        );
        assert!(p.longest_io > Duration::ZERO);
        assert!(
            p.ios > 0 && p.bytes == p.ios * u64::from(p.pattern.block),
            "{p:?}"
        );
        let per_channel: u64 = p.channels.iter().map(|c| c.bytes).sum();
        assert_eq!(per_channel, p.bytes, "{p:?}");
        assert!(
            p.channels.iter().all(|c| c.bytes > 0),
            "both channels carry {p:?}"
        );
    }
    // Without a channel count: one channel per advertised address.
    let mut auto = opts.clone();
    auto.channels = 0;
    auto.patterns.truncate(1);
    let r = bench::run(&auto, |_| {}).await.unwrap();
    assert_eq!(r.channels.len(), 2);
    // --address overrides the interface list; an unreachable one is reported, not fatal.
    let mut opts = opts;
    opts.channels = 2;
    opts.addresses = vec!["127.0.0.3".parse().unwrap()];
    opts.patterns.truncate(1);
    let r = bench::run(&opts, |_| {}).await.unwrap();
    assert_eq!(r.channels.len(), 1);
    assert_eq!(r.bind_failures.len(), 1);
    assert!(r.bind_failures[0].0.to_string().starts_with("127.0.0.3:"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn doctor_reports_the_offer_and_binds_every_interface() {
    let srv = start().await;
    let f = gather(&url(srv.addrs[0].port()), PASS, false)
        .await
        .unwrap();
    assert_eq!(f.dialect, 0x0311);
    assert!(f.multichannel);
    assert_eq!(f.signing, "AesGmac");
    let list = f.interfaces.as_ref().unwrap();
    assert_eq!(list.len(), 2);
    assert!(list.iter().all(|c| c.bind.is_ok()), "{list:?}");
    assert_eq!(advise(&f), Vec::<String>::new());
    let f = gather(&url(srv.addrs[0].port()), PASS, true).await.unwrap();
    assert!(f.encrypted);
    assert_eq!(f.cipher.as_deref(), Some("Aes128Gcm"));
    let err = gather(&url(srv.addrs[0].port()), "wrong", false)
        .await
        .unwrap_err();
    assert!(err.to_string().contains("STATUS_LOGON_FAILURE"), "{err}");
}
