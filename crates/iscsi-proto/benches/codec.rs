//! Criterion benchmarks of the PDU codec on the hot path: decoding a SCSI Command with
//! immediate data and a Data-Out, encoding a Data-In with status and a SCSI Response, with and
//! without CRC32C digests. Run: `cargo bench -p iscsi-proto --bench codec`.

use bytes::{Bytes, BytesMut};
use criterion::{black_box, criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use iscsi_proto::pdu::{DataIn, DataOut, Framer, Pdu, ScsiCommand, ScsiResponse};

fn framers() -> [(&'static str, Framer); 2] {
    [
        (
            "plain",
            Framer {
                max_recv_data_segment_length: 1 << 20,
                ..Framer::default()
            },
        ),
        (
            "crc32c",
            Framer {
                header_digest: true,
                data_digest: true,
                max_recv_data_segment_length: 1 << 20,
            },
        ),
    ]
}

fn write_cmd(len: usize) -> Pdu {
    let mut cdb = [0u8; 16];
    cdb[0] = 0x2a;
    Pdu::ScsiCommand(ScsiCommand {
        final_bit: true,
        write: true,
        attr: 1,
        itt: 7,
        expected_data_length: len as u32,
        cmd_sn: 42,
        cdb,
        data: Bytes::from(vec![0x5a; len]),
        ..ScsiCommand::default()
    })
}

fn decode(c: &mut Criterion) {
    for (name, framer) in framers() {
        for len in [4096usize, 131072] {
            for (kind, pdu) in [
                ("scsi-command", write_cmd(len)),
                (
                    "data-out",
                    Pdu::DataOut(DataOut {
                        final_bit: true,
                        itt: 7,
                        ttt: 9,
                        data: Bytes::from(vec![0xa5; len]),
                        ..DataOut::default()
                    }),
                ),
            ] {
                let wire = framer.encode_to_vec(&pdu);
                let mut g = c.benchmark_group(format!("decode/{kind}/{name}"));
                g.throughput(Throughput::Bytes(wire.len() as u64));
                g.bench_function(format!("{len}"), |b| {
                    b.iter_batched(
                        || BytesMut::from(&wire[..]),
                        |mut buf| black_box(framer.decode(&mut buf)),
                        BatchSize::SmallInput,
                    )
                });
                g.finish();
            }
        }
    }
}

fn encode(c: &mut Criterion) {
    for (name, framer) in framers() {
        for len in [4096usize, 131072] {
            let data_in = Pdu::DataIn(DataIn {
                final_bit: true,
                status_present: true,
                itt: 7,
                data: Bytes::from(vec![1u8; len]),
                ..DataIn::default()
            });
            let mut scratch = BytesMut::with_capacity(4096);
            let mut g = c.benchmark_group(format!("encode/data-in/{name}"));
            g.throughput(Throughput::Bytes(len as u64));
            g.bench_function(format!("{len}"), |b| {
                b.iter(|| black_box(framer.encode(&data_in, &mut scratch).wire_len()))
            });
            g.finish();
        }
        let resp = Pdu::ScsiResponse(ScsiResponse {
            itt: 7,
            ..ScsiResponse::default()
        });
        let mut scratch = BytesMut::with_capacity(4096);
        c.bench_function(&format!("encode/scsi-response/{name}"), |b| {
            b.iter(|| black_box(framer.encode(&resp, &mut scratch).wire_len()))
        });
    }
}

criterion_group!(benches, decode, encode);
criterion_main!(benches);
