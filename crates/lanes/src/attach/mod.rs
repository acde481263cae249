//! `lanes attach`: one multipath device over every portal of a target, exported as NBD and/or
//! a FUSE file, until SIGINT/SIGTERM; then it drains, flushes and logs out of every path.
//!
//! Portals come from SendTargets on the URL's portal plus every `--portal`; paths whose LUN
//! identifier differs are refused (lanes-initiator's `Multipath::attach` checks VPD 0x83).

mod args;
mod device;
mod lock;
mod status;

use anyhow::{bail, Context as _};
use lanes_initiator::multipath::{MultipathConfig, PortalConfig};
use lanes_initiator::{ChapSecret, IscsiUrl, LoginOptions, Multipath};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tracing::{info, warn};

pub use args::AttachArgs;
use device::MultipathDevice;

/// Every portal of the target: SendTargets from the URL's portal, then the extra ones.
async fn portals(
    url: &IscsiUrl,
    args: &AttachArgs,
    options: &LoginOptions,
) -> anyhow::Result<Vec<PortalConfig>> {
    let first = lanes_initiator::resolve(&url.portal())
        .await
        .with_context(|| format!("resolving {}", url.portal()))?;
    let mut found: Vec<(SocketAddr, u16)> = Vec::new();
    match lanes_initiator::discover(first, options).await {
        Ok(targets) => match targets.into_iter().find(|(name, _)| *name == url.target) {
            Some((_, addrs)) => found.extend(addrs),
            None => bail!(
                "the target at {first} does not offer {} (SendTargets)",
                url.target
            ),
        },
        Err(e) if args.portals.is_empty() => {
            bail!(
                "discovery on {first} failed: {}",
                lanes_initiator::chain(&e)
            )
        }
        Err(e) => warn!(
            "discovery on {first} failed ({}); using the given portals only",
            lanes_initiator::chain(&e)
        ),
    }
    if !found.iter().any(|(a, _)| *a == first) {
        // The portal we were given answers even when SendTargets lists it under another address.
        let tag = found.first().map_or(1, |p| p.1);
        found.insert(0, (first, tag));
    }
    for extra in &args.portals {
        let addr = lanes_initiator::resolve(&with_default_port(extra))
            .await
            .with_context(|| format!("resolving --portal {extra}"))?;
        if !found.iter().any(|(a, _)| *a == addr) {
            let tag = found.first().map_or(1, |p| p.1);
            found.push((addr, tag));
        }
    }
    for b in &args.binds {
        if !found.iter().any(|(a, _)| *a == b.portal) {
            bail!(
                "--bind names {}, which is not a portal of {} (its portals: {})",
                b.portal,
                url.target,
                found
                    .iter()
                    .map(|(a, _)| a.to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            );
        }
    }
    Ok(found
        .into_iter()
        .map(|(addr, tpgt)| PortalConfig {
            addr,
            tpgt,
            weight: args.weight_of(addr),
            priority: args.priority_of(addr),
            interface: args.interface_of(addr),
        })
        .collect())
}

fn with_default_port(portal: &str) -> String {
    if portal.parse::<SocketAddr>().is_ok()
        || portal
            .rsplit_once(':')
            .is_some_and(|(h, _)| !h.ends_with(']') && !h.contains(':'))
    {
        portal.to_string()
    } else {
        format!("{portal}:3260")
    }
}

fn login_options(url: &IscsiUrl, args: &AttachArgs) -> anyhow::Result<LoginOptions> {
    let mut options = LoginOptions::new(args.initiator_name());
    options.lun = url.lun;
    options.chap = match (&args.chap_user, &args.chap_secret_file, &url.chap) {
        (Some(user), Some(file), _) => {
            let secret = std::fs::read(file)
                .with_context(|| format!("reading the CHAP secret from {}", file.display()))?;
            let secret = trim_newline(secret);
            if secret.is_empty() {
                bail!("the CHAP secret file {} is empty", file.display());
            }
            Some(ChapSecret {
                user: user.clone(),
                secret,
            })
        }
        (Some(_), None, _) | (None, Some(_), _) => {
            bail!("--chap-user and --chap-secret-file go together")
        }
        (None, None, Some((user, secret))) => Some(ChapSecret {
            user: user.clone(),
            secret: secret.as_bytes().to_vec(),
        }),
        (None, None, None) => None,
    };
    Ok(options)
}

fn trim_newline(mut s: Vec<u8>) -> Vec<u8> {
    while s.last().is_some_and(|b| *b == b'\n' || *b == b'\r') {
        s.pop();
    }
    s
}

pub async fn run(args: AttachArgs) -> anyhow::Result<()> {
    let url: IscsiUrl = args.url.parse()?;
    let options = login_options(&url, &args)?;
    let portals = portals(&url, &args, &options).await?;
    let mut config = MultipathConfig::new(url.target.clone(), portals, options);
    config.policy = args.policy.clone();
    config.health.ping_interval = args.ping_interval.0;
    config.health.failback = args.failback;
    config.no_path_timeout = args.no_path_timeout.0;
    config.split_threshold = args.split_threshold;
    config.mcs = args.mcs;
    let mp = Arc::new(Multipath::attach(config).await?);
    // One attach per LUN per host: two would each think they own the device's caches.
    let _lock = match lock::AttachLock::take(mp.lun_id()) {
        Ok(lock) => lock,
        Err(e) => {
            let _ = mp.detach(Duration::from_secs(1)).await;
            return Err(e);
        }
    };
    for r in mp.refused() {
        warn!(portal = %r.portal, "path refused: {}", r.reason);
    }
    // One aligned view for every export: NBD and FUSE clients writing the same blocks share its
    // range lock, so their read-modify-writes cannot tear each other's blocks.
    let dev = Arc::new(lanes_export::aligned::AlignedIo::new(Arc::new(
        MultipathDevice::new(mp.clone()),
    ))?);
    let (shutdown_tx, shutdown_rx) = tokio::sync::watch::channel(false);
    let mut tasks = tokio::task::JoinSet::new();
    let socket = args.status_socket_path(mp.lun_id());
    let status = status::StatusServer::bind(&socket, args.metrics)
        .await
        .with_context(|| format!("binding the status socket {}", socket.display()))?;
    if let Some(addr) = status.metrics_addr() {
        println!("metrics: http://{addr}/metrics");
    }
    {
        let (mp, rx) = (mp.clone(), shutdown_rx.clone());
        tasks.spawn(async move { status.serve(mp, rx).await });
    }
    if let Some(listen) = &args.nbd {
        let server = lanes_export::NbdServer::bind(listen, "lanes")
            .await
            .with_context(|| format!("binding the NBD export {listen}"))?;
        info!(nbd = %server.local_addr(), "NBD export ready");
        println!("nbd: {}", server.local_addr());
        let (dev, mut rx) = (dev.clone(), shutdown_rx.clone());
        tasks.spawn(async move {
            let stop = async move {
                let _ = rx.wait_for(|s| *s).await;
            };
            if let Err(e) = server.serve_aligned(dev, stop).await {
                warn!("NBD export ended: {e}");
            }
        });
    }
    let fuse = match &args.fuse {
        Some(dir) => {
            let export = lanes_export::FuseExport::mount_aligned(
                dev.clone(),
                dir,
                tokio::runtime::Handle::current(),
                lanes_export::FuseOptions::default(),
            )
            .with_context(|| format!("mounting the FUSE export on {}", dir.display()))?;
            println!("fuse: {}/disk", dir.display());
            Some(export)
        }
        None => None,
    };
    // Before READY=1: a stop right after it must find the handlers in place.
    let stop = crate::notify::stop_signal()?;
    let st = mp.status();
    println!(
        "attached {} ({} bytes, {}-byte blocks) over {} path(s), policy {}; status: {}",
        st.lun_id,
        st.size,
        st.block_size,
        st.paths.len(),
        st.policy,
        socket.display()
    );
    crate::notify::notify_or_log(&format!(
        "READY=1\nSTATUS=attached {} over {} path(s)\nMAINPID={}",
        st.lun_id,
        st.paths.len(),
        std::process::id()
    ));
    stop.await;
    crate::notify::notify_or_log("STOPPING=1\nSTATUS=draining, flushing, logging out");
    info!("stopping: draining I/O, flushing, logging out");
    if let Some(export) = fuse {
        let unmounted = tokio::task::spawn_blocking(move || export.unmount()).await;
        if let Ok(Err(e)) = unmounted {
            warn!("FUSE unmount: {e}");
        }
    }
    let _ = shutdown_tx.send(true);
    while tasks.join_next().await.is_some() {}
    mp.detach(Duration::from_secs(30)).await?;
    let _ = std::fs::remove_file(&socket);
    Ok(())
}
