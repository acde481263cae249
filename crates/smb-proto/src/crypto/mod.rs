//! Preauth integrity, the SMB 3.1.1 key schedule, signing and encryption.
