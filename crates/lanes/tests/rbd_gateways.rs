//! Two `lanes serve` gateways over one RBD image on a real Ceph cluster (Debian's packages,
//! started by the test on a loopback address of its own): the same LUN identity on both, a
//! write through one gateway read back through the other at once, both ways. Root only.

use bytes::Bytes;
use lanes_initiator::{LoginOptions, Session};
use lanes_test_support::ceph::Cluster;
use lanes_test_support::serve::ServeChild;

/// Gateway NAME (its data in DIR/NAME) over image SPEC of the cluster.
fn gateway(cluster: &Cluster, dir: &std::path::Path, name: &str, spec: &str) -> ServeChild {
    cluster.gateway(
        env!("CARGO_BIN_EXE_lanes"),
        "iqn.2026-11.io.lanes:ceph",
        spec,
        &dir.join(name),
    )
}

/// A scenario's name and body.
type Scenario = (&'static str, fn(&Cluster));

/// The scenarios below, one after another on one cluster (each with an image and gateways of
/// its own): a cluster takes about 20 s to start.
#[test]
fn gateways_over_one_cluster() {
    let cluster = Cluster::start(2);
    let scenarios: [Scenario; 7] = [
        (
            "every_gateway_reports_every_gateways_port_group_state",
            every_gateway_reports_every_gateways_port_group_state,
        ),
        (
            "a_gateway_restarted_after_kill_fences_its_predecessor_as_it_starts",
            a_gateway_restarted_after_kill_fences_its_predecessor_as_it_starts,
        ),
        (
            "a_reset_elsewhere_waits_for_commands_here_without_fencing_them",
            a_reset_elsewhere_waits_for_commands_here_without_fencing_them,
        ),
        (
            "two_gateways_over_one_image_see_one_lun",
            two_gateways_over_one_image_see_one_lun,
        ),
        (
            "a_resized_image_grows_on_every_gateway",
            a_resized_image_grows_on_every_gateway,
        ),
        (
            "a_blocklisted_gateway_sends_its_hosts_to_other_paths_then_reconnects",
            a_blocklisted_gateway_sends_its_hosts_to_other_paths_then_reconnects,
        ),
        (
            "a_write_held_in_a_paused_gateway_never_lands_after_a_reset_elsewhere",
            a_write_held_in_a_paused_gateway_never_lands_after_a_reset_elsewhere,
        ),
    ];
    for (name, scenario) in scenarios {
        eprintln!("rbd_gateways: {name}");
        scenario(&cluster);
    }
}

/// A LOGICAL UNIT RESET through B while host 1 keeps 16 writes in flight through A: A's
/// commands under way end before A acknowledges the reset's notice (they complete on
/// librados' threads, which the notice must not hold), so B never fences A, and host 1's
/// writes all succeed (after the reset's unit attention).
fn a_reset_elsewhere_waits_for_commands_here_without_fencing_them(cluster: &Cluster) {
    cluster.image("busy", "64M");
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (
        gateway(cluster, dir.path(), "a", "rbd/busy"),
        gateway(cluster, dir.path(), "b", "rbd/busy"),
    );
    let blocklist_before = cluster.ceph(&["osd", "blocklist", "ls"]);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let refused = rt.block_on(async {
        let sa = std::sync::Arc::new(login(&a, "iqn.2026-11.test:host-1").await);
        let sb = login(&b, "iqn.2026-11.test:host-2").await;
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let writers: Vec<_> = (0..16u32)
            .map(|w| {
                let (sa, stop) = (sa.clone(), stop.clone());
                tokio::spawn(async move {
                    let mut refused = Vec::new();
                    let mut n = 0u32;
                    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                        match write10(&sa, w * 64 + n % 64, w as u8).await {
                            (0, _) | (2, Some((6, _, _))) => {}
                            other => refused.push(other),
                        }
                        n += 1;
                    }
                    (n, refused)
                })
            })
            .collect();
        for _ in 0..5 {
            sb.lun_reset().await.expect("LOGICAL UNIT RESET through B");
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let mut refused = Vec::new();
        let mut writes = 0;
        for w in writers {
            let (n, r) = w.await.unwrap();
            writes += n;
            refused.extend(r);
        }
        assert!(writes > 16, "the writes ran ({writes})");
        refused
    });
    assert!(refused.is_empty(), "host 1's writes through A: {refused:?}");
    assert_eq!(
        cluster.ceph(&["osd", "blocklist", "ls"]),
        blocklist_before,
        "nobody fenced"
    );
}

async fn login(g: &ServeChild, host: &str) -> Session {
    let s = Session::login(g.portal, &g.target, &LoginOptions::new(host))
        .await
        .expect("login");
    let _ = s.test_unit_ready().await;
    s
}

fn two_gateways_over_one_image_see_one_lun(cluster: &Cluster) {
    cluster.image("gw", "64M");
    let dir = tempfile::tempdir().unwrap();
    let a = gateway(cluster, dir.path(), "a", "rbd/gw");
    let b = gateway(cluster, dir.path(), "b", "rbd/gw");
    assert_eq!(a.wwids, b.wwids, "one LUN identity on every gateway");
    assert!(a.banner.contains("rbd:rbd/gw"), "{}", a.banner);

    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let sa = login(&a, "iqn.2026-11.test:host-a").await;
        let sb = login(&b, "iqn.2026-11.test:host-b").await;
        assert_eq!(sa.read_capacity16().await.unwrap(), (64 << 20 >> 9, 512));
        let id_a = sa.device_identity().await.unwrap().lun;
        let id_b = sb.device_identity().await.unwrap().lun;
        assert!(id_a.is_some());
        assert_eq!(id_a, id_b);

        let data: Vec<u8> = (0..65536u32).map(|i| (i % 251) as u8).collect();
        sa.write_fua(2048, Bytes::from(data.clone()), true)
            .await
            .unwrap();
        assert_eq!(sb.read(2048, 128).await.unwrap(), Bytes::from(data.clone()));
        // And the other way, without FUA: no cache on either gateway.
        sb.write_fua(2048, Bytes::from(vec![0x5A; 4096]), false)
            .await
            .unwrap();
        let back = sa.read(2048, 128).await.unwrap();
        assert!(back[..4096].iter().all(|x| *x == 0x5A));
        assert_eq!(&back[4096..], &data[4096..]);
        // A READ longer than a piece, alone on the LU, is read in pieces and sent as they
        // come: the host gets the same bytes, in order, whole or with a short last piece.
        let big: Vec<u8> = (0..(2051 * 512u32)).map(|i| (i % 253) as u8).collect();
        sa.write_fua(8192, Bytes::from(big.clone()), true)
            .await
            .unwrap();
        for blocks in [2048u32, 2051] {
            let back = sb.read(8192, blocks).await.unwrap();
            assert!(
                back[..] == big[..blocks as usize * 512],
                "{blocks} blocks read back differ"
            );
        }
        // UNMAP through one gateway reads back zeros through the other.
        sa.unmap(2048, 8).await.unwrap();
        assert!(sb.read(2048, 8).await.unwrap().iter().all(|x| *x == 0));

        // COMPARE AND WRITE from both gateways at once, as VMware ATS heartbeats race: exactly
        // one GOOD and one MISCOMPARE every round, and the block holds the winner's data.
        let lba = 4096u64;
        let mut current = vec![0x40u8; 512];
        sa.write_fua(lba, Bytes::from(current.clone()), true)
            .await
            .unwrap();
        for round in 0..20u8 {
            let mine = |who: u8| vec![(round * 2 + who) | 0x80; 512];
            let (na, nb) = (mine(0), mine(1));
            let (ra, rb) = tokio::join!(caw(&sa, lba, &current, &na), caw(&sb, lba, &current, &nb));
            let now = sb.read(lba, 1).await.unwrap().to_vec();
            match (ra, rb) {
                (Ok(()), Err(_)) => assert_eq!(now, na, "round {round}"),
                (Err(_), Ok(())) => assert_eq!(now, nb, "round {round}"),
                other => panic!("round {round}: not exactly one winner: {other:?}"),
            }
            current = now;
        }
    });
}

