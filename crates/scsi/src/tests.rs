//! Unit tests driving logical units through the public request API.

mod aio;
mod inventory;
mod reservations;
mod shared_pr;

use crate::*;
use blockstore::{BlockDevice, FileDevice, MemoryDevice};
use bytes::{Bytes, BytesMut};
use std::sync::Arc;

const BLOCKS: u64 = 1024;

fn nexus(id: u64, name: &str, port: u16) -> Nexus {
    Nexus {
        id,
        initiator_name: name.into(),
        isid: [0x80, 0, 0, 0, 0, id as u8],
        relative_target_port: port,
        target_port_group: port,
    }
}

fn config(dev: Arc<dyn BlockDevice>) -> LunConfig {
    LunConfig {
        device: dev,
        block_size: 512,
        naa_id: [0x60, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15],
        serial: "SER123".into(),
        vendor: "LANES".into(),
        product: "test disk".into(),
        revision: "0001".into(),
        read_only: false,
        write_cache: true,
        pr_file: None,
        pr_store: None,
        thin: true,
    }
}

struct Fixture {
    map: LunMap,
    dev: Arc<MemoryDevice>,
    tpgs: Arc<TargetPortGroups>,
}

fn fixture() -> Fixture {
    let dev = Arc::new(MemoryDevice::new(BLOCKS * 512));
    let tpgs = Arc::new(TargetPortGroups::one_per_port(2));
    let lu = Arc::new(LogicalUnit::new(config(dev.clone()), tpgs.clone()).unwrap());
    let map = LunMap::new(vec![(0, lu)]);
    Fixture { map, dev, tpgs }
}

fn segments(data: &[u8]) -> Vec<Bytes> {
    if data.is_empty() {
        vec![]
    } else {
        vec![Bytes::copy_from_slice(data)]
    }
}

fn request<'a>(n: &'a Nexus, cdb: &'a [u8], segs: &'a [Bytes], limit: u32) -> ScsiRequest<'a> {
    ScsiRequest {
        nexus: n,
        lun: 0,
        cdb,
        data_out: segs,
        data_in_limit: limit,
        attr: TaskAttribute::Simple,
    }
}

fn run(map: &LunMap, n: &Nexus, cdb: &[u8], data: &[u8], limit: u32) -> (ScsiOutcome, BytesMut) {
    let segs = segments(data);
    let mut out = BytesMut::new();
    let o = map.execute(&request(n, cdb, &segs, limit), &mut out);
    (o, out)
}

fn asc(o: &ScsiOutcome) -> (u8, u8, u8) {
    let s = o.sense.expect("sense");
    (s.key, s.asc, s.ascq)
}

fn cdb16(op: u8, lba: u64, n: u32) -> [u8; 16] {
    let mut c = [0u8; 16];
    c[0] = op;
    c[2..10].copy_from_slice(&lba.to_be_bytes());
    c[10..14].copy_from_slice(&n.to_be_bytes());
    c
}

fn pr_out(action: u8, kind: u8, key: u64, sa_key: u64, flags: u8) -> ([u8; 10], [u8; 24]) {
    let mut c = [0u8; 10];
    c[0] = 0x5F;
    c[1] = action;
    c[2] = kind;
    c[8] = 24;
    let mut d = [0u8; 24];
    d[0..8].copy_from_slice(&key.to_be_bytes());
    d[8..16].copy_from_slice(&sa_key.to_be_bytes());
    d[20] = flags;
    (c, d)
}

#[test]
fn unit_attention_after_login_then_clear() {
    let f = fixture();
    let a = nexus(1, "iqn.a", 1);
    f.map.nexus_added(&a);
    let (o, d) = run(&f.map, &a, &[0x12, 0, 0, 0, 96, 0], &[], 96);
    assert_eq!(o.status, 0, "INQUIRY does not report UA");
    assert_eq!(d[0], 0);
    assert_eq!(d[2], 6);
    assert_eq!(d.len(), 66);
    let (o, _) = run(&f.map, &a, &[0, 0, 0, 0, 0, 0], &[], 0);
    assert_eq!(asc(&o), (6, 0x29, 0));
    let (o, _) = run(&f.map, &a, &[0, 0, 0, 0, 0, 0], &[], 0);
    assert_eq!(o.status, 0);
}

