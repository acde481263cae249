//! A fixed workload for instruction counting (`bench/codec-instructions` runs it under
//! `valgrind --tool=callgrind`): decode N SCSI Commands with 4 KiB of immediate data and
//! encode N Data-In + status PDUs, with CRC32C digests. Instruction counts are repeatable where
//! timings on a shared machine are not.

use bytes::{Bytes, BytesMut};
use iscsi_proto::pdu::{DataIn, Framer, Pdu, ScsiCommand};

fn main() {
    let n: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(10_000);
    let framer = Framer {
        header_digest: true,
        data_digest: true,
        max_recv_data_segment_length: 1 << 20,
    };
    let mut cdb = [0u8; 16];
    cdb[0] = 0x2a;
    let cmd = Pdu::ScsiCommand(ScsiCommand {
        final_bit: true,
        write: true,
        attr: 1,
        expected_data_length: 4096,
        cdb,
        data: Bytes::from(vec![0x5a; 4096]),
        ..ScsiCommand::default()
    });
    let wire = framer.encode_to_vec(&cmd);
    let mut stream = BytesMut::with_capacity(wire.len() * n);
    for _ in 0..n {
        stream.extend_from_slice(&wire);
    }
    let mut decoded = 0usize;
    while let Ok(Some(_)) = framer.decode(&mut stream) {
        decoded += 1;
    }
    let payload = Bytes::from(vec![1u8; 4096]);
    let mut scratch = BytesMut::with_capacity(4096);
    let mut bytes = 0usize;
    for i in 0..n {
        let pdu = Pdu::DataIn(DataIn {
            final_bit: true,
            status_present: true,
            itt: i as u32,
            data: payload.clone(),
            ..DataIn::default()
        });
        bytes += framer.encode(&pdu, &mut scratch).wire_len();
    }
    println!("decoded {decoded} commands, encoded {n} Data-In ({bytes} bytes)");
}
