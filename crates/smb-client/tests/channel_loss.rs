//! One of two channels goes silent under a verified write + read-back load, and comes back.
//!
//! The second channel runs through a proxy that can black-hole it: while cut, it takes in
//! what either side sends and passes nothing on (a path that went silent, with requests
//! queued inside it), and turns new connections away. When it heals, it delivers what it held,
//! so the server receives the lost channel's writes late, after newer writes to the same
//! blocks went through the other channel: the ChannelSequence must make the server refuse
//! them. Checked: no request fails, every read returns the last acknowledged version of its
//! block with no torn sector, the file on the server ends with exactly those versions, the
//! longest request stays within the client's detection time plus 2 s, I/O goes on over the
//! surviving channel during the cut, and the client binds the channel again once the path is
//! back, which the server counts.

mod common;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{config, start, PASS};
use lanes_smb_client::{File, OpenOptions, Session};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

const BLOCK: usize = 64 * 1024;
const SECTOR: usize = 512;
const WRITERS: u64 = 8;
const BLOCKS_PER_WRITER: u64 = 8;
const DETECT: Duration = Duration::from_secs(3);

/// Passes bytes one way unless cut; while cut, holds them (and an end of stream) until healed.
async fn pump(mut rd: OwnedReadHalf, mut wr: OwnedWriteHalf, mut cut: watch::Receiver<bool>) {
    let mut held = Vec::new();
    let mut buf = vec![0u8; 64 * 1024];
    let mut eof = false;
    loop {
        if !*cut.borrow_and_update() {
            if !held.is_empty() {
                if wr.write_all(&held).await.is_err() {
                    return;
                }
                held.clear();
            }
            if eof {
                let _ = wr.shutdown().await;
                return;
            }
        }
        if eof {
            if cut.changed().await.is_err() {
                return;
            }
            continue;
        }
        tokio::select! {
            r = rd.read(&mut buf) => match r {
                Ok(0) | Err(_) => eof = true,
                Ok(n) => held.extend_from_slice(&buf[..n]),
            },
            _ = cut.changed() => {}
        }
    }
}