#[test]
fn inquiry_vpd_pages() {
    let f = fixture();
    let a = nexus(1, "iqn.a", 2);
    let (o, d) = run(&f.map, &a, &[0x12, 1, 0, 0, 255, 0], &[], 255);
    assert_eq!(o.status, 0);
    let pages = d[4..].to_vec();
    for p in pages {
        let (o, d) = run(&f.map, &a, &[0x12, 1, p, 0, 255, 0], &[], 255);
        assert_eq!(o.status, 0, "page {p:02x}");
        assert_eq!(d[1], p);
        assert_eq!(u16::from_be_bytes([d[2], d[3]]) as usize + 4, d.len());
    }
    let (_, d) = run(&f.map, &a, &[0x12, 1, 0x83, 0, 255, 0], &[], 255);
    assert_eq!(&d[4..8], &[1, 3, 0, 16]);
    assert_eq!(d[8], 0x60);
    let (o, _) = run(&f.map, &a, &[0x12, 1, 0x99, 0, 255, 0], &[], 255);
    assert_eq!(asc(&o), (5, 0x24, 0));
    let (o, d) = run(&f.map, &a, &[0x12, 0, 0, 0, 5, 0], &[], 5);
    assert_eq!((o.status, d.len()), (0, 5));
}

#[test]
fn read_write_ranges_and_protect() {
    let f = fixture();
    let a = nexus(1, "iqn.a", 1);
    let data = vec![0xA5u8; 1024];
    let (o, _) = run(&f.map, &a, &[0x2A, 0, 0, 0, 0, 10, 0, 0, 2, 0], &data, 0);
    assert_eq!(o.status, 0);
    let (o, d) = run(&f.map, &a, &[0x28, 0, 0, 0, 0, 10, 0, 0, 2, 0], &[], 1024);
    assert_eq!((o.status, &d[..]), (0, &data[..]));
    let (o, _) = run(&f.map, &a, &cdb16(0x88, u64::MAX, 1), &[], 512);
    assert_eq!(asc(&o), (5, 0x21, 0));
    let (o, _) = run(&f.map, &a, &[0x28, 0, 0, 0, 3, 255, 0, 0, 2, 0], &[], 1024);
    assert_eq!(asc(&o), (5, 0x21, 0));
    // Zero blocks at LBA == capacity is fine, one past is not.
    let (o, _) = run(&f.map, &a, &[0x2A, 0, 0, 0, 4, 0, 0, 0, 0, 0], &[], 0);
    assert_eq!(o.status, 0);
    let (o, _) = run(&f.map, &a, &[0x2A, 0, 0, 0, 4, 1, 0, 0, 0, 0], &[], 0);
    assert_eq!(asc(&o), (5, 0x21, 0));
    // Fewer bytes than the CDB asks for: only those are written.
    let (o, _) = run(
        &f.map,
        &a,
        &[0x2A, 0, 0, 0, 0, 20, 0, 0, 1, 0],
        &[7u8; 200],
        0,
    );
    assert_eq!(o.status, 0);
    let mut back = [0u8; 512];
    f.dev.read_at(&mut back, 20 * 512).unwrap();
    assert!(back[..200].iter().all(|&b| b == 7) && back[200..].iter().all(|&b| b == 0));
    let ro = Arc::new(
        LogicalUnit::new(
            LunConfig {
                read_only: true,
                ..config(f.dev.clone())
            },
            f.tpgs.clone(),
        )
        .unwrap(),
    );
    let map = LunMap::new(vec![(0, ro)]);
    let (o, _) = run(
        &map,
        &a,
        &[0x2A, 0, 0, 0, 0, 10, 0, 0, 1, 0],
        &data[..512],
        0,
    );
    assert_eq!(asc(&o), (7, 0x27, 0));
}

