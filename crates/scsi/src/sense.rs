//! Sense data (SPC-4 4.5): the key/ASC/ASCQ triples this crate reports and their wire formats.

/// SCSI status codes (SAM-5 5.3).
pub mod status {
    /// GOOD.
    pub const GOOD: u8 = 0x00;
    /// CHECK CONDITION: sense data describes the failure.
    pub const CHECK_CONDITION: u8 = 0x02;
    /// CONDITION MET (PRE-FETCH when the range fits the cache).
    pub const CONDITION_MET: u8 = 0x04;
    /// BUSY.
    pub const BUSY: u8 = 0x08;
    /// RESERVATION CONFLICT.
    pub const RESERVATION_CONFLICT: u8 = 0x18;
    /// TASK SET FULL.
    pub const TASK_SET_FULL: u8 = 0x28;
    /// TASK ABORTED: ended by another I_T nexus's task management (the control mode page's TAS
    /// bit is set).
    pub const TASK_ABORTED: u8 = 0x40;
}

/// Sense keys (SPC-4 table 27).
pub mod key {
    /// NO SENSE.
    pub const NO_SENSE: u8 = 0x0;
    /// NOT READY.
    pub const NOT_READY: u8 = 0x2;
    /// MEDIUM ERROR.
    pub const MEDIUM_ERROR: u8 = 0x3;
    /// HARDWARE ERROR.
    pub const HARDWARE_ERROR: u8 = 0x4;
    /// ILLEGAL REQUEST.
    pub const ILLEGAL_REQUEST: u8 = 0x5;
    /// UNIT ATTENTION.
    pub const UNIT_ATTENTION: u8 = 0x6;
    /// DATA PROTECT.
    pub const DATA_PROTECT: u8 = 0x7;
    /// COPY ABORTED.
    pub const COPY_ABORTED: u8 = 0xA;
    /// ABORTED COMMAND.
    pub const ABORTED_COMMAND: u8 = 0xB;
    /// MISCOMPARE.
    pub const MISCOMPARE: u8 = 0xE;
}

/// One sense condition: key, additional sense code and qualifier, plus optional fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sense {
    /// Sense key.
    pub key: u8,
    /// Additional sense code.
    pub asc: u8,
    /// Additional sense code qualifier.
    pub ascq: u8,
    /// INFORMATION field (e.g. miscompare offset), VALID bit set when present.
    pub info: Option<u64>,
    /// Sense-key-specific bytes 15..18 (SKSV is bit 7 of the first byte).
    pub specific: Option<[u8; 3]>,
}

impl Sense {
    /// A condition without INFORMATION or sense-key-specific data.
    pub const fn new(key: u8, asc: u8, ascq: u8) -> Self {
        Self {
            key,
            asc,
            ascq,
            info: None,
            specific: None,
        }
    }

    /// ILLEGAL REQUEST, INVALID FIELD IN CDB, pointing at `byte` (and `bit`, if known).
    pub fn invalid_cdb(byte: usize, bit: Option<u8>) -> Self {
        Self::field_pointer(0x24, true, byte, bit)
    }

    /// ILLEGAL REQUEST, INVALID FIELD IN PARAMETER LIST, pointing at `byte` of the data-out.
    pub fn invalid_param(byte: usize, bit: Option<u8>) -> Self {
        Self::field_pointer(0x26, false, byte, bit)
    }

    fn field_pointer(asc: u8, in_cdb: bool, byte: usize, bit: Option<u8>) -> Self {
        let ptr = u16::try_from(byte).unwrap_or(u16::MAX).to_be_bytes();
        let mut b0 = 0x80 | if in_cdb { 0x40 } else { 0 };
        if let Some(bit) = bit {
            b0 |= 0x08 | (bit & 7);
        }
        Self {
            specific: Some([b0, ptr[0], ptr[1]]),
            ..Self::new(key::ILLEGAL_REQUEST, asc, 0)
        }
    }

