//! Tests of `DataOutTracker`: immediate, unsolicited and solicited data, and the errors.

use super::*;
use bytes::Bytes;

fn params(edtl: u32, imm: u32) -> WriteParams {
    WriteParams {
        expected_data_length: edtl,
        immediate_length: imm,
        unsolicited_follows: true,
        initial_r2t: false,
        immediate_data: true,
        first_burst_length: 8192,
        max_burst_length: 16384,
        max_outstanding_r2t: 2,
        max_recv_data_segment_length: 4096,
    }
}

fn data_out(ttt: u32, data_sn: u32, offset: u32, len: usize, final_bit: bool) -> DataOut {
    DataOut {
        final_bit,
        ttt,
        data_sn,
        buffer_offset: offset,
        data: Bytes::from(vec![0u8; len]),
        ..DataOut::default()
    }
}

fn planned(t: &mut DataOutTracker) -> Vec<R2tRequest> {
    let mut out = Vec::new();
    t.next_r2ts(tags(), &mut out);
    out
}

fn tags() -> impl FnMut() -> u32 {
    let mut n = 100;
    move || {
        n += 1;
        n
    }
}

#[test]
fn immediate_unsolicited_then_solicited() {
    let mut t = DataOutTracker::new(params(40960, 2048)).unwrap();
    // Unsolicited burst: 2048..8192, then R2Ts for 8192..40960 in 16 KiB bursts, 2 at a time.
    let r2ts = planned(&mut t);
    assert_eq!(
        r2ts,
        vec![
            R2tRequest {
                ttt: 101,
                r2t_sn: 0,
                offset: 8192,
                length: 16384
            },
            R2tRequest {
                ttt: 102,
                r2t_sn: 1,
                offset: 24576,
                length: 16384
            },
        ]
    );
    assert!(planned(&mut t).is_empty());
    let p = t
        .on_data_out(&data_out(RESERVED_TAG, 0, 2048, 4096, false))
        .unwrap();
    assert!(!p.burst_done);
    let p = t
        .on_data_out(&data_out(RESERVED_TAG, 1, 6144, 2048, true))
        .unwrap();
    assert!(p.burst_done && !p.all_done);
    for (i, off) in (8192..24576).step_by(4096).enumerate() {
        let last = off + 4096 == 24576;
        let p = t
            .on_data_out(&data_out(101, i as u32, off, 4096, last))
            .unwrap();
        assert_eq!(p.burst_done, last);
    }
    for (i, off) in (24576..40960).step_by(4096).enumerate() {
        let p = t
            .on_data_out(&data_out(102, i as u32, off, 4096, off + 4096 == 40960))
            .unwrap();
        assert_eq!(p.all_done, off + 4096 == 40960);
    }
    assert!(t.is_complete());
    assert!(planned(&mut t).is_empty());
}

#[test]
fn short_unsolicited_burst_leaves_a_hole_for_r2t() {
    let mut p = params(8192, 0);
    p.max_outstanding_r2t = 1;
    let mut t = DataOutTracker::new(p).unwrap();
    assert!(planned(&mut t).is_empty());
    t.on_data_out(&data_out(RESERVED_TAG, 0, 0, 1024, true))
        .unwrap();
    assert_eq!(
        planned(&mut t),
        vec![R2tRequest {
            ttt: 101,
            r2t_sn: 0,
            offset: 1024,
            length: 7168
        }]
    );
    assert_eq!(
        t.on_data_out(&data_out(RESERVED_TAG, 1, 1024, 512, false)),
        Err(DataOutError::UnsolicitedNotAllowed)
    );
}

#[test]
fn initial_r2t_yes_means_no_unsolicited_data() {
    let mut p = params(4096, 0);
    p.initial_r2t = true;
    let mut t = DataOutTracker::new(p).unwrap();
    assert_eq!(
        t.on_data_out(&data_out(RESERVED_TAG, 0, 0, 512, false)),
        Err(DataOutError::UnsolicitedNotAllowed)
    );
    let r2t = planned(&mut t);
    assert_eq!(r2t.len(), 1);
    assert_eq!((r2t[0].offset, r2t[0].length), (0, 4096));
    let done = t.on_data_out(&data_out(101, 0, 0, 4096, true)).unwrap();
    assert!(done.all_done && done.burst_done);
}

#[test]
fn immediate_data_only() {
    let t = DataOutTracker::new(WriteParams {
        unsolicited_follows: false,
        ..params(2048, 2048)
    })
    .unwrap();
    assert!(t.is_complete());
    assert_eq!(
        DataOutTracker::new(params(2048, 4096)).unwrap_err(),
        DataOutError::ImmediateData { len: 4096 }
    );
    let no_imm = WriteParams {
        immediate_data: false,
        ..params(2048, 512)
    };
    assert!(DataOutTracker::new(no_imm).is_err());
}

#[test]
fn sequence_errors() {
    let mut p = params(16384, 0);
    p.initial_r2t = true;
    let mut t = DataOutTracker::new(p).unwrap();
    planned(&mut t);
    assert_eq!(
        t.on_data_out(&data_out(999, 0, 0, 512, false)),
        Err(DataOutError::UnknownTransferTag(999))
    );
    assert_eq!(
        t.on_data_out(&data_out(101, 1, 0, 512, false)),
        Err(DataOutError::DataSn {
            expected: 0,
            got: 1
        })
    );
    assert_eq!(
        t.on_data_out(&data_out(101, 0, 16000, 512, false)),
        Err(DataOutError::OutsideRange {
            offset: 16000,
            len: 512
        })
    );
    assert_eq!(
        t.on_data_out(&data_out(101, 0, 0, 8192, false)),
        Err(DataOutError::TooLong { len: 8192 })
    );
    t.on_data_out(&data_out(101, 0, 0, 1024, false)).unwrap();
    assert_eq!(
        t.on_data_out(&data_out(101, 1, 512, 1024, false)),
        Err(DataOutError::Overlap {
            offset: 512,
            len: 1024
        })
    );
    assert_eq!(
        t.on_data_out(&data_out(101, 1, 1024, 1024, true)),
        Err(DataOutError::EarlyFinal)
    );
    assert_eq!(
        DataOutError::UnknownTransferTag(1).reject_reason(),
        reject_reason::INVALID_PDU_FIELD
    );
    assert_eq!(
        DataOutError::EarlyFinal.reject_reason(),
        reject_reason::PROTOCOL_ERROR
    );
}

#[test]
fn out_of_order_pdus_within_a_burst_are_accepted_without_overlap() {
    let mut p = params(4096, 0);
    p.initial_r2t = true;
    let mut t = DataOutTracker::new(p).unwrap();
    planned(&mut t);
    t.on_data_out(&data_out(101, 0, 2048, 2048, false)).unwrap();
    let p = t.on_data_out(&data_out(101, 1, 0, 2048, true)).unwrap();
    assert!(p.all_done);
}