#[test]
fn report_luns_and_missing_lun() {
    let f = fixture();
    let a = nexus(1, "iqn.a", 1);
    let segs: Vec<Bytes> = vec![];
    let mut out = BytesMut::new();
    let req = ScsiRequest {
        nexus: &a,
        lun: 5,
        cdb: &[0xA0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0],
        data_out: &segs,
        data_in_limit: 256,
        attr: TaskAttribute::Simple,
    };
    assert_eq!(f.map.execute(&req, &mut out).status, 0);
    assert_eq!(&out[..], &[0, 0, 0, 8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
    out.clear();
    let req = ScsiRequest {
        cdb: &[0x12, 0, 0, 0, 36, 0],
        ..req
    };
    assert_eq!(f.map.execute(&req, &mut out).status, 0);
    assert_eq!(out[0], 0x7F);
    let req = ScsiRequest {
        cdb: &[0, 0, 0, 0, 0, 0],
        ..req
    };
    assert_eq!(asc(&f.map.execute(&req, &mut out)), (5, 0x25, 0));
}

#[test]
fn mode_select_wce_round_trip() {
    let f = fixture();
    let a = nexus(1, "iqn.a", 1);
    let (o, d) = run(&f.map, &a, &[0x1A, 0x08, 0x08, 0, 255, 0], &[], 255);
    assert_eq!(o.status, 0);
    assert_eq!(d[3], 0);
    assert_eq!(d[4], 0x08);
    assert_eq!(d[6] & 0x04, 0x04);
    let mut param = d.to_vec();
    param[0] = 0;
    param[6] &= !0x04;
    let (o, _) = run(
        &f.map,
        &a,
        &[0x15, 0x10, 0, 0, param.len() as u8, 0],
        &param,
        0,
    );
    assert_eq!(o.status, 0, "{:?}", o.sense);
    let (_, d) = run(&f.map, &a, &[0x1A, 0x08, 0x08, 0, 255, 0], &[], 255);
    assert_eq!(d[6] & 0x04, 0);
    // Changing an unchangeable bit is refused.
    param[7] = 0xFF;
    let (o, _) = run(
        &f.map,
        &a,
        &[0x15, 0x10, 0, 0, param.len() as u8, 0],
        &param,
        0,
    );
    assert_eq!(asc(&o), (5, 0x26, 0));
    let (o, _) = run(&f.map, &a, &[0x1A, 0x08, 0xC8, 0, 255, 0], &[], 255);
    assert_eq!(asc(&o), (5, 0x39, 0));
    let (o, d) = run(&f.map, &a, &[0x1A, 0, 0x3F, 0, 255, 0], &[], 255);
    assert_eq!(o.status, 0);
    assert_eq!(d[0] as usize + 1, d.len());
}

#[test]
fn unmap_punches_and_lba_status_reports() {
    for file in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let dev: Arc<dyn BlockDevice> = if file {
            Arc::new(FileDevice::open(dir.path().join("v.img"), Some(BLOCKS * 512)).unwrap())
        } else {
            Arc::new(MemoryDevice::new(BLOCKS * 512))
        };
        let lu = Arc::new(
            LogicalUnit::new(
                config(dev.clone()),
                Arc::new(TargetPortGroups::one_per_port(1)),
            )
            .unwrap(),
        );
        let map = LunMap::new(vec![(0, lu)]);
        let a = nexus(1, "iqn.a", 1);
        let data = vec![0x11u8; 512 * 64];
        assert_eq!(run(&map, &a, &cdb16(0x8A, 0, 64), &data, 0).0.status, 0);
        let mut param = vec![0u8; 24];
        param[1] = 22;
        param[3] = 16;
        param[8..16].copy_from_slice(&8u64.to_be_bytes());
        param[16..20].copy_from_slice(&16u32.to_be_bytes());
        let (o, _) = run(&map, &a, &[0x42, 0, 0, 0, 0, 0, 0, 0, 24, 0], &param, 0);
        assert_eq!(o.status, 0, "{:?}", o.sense);
        let (_, d) = run(&map, &a, &cdb16(0x88, 8, 16), &[], 8192);
        assert!(d.iter().all(|&b| b == 0));
        let mut c = cdb16(0x9E, 8, 1000);
        c[1] = 0x12;
        let (o, d) = run(&map, &a, &c, &[], 1000);
        assert_eq!(o.status, 0);
        assert_eq!(u64::from_be_bytes(d[8..16].try_into().unwrap()), 8);
        if !file || d[20] == 1 {
            assert_eq!(d[20], 1, "deallocated");
        }
        // Out-of-range descriptor.
        param[8..16].copy_from_slice(&(BLOCKS - 1).to_be_bytes());
        let (o, _) = run(&map, &a, &[0x42, 0, 0, 0, 0, 0, 0, 0, 24, 0], &param, 0);
        assert_eq!(asc(&o), (5, 0x21, 0));
        let (o, _) = run(&map, &a, &[0x42, 0, 0, 0, 0, 0, 0, 0, 4, 0], &param[..4], 0);
        assert_eq!(asc(&o), (5, 0x1A, 0));
    }
}

#[test]
fn compare_and_write_miscompare_and_atomicity() {
    let f = fixture();
    let a = nexus(1, "iqn.a", 1);
    let mut c = cdb16(0x89, 4, 0);
    c[13] = 1;
    let mut d = vec![0u8; 1024];
    d[512..].fill(9);
    assert_eq!(run(&f.map, &a, &c, &d, 0).0.status, 0);
    let o = run(&f.map, &a, &c, &d, 0).0;
    assert_eq!(asc(&o), (0xE, 0x1D, 0));
    assert_eq!(o.sense.unwrap().info, Some(0));

    // Many threads increment a counter in block 0 with CAW while others write elsewhere
    // and also overwrite block 0 only through CAW: every increment must be observed.
    let threads = 4;
    let per = 50;
    std::thread::scope(|s| {
        for t in 0..threads {
            let map = &f.map;
            s.spawn(move || {
                let n = nexus(10 + t, "iqn.t", 1);
                let mut done = 0;
                while done < per {
                    let (_, cur) = run(map, &n, &cdb16(0x88, 0, 1), &[], 512);
                    let v = u64::from_be_bytes(cur[..8].try_into().unwrap());
                    let mut buf = cur.to_vec();
                    buf.extend_from_slice(&cur);
                    buf[512..520].copy_from_slice(&(v + 1).to_be_bytes());
                    let mut c = cdb16(0x89, 0, 0);
                    c[13] = 1;
                    if run(map, &n, &c, &buf, 0).0.status == 0 {
                        done += 1;
                    }
                    run(map, &n, &cdb16(0x8A, 1 + t, 1), &[t as u8; 512], 0);
                }
            });
        }
    });
    let mut b = [0u8; 8];
    f.dev.read_at(&mut b, 0).unwrap();
    assert_eq!(u64::from_be_bytes(b), threads * per);
}

#[test]
fn report_supported_opcodes_one_command() {
    let f = fixture();
    let a = nexus(1, "iqn.a", 1);
    let (o, d) = run(
        &f.map,
        &a,
        &[0xA3, 0x0C, 0, 0, 0, 0, 0, 0, 0x10, 0, 0, 0],
        &[],
        4096,
    );
    assert_eq!(o.status, 0);
    let len = u32::from_be_bytes(d[..4].try_into().unwrap()) as usize;
    assert_eq!(len + 4, d.len());
    for desc in d[4..].chunks(8) {
        let servactv = desc[5] & 1 != 0;
        let opts = if servactv { 2 } else { 1 };
        let c = [
            0xA3, 0x0C, opts, desc[0], desc[2], desc[3], 0, 0, 1, 0, 0, 0,
        ];
        let (o, one) = run(&f.map, &a, &c, &[], 256);
        assert_eq!(o.status, 0);
        assert_eq!(one[1] & 7, 3);
        assert_eq!(one[4], desc[0]);
        let wrong = [
            0xA3,
            0x0C,
            3 - opts,
            desc[0],
            desc[2],
            desc[3],
            0,
            0,
            1,
            0,
            0,
            0,
        ];
        assert_eq!(run(&f.map, &a, &wrong, &[], 256).0.status, 2);
    }
}

#[test]
fn extended_copy_between_blocks() {
    let f = fixture();
    let a = nexus(1, "iqn.a", 1);
    assert_eq!(
        run(&f.map, &a, &cdb16(0x8A, 0, 4), &[0x42; 2048], 0)
            .0
            .status,
        0
    );
    let mut p = vec![0u8; 16 + 32 + 28];
    p[1] = 3 << 3;
    p[3] = 32;
    p[11] = 28;
    p[16] = 0xE4;
    p[16 + 4..16 + 8].copy_from_slice(&[1, 3, 0, 16]);
    p[16 + 8..16 + 24].copy_from_slice(&config(f.dev.clone()).naa_id);
    p[16 + 30] = 2;
    let s = 48;
    p[s] = 0x02;
    p[s + 3] = 24;
    p[s + 10..s + 12].copy_from_slice(&4u16.to_be_bytes());
    p[s + 12..s + 20].copy_from_slice(&0u64.to_be_bytes());
    p[s + 20..s + 28].copy_from_slice(&100u64.to_be_bytes());
    let mut c = [0u8; 16];
    c[0] = 0x83;
    c[13] = p.len() as u8;
    let (o, _) = run(&f.map, &a, &c, &p, 0);
    assert_eq!(o.status, 0, "{:?}", o.sense);
    let (_, d) = run(&f.map, &a, &cdb16(0x88, 100, 4), &[], 2048);
    assert!(d.iter().all(|&b| b == 0x42));
    p[16] = 0xE0;
    assert_eq!(asc(&run(&f.map, &a, &c, &p, 0).0), (5, 0x26, 0x07));
    c[13] = 40;
    assert_eq!(asc(&run(&f.map, &a, &c, &p[..40], 0).0), (5, 0x1A, 0));
    let mut r = [0u8; 16];
    r[0] = 0x84;
    r[1] = 3;
    r[13] = 255;
    let (o, d) = run(&f.map, &a, &r, &[], 255);
    assert_eq!(o.status, 0);
    assert_eq!(
        u32::from_be_bytes(d[..4].try_into().unwrap()) as usize + 4,
        d.len()
    );
}

mod fuzz {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]
        #[test]
        fn random_cdbs_never_panic(cdb in proptest::collection::vec(any::<u8>(), 0..20),
                                   data in proptest::collection::vec(any::<u8>(), 0..2048),
                                   limit in 0u32..70000) {
            let _ = crate::decode_cdb(&cdb);
            let f = fixture();
            let a = nexus(1, "iqn.a", 1);
            let mut marker = vec![0x5Au8; BLOCKS as usize * 512];
            marker[0] = 1;
            f.dev.write_at(&marker, 0).unwrap();
            let (o, _) = run(&f.map, &a, &cdb, &data, limit);
            if o.status != 0 {
                let mut back = vec![0u8; BLOCKS as usize * 512];
                f.dev.read_at(&mut back, 0).unwrap();
                // A failed command leaves the medium alone (COMPARE AND WRITE and
                // EXTENDED COPY may fail after a partial copy; neither happens with random data
                // against this marker except by a full miscompare).
                prop_assert!(back == marker, "cdb {:02x?} changed the medium and failed", cdb);
            }
        }
    }
}