/// A proxy on 127.0.0.2 to `server`; the sender cuts (true) and heals (false) it.
async fn cuttable_proxy(server: SocketAddr) -> (SocketAddr, watch::Sender<bool>) {
    let l = TcpListener::bind("127.0.0.2:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let (tx, rx) = watch::channel(false);
    tokio::spawn(async move {
        loop {
            let Ok((client, _)) = l.accept().await else {
                return;
            };
            if *rx.borrow() {
                drop(client); // cut: nothing gets through, not even a new connection
                continue;
            }
            let Ok(upstream) = TcpStream::connect(server).await else {
                continue;
            };
            let (cr, cw) = client.into_split();
            let (ur, uw) = upstream.into_split();
            tokio::spawn(pump(cr, uw, rx.clone()));
            tokio::spawn(pump(ur, cw, rx.clone()));
        }
    });
    (addr, tx)
}

/// Block `block` at `version`: every sector names both, so a torn or stale block shows.
fn content(block: u64, version: u64) -> Vec<u8> {
    let mut v = vec![0u8; BLOCK];
    for (i, s) in v.chunks_mut(SECTOR).enumerate() {
        s[..8].copy_from_slice(&block.to_le_bytes());
        s[8..16].copy_from_slice(&version.to_le_bytes());
        s[16..24].copy_from_slice(&(i as u64).to_le_bytes());
    }
    v
}

/// The (block, version) every sector of `data` names, or a description of what is wrong.
fn versions_of(data: &[u8], block: u64) -> Result<u64, String> {
    if data.len() != BLOCK {
        return Err(format!("block {block}: {} bytes read", data.len()));
    }
    let mut seen = None;
    for (i, s) in data.chunks(SECTOR).enumerate() {
        let b = u64::from_le_bytes(s[..8].try_into().unwrap());
        let v = u64::from_le_bytes(s[8..16].try_into().unwrap());
        let n = u64::from_le_bytes(s[16..24].try_into().unwrap());
        if b != block || n != i as u64 {
            return Err(format!(
                "block {block} sector {i}: holds block {b} sector {n}"
            ));
        }
        if *seen.get_or_insert(v) != v {
            return Err(format!("block {block}: torn, versions {seen:?} and {v}"));
        }
    }
    seen.ok_or_else(|| "empty".into())
}

#[derive(Default)]
struct Load {
    ops: AtomicU64,
    longest_us: AtomicU64,
    stop: AtomicBool,
}

/// One writer: its own blocks in turn, each written at the next version and then read back.
/// Returns the last acknowledged version of each of its blocks.
async fn writer(f: File, w: u64, load: Arc<Load>) -> Result<HashMap<u64, u64>, String> {
    let mut acked = HashMap::new();
    let mut version = 0u64;
    while !load.stop.load(Ordering::Relaxed) {
        version += 1;
        for k in 0..BLOCKS_PER_WRITER {
            let block = w + k * WRITERS;
            let off = block * BLOCK as u64;
            let t = Instant::now();
            let n = f
                .write_at(off, &content(block, version))
                .await
                .map_err(|e| format!("write of block {block}: {e}"))?;
            if n as usize != BLOCK {
                return Err(format!("block {block}: {n} bytes written"));
            }
            acked.insert(block, version);
            let back = f
                .read_at(off, BLOCK as u32)
                .await
                .map_err(|e| format!("read of block {block}: {e}"))?;
            let v = versions_of(&back, block)?;
            if v != version {
                return Err(format!(
                    "block {block}: read version {v} after {version} was acknowledged"
                ));
            }
            load.longest_us
                .fetch_max(t.elapsed().as_micros() as u64, Ordering::Relaxed);
            load.ops.fetch_add(1, Ordering::Relaxed);
        }
    }
    Ok(acked)
}

/// Waits (polling what the test observes, not for a time) until `cond` holds, at most `limit`.
async fn until(what: &str, limit: Duration, mut cond: impl FnMut() -> bool) {
    let t = Instant::now();
    while !cond() {
        assert!(t.elapsed() < limit, "{what}: not within {limit:?}");
        tokio::task::yield_now().await;
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Through the session and on the server's disk, every block is its last acknowledged version.
async fn check(f: &File, path: &std::path::Path, acked: &HashMap<u64, u64>) {
    let disk = std::fs::read(path).unwrap();
    for (&block, &version) in acked {
        let off = block as usize * BLOCK;
        let back = f.read_at(off as u64, BLOCK as u32).await.unwrap();
        assert_eq!(versions_of(&back, block), Ok(version), "read back");
        assert_eq!(
            versions_of(&disk[off..off + BLOCK], block),
            Ok(version),
            "the server's file: a late write of the lost channel landed"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_channel_loses_nothing_and_comes_back() {
    let srv = start().await;
    let (proxy, cut) = cuttable_proxy(srv.addrs[1]).await;
    let mut cfg = config(PASS);
    cfg.channel_timeout = Some(DETECT);
    let s = Session::connect(srv.addrs[0], cfg).await.unwrap();
    s.bind_channel(proxy).await.unwrap();
    let tree = s.tree_connect("127.0.0.1", "share").await.unwrap();
    let f = tree
        .open("loss.bin", OpenOptions::READ_WRITE)
        .await
        .unwrap();

    let load = Arc::new(Load::default());
    let mut tasks = tokio::task::JoinSet::new();
    for w in 0..WRITERS {
        tasks.spawn(writer(f.clone(), w, load.clone()));
    }
    let ops = |n: u64| {
        let load = load.clone();
        move || load.ops.load(Ordering::Relaxed) >= n
    };
    until("load under way", Duration::from_secs(30), ops(200)).await;
    let via_proxy = |s: &Session| {
        s.channels()
            .iter()
            .find(|c| c.server == proxy)
            .map(|c| c.requests)
    };
    assert!(
        via_proxy(&s).unwrap() > 0,
        "the second channel carries requests"
    );

    cut.send(true).unwrap();
    let cut_at = Instant::now();
    until(
        "the silent channel given up",
        Duration::from_secs(20),
        || s.failovers().0 >= 1 && via_proxy(&s).is_none(),
    )
    .await;
    let lost_after = cut_at.elapsed();
    let at_loss = load.ops.load(Ordering::Relaxed);
    until(
        "I/O on the surviving channel during the cut",
        Duration::from_secs(20),
        ops(at_loss + 300),
    )
    .await;
    assert_eq!(
        via_proxy(&s),
        None,
        "the lost channel is out of the session"
    );

    // Stop the load while the path is still cut, so that no newer write covers a late one.
    load.stop.store(true, Ordering::Relaxed);
    let mut acked = HashMap::new();
    while let Some(r) = tasks.join_next().await {
        acked.extend(r.unwrap().unwrap_or_else(|e| panic!("{e}")));
    }
    assert_eq!(acked.len() as u64, WRITERS * BLOCKS_PER_WRITER);

    // Healed: the lost channel's late frames reach the server, whose end of that connection
    // closes after them. None of its writes may land.
    cut.send(false).unwrap();
    until(
        "the server done with the old connection",
        Duration::from_secs(30),
        || srv.server.server.status().counters.channels_lost >= 1,
    )
    .await;
    check(&f, &srv.share.join("loss.bin"), &acked).await;

    // The client binds the channel again and uses it.
    until("the channel bound again", Duration::from_secs(30), || {
        s.failovers().1 >= 1 && via_proxy(&s).is_some()
    })
    .await;
    let before = via_proxy(&s).unwrap_or(0);
    load.stop.store(false, Ordering::Relaxed);
    let done = load.ops.load(Ordering::Relaxed);
    for w in 0..WRITERS {
        tasks.spawn(writer(f.clone(), w, load.clone()));
    }
    until(
        "more I/O after the return",
        Duration::from_secs(30),
        ops(done + 200),
    )
    .await;
    load.stop.store(true, Ordering::Relaxed);
    while let Some(r) = tasks.join_next().await {
        acked.extend(r.unwrap().unwrap_or_else(|e| panic!("{e}")));
    }
    assert!(
        via_proxy(&s).unwrap_or(0) > before,
        "the channel bound again carries requests: {:?}",
        s.channels()
    );
    check(&f, &srv.share.join("loss.bin"), &acked).await;

    let longest = Duration::from_micros(load.longest_us.load(Ordering::Relaxed));
    eprintln!(
        "channel loss: given up {} ms after the cut (timeout {} ms), longest write+read {} ms, \
         {} ops",
        lost_after.as_millis(),
        DETECT.as_millis(),
        longest.as_millis(),
        load.ops.load(Ordering::Relaxed)
    );
    assert!(
        longest <= lost_after + Duration::from_secs(2),
        "longest write+read {longest:?}: more than the detection ({lost_after:?}) plus 2 s"
    );
    let status = srv.server.server.status();
    let session = &status.sessions[0];
    assert!(
        session.binds >= 2,
        "the first bind and the bind after the loss: {}",
        session.binds
    );
    assert_eq!(s.channels().len(), 2, "{:?}", s.channels());
    f.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_channel_that_goes_silent_is_found_by_its_echo() {
    let srv = start().await;
    let (proxy, cut) = cuttable_proxy(srv.addrs[1]).await;
    let mut cfg = config(PASS);
    cfg.channel_timeout = Some(Duration::from_secs(2));
    let s = Session::connect(srv.addrs[0], cfg).await.unwrap();
    s.bind_channel(proxy).await.unwrap();
    // Idle, the channel is kept alive by its ECHOs: it is not given up.
    let echoes = |s: &Session| {
        s.channels()
            .iter()
            .find(|c| c.server == proxy)
            .map_or(0, |c| c.requests)
    };
    let first = echoes(&s);
    until("ECHOs on an idle channel", Duration::from_secs(20), || {
        echoes(&s) >= first + 4
    })
    .await;
    assert_eq!(s.failovers(), (0, 0), "a quiet channel that answers stays");
    // Silent: its ECHO goes unanswered, and it is given up with no request of ours waiting.
    cut.send(true).unwrap();
    until(
        "the silent idle channel given up",
        Duration::from_secs(20),
        || s.channels().iter().all(|c| c.server != proxy),
    )
    .await;
    assert!(s.failovers().0 >= 1);
    cut.send(false).unwrap();
    until("the channel bound again", Duration::from_secs(30), || {
        s.channels().iter().any(|c| c.server == proxy)
    })
    .await;
    assert!(s.failovers().1 >= 1);
    assert_eq!(s.channels().len(), 2);
}