/// `rbd resize` outside lanes: every gateway picks the new size up by itself and tells its
/// hosts (CAPACITY DATA HAS CHANGED), then READ CAPACITY gives the new size everywhere, and
/// the blocks past the old end are written through one gateway and read through the other.
fn a_resized_image_grows_on_every_gateway(cluster: &Cluster) {
    cluster.image("grow", "64M");
    let dir = tempfile::tempdir().unwrap();
    let g = |name| gateway(cluster, dir.path(), name, "rbd/grow");
    let (a, b) = (g("a"), g("b"));
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let sa = login(&a, "iqn.2026-11.test:host-a").await;
        let sb = login(&b, "iqn.2026-11.test:host-b").await;
        assert_eq!(sa.read_capacity16().await.unwrap(), (64 << 20 >> 9, 512));
        cluster.rbd(&["resize", "rbd/grow", "--size", "96M"]);
        for s in [&sa, &sb] {
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
            loop {
                let out = s
                    .execute([0u8; 16], 0, None)
                    .await
                    .expect("TEST UNIT READY");
                match (out.status, out.sense_triplet()) {
                    (2, Some((6, 0x2a, 0x09))) => break,
                    (0, _) => {}
                    other => panic!("TEST UNIT READY answered {other:?}"),
                }
                assert!(
                    std::time::Instant::now() < deadline,
                    "no CAPACITY DATA HAS CHANGED within 30 s of rbd resize"
                );
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            }
            assert_eq!(s.read_capacity16().await.unwrap(), (96 << 20 >> 9, 512));
        }
        let lba = (80 << 20) >> 9;
        let data: Vec<u8> = (0..8192u32).map(|i| (i % 241) as u8).collect();
        sa.write_fua(lba, Bytes::from(data.clone()), true)
            .await
            .unwrap();
        assert_eq!(sb.read(lba, 16).await.unwrap(), Bytes::from(data));
    });
}

