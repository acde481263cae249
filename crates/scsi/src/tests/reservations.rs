//! Reservation and ALUA tests: PR with two nexuses, APTPL reload, SPC-2 reserve, resets, ALUA.

use super::*;

#[test]
fn persistent_reservations_two_nexuses() {
    let f = fixture();
    let a = nexus(1, "iqn.a", 1);
    let b = nexus(2, "iqn.b", 2);
    f.map.nexus_added(&a);
    f.map.nexus_added(&b);
    run(&f.map, &a, &[0; 6], &[], 0);
    run(&f.map, &b, &[0; 6], &[], 0);
    let (c, d) = pr_out(0, 0, 0, 0xA, 0);
    assert_eq!(run(&f.map, &a, &c, &d, 0).0.status, 0);
    let (c, d) = pr_out(0, 0, 0, 0xB, 0);
    assert_eq!(run(&f.map, &b, &c, &d, 0).0.status, 0);
    // Wrong key when re-registering conflicts.
    let (c, d) = pr_out(0, 0, 0x99, 0xC, 0);
    assert_eq!(
        run(&f.map, &a, &c, &d, 0).0.status,
        status::RESERVATION_CONFLICT
    );
    let (c, d) = pr_out(1, 1, 0xA, 0, 0);
    assert_eq!(run(&f.map, &a, &c, &d, 0).0.status, 0);
    let write = [0x2A, 0, 0, 0, 0, 1, 0, 0, 1, 0];
    let read = [0x28, 0, 0, 0, 0, 1, 0, 0, 1, 0];
    assert_eq!(
        run(&f.map, &b, &write, &[0; 512], 0).0.status,
        status::RESERVATION_CONFLICT
    );
    assert_eq!(run(&f.map, &b, &read, &[], 512).0.status, 0);
    assert_eq!(run(&f.map, &a, &write, &[0; 512], 0).0.status, 0);
    // READ KEYS and READ RESERVATION.
    let (o, d) = run(&f.map, &b, &[0x5E, 0, 0, 0, 0, 0, 0, 1, 0, 0], &[], 256);
    assert_eq!(o.status, 0);
    assert_eq!(u32::from_be_bytes([d[4], d[5], d[6], d[7]]), 16);
    let (_, d) = run(&f.map, &b, &[0x5E, 1, 0, 0, 0, 0, 0, 1, 0, 0], &[], 256);
    assert_eq!(u64::from_be_bytes(d[8..16].try_into().unwrap()), 0xA);
    assert_eq!(d[21], 1);
    // B preempts A: A loses its registration and gets RESERVATIONS PREEMPTED.
    let (c, d) = pr_out(4, 3, 0xB, 0xA, 0);
    assert_eq!(run(&f.map, &b, &c, &d, 0).0.status, 0);
    let (o, _) = run(&f.map, &a, &[0; 6], &[], 0);
    assert_eq!(asc(&o), (6, 0x2A, 0x03));
    assert_eq!(
        run(&f.map, &a, &read, &[], 512).0.status,
        status::RESERVATION_CONFLICT
    );
    // Full status shows one registration holding an EA reservation.
    let (_, d) = run(&f.map, &b, &[0x5E, 3, 0, 0, 0, 0, 0, 1, 0, 0], &[], 256);
    assert_eq!(d[8 + 12], 1);
    assert_eq!(d[8 + 13], 3);
    // CLEAR.
    let (c, d) = pr_out(3, 0, 0xB, 0, 0);
    assert_eq!(run(&f.map, &b, &c, &d, 0).0.status, 0);
    assert_eq!(run(&f.map, &a, &read, &[], 512).0.status, 0);
}

#[test]
fn aptpl_state_reloads() {
    let dir = tempfile::tempdir().unwrap();
    let pr_file = dir.path().join("pr/lun0.pr");
    let dev: Arc<dyn BlockDevice> = Arc::new(MemoryDevice::new(BLOCKS * 512));
    let tpgs = Arc::new(TargetPortGroups::one_per_port(1));
    let cfg = LunConfig {
        pr_file: Some(pr_file.clone()),
        ..config(dev)
    };
    let a = nexus(1, "iqn.a", 1);
    {
        let lu = Arc::new(LogicalUnit::new(cfg.clone(), tpgs.clone()).unwrap());
        let map = LunMap::new(vec![(0, lu)]);
        let (c, d) = pr_out(0, 0, 0, 0x1234, 1);
        assert_eq!(run(&map, &a, &c, &d, 0).0.status, 0);
        let (c, d) = pr_out(1, 5, 0x1234, 0, 0);
        assert_eq!(run(&map, &a, &c, &d, 0).0.status, 0);
    }
    assert!(pr_file.exists());
    let lu = Arc::new(LogicalUnit::new(cfg, tpgs).unwrap());
    let map = LunMap::new(vec![(0, lu)]);
    let (_, d) = run(&map, &a, &[0x5E, 1, 0, 0, 0, 0, 0, 1, 0, 0], &[], 256);
    assert_eq!(u64::from_be_bytes(d[8..16].try_into().unwrap()), 0x1234);
    assert_eq!(d[21], 5);
    let (_, d) = run(&map, &a, &[0x5E, 2, 0, 0, 0, 0, 0, 1, 0, 0], &[], 256);
    assert_eq!(d[3] & 1, 1, "PTPL_A");
}

