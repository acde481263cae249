//! LUN inventory and capacity changes at run time: the unit attentions they raise, once per
//! I_T nexus, and what the changed LUs answer afterwards.

use super::*;

fn on_lun(map: &LunMap, n: &Nexus, lun: u64, cdb: &[u8], limit: u32) -> (ScsiOutcome, BytesMut) {
    let mut out = BytesMut::new();
    let req = ScsiRequest {
        lun,
        ..request(n, cdb, &[], limit)
    };
    let o = map.execute(&req, &mut out);
    (o, out)
}

const TUR: [u8; 6] = [0; 6];

fn file_lu(dir: &std::path::Path, name: &str, bytes: u64) -> Arc<LogicalUnit> {
    let dev = Arc::new(FileDevice::open(dir.join(name), Some(bytes)).unwrap());
    let tpgs = Arc::new(TargetPortGroups::one_per_port(1));
    Arc::new(LogicalUnit::new(config(dev), tpgs).unwrap())
}

#[test]
fn reported_luns_changed_once_per_nexus() {
    let dir = tempfile::tempdir().unwrap();
    let map = LunMap::new(vec![(0, file_lu(dir.path(), "a", 1 << 20))]);
    let (a, b) = (nexus(1, "iqn.a", 1), nexus(2, "iqn.b", 1));
    for n in [&a, &b] {
        map.nexus_added(n);
        assert_eq!(asc(&on_lun(&map, n, 0, &TUR, 0).0), (6, 0x29, 0));
    }
    let map = map.with_changes(&[], vec![(1, file_lu(dir.path(), "b", 1 << 20))]);
    map.inventory_changed(&[1], [&a, &b]);
    // a learns it on LUN 0, b on the new LUN 1; neither hears it again on the other LU.
    assert_eq!(asc(&on_lun(&map, &a, 0, &TUR, 0).0), (6, 0x3F, 0x0E));
    assert_eq!(on_lun(&map, &a, 1, &TUR, 0).0.status, 0);
    assert_eq!(on_lun(&map, &a, 0, &TUR, 0).0.status, 0);
    assert_eq!(asc(&on_lun(&map, &b, 1, &TUR, 0).0), (6, 0x3F, 0x0E));
    assert_eq!(on_lun(&map, &b, 0, &TUR, 0).0.status, 0);
    assert_eq!(on_lun(&map, &b, 1, &TUR, 0).0.status, 0);
    let (o, d) = on_lun(&map, &a, 0, &[0xA0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0], 256);
    assert_eq!(o.status, 0);
    assert_eq!(&d[..4], &[0, 0, 0, 16], "two LUNs reported");

    // Fetched with REQUEST SENSE (fixed format) on LUN 1, it is gone from LUN 0 too.
    let map = map.with_changes(&[], vec![(2, file_lu(dir.path(), "c", 1 << 20))]);
    map.inventory_changed(&[2], [&a, &b]);
    let (o, d) = on_lun(&map, &a, 1, &[0x03, 0, 0, 0, 18, 0], 18);
    assert_eq!(o.status, 0);
    assert_eq!((d[2] & 0x0F, d[12], d[13]), (6, 0x3F, 0x0E));
    assert_eq!(on_lun(&map, &a, 0, &TUR, 0).0.status, 0);
    assert_eq!(on_lun(&map, &a, 2, &TUR, 0).0.status, 0);
    assert_eq!(asc(&on_lun(&map, &b, 2, &TUR, 0).0), (6, 0x3F, 0x0E));
    assert_eq!(on_lun(&map, &b, 0, &TUR, 0).0.status, 0);

    let map = map.with_changes(&[0], Vec::new());
    map.inventory_changed(&[], [&a, &b]);
    assert_eq!(asc(&on_lun(&map, &a, 0, &TUR, 0).0), (5, 0x25, 0));
    assert_eq!(asc(&on_lun(&map, &a, 1, &TUR, 0).0), (6, 0x3F, 0x0E));
    assert_eq!(on_lun(&map, &a, 1, &TUR, 0).0.status, 0);
}

#[test]
fn grown_lu_reports_capacity_change_once_and_new_size() {
    let dir = tempfile::tempdir().unwrap();
    let lu = file_lu(dir.path(), "a", 1 << 20);
    let map = LunMap::new(vec![(0, lu.clone())]);
    let (a, b) = (nexus(1, "iqn.a", 1), nexus(2, "iqn.b", 1));
    for n in [&a, &b] {
        map.nexus_added(n);
        let _ = on_lun(&map, n, 0, &TUR, 0);
    }
    let beyond = cdb16(0x88, 2048, 1);
    assert_eq!(asc(&on_lun(&map, &a, 0, &beyond, 512).0), (5, 0x21, 0));
    assert!(
        lu.grow((3 << 20) + 100).is_err(),
        "not a whole number of blocks is refused"
    );
    assert!(lu.grow((2 << 20) + 512).unwrap());
    assert!(!lu.grow((2 << 20) + 512).unwrap(), "same size: no change");
    assert!(lu.grow(1 << 20).is_err(), "never shrinks");
    for n in [&a, &b] {
        assert_eq!(asc(&on_lun(&map, n, 0, &TUR, 0).0), (6, 0x2A, 0x09));
        assert_eq!(on_lun(&map, n, 0, &TUR, 0).0.status, 0);
    }
    let (o, d) = on_lun(
        &map,
        &a,
        0,
        &[0x9E, 0x10, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 32, 0, 0],
        32,
    );
    assert_eq!(o.status, 0);
    assert_eq!(
        u64::from_be_bytes(d[..8].try_into().unwrap()),
        4096,
        "last LBA"
    );
    assert_eq!(on_lun(&map, &a, 0, &beyond, 512).0.status, 0);
}