/// The cluster fences a gateway (`ceph osd blocklist add` of its client, as a surviving
/// gateway or an admin does): that gateway answers every I/O, and then TEST UNIT READY, with
/// NOT READY, TARGET PORT IN UNAVAILABLE STATE (02/04/0C), which multipath hosts take as "use
/// another path" (not a medium error an application would see), and nothing it is sent lands;
/// the other gateway serves on.
fn a_blocklisted_gateway_sends_its_hosts_to_other_paths_then_reconnects(cluster: &Cluster) {
    cluster.image("fence", "64M");
    let dir = tempfile::tempdir().unwrap();
    let g = |name| gateway(cluster, dir.path(), name, "rbd/fence");
    let a = g("a");
    // A's client (one per gateway and image): the only watcher of the reservation object yet.
    let object = "lanes.pr.fence"; // lanes_rbd::pr_object_name("fence")
    let watchers = cluster.rados(&["-p", "rbd", "listwatchers", object]);
    let addrs: Vec<&str> = watchers
        .split_whitespace()
        .filter_map(|w| w.strip_prefix("watcher="))
        .collect();
    assert_eq!(addrs.len(), 1, "{watchers}");
    let a_client = addrs[0].to_string();
    let b = g("b");
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let sa = login(&a, "iqn.2026-11.test:host-a").await;
        let sb = login(&b, "iqn.2026-11.test:host-b").await;
        let lba = 1000u32;
        assert_eq!(write10(&sa, lba, 0x11).await, (0, None), "before the fence");
        cluster.ceph(&["osd", "blocklist", "add", &a_client]);
        // The gateway learns of it with its next I/O (from the OSD map): until then a write
        // may still go through.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        loop {
            match write10(&sa, lba, 0x22).await {
                // GOOD until it learns; ASYMMETRIC ACCESS STATE CHANGED once its port group
                // went unavailable (the command is not run, a host retries it).
                (0, _) | (2, Some((6, 0x2a, 0x06))) => {}
                (2, Some((2, 0x04, 0x0c))) => break,
                other => panic!("a fenced gateway answered {other:?}"),
            }
            assert!(std::time::Instant::now() < deadline, "never fenced");
        }
        // From then on nothing it is sent lands, and its path looks unavailable.
        // (The port group may go unavailable between: that unit attention comes first, once.)
        let mut refused = write10(&sa, lba, 0x33).await;
        if refused == (2, Some((6, 0x2a, 0x06))) {
            refused = write10(&sa, lba, 0x33).await;
        }
        assert_eq!(refused, (2, Some((2, 0x04, 0x0c))));
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        loop {
            let out = sa
                .execute([0u8; 16], 0, None)
                .await
                .expect("TEST UNIT READY");
            match (out.status, out.sense_triplet()) {
                (2, Some((2, 0x04, 0x0c))) => break,
                (0, _) | (2, Some((6, 0x2a, 0x06))) => {}
                other => panic!("TEST UNIT READY answered {other:?}"),
            }
            assert!(
                std::time::Instant::now() < deadline,
                "TEST UNIT READY still GOOD on the fenced gateway"
            );
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
        // B serves on and holds the last write that went through A, not the refused ones.
        let now = sb.read(u64::from(lba), 1).await.unwrap();
        assert!(
            now.iter().all(|x| *x == 0x11 || *x == 0x22),
            "refused data landed"
        );
        assert_eq!(write10(&sb, lba, 0x44).await, (0, None));
        assert!(sb
            .read(u64::from(lba), 1)
            .await
            .unwrap()
            .iter()
            .all(|x| *x == 0x44));
        // A reconnects by itself with a new client, and serves again: first the unit
        // attention of its port group's change, then GOOD, and it reads what B wrote.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        loop {
            match write10(&sa, lba + 1, 0x55).await {
                (0, None) => break,
                (2, Some((2, 0x04, 0x0c))) | (2, Some((6, _, _))) => {}
                other => panic!("a reconnecting gateway answered {other:?}"),
            }
            assert!(
                std::time::Instant::now() < deadline,
                "A did not come back with a new client"
            );
            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        }
        assert!(sa
            .read(u64::from(lba), 1)
            .await
            .unwrap()
            .iter()
            .all(|x| *x == 0x44));
        assert!(sb
            .read(u64::from(lba) + 1, 1)
            .await
            .unwrap()
            .iter()
            .all(|x| *x == 0x55));
        // Its new client is the one watching now, next to B's; the fenced one is gone.
        let watchers = cluster.rados(&["-p", "rbd", "listwatchers", object]);
        assert!(!watchers.contains(&a_client), "{watchers}");
        assert_eq!(watchers.matches("watcher=").count(), 2, "{watchers}");
    });
}

