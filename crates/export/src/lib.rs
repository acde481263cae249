//! lanes' device exports: an NBD server (newstyle fixed handshake) and a FUSE file, both over
//! the [`Device`] trait that lanes' multipath device implements.
