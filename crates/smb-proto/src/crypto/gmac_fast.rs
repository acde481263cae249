//! AES-128-GMAC of a large message through `ring`'s AES-GCM, whose assembly hashes ciphertext
//! many blocks at a time (12-13 GB/s on one core here) where GHASH over associated data, in
//! `ring` as in RustCrypto's `ghash`, goes one block at a time (2.2-2.9 GB/s). Signing a 1 MiB
//! READ or WRITE with GMAC was most of a signed session's server CPU.
//!
//! GMAC(M) is the GCM tag with M as associated data and no plaintext:
//! `E(K, J0) ^ GHASH(M || pad || [8 |M|]_64 || [0]_64)`. GCM encryption with no associated data
//! whose *ciphertext* is M gives `E(K, J0) ^ GHASH(M || pad || [0]_64 || [8 |M|]_64)`: the same
//! blocks, only the final length block differs, and GHASH is linear, so the two tags differ by
//! `(L_a ^ L_c) * H` with `H = E(K, 0)`. The ciphertext is M when the plaintext is
//! `M ^ keystream`, and encrypting M once gives exactly that: so M is copied into a scratch
//! buffer, encrypted twice in place under the signature's nonce (the first pass turns it into
//! `M ^ keystream`, the second back into M, with the tag), and the tag corrected. The nonce's
//! keystream never leaves this function: nothing encrypted here is sent.

use std::cell::RefCell;

use aes::cipher::{generic_array::GenericArray, BlockEncrypt, KeyInit};
use aes::Aes128;
use ghash::universal_hash::UniversalHash;
use ghash::GHash;

/// Below this many bytes the one-block GHASH of `signing.rs` is cheaper than two passes here.
const FAST_FROM: usize = 4096;

thread_local! {
    /// One scratch buffer per thread, grown to the largest message signed on it.
    static SCRATCH: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// GMAC under `key` and the 12-byte `nonce` of the concatenation of `parts`; `None` for a
/// message shorter than [`FAST_FROM`] or one `ring` refuses (longer than GCM allows): the caller
/// then hashes it block by block.
pub(crate) fn gmac(key: &[u8; 16], nonce: &[u8; 12], parts: &[&[u8]]) -> Option<[u8; 16]> {
    let total: usize = parts.iter().map(|p| p.len()).sum();
    if total < FAST_FROM {
        return None;
    }
    through_gcm(key, nonce, parts, total)
}

/// The derivation itself, for any length.
fn through_gcm(
    key: &[u8; 16],
    nonce: &[u8; 12],
    parts: &[&[u8]],
    total: usize,
) -> Option<[u8; 16]> {
    let k = ring::aead::LessSafeKey::new(
        ring::aead::UnboundKey::new(&ring::aead::AES_128_GCM, key).ok()?,
    );
    let tag = SCRATCH.with(|s| {
        let mut buf = s.borrow_mut();
        buf.clear();
        buf.reserve(total);
        for p in parts {
            buf.extend_from_slice(p);
        }
        let seal = |b: &mut [u8]| {
            k.seal_in_place_separate_tag(
                ring::aead::Nonce::assume_unique_for_key(*nonce),
                ring::aead::Aad::empty(),
                b,
            )
        };
        // The first pass's tag means nothing (its ciphertext is not M).
        let _ = seal(&mut buf).ok()?;
        seal(&mut buf).ok()
    })?;
    // (L_a ^ L_c) * H: the length block with the bit length in both halves, times H.
    let aes = Aes128::new(GenericArray::from_slice(key));
    let mut h = GenericArray::default();
    aes.encrypt_block(&mut h);
    let bits = (total as u64).wrapping_mul(8).to_be_bytes();
    let mut l = [0u8; 16];
    l[..8].copy_from_slice(&bits);
    l[8..].copy_from_slice(&bits);
    let mut gh = GHash::new(&h);
    gh.update(&[GenericArray::from(l)]);
    let fix = gh.finalize();
    let mut out = [0u8; 16];
    for ((o, t), f) in out.iter_mut().zip(tag.as_ref()).zip(fix.iter()) {
        *o = t ^ f;
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crypto::signing::gmac_aes128;

    #[test]
    fn equals_the_block_by_block_gmac_for_any_length_and_split() {
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        for len in [
            1usize,
            15,
            16,
            17,
            64,
            4095,
            4096,
            4097,
            65_536,
            65_600,
            1 << 20,
        ] {
            let key: [u8; 16] = core::array::from_fn(|_| next() as u8);
            let nonce: [u8; 12] = core::array::from_fn(|_| next() as u8);
            let msg: Vec<u8> = (0..len).map(|_| next() as u8).collect();
            let cut1 = (next() as usize) % (len + 1);
            let cut2 = cut1 + (next() as usize) % (len - cut1 + 1);
            let parts = [&msg[..cut1], &msg[cut1..cut2], &msg[cut2..]];
            let want = gmac_aes128(&key, &nonce, &[&msg]);
            let fast = |n: &[u8; 12], p: &[&[u8]]| through_gcm(&key, n, p, len);
            assert_eq!(fast(&nonce, &parts), Some(want), "length {len}");
            let expected = (len >= FAST_FROM).then_some(want);
            assert_eq!(gmac(&key, &nonce, &parts), expected, "length {len}");
            // Another nonce or one changed byte gives another tag.
            let mut other = nonce;
            other[0] ^= 1;
            assert_ne!(fast(&other, &parts), Some(want));
            let mut changed = msg.clone();
            changed[len / 2] ^= 0x10;
            assert_ne!(fast(&nonce, &[&changed]), Some(want));
        }
    }
}
