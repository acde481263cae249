//! Serial number arithmetic (RFC 1982, as RFC 7143 3.2.2.1 requires for CmdSN, StatSN, DataSN).

/// `a < b` in 32-bit serial arithmetic.
pub fn lt(a: u32, b: u32) -> bool {
    a != b && b.wrapping_sub(a) < 0x8000_0000
}

/// `a <= b` in 32-bit serial arithmetic.
pub fn le(a: u32, b: u32) -> bool {
    a == b || lt(a, b)
}

/// `a > b` in 32-bit serial arithmetic.
pub fn gt(a: u32, b: u32) -> bool {
    lt(b, a)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wraps() {
        assert!(lt(0xffff_fff0, 5));
        assert!(gt(5, 0xffff_fff0));
        assert!(le(7, 7));
        assert!(!lt(7, 7));
        assert!(lt(1, 2));
        assert!(!lt(2, 1));
    }
}