#[test]
fn bad_fields_get_the_right_sense() {
    let f = fixture();
    let a = nexus(1, "iqn.a", 1);
    let mut ws16 = cdb16(0x93, 0, 0);
    ws16[1] = 0x08;
    let mut anchor = cdb16(0x93, 0, 1);
    anchor[1] = 0x10;
    let mut caw_big = cdb16(0x89, 0, 0);
    caw_big[13] = 255;
    let mut rc16_bad_sa = [0u8; 16];
    rc16_bad_sa[0] = 0x9E;
    rc16_bad_sa[1] = 0x1F;
    type Case = (Vec<u8>, Vec<u8>, (u8, u8, u8));
    let cases: Vec<Case> = vec![
        (
            vec![0x28, 0x60, 0, 0, 0, 0, 0, 0, 1, 0],
            vec![],
            (5, 0x24, 0),
        ), // RDPROTECT
        (
            vec![0x2F, 0x04, 0, 0, 0, 0, 0, 0, 1, 0],
            vec![],
            (5, 0x24, 0),
        ), // BYTCHK 2
        (vec![0x25, 0, 0, 0, 0, 1, 0, 0, 0, 0], vec![], (5, 0x24, 0)), // LBA without PMI
        (vec![0x1E, 0, 0, 0, 2, 0], vec![], (5, 0x24, 0)),             // PREVENT 2
        (
            vec![0x5E, 0x09, 0, 0, 0, 0, 0, 1, 0, 0],
            vec![],
            (5, 0x24, 0),
        ), // PR IN action
        (vec![0x35, 0, 0, 0, 4, 0, 0, 0, 1, 0], vec![], (5, 0x21, 0)), // SYNC beyond end
        (vec![0x34, 0, 0, 0, 4, 0, 0, 0, 1, 0], vec![], (5, 0x21, 0)), // PRE-FETCH beyond
        (ws16.to_vec(), vec![0; 512], (5, 0x24, 0)),                   // WSNZ
        (anchor.to_vec(), vec![0; 512], (5, 0x24, 0)),                 // ANCHOR
        (caw_big.to_vec(), vec![0; 1024], (5, 0x1A, 0)),               // short data-out
        (rc16_bad_sa.to_vec(), vec![], (5, 0x24, 0)),
        (
            vec![0x42, 1, 0, 0, 0, 0, 0, 0, 24, 0],
            vec![0; 24],
            (5, 0x24, 0),
        ), // UNMAP ANCHOR
        (vec![0x15, 0x11, 0, 0, 0, 0], vec![], (5, 0x24, 0)), // MODE SELECT SP
        (
            vec![0x5F, 0, 0, 0, 0, 0, 0, 0, 20, 0],
            vec![0; 20],
            (5, 0x1A, 0),
        ), // PR OUT length
        (vec![0xC0, 0, 0, 0, 0, 0, 0, 0, 0, 0], vec![], (5, 0x20, 0)),
        (vec![0x04, 0, 0, 0, 0, 0], vec![], (5, 0x20, 0)), // FORMAT UNIT
    ];
    for (cdb, data, want) in cases {
        let (o, d) = run(&f.map, &a, &cdb, &data, 512);
        assert_eq!(asc(&o), want, "cdb {cdb:02x?}");
        assert!(d.is_empty());
    }
    // Descriptor-format REQUEST SENSE with nothing pending.
    let (o, d) = run(&f.map, &a, &[0x03, 1, 0, 0, 252, 0], &[], 252);
    assert_eq!((o.status, d[0]), (0, 0x72));
}

