//! The few CDBs the initiator builds (SBC-3, SPC-4) and the sense data it reads.

/// READ(16).
pub fn read16(lba: u64, blocks: u32) -> [u8; 16] {
    let mut c = [0u8; 16];
    c[0] = 0x88;
    c[2..10].copy_from_slice(&lba.to_be_bytes());
    c[10..14].copy_from_slice(&blocks.to_be_bytes());
    c
}

/// WRITE(16).
pub fn write16(lba: u64, blocks: u32) -> [u8; 16] {
    let mut c = read16(lba, blocks);
    c[0] = 0x8a;
    c
}

/// TEST UNIT READY.
pub fn test_unit_ready() -> [u8; 16] {
    [0u8; 16]
}

/// INQUIRY (standard data, or a VPD page).
pub fn inquiry(vpd_page: Option<u8>, allocation: u16) -> [u8; 16] {
    let mut c = [0u8; 16];
    c[0] = 0x12;
    if let Some(page) = vpd_page {
        c[1] = 1;
        c[2] = page;
    }
    c[3..5].copy_from_slice(&allocation.to_be_bytes());
    c
}

/// READ CAPACITY(16) (SERVICE ACTION IN(16)).
pub fn read_capacity16() -> [u8; 16] {
    let mut c = [0u8; 16];
    c[0] = 0x9e;
    c[1] = 0x10;
    c[13] = 32;
    c
}

/// (sense key, ASC, ASCQ) of fixed or descriptor format sense data.
pub fn sense_triplet(sense: &[u8]) -> Option<(u8, u8, u8)> {
    let at = |i: usize| sense.get(i).copied();
    match at(0).map(|b| b & 0x7f)? {
        0x70 | 0x71 => Some((at(2)? & 0x0f, at(12)?, at(13)?)),
        0x72 | 0x73 => Some((at(1)? & 0x0f, at(2)?, at(3)?)),
        _ => None,
    }
}

/// SCSI status CHECK CONDITION.
pub const CHECK_CONDITION: u8 = 0x02;
/// Sense key UNIT ATTENTION.
pub const UNIT_ATTENTION: u8 = 0x06;
