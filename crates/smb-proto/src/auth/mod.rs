//! Authentication: NTLMv2 on the server side and the SPNEGO wrapping around it.