#[test]
fn write_same_unmap_and_fill() {
    let f = fixture();
    let a = nexus(1, "iqn.a", 1);
    let mut ws = [0x41u8, 0, 0, 0, 0, 10, 0, 0, 5, 0];
    assert_eq!(run(&f.map, &a, &ws, &[0xEE; 512], 0).0.status, 0);
    let (_, d) = run(&f.map, &a, &cdb16(0x88, 10, 5), &[], 2560);
    assert!(d.iter().all(|&b| b == 0xEE));
    ws[1] = 0x08;
    assert_eq!(run(&f.map, &a, &ws, &[0; 512], 0).0.status, 0);
    let (_, d) = run(&f.map, &a, &cdb16(0x88, 10, 5), &[], 2560);
    assert!(d.iter().all(|&b| b == 0));
    let mut ndob = cdb16(0x93, 10, 5);
    ndob[1] = 0x09;
    assert_eq!(run(&f.map, &a, &ndob, &[], 0).0.status, 0);
}

/// A device that does WRITE SAME itself (as RBD does, through `rbd_writesame`).
struct SameDoer {
    inner: MemoryDevice,
    calls: std::sync::Mutex<Vec<(u64, u64, usize)>>,
}

impl BlockDevice for SameDoer {
    fn size_bytes(&self) -> u64 {
        self.inner.size_bytes()
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
        self.inner.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> std::io::Result<()> {
        self.inner.write_at(buf, offset)
    }
    fn write_vectored_at(&self, bufs: &[&[u8]], offset: u64) -> std::io::Result<()> {
        self.inner.write_vectored_at(bufs, offset)
    }
    fn flush(&self) -> std::io::Result<()> {
        self.inner.flush()
    }
    fn punch_hole(&self, offset: u64, len: u64) -> std::io::Result<()> {
        self.inner.punch_hole(offset, len)
    }
    fn allocation_map(&self, offset: u64, len: u64) -> std::io::Result<Vec<blockstore::Extent>> {
        self.inner.allocation_map(offset, len)
    }
    fn write_same(&self, offset: u64, len: u64, pattern: &[u8]) -> Option<std::io::Result<()>> {
        self.calls
            .lock()
            .unwrap()
            .push((offset, len, pattern.len()));
        let mut at = 0;
        while at < len {
            if let Err(e) = self.inner.write_at(pattern, offset + at) {
                return Some(Err(e));
            }
            at += pattern.len() as u64;
        }
        Some(Ok(()))
    }
}

/// WRITE SAME goes to a device that does it itself as one call with one block of pattern;
/// with UNMAP and zeros it is still a deallocation.
#[test]
fn write_same_is_left_to_a_device_that_does_it_itself() {
    let dev = Arc::new(SameDoer {
        inner: MemoryDevice::new(BLOCKS * 512),
        calls: std::sync::Mutex::new(Vec::new()),
    });
    let lu = Arc::new(
        LogicalUnit::new(
            config(dev.clone()),
            Arc::new(TargetPortGroups::one_per_port(1)),
        )
        .unwrap(),
    );
    let map = LunMap::new(vec![(0, lu)]);
    let a = nexus(1, "iqn.a", 1);
    run(&map, &a, &[0u8; 6], &[], 0);
    let ws = [0x41u8, 0, 0, 0, 0, 10, 0, 0, 5, 0];
    assert_eq!(run(&map, &a, &ws, &[0xEE; 512], 0).0.status, 0);
    assert_eq!(*dev.calls.lock().unwrap(), vec![(10 * 512, 5 * 512, 512)]);
    let (_, d) = run(&map, &a, &cdb16(0x88, 10, 5), &[], 2560);
    assert!(d.iter().all(|&b| b == 0xEE));
    let mut unmap = ws;
    unmap[1] = 0x08;
    assert_eq!(run(&map, &a, &unmap, &[0; 512], 0).0.status, 0);
    assert_eq!(
        dev.calls.lock().unwrap().len(),
        1,
        "UNMAP with zeros deallocates"
    );
    let (_, d) = run(&map, &a, &cdb16(0x88, 10, 5), &[], 2560);
    assert!(d.iter().all(|&b| b == 0));
}

#[test]
fn write_through_when_cache_disabled() {
    let dev = Arc::new(MemoryDevice::new(BLOCKS * 512));
    let cfg = LunConfig {
        write_cache: false,
        ..config(dev)
    };
    let lu = Arc::new(LogicalUnit::new(cfg, Arc::new(TargetPortGroups::one_per_port(1))).unwrap());
    let map = LunMap::new(vec![(0, lu)]);
    let a = nexus(1, "iqn.a", 1);
    let (_, d) = run(&map, &a, &[0x1A, 0x08, 0x08, 0, 255, 0], &[], 255);
    assert_eq!(d[6] & 0x04, 0);
    assert_eq!(run(&map, &a, &cdb16(0x8A, 0, 1), &[1; 512], 0).0.status, 0);
}

fn run_nowait(map: &LunMap, n: &Nexus, cdb: &[u8], data: &[u8]) -> Option<(ScsiOutcome, BytesMut)> {
    let segs = segments(data);
    let mut out = BytesMut::new();
    map.execute_nowait(&request(n, cdb, &segs, 1 << 20), &mut out)
        .map(|o| (o, out))
}

/// The event-loop path serves plain reads and buffered writes, and declines (changing nothing)
/// whatever needs a flush, a unit attention report, or is not I/O.
#[test]
fn nowait_path_serves_plain_io_and_declines_the_rest() {
    let f = fixture();
    let n = nexus(1, "iqn.2026-11.test:a", 1);
    f.map.nexus_added(&n);
    // The power-on unit attention is pending: the inline path must leave it to `execute`.
    assert!(run_nowait(&f.map, &n, &cdb16(0x88, 0, 1), &[]).is_none());
    let (o, _) = run(&f.map, &n, &[0u8; 6], &[], 0);
    assert_eq!(
        asc(&o),
        (0x06, 0x29, 0x00),
        "UA still reported after the declined attempt"
    );
    let data = vec![0x5au8; 1024];
    let (o, _) = run_nowait(&f.map, &n, &cdb16(0x8a, 10, 2), &data).expect("buffered write inline");
    assert_eq!(o.status, 0);
    let (o, out) = run_nowait(&f.map, &n, &cdb16(0x88, 10, 2), &[]).expect("read inline");
    assert_eq!(o.status, 0);
    assert_eq!(&out[..], &data[..]);
    // FUA needs a flush: declined, and nothing written.
    let mut fua = cdb16(0x8a, 20, 1);
    fua[1] = 0x08;
    assert!(run_nowait(&f.map, &n, &fua, &[1u8; 512]).is_none());
    let mut check = [0u8; 512];
    f.dev.read_at(&mut check, 20 * 512).unwrap();
    assert_eq!(check, [0u8; 512]);
    // Not I/O: declined.
    assert!(run_nowait(&f.map, &n, &[0u8; 6], &[]).is_none());
    // A bad LBA is answered inline with the same sense as the blocking path.
    let (o, _) = run_nowait(&f.map, &n, &cdb16(0x88, BLOCKS, 1), &[]).expect("answered");
    assert_eq!(asc(&o), (0x05, 0x21, 0x00));
}

/// A device whose writes wait for another machine (an HA pair's peer, Ceph's OSDs).
struct Remote(MemoryDevice);

impl BlockDevice for Remote {
    fn size_bytes(&self) -> u64 {
        self.0.size_bytes()
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
        self.0.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> std::io::Result<()> {
        self.0.write_at(buf, offset)
    }
    fn write_vectored_at(&self, bufs: &[&[u8]], offset: u64) -> std::io::Result<()> {
        self.0.write_vectored_at(bufs, offset)
    }
    fn flush(&self) -> std::io::Result<()> {
        self.0.flush()
    }
    fn punch_hole(&self, offset: u64, len: u64) -> std::io::Result<()> {
        self.0.punch_hole(offset, len)
    }
    fn allocation_map(&self, offset: u64, len: u64) -> std::io::Result<Vec<blockstore::Extent>> {
        self.0.allocation_map(offset, len)
    }
    fn writes_stay_local(&self) -> bool {
        false
    }
    fn writes_partial_blocks(&self) -> bool {
        false
    }
}

/// Buffered WRITEs queue on a few shared threads; a WRITE that waits for another machine must
/// not, or one lost peer holds up every LUN's writes.
#[test]
fn writes_that_wait_for_another_machine_are_not_buffered() {
    let f = fixture();
    let write10 = [0x2A, 0, 0, 0, 0, 10, 0, 0, 1, 0];
    assert!(f.map.is_buffered_write(0, &write10));
    let remote = Arc::new(Remote(MemoryDevice::new(BLOCKS * 512)));
    let lu = LogicalUnit::new(config(remote), f.tpgs.clone()).unwrap();
    assert!(!lu.is_buffered_write(&write10));
}

/// A device that keeps whole blocks only refuses a WRITE whose data-out ends inside a block
/// (writing nothing), and still takes the whole blocks of a short data-out.
#[test]
fn a_whole_block_device_refuses_data_out_that_ends_inside_a_block() {
    let f = fixture();
    let a = nexus(1, "iqn.2026-11.test:a", 1);
    f.map.nexus_added(&a);
    let remote = Arc::new(Remote(MemoryDevice::new(BLOCKS * 512)));
    let lu = Arc::new(LogicalUnit::new(config(remote.clone()), f.tpgs.clone()).unwrap());
    let map = LunMap::new(vec![(0, lu)]);
    map.nexus_added(&a);
    // The power-on unit attention first.
    let (o, _) = run(&map, &a, &[0u8; 6], &[], 0);
    assert_eq!(asc(&o).0, 0x06);
    let (o, _) = run(
        &map,
        &a,
        &[0x2A, 0, 0, 0, 0, 20, 0, 0, 1, 0],
        &[7u8; 200],
        0,
    );
    assert_eq!(asc(&o), (0x05, 0x0E, 0x03));
    let mut back = [0u8; 1024];
    remote.read_at(&mut back, 20 * 512).unwrap();
    assert!(
        back.iter().all(|&b| b == 0),
        "a refused write changed the disk"
    );
    // Two blocks asked for, one sent: the one is written.
    let (o, _) = run(
        &map,
        &a,
        &[0x2A, 0, 0, 0, 0, 20, 0, 0, 2, 0],
        &[9u8; 512],
        0,
    );
    assert_eq!(o.status, 0);
    remote.read_at(&mut back, 20 * 512).unwrap();
    assert!(back[..512].iter().all(|&b| b == 9) && back[512..].iter().all(|&b| b == 0));
}

/// A device that cannot read without sleeping is not asked to: the inline path declines a READ
/// before it prepares the READ's buffer (a megabyte of zeros, for nothing).
#[test]
fn a_device_without_nowait_reads_has_its_reads_declined_untouched() {
    let f = fixture();
    let a = nexus(1, "iqn.2026-11.test:a", 1);
    let remote = Arc::new(Remote(MemoryDevice::new(BLOCKS * 512)));
    let lu = Arc::new(LogicalUnit::new(config(remote), f.tpgs.clone()).unwrap());
    let map = LunMap::new(vec![(0, lu)]);
    map.nexus_added(&a);
    let (o, _) = run(&map, &a, &[0u8; 6], &[], 0);
    assert_eq!(asc(&o).0, 0x06, "the power-on unit attention first");
    let segs = segments(&[]);
    let mut out = BytesMut::new();
    let declined = map.execute_nowait(&request(&a, &cdb16(0x88, 10, 2), &segs, 1 << 20), &mut out);
    assert!(declined.is_none());
    assert_eq!((out.len(), out.capacity()), (0, 0), "no buffer prepared");
    f.map.nexus_added(&a);
    let _ = run(&f.map, &a, &[0u8; 6], &[], 0);
    assert!(
        run_nowait(&f.map, &a, &cdb16(0x88, 10, 2), &[]).is_some(),
        "the memory device reads inline"
    );
}
