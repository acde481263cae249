//! Fuzz target: the SCSI CDB decoder must never panic, whatever the bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = scsi::decode_cdb(data);
});
