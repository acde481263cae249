//! Free loopback ports for tests that must name their ports before a server binds them.

use std::net::{SocketAddr, TcpListener};

/// `N` distinct free addresses on 127.0.0.1. Every listener is held until all are picked, so
/// two of them are never the same port (one released port is often the very next one handed
/// out). Another process may still take one before the caller binds it: a caller that can,
/// retries on "address in use".
pub fn free_addrs<const N: usize>() -> [SocketAddr; N] {
    let held: [TcpListener; N] =
        std::array::from_fn(|_| TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0"));
    std::array::from_fn(|i| held[i].local_addr().expect("local address"))
}

/// `N` distinct free ports on 127.0.0.1 (see [`free_addrs`]).
pub fn free_ports<const N: usize>() -> [u16; N] {
    free_addrs::<N>().map(|a| a.port())
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_ports_are_distinct() {
        let ports = super::free_ports::<16>();
        let mut sorted = ports.to_vec();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted.len(), 16, "{ports:?}");
    }
}
