//! A TCP relay between the initiator and one portal that can turn into a black hole: while
//! black-holed it forwards nothing in either direction and sends no reset (packets vanish),
//! but keeps what the initiator sent. `restore` delivers those held bytes to the target late,
//! as a healed network would: if the target still executed them, a stale write would land.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::OwnedWriteHalf;
use tokio::net::{TcpListener, TcpStream};

struct Link {
    to_target: tokio::sync::Mutex<OwnedWriteHalf>,
    held: Mutex<Vec<u8>>,
}

pub struct Proxy {
    pub addr: SocketAddr,
    black: Arc<AtomicBool>,
    /// Extra one-way delay in ms applied to what the initiator sends (a slow path).
    delay_ms: Arc<std::sync::atomic::AtomicU64>,
    links: Arc<Mutex<Vec<Arc<Link>>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Proxy {
    /// Listens on `bind` (port 0) and relays every connection to `target`.
    pub async fn start(bind: &str, target: SocketAddr) -> Proxy {
        let listener = TcpListener::bind(bind).await.expect("proxy bind");
        let addr = listener.local_addr().expect("proxy addr");
        let black = Arc::new(AtomicBool::new(false));
        let links: Arc<Mutex<Vec<Arc<Link>>>> = Arc::default();
        let delay_ms = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let (b, l, d) = (black.clone(), links.clone(), delay_ms.clone());
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                if b.load(Ordering::SeqCst) {
                    // A black hole does not answer a SYN either: let the connect time out.
                    std::mem::forget(client);
                    continue;
                }
                let Ok(server) = TcpStream::connect(target).await else {
                    continue;
                };
                let _ = client.set_nodelay(true);
                let _ = server.set_nodelay(true);
                let (mut cr, mut cw) = client.into_split();
                let (mut sr, sw) = server.into_split();
                let link = Arc::new(Link {
                    to_target: tokio::sync::Mutex::new(sw),
                    held: Mutex::new(Vec::new()),
                });
                l.lock().unwrap().push(link.clone());
                let black_up = b.clone();
                let delay_up = d.clone();
                tokio::spawn(async move {
                    let mut buf = vec![0u8; 256 << 10];
                    loop {
                        let n = match cr.read(&mut buf).await {
                            Ok(0) | Err(_) => break,
                            Ok(n) => n,
                        };
                        if black_up.load(Ordering::SeqCst) {
                            link.held.lock().unwrap().extend_from_slice(&buf[..n]);
                            continue;
                        }
                        let delay = delay_up.load(Ordering::SeqCst);
                        if delay > 0 {
                            // The emulated slow link itself, not a test waiting for something.
                            tokio::time::sleep(std::time::Duration::from_millis(delay)).await;
                        }
                        let mut w = link.to_target.lock().await;
                        let held = std::mem::take(&mut *link.held.lock().unwrap());
                        if w.write_all(&held).await.is_err()
                            || w.write_all(&buf[..n]).await.is_err()
                        {
                            break;
                        }
                    }
                    if !black_up.load(Ordering::SeqCst) {
                        let _ = link.to_target.lock().await.shutdown().await;
                    }
                });
                let black_down = b.clone();
                tokio::spawn(async move {
                    let mut buf = vec![0u8; 256 << 10];
                    loop {
                        let n = match sr.read(&mut buf).await {
                            Ok(0) | Err(_) => break,
                            Ok(n) => n,
                        };
                        if black_down.load(Ordering::SeqCst) {
                            continue;
                        }
                        if cw.write_all(&buf[..n]).await.is_err() {
                            break;
                        }
                    }
                    if !black_down.load(Ordering::SeqCst) {
                        let _ = cw.shutdown().await;
                    } else {
                        std::mem::forget(cw);
                    }
                });
            }
        });
        Proxy {
            addr,
            delay_ms,
            black,
            links,
            task,
        }
    }

    /// Delays everything the initiator sends by `ms` from now on (0: no delay).
    pub fn slow(&self, ms: u64) {
        self.delay_ms.store(ms, Ordering::SeqCst);
    }

    pub fn blackhole(&self) {
        self.black.store(true, Ordering::SeqCst);
    }

    /// Ends the black hole and delivers what was held to the target; returns how many bytes
    /// reached a target connection that was still open.
    pub async fn restore(&self) -> usize {
        self.black.store(false, Ordering::SeqCst);
        let links: Vec<Arc<Link>> = self.links.lock().unwrap().clone();
        let mut delivered = 0;
        for link in links {
            let held = std::mem::take(&mut *link.held.lock().unwrap());
            if held.is_empty() {
                continue;
            }
            let mut w = link.to_target.lock().await;
            if w.write_all(&held).await.is_ok() && w.flush().await.is_ok() {
                delivered += held.len();
            }
        }
        delivered
    }
}
