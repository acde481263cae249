//! The client against lanes' own SMB server on loopback: data over two channels, signing and
//! encryption, logon failures, refused bindings and the interface list.

mod common;

use std::time::Duration;

use common::{config, pattern, sha256, start, PASS};
use lanes_smb_client::{File, OpenOptions, Session, SmbError};
use smb_proto::msg::ioctl::NETWORK_INTERFACE_CAP_RSS;
use smb_proto::NtStatus;

const MIB: usize = 1024 * 1024;

/// Writes `data` in 1 MiB pieces, all in flight at once, then reads it back the same way.
async fn round_trip(file: &File, data: &[u8]) -> Vec<u8> {
    let mut tasks = tokio::task::JoinSet::new();
    for (i, chunk) in data.chunks(MIB).enumerate() {
        let (f, c) = (file.clone(), chunk.to_vec());
        tasks.spawn(async move {
            let n = f.write_at((i * MIB) as u64, &c).await.unwrap();
            assert_eq!(n as usize, c.len());
        });
    }
    while let Some(r) = tasks.join_next().await {
        r.unwrap();
    }
    file.flush().await.unwrap();
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..data.len().div_ceil(MIB) {
        let f = file.clone();
        tasks.spawn(async move { (i, f.read_at((i * MIB) as u64, MIB as u32).await.unwrap()) });
    }
    let mut back = vec![0u8; data.len()];
    while let Some(r) = tasks.join_next().await {
        let (i, bytes) = r.unwrap();
        back[i * MIB..i * MIB + bytes.len()].copy_from_slice(&bytes);
    }
    back
}

async fn two_channel_round_trip(encrypt: bool, size: usize) {
    let srv = start().await;
    let mut cfg = config(PASS);
    cfg.encrypt = encrypt;
    let s = Session::connect(srv.addrs[0], cfg).await.unwrap();
    assert_eq!(s.encrypted(), encrypt);
    s.bind_channel(srv.addrs[1]).await.unwrap();
    assert_eq!(s.channels().len(), 2);
    let tree = s.tree_connect("127.0.0.1", "share").await.unwrap();
    let f = tree
        .open("data.bin", OpenOptions::READ_WRITE)
        .await
        .unwrap();
    let data = pattern(size, 0x5eed);
    let back = round_trip(&f, &data).await;
    assert_eq!(sha256(&back), sha256(&data), "read back what was written");
    assert_eq!(
        sha256(&std::fs::read(srv.share.join("data.bin")).unwrap()),
        sha256(&data),
        "the file on the server holds it"
    );
    // Past the end: nothing.
    assert!(f.read_at(size as u64, 4096).await.unwrap().is_empty());
    f.close().await.unwrap();
    let chans = s.channels();
    let total_w: u64 = chans.iter().map(|c| c.bytes_written).sum();
    let total_r: u64 = chans.iter().map(|c| c.bytes_read).sum();
    assert_eq!((total_w, total_r), (size as u64, size as u64));
    for c in &chans {
        assert!(
            c.bytes_written > 0 && c.bytes_read > 0,
            "both channels carry data: {chans:?}"
        );
    }
    assert_eq!(chans[0].server.ip().to_string(), "127.0.0.1");
    assert_eq!(chans[1].server.ip().to_string(), "127.0.0.2");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eight_mib_over_two_signed_channels_reads_back_the_same() {
    two_channel_round_trip(false, 8 * MIB).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn encrypted_channels_read_back_the_same() {
    two_channel_round_trip(true, 4 * MIB).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_password_is_a_logon_failure() {
    let srv = start().await;
    let r = tokio::time::timeout(
        Duration::from_secs(20),
        Session::connect(srv.addrs[0], config("not the password")),
    )
    .await
    .expect("answered, not hanging");
    let err = r.err().expect("refused");
    assert_eq!(err.status(), Some(NtStatus::LOGON_FAILURE), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn binding_with_a_wrong_password_is_refused_and_the_session_lives_on() {
    let srv = start().await;
    let s = Session::connect(srv.addrs[0], config(PASS)).await.unwrap();
    let err = tokio::time::timeout(
        Duration::from_secs(20),
        s.bind_channel_as(srv.addrs[1], &config("wrong")),
    )
    .await
    .expect("answered, not hanging")
    .expect_err("a bind with a wrong password must fail");
    assert!(
        matches!(err, SmbError::Status { status, .. } if status == NtStatus::LOGON_FAILURE),
        "{err}"
    );
    assert_eq!(s.channels().len(), 1);
    let tree = s.tree_connect("127.0.0.1", "share").await.unwrap();
    let f = tree.open("x", OpenOptions::READ_WRITE).await.unwrap();
    f.write_at(0, b"still here").await.unwrap();
    assert_eq!(&f.read_at(0, 64).await.unwrap()[..], b"still here");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_interface_list_holds_the_servers_addresses() {
    let srv = start().await;
    let s = Session::connect(srv.addrs[0], config(PASS)).await.unwrap();
    let tree = s.tree_connect("127.0.0.1", "share").await.unwrap();
    let list = tree.network_interfaces().await.unwrap();
    let mut addrs: Vec<String> = list.iter().map(|n| n.address.to_string()).collect();
    addrs.sort();
    assert_eq!(addrs, ["127.0.0.1", "127.0.0.2"]);
    for n in &list {
        assert_eq!(n.link_speed, common::LINK_SPEED);
        assert_ne!(n.capability & NETWORK_INTERFACE_CAP_RSS, 0);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_share_and_a_missing_file_are_errors() {
    let srv = start().await;
    let s = Session::connect(srv.addrs[0], config(PASS)).await.unwrap();
    let err = s.tree_connect("127.0.0.1", "nope").await.err().unwrap();
    assert_eq!(err.status(), Some(NtStatus::BAD_NETWORK_NAME), "{err}");
    let tree = s.tree_connect("127.0.0.1", "share").await.unwrap();
    let err = tree.open("absent", OpenOptions::READ).await.err().unwrap();
    assert_eq!(err.status(), Some(NtStatus::OBJECT_NAME_NOT_FOUND), "{err}");
}