#[test]
fn alua_state_change_raises_ua_and_blocks_io() {
    let f = fixture();
    let a = nexus(1, "iqn.a", 1);
    let b = nexus(2, "iqn.b", 2);
    f.map.nexus_added(&a);
    f.map.nexus_added(&b);
    run(&f.map, &a, &[0; 6], &[], 0);
    run(&f.map, &b, &[0; 6], &[], 0);
    f.tpgs.set_state(2, AluaState::Standby);
    let (o, _) = run(&f.map, &a, &[0; 6], &[], 0);
    assert_eq!(asc(&o), (6, 0x2A, 0x06));
    let read = [0x28, 0, 0, 0, 0, 1, 0, 0, 1, 0];
    assert_eq!(run(&f.map, &a, &read, &[], 512).0.status, 0);
    let (o, _) = run(&f.map, &b, &read, &[], 512);
    assert_eq!(asc(&o), (6, 0x2A, 0x06));
    let (o, _) = run(&f.map, &b, &read, &[], 512);
    assert_eq!(asc(&o), (2, 0x04, 0x0B));
    let (o, d) = run(
        &f.map,
        &b,
        &[0xA3, 0x0A, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0],
        &[],
        256,
    );
    assert_eq!(o.status, 0);
    assert_eq!(d[4] & 0x0F, 0);
    assert_eq!(d[16] & 0x0F, 2);
    // Explicit ALUA back to active/optimized.
    let param = [0u8, 0, 0, 0, 0, 0, 0, 2];
    let (o, _) = run(
        &f.map,
        &b,
        &[0xA4, 0x0A, 0, 0, 0, 0, 0, 0, 0, 8, 0, 0],
        &param,
        0,
    );
    assert_eq!(o.status, 0, "{:?}", o.sense);
    assert_eq!(f.tpgs.state_of(2), AluaState::ActiveOptimized);
    assert_eq!(run(&f.map, &b, &read, &[], 512).0.status, 0);
    assert_eq!(asc(&run(&f.map, &a, &read, &[], 512).0), (6, 0x2A, 0x06));
}

#[test]
fn report_target_port_groups_lists_other_servers_groups_with_their_states() {
    let f = fixture();
    let a = nexus(1, "iqn.a", 1);
    f.map.nexus_added(&a);
    run(&f.map, &a, &[0; 6], &[], 0);
    let rtpg = [0xA3, 0x0A, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0];
    let groups = |d: &[u8]| {
        let mut out = Vec::new();
        let mut at = 4;
        while at + 8 <= d.len() {
            let n = usize::from(d[at + 7]);
            let id = u16::from_be_bytes([d[at + 2], d[at + 3]]);
            let port = u16::from_be_bytes([d[at + 10], d[at + 11]]);
            out.push((id, d[at] & 0x0F, port));
            at += 8 + 4 * n;
        }
        out
    };
    let (_, before) = run(&f.map, &a, &rtpg, &[], 256);
    // Another gateway publishes groups 7 (standby) and 2 (one of ours: ignored). A group that
    // appears changes no path's access: no unit attention.
    assert!(!f
        .tpgs
        .set_remote(&[(7, AluaState::Standby), (2, AluaState::Standby)]));
    assert_eq!(run(&f.map, &a, &[0; 6], &[], 0).0.status, 0);
    // Its state changes: every nexus is told.
    assert!(f
        .tpgs
        .set_remote(&[(7, AluaState::ActiveOptimized), (2, AluaState::Standby)]));
    let (o, _) = run(&f.map, &a, &[0; 6], &[], 0);
    assert_eq!(
        asc(&o),
        (6, 0x2A, 0x06),
        "a remote change is an access state change"
    );
    let (o, d) = run(&f.map, &a, &rtpg, &[], 256);
    assert_eq!(o.status, 0);
    let mut expected = groups(&before);
    expected.push((7, 0, 7));
    assert_eq!(groups(&d), expected);
    // Its server vanished from the published list: unavailable everywhere.
    assert!(f.tpgs.set_remote(&[]));
    assert_eq!(asc(&run(&f.map, &a, &[0; 6], &[], 0).0), (6, 0x2A, 0x06));
    let (_, d) = run(&f.map, &a, &rtpg, &[], 256);
    assert_eq!(groups(&d).last(), Some(&(7, 3, 7)));
}

#[test]
fn reserve6_and_resets() {
    let f = fixture();
    let a = nexus(1, "iqn.a", 1);
    let b = nexus(2, "iqn.b", 1);
    assert_eq!(run(&f.map, &a, &[0x16, 0, 0, 0, 0, 0], &[], 0).0.status, 0);
    assert_eq!(
        run(&f.map, &b, &[0; 6], &[], 0).0.status,
        status::RESERVATION_CONFLICT
    );
    assert_eq!(run(&f.map, &b, &[0x17, 0, 0, 0, 0, 0], &[], 0).0.status, 0);
    assert_eq!(
        run(&f.map, &b, &[0x16, 0, 0, 0, 0, 0], &[], 0).0.status,
        status::RESERVATION_CONFLICT
    );
    f.map.nexus_added(&a);
    f.map.nexus_added(&b);
    assert_eq!(asc(&run(&f.map, &a, &[0; 6], &[], 0).0), (6, 0x29, 0));
    f.map.lun_reset(0, &a);
    assert_eq!(asc(&run(&f.map, &a, &[0; 6], &[], 0).0), (6, 0x29, 0x03));
    let (o, _) = run(&f.map, &b, &[0; 6], &[], 0);
    assert_eq!(asc(&o).0, 6);
    let (o, _) = run(&f.map, &b, &[0; 6], &[], 0);
    assert_eq!(asc(&o), (6, 0x29, 0x03));
    assert_eq!(run(&f.map, &b, &[0; 6], &[], 0).0.status, 0);
}
