//! The witness against a real etcd (Debian's etcd-server 3.4) on loopback.

use std::sync::Arc;
use std::time::{Duration, Instant};

use lanes_test_support::etcd::Etcd;
use lanes_witness::{ClusterState, EpochRecord, Error, Outcome, Witness, WitnessConfig};

fn witness(etcd: &Etcd, key: &str, node: u8) -> Witness {
    Witness::new(WitnessConfig {
        endpoints: vec![etcd.client],
        key: key.to_string(),
        node,
        timeout: Duration::from_secs(2),
    })
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

#[test]
fn concurrent_claims_on_one_revision_have_exactly_one_winner() {
    let etcd = Etcd::start();
    runtime().block_on(async {
        for round in 0..40 {
            let key = format!("/lanes/race{round}/epoch");
            let one = Arc::new(witness(&etcd, &key, 1));
            let two = Arc::new(witness(&etcd, &key, 2));
            // Both read the same record (the first read creates it), then both claim at once.
            let seen_one = one.read().await.unwrap();
            let seen_two = two.read().await.unwrap();
            assert_eq!(seen_one, seen_two);
            assert_eq!(seen_one.record, EpochRecord::FIRST);
            let (a, b) = tokio::join!(
                {
                    let one = one.clone();
                    async move { one.claim(&seen_one).await.unwrap() }
                },
                {
                    let two = two.clone();
                    async move { two.claim(&seen_two).await.unwrap() }
                }
            );
            let (winner, record) = match (a, b) {
                (Outcome::Won(w), Outcome::Lost(l)) | (Outcome::Lost(l), Outcome::Won(w)) => {
                    assert_eq!(w, l, "the loser sees the winner's record");
                    (w, w.record)
                }
                other => panic!("round {round}: not exactly one winner: {other:?}"),
            };
            assert_eq!(record.epoch, 2);
            assert!(matches!(record.state, ClusterState::Alone { .. }));
            // What etcd holds is the winner's record.
            assert_eq!(one.read().await.unwrap(), winner);
        }
    });
}

#[test]
fn an_outdated_or_stale_node_never_wins_and_only_the_holder_rejoins() {
    let etcd = Etcd::start();
    runtime().block_on(async {
        let one = witness(&etcd, "/lanes/pair/epoch", 1);
        let two = witness(&etcd, "/lanes/pair/epoch", 2);
        let first = one.read().await.unwrap();
        let Outcome::Won(alone) = one.claim(&first).await.unwrap() else {
            panic!("the only claimant lost")
        };
        assert_eq!(alone.record.state, ClusterState::Alone { holder: 1 });
        // Node 2 with the old revision: lost, and it learns it is outdated.
        let Outcome::Lost(seen) = two.claim(&first).await.unwrap() else {
            panic!("a claim on a stale revision won")
        };
        assert_eq!(seen, alone);
        assert_eq!(seen.record.outdated(), Some(2));
        // With the fresh record it is still refused: outdated until the holder rejoins.
        assert!(matches!(two.claim(&seen).await.unwrap(), Outcome::Lost(_)));
        assert!(matches!(two.rejoin(&seen).await.unwrap(), Outcome::Lost(_)));
        // The holder claims again (the peer went away during the resync): same epoch.
        let Outcome::Won(again) = one.claim(&alone).await.unwrap() else {
            panic!("the holder lost its own epoch")
        };
        assert_eq!(again.record, alone.record);
        let Outcome::Won(in_sync) = one.rejoin(&again).await.unwrap() else {
            panic!("the holder could not rejoin")
        };
        assert_eq!(in_sync.record.epoch, 3);
        assert_eq!(in_sync.record.state, ClusterState::InSync);
        // A rejoin on a revision that moved on is lost.
        assert!(matches!(
            one.rejoin(&again).await.unwrap(),
            Outcome::Lost(_)
        ));
        assert_eq!(two.read().await.unwrap(), in_sync);
    });
}

#[test]
fn an_unreachable_witness_is_an_error_within_the_timeout_and_a_restart_keeps_the_record() {
    let mut etcd = Etcd::start();
    runtime().block_on(async {
        let one = witness(&etcd, "/lanes/restart/epoch", 1);
        let first = one.read().await.unwrap();
        let Outcome::Won(alone) = one.claim(&first).await.unwrap() else {
            panic!("the only claimant lost")
        };
        etcd.kill();
        let started = Instant::now();
        let err = one.claim(&alone).await.unwrap_err();
        assert!(matches!(err, Error::Unreachable { .. }), "{err}");
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "{:?}",
            started.elapsed()
        );
        etcd.restart();
        assert_eq!(one.read().await.unwrap(), alone);
    });
}

#[test]
fn a_foreign_value_under_the_key_is_named_not_trusted() {
    let etcd = Etcd::start();
    runtime().block_on(async {
        // Another program's value under the key: put it through the gateway directly.
        let one = witness(&etcd, "/lanes/foreign/epoch", 1);
        let raw = lanes_witness::gateway::put_if_revision("/lanes/foreign/epoch", 0, b"not json");
        let mut stream = tokio::net::TcpStream::connect(etcd.client).await.unwrap();
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        stream
            .write_all(&lanes_witness::http::post(
                &etcd.client.to_string(),
                lanes_witness::gateway::TXN,
                &raw,
            ))
            .await
            .unwrap();
        let mut answer = Vec::new();
        stream.read_to_end(&mut answer).await.unwrap();
        assert!(answer.starts_with(b"HTTP/1.1 200"));
        let err = one.read().await.unwrap_err();
        assert!(
            matches!(&err, Error::Record { key, .. } if key == "/lanes/foreign/epoch"),
            "{err}"
        );
    });
}

#[test]
fn a_silent_endpoint_costs_one_timeout_and_the_next_endpoint_answers() {
    let etcd = Etcd::start();
    // Accepts connections (the kernel's backlog) but never answers: a partitioned etcd.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let config = |endpoints| WitnessConfig {
        endpoints,
        key: "/lanes/silent/epoch".to_string(),
        node: 1,
        timeout: Duration::from_millis(300),
    };
    runtime().block_on(async {
        let alone = Witness::new(config(vec![silent.local_addr().unwrap()]));
        let started = Instant::now();
        let err = alone.read().await.unwrap_err();
        let took = started.elapsed();
        assert!(
            matches!(&err, Error::Unreachable { reason, .. } if reason.contains("no answer")),
            "{err}"
        );
        assert!(
            took >= Duration::from_millis(300) && took < Duration::from_secs(5),
            "{took:?}"
        );
        let both = Witness::new(config(vec![silent.local_addr().unwrap(), etcd.client]));
        assert_eq!(both.read().await.unwrap().record, EpochRecord::FIRST);
    });
}
