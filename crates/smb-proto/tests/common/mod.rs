//! Shared test helpers and the published captures the tests check against.
#![allow(dead_code)]

pub mod captures;
pub mod frames;

pub fn hex(s: &str) -> Vec<u8> {
    let s: String = s.chars().filter(|c| !c.is_whitespace()).collect();
    assert!(s.len().is_multiple_of(2), "odd hex length");
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex digit"))
        .collect()
}

pub fn hex16(s: &str) -> [u8; 16] {
    hex(s).try_into().expect("16 bytes")
}