    /// ILLEGAL REQUEST, INVALID COMMAND OPERATION CODE.
    pub const fn invalid_opcode() -> Self {
        Self::new(key::ILLEGAL_REQUEST, 0x20, 0)
    }
    /// ILLEGAL REQUEST, LOGICAL BLOCK ADDRESS OUT OF RANGE.
    pub const fn lba_out_of_range() -> Self {
        Self::new(key::ILLEGAL_REQUEST, 0x21, 0)
    }
    /// ILLEGAL REQUEST, PARAMETER LIST LENGTH ERROR.
    pub const fn param_list_length() -> Self {
        Self::new(key::ILLEGAL_REQUEST, 0x1A, 0)
    }
    /// ILLEGAL REQUEST, LOGICAL UNIT NOT SUPPORTED.
    pub const fn lun_not_supported() -> Self {
        Self::new(key::ILLEGAL_REQUEST, 0x25, 0)
    }
    /// ILLEGAL REQUEST, INVALID FIELD IN INFORMATION UNIT: the data-out does not fit the
    /// command (SAM-5 5.4.3: a transport's underflow the device server cannot use).
    pub const fn invalid_field_in_iu() -> Self {
        Self::new(key::ILLEGAL_REQUEST, 0x0E, 0x03)
    }
    /// ILLEGAL REQUEST, SAVING PARAMETERS NOT SUPPORTED.
    pub const fn saving_not_supported() -> Self {
        Self::new(key::ILLEGAL_REQUEST, 0x39, 0)
    }
    /// DATA PROTECT, WRITE PROTECTED.
    pub const fn write_protected() -> Self {
        Self::new(key::DATA_PROTECT, 0x27, 0)
    }
    /// MEDIUM ERROR, UNRECOVERED READ ERROR (backend read failed).
    pub const fn read_error() -> Self {
        Self::new(key::MEDIUM_ERROR, 0x11, 0)
    }
    /// MEDIUM ERROR, WRITE ERROR (backend write failed).
    pub const fn write_error() -> Self {
        Self::new(key::MEDIUM_ERROR, 0x0C, 0)
    }
    /// A backend failure as the initiator should see it: a device that cannot serve through
    /// this port now (`NotConnected`: a replica that lost its peer and its epoch) reports NOT
    /// READY, LOGICAL UNIT NOT ACCESSIBLE, TARGET PORT IN UNAVAILABLE STATE, which multipath
    /// initiators answer by retrying on another path; anything else is `fallback`.
    pub fn device(e: &std::io::Error, fallback: Sense) -> Self {
        if e.kind() == std::io::ErrorKind::NotConnected {
            Self::new(key::NOT_READY, 0x04, 0x0C)
        } else {
            fallback
        }
    }
    /// HARDWARE ERROR, INTERNAL TARGET FAILURE.
    pub const fn internal_failure() -> Self {
        Self::new(key::HARDWARE_ERROR, 0x44, 0)
    }
    /// MISCOMPARE, MISCOMPARE DURING VERIFY OPERATION at byte `offset`.
    pub const fn miscompare(offset: u64) -> Self {
        Self {
            info: Some(offset),
            ..Self::new(key::MISCOMPARE, 0x1D, 0)
        }
    }
    /// UNIT ATTENTION with the given ASC/ASCQ.
    pub const fn unit_attention(asc: u8, ascq: u8) -> Self {
        Self::new(key::UNIT_ATTENTION, asc, ascq)
    }

    /// Fixed-format sense data (response code 70h), 18 bytes.
    pub fn to_fixed_bytes(&self) -> [u8; 18] {
        let mut b = [0u8; 18];
        b[0] = 0x70;
        b[2] = self.key & 0x0F;
        if let Some(info) = self.info {
            b[0] |= 0x80;
            // Fixed format carries only 32 bits of INFORMATION.
            b[3..7].copy_from_slice(&(info as u32).to_be_bytes());
        }
        b[7] = 10;
        b[12] = self.asc;
        b[13] = self.ascq;
        if let Some(s) = self.specific {
            b[15..18].copy_from_slice(&s);
        }
        b
    }

    /// Descriptor-format sense data (response code 72h) with information and
    /// sense-key-specific descriptors when present.
    pub fn to_descriptor_bytes(&self) -> Vec<u8> {
        let mut b = vec![0x72, self.key & 0x0F, self.asc, self.ascq, 0, 0, 0, 0];
        if let Some(info) = self.info {
            b.extend_from_slice(&[0x00, 0x0A, 0x80, 0]);
            b.extend_from_slice(&info.to_be_bytes());
        }
        if let Some(s) = self.specific {
            b.extend_from_slice(&[0x02, 0x06, 0, 0, s[0], s[1], s[2], 0]);
        }
        let add = (b.len() - 8) as u8;
        if let Some(x) = b.get_mut(7) {
            *x = add;
        }
        b
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fixed_layout() {
        let s = Sense::invalid_cdb(2, Some(5));
        let b = s.to_fixed_bytes();
        assert_eq!(b[0], 0x70);
        assert_eq!(b[2], 5);
        assert_eq!(b[7], 10);
        assert_eq!((b[12], b[13]), (0x24, 0));
        assert_eq!(&b[15..18], &[0xCD, 0, 2]);
        let m = Sense::miscompare(513).to_fixed_bytes();
        assert_eq!(m[0], 0xF0);
        assert_eq!(&m[3..7], &513u32.to_be_bytes());
        let d = Sense::miscompare(7).to_descriptor_bytes();
        assert_eq!(d[0], 0x72);
        assert_eq!(d[7] as usize, d.len() - 8);
    }
}