/// tcmu-runner issue 420, on purpose: a write held inside a paused gateway must not land
/// after the host reset the LUN through another gateway and wrote the block anew there.
/// Gateway A is stopped (SIGSTOP) with a write to block X on its way; the host gives up on it
/// and resets the LUN through B: B's reset notice gets no answer from A, so B blocklists A's
/// client (and waits for the OSDs to have that map) before the reset completes. The host
/// writes X through B. A resumes: the held write is refused (the reset's unit attention, or
/// NOT READY from the fence), A's next write is refused by the cluster (02/04/0C), and X
/// keeps what was written through B after the reset.
fn a_write_held_in_a_paused_gateway_never_lands_after_a_reset_elsewhere(cluster: &Cluster) {
    cluster.image("race", "64M");
    let dir = tempfile::tempdir().unwrap();
    let g = |name| gateway(cluster, dir.path(), name, "rbd/race");
    let (a, b) = (g("a"), g("b"));
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let sa = std::sync::Arc::new(login(&a, "iqn.2026-11.test:host").await);
        let sb = login(&b, "iqn.2026-11.test:host").await;
        let lba = 2000u32;
        assert_eq!(write10(&sa, lba, 0x11).await, (0, None));
        a.pause();
        let held = {
            let sa = sa.clone();
            tokio::spawn(async move { write10(&sa, lba, 0x22).await })
        };
        let started = std::time::Instant::now();
        sb.lun_reset().await.expect("LUN RESET through B completes");
        let took = started.elapsed();
        // The newer write, after the unit attentions for B's own nexus: the reset's, and
        // ASYMMETRIC ACCESS STATE CHANGED when B sees A's port group go (A fenced).
        let (newer, b_attentions) = write10_past_attentions(&sb, lba, 0x33).await;
        assert_eq!(newer, (0, None), "the newer write, after {b_attentions:?}");
        a.resume();
        let outcome = tokio::time::timeout(std::time::Duration::from_secs(60), held)
            .await
            .expect("A answers the held write once resumed")
            .expect("task");
        // Refused: by a unit attention (the reset's, or the port group's change of state once
        // A saw it was fenced; the command was not run) or by the fenced storage.
        assert!(
            matches!(outcome, (2, Some((6, _, _))) | (2, Some((2, 0x04, 0x0c)))),
            "the held write must be refused, not done: {outcome:?}"
        );
        let now = sb.read(u64::from(lba), 1).await.unwrap();
        assert!(
            now.iter().all(|x| *x == 0x33),
            "a stale write landed after the newer one (first byte {:#x})",
            now[0]
        );
        // A was fenced: what it is sent now is refused, after the unit attentions still queued
        // for A's nexus (the reset's, when its notice arrived after the held write ran, and
        // ASYMMETRIC ACCESS STATE CHANGED for its port group going unavailable). A reconnects
        // with a new client no sooner than a second after it made the group unavailable.
        let (next, attentions) = write10_past_attentions(&sa, lba, 0x55).await;
        assert_eq!(
            next,
            (2, Some((2, 0x04, 0x0c))),
            "after the unit attentions {attentions:?}"
        );
        let now = sb.read(u64::from(lba), 1).await.unwrap();
        assert!(now.iter().all(|x| *x == 0x33), "first byte {:#x}", now[0]);
        eprintln!(
            "LUN RESET through B with A paused: {took:?}; the held write: {outcome:?}, \
             then {attentions:?} before {next:?}; B's newer write after {b_attentions:?}"
        );
    });
}

