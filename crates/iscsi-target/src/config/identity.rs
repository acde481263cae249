//! Stable LUN identity: serial numbers and NAA-6 designators that survive restarts.
//!
//! dm-multipath groups paths by WWID, so every portal must report the same designator for a LUN
//! and it must not change when `lanes serve` restarts. Both are derived only from the target
//! name and the LUN's serial (itself derived from the target name and LUN number by default).

use sha2::{Digest, Sha256};

use super::LunConfig;

/// The 24-bit IEEE company id in our NAA-6 designators: `0x0A6C61` ("la" after the `0x0A`).
///
/// Its first octet `0x0A` has the local (X) bit set and the multicast (M) bit clear, which makes
/// it a CID, a company id from the block IEEE keeps for local administration: it can never
/// collide with a vendor's registered OUI.
pub const NAA_COMPANY_ID: u32 = 0x0A_6C_61;

/// The default unit serial number: 16 hex digits hashed from the target name and LUN number.
pub fn default_serial(target_name: &str, lun: u64) -> String {
    let digest = Sha256::new()
        .chain_update(b"lanes serial\0")
        .chain_update(target_name.as_bytes())
        .chain_update(b"\0")
        .chain_update(lun.to_be_bytes())
        .finalize();
    digest[..8].iter().map(|b| format!("{b:02x}")).collect()
}

/// The NAA IEEE Registered Extended designator (NAA 6, SPC-4 7.8.6.6.4) of a LUN: 4 bits NAA,
/// 24 bits [`NAA_COMPANY_ID`], then 100 bits of SHA-256 over the target name and serial.
pub fn naa_id(target_name: &str, lun: &LunConfig) -> [u8; 16] {
    let serial = lun.effective_serial(target_name);
    let digest = Sha256::new()
        .chain_update(b"lanes naa\0")
        .chain_update(target_name.as_bytes())
        .chain_update(b"\0")
        .chain_update(serial.as_bytes())
        .finalize();
    let mut low = [0u8; 16];
    low.copy_from_slice(&digest[..16]);
    let hash_bits = u128::from_be_bytes(low) & ((1u128 << 100) - 1);
    let value = (6u128 << 124) | (u128::from(NAA_COMPANY_ID) << 100) | hash_bits;
    value.to_be_bytes()
}

/// The WWID Linux shows for an NAA designator (`/dev/disk/by-id/wwn-…`, `multipath -ll`): the
/// designator type 3 followed by the 32 hex digits, e.g. `360a6c61…`.
pub fn wwid_string(naa: &[u8; 16]) -> String {
    let mut wwid = String::with_capacity(33);
    wwid.push('3');
    for byte in naa {
        wwid.push_str(&format!("{byte:02x}"));
    }
    wwid
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn naa_is_stable_and_well_formed() {
        let lun = LunConfig::new(0, "/tmp/disk0.img".into());
        let id = naa_id("iqn.2026-11.io.lanes:host", &lun);
        assert_eq!(id[0] >> 4, 6, "NAA 6");
        assert_eq!(
            id,
            naa_id("iqn.2026-11.io.lanes:host", &lun),
            "deterministic"
        );
        let wwid = wwid_string(&id);
        assert_eq!(wwid.len(), 33);
        assert!(wwid.starts_with("360a6c61"), "{wwid}");

        // The path does not matter, the LUN number and target do.
        let moved = LunConfig::new(0, "/elsewhere.img".into());
        assert_eq!(id, naa_id("iqn.2026-11.io.lanes:host", &moved));
        let other = LunConfig::new(1, "/tmp/disk0.img".into());
        assert_ne!(id, naa_id("iqn.2026-11.io.lanes:host", &other));
        assert_ne!(id, naa_id("iqn.2026-11.io.lanes:other", &lun));

        // An explicit serial decides the identity.
        let mut with_serial = other.clone();
        with_serial.serial = Some(default_serial("iqn.2026-11.io.lanes:host", 0));
        assert_eq!(id, naa_id("iqn.2026-11.io.lanes:host", &with_serial));
    }

    #[test]
    fn serial_is_sixteen_hex_digits() {
        let serial = default_serial("iqn.2026-11.io.lanes:host", 3);
        assert_eq!(serial.len(), 16);
        assert!(serial.bytes().all(|b| b.is_ascii_hexdigit()));
    }
}
