//! The witness against a real etcd (Debian's etcd-server 3.4) on loopback.

use std::sync::Arc;
use std::time::{Duration, Instant};

use lanes_test_support::etcd::Etcd;
use lanes_witness::{EpochRecord, Error, RaceOutcome, Witness, WitnessConfig};

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
fn concurrent_races_have_exactly_one_winner_and_the_loser_stays_outdated() {
    let etcd = Etcd::start();
    runtime().block_on(async {
        for round in 0..40 {
            let key = format!("/lanes/race{round}/epoch");
            let nodes = [
                Arc::new(witness(&etcd, &key, 0)),
                Arc::new(witness(&etcd, &key, 1)),
            ];
            let (a, b) = tokio::join!(
                {
                    let w = nodes[0].clone();
                    async move { w.race_inner().await.unwrap() }
                },
                {
                    let w = nodes[1].clone();
                    async move { w.race_inner().await.unwrap() }
                }
            );
            let winner = match (a, b) {
                (RaceOutcome::Won { epoch: 1 }, RaceOutcome::Lost { epoch: 1 }) => 0,
                (RaceOutcome::Lost { epoch: 1 }, RaceOutcome::Won { epoch: 1 }) => 1,
                other => panic!("round {round}: not exactly one winner of epoch 1: {other:?}"),
            };
            let stored = nodes[0].read().await.unwrap().record;
            assert_eq!(
                stored,
                EpochRecord {
                    epoch: 1,
                    holder: Some(winner),
                    outdated: Some(1 - winner),
                }
            );
            // The loser is outdated: racing again never wins.
            assert_eq!(
                nodes[usize::from(1 - winner)].race().await,
                RaceOutcome::Lost { epoch: 1 }
            );
        }
    });
}

#[test]
fn after_a_resync_the_marks_clear_and_a_stale_mark_never_clears_a_newer_race() {
    let etcd = Etcd::start();
    runtime().block_on(async {
        let n0 = witness(&etcd, "/lanes/pair/epoch", 0);
        let n1 = witness(&etcd, "/lanes/pair/epoch", 1);
        assert_eq!(n0.race().await, RaceOutcome::Won { epoch: 1 });
        assert_eq!(n1.race().await, RaceOutcome::Lost { epoch: 1 });
        // The holder resynced its peer in epoch 1 and clears the marks.
        assert!(n0.mark_in_sync(1).await.unwrap());
        assert_eq!(
            n1.read().await.unwrap().record,
            EpochRecord {
                epoch: 1,
                holder: None,
                outdated: None
            }
        );
        // Now node 1 may win a later race (node 0 lost, say).
        assert_eq!(n1.race().await, RaceOutcome::Won { epoch: 2 });
        // A mark for epoch 1 delayed past that race changes nothing.
        assert!(n0.mark_in_sync(1).await.unwrap());
        let now = n0.read().await.unwrap().record;
        assert_eq!(now.outdated, Some(0), "{now:?}");
        assert_eq!(n0.race().await, RaceOutcome::Lost { epoch: 2 });
    });
}

#[test]
fn an_unreachable_witness_is_an_error_within_the_timeout_and_a_restart_keeps_the_record() {
    let mut etcd = Etcd::start();
    runtime().block_on(async {
        let n0 = witness(&etcd, "/lanes/restart/epoch", 0);
        assert_eq!(n0.race().await, RaceOutcome::Won { epoch: 1 });
        let before = n0.read().await.unwrap();
        etcd.kill();
        let started = Instant::now();
        assert_eq!(n0.race().await, RaceOutcome::Unreachable);
        let err = n0.race_inner().await.unwrap_err();
        assert!(matches!(err, Error::Unreachable { .. }), "{err}");
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "{:?}",
            started.elapsed()
        );
        etcd.restart();
        assert_eq!(n0.read().await.unwrap(), before);
    });
}

#[test]
fn a_foreign_value_under_the_key_is_named_not_trusted() {
    let etcd = Etcd::start();
    runtime().block_on(async {
        let n0 = witness(&etcd, "/lanes/foreign/epoch", 0);
        // Another program's value under the key.
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
        let err = n0.read().await.unwrap_err();
        assert!(
            matches!(&err, Error::Record { key, .. } if key == "/lanes/foreign/epoch"),
            "{err}"
        );
        // Racing on it is never a win.
        assert_eq!(n0.race().await, RaceOutcome::Unreachable);
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
        node: 0,
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
        assert_eq!(both.read().await.unwrap().record, EpochRecord::default());
    });
}