/// The clients watching an image's reservation object (each gateway's, and a killed one's
/// until its watch times out or it is blocklisted).
fn watchers(cluster: &Cluster, image: &str) -> Vec<String> {
    // lanes_rbd::pr_object_name(image)
    let object = format!("lanes.pr.{image}");
    cluster
        .rados(&["-p", "rbd", "listwatchers", &object])
        .split_whitespace()
        .filter_map(|w| w.strip_prefix("watcher="))
        .map(str::to_string)
        .collect()
}

/// kill -9 of gateway A while a LUN RESET goes through B: the reset waits for A's
/// acknowledgement. A started again on the same machine finds the client its dead
/// predecessor left published and blocklists it before it serves, so the reset completes
/// without waiting out the dead watch, and the old client can never write again.
fn a_gateway_restarted_after_kill_fences_its_predecessor_as_it_starts(cluster: &Cluster) {
    use lanes_test_support::serve::Signal;
    cluster.image("restart", "64M");
    let dir = tempfile::tempdir().unwrap();
    let g = |name| gateway(cluster, dir.path(), name, "rbd/restart");
    let mut a = g("a");
    let old = watchers(cluster, "restart");
    assert_eq!(old.len(), 1, "{old:?}");
    let b = g("b");
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let sb = login(&b, "iqn.2026-11.test:host").await;
        assert!(!cluster
            .ceph(&["osd", "blocklist", "ls"])
            .contains(old[0].as_str()));
        a.stop(Signal::Kill, std::time::Duration::from_secs(10))
            .expect("A exits on SIGKILL");
        let started = std::time::Instant::now();
        let reset = tokio::spawn(async move {
            let r = sb.lun_reset().await;
            (r, sb)
        });
        let a2 = g("a");
        let blocklist = cluster.ceph(&["osd", "blocklist", "ls"]);
        assert!(
            blocklist.contains(old[0].as_str()),
            "the restarted gateway did not fence its predecessor's client {}: {blocklist}",
            old[0]
        );
        let (r, sb) = reset.await.expect("task");
        r.expect("LUN RESET through B completes");
        eprintln!(
            "LUN RESET through B with A killed and restarted: {:?}",
            started.elapsed()
        );
        // Both gateways serve: the new A and B share the image.
        let sa = login(&a2, "iqn.2026-11.test:host-2").await;
        ready(&sb).await;
        assert_eq!(write10(&sb, 3000, 0x66).await, (0, None));
        ready(&sa).await;
        assert!(sa.read(3000, 1).await.unwrap().iter().all(|x| *x == 0x66));
    });
}

/// Gateway NAME over image SPEC with a portal group of tag TAG (from a configuration file).
fn tagged_gateway(
    cluster: &Cluster,
    dir: &std::path::Path,
    name: &str,
    spec: &str,
    tag: u16,
) -> ServeChild {
    let (pool, image) = spec.split_once('/').unwrap();
    let home = dir.join(name);
    std::fs::create_dir_all(home.join("data")).unwrap();
    let config = home.join("lanes.toml");
    std::fs::write(
        &config,
        format!(
            "[server]\ndata-dir = \"{}\"\n\n[[portal-group]]\ntag = {tag}\nportals = [\"127.0.0.1:0\"]\n\n\
             [[target]]\nname = \"iqn.2026-11.io.lanes:ceph\"\n\n[[target.lun]]\nlun = 0\n\
             backend = \"rbd\"\npool = \"{pool}\"\nimage = \"{image}\"\nceph-conf = \"{}\"\n",
            home.join("data").display(),
            cluster.conf.display(),
        ),
    )
    .unwrap();
    lanes_test_support::serve::ServeCommand::new(env!("CARGO_BIN_EXE_lanes"))
        .arg("--config")
        .arg(&config)
        .inherit_stderr()
        .start()
}

/// REPORT TARGET PORT GROUPS through `g` in a session of its own: `(group, state)` by group.
async fn port_groups(g: &ServeChild) -> Vec<(u16, u8)> {
    let s = login(g, "iqn.2026-11.test:alua-checker").await;
    let mut groups: Vec<(u16, u8)> = s
        .report_target_port_groups()
        .await
        .expect("REPORT TARGET PORT GROUPS")
        .iter()
        .map(|p| (p.group, p.state))
        .collect();
    let _ = s.logout().await;
    groups.sort_unstable();
    groups
}

/// Waits (at most `bound`; states are shared once a second) until every gateway in `gs`
/// reports `expected`.
async fn port_groups_become(
    gs: &[&ServeChild],
    expected: &[(u16, u8)],
    bound: std::time::Duration,
) {
    let deadline = std::time::Instant::now() + bound;
    loop {
        let mut seen = Vec::new();
        for g in gs {
            seen.push(port_groups(g).await);
        }
        if seen.iter().all(|s| s == expected) {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "port groups through each gateway: {seen:?}, expected {expected:?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
}

/// Gateways A (port group 1) and B (port group 2): REPORT TARGET PORT GROUPS through either
/// lists both groups active/optimized. A is paused and B fences it (a LUN RESET that A cannot
/// acknowledge): B reports group 1 unavailable. A resumes, finds itself fenced, reconnects,
/// and both report both groups active/optimized again.
fn every_gateway_reports_every_gateways_port_group_state(cluster: &Cluster) {
    cluster.image("alua", "64M");
    let dir = tempfile::tempdir().unwrap();
    let a = tagged_gateway(cluster, dir.path(), "a", "rbd/alua", 1);
    let b = tagged_gateway(cluster, dir.path(), "b", "rbd/alua", 2);
    let both_optimized = [(1, 0), (2, 0)];
    let bound = std::time::Duration::from_secs(30);
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        port_groups_become(&[&a, &b], &both_optimized, bound).await;
        let sb = login(&b, "iqn.2026-11.test:host").await;
        a.pause();
        sb.lun_reset().await.expect("LUN RESET through B");
        port_groups_become(&[&b], &[(1, 3), (2, 0)], bound).await;
        a.resume();
        port_groups_become(&[&a, &b], &both_optimized, bound).await;
    });
}

/// TEST UNIT READY until GOOD (each unit attention pending on the nexus is reported once).
async fn ready(s: &Session) {
    for _ in 0..8 {
        if s.test_unit_ready().await.is_ok() {
            return;
        }
    }
    panic!("TEST UNIT READY never GOOD");
}

/// WRITE(10) of one 512-byte block filled with `fill`: the status and the sense triplet.
async fn write10(s: &Session, lba: u32, fill: u8) -> (u8, Option<(u8, u8, u8)>) {
    let mut cdb = [0u8; 16];
    cdb[0] = 0x2a;
    cdb[2..6].copy_from_slice(&lba.to_be_bytes());
    cdb[8] = 1;
    let out = s
        .execute(cdb, 0, Some(Bytes::from(vec![fill; 512])))
        .await
        .expect("transport");
    (out.status, out.sense_triplet())
}

/// WRITE(10) of one block, sent again after each unit attention (the command did not run),
/// at most four times: the last outcome, and the attentions (ASC, ASCQ) before it.
async fn write10_past_attentions(
    s: &Session,
    lba: u32,
    fill: u8,
) -> ((u8, Option<(u8, u8, u8)>), Vec<(u8, u8)>) {
    let mut attentions = Vec::new();
    loop {
        let out = write10(s, lba, fill).await;
        match out {
            (2, Some((6, asc, ascq))) if attentions.len() < 4 => attentions.push((asc, ascq)),
            _ => return (out, attentions),
        }
    }
}

/// COMPARE AND WRITE(16) of one block: Ok on GOOD, Err with the sense on MISCOMPARE.
async fn caw(s: &Session, lba: u64, verify: &[u8], write: &[u8]) -> Result<(), (u8, u8, u8)> {
    let mut cdb = [0u8; 16];
    cdb[0] = 0x89;
    cdb[2..10].copy_from_slice(&lba.to_be_bytes());
    cdb[13] = 1;
    let data = Bytes::from([verify, write].concat());
    let out = s.execute(cdb, 0, Some(data)).await.expect("transport");
    match (out.status, out.sense_triplet()) {
        (0, _) => Ok(()),
        (2, Some(t)) if t.0 == 0x0e && t.1 == 0x1d => Err(t),
        other => panic!("COMPARE AND WRITE answered {other:?}"),
    }
}
