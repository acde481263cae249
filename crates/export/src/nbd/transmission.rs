//! Checking transmission requests against the export before anything touches the device:
//! each request header becomes an [`Action`] to run, an error to answer, or a disconnect.
//! Sans-IO; the error choices follow proto.md "Error values" and "Size constraints".

use super::proto::{Command, CommandFlags, ErrorCode, Request};

/// Largest READ or WRITE payload accepted: 32 MiB, the size "Size constraints" says a server
/// SHOULD NOT consider a denial of service.
pub const MAX_PAYLOAD: u32 = 32 << 20;

/// What the checks need to know about the export.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Export size in bytes.
    pub size: u64,
    /// Largest READ or WRITE payload.
    pub max_payload: u32,
}

/// A request that passed the checks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    Read {
        offset: u64,
        length: u32,
    },
    /// The payload (`length` bytes) follows the header.
    Write {
        offset: u64,
        length: u32,
        fua: bool,
    },
    Flush,
    Trim {
        offset: u64,
        length: u32,
        fua: bool,
    },
    /// `NBD_CMD_FLAG_NO_HOLE` needs nothing extra: [`crate::Device::write_zeroes`] leaves the
    /// provisioning to the device.
    WriteZeroes {
        offset: u64,
        length: u32,
        fua: bool,
    },
    /// `NBD_CMD_CACHE`: a hint this server has no use for; answered with success.
    Cache,
    /// `NBD_CMD_DISC`: finish what is in flight, then close.
    Disconnect,
}

/// The outcome of checking one request header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Run(Action),
    /// Answer with this error (after skipping the request's payload, if it has one).
    Reject(ErrorCode),
    /// The payload is too large to skip safely: a hard disconnect ("Size constraints": either
    /// side MAY disconnect when a payload is large enough to be a denial of service).
    HardDisconnect,
}

/// Checks one request header.
pub fn check(request: &Request, limits: &Limits) -> Verdict {
    let Request {
        flags,
        command,
        offset,
        length,
        ..
    } = *request;
    if command == Command::WRITE && length > limits.max_payload {
        return Verdict::HardDisconnect;
    }
    // "NBD_CMD_FLAG_FUA ... valid for all commands"; the others only where documented. We do
    // not offer DF (no structured replies), FAST_ZERO or extended headers, so those are
    // "a flag not explicitly documented as applicable": EINVAL.
    let allowed = match command {
        Command::WRITE_ZEROES => CommandFlags::FUA | CommandFlags::NO_HOLE,
        _ => CommandFlags::FUA,
    };
    if flags.0 & !allowed.0 != 0 {
        return Verdict::Reject(ErrorCode::EINVAL);
    }
    let fua = flags.contains(CommandFlags::FUA);
    let in_range = offset
        .checked_add(u64::from(length))
        .is_some_and(|end| end <= limits.size);
    match command {
        Command::READ => {
            if length > limits.max_payload {
                Verdict::Reject(ErrorCode::EINVAL)
            } else if !in_range {
                // "SHOULD return NBD_EINVAL if it receives a read ... beyond the size".
                Verdict::Reject(ErrorCode::EINVAL)
            } else {
                Verdict::Run(Action::Read { offset, length })
            }
        }
        Command::WRITE => {
            if !in_range {
                // "SHOULD return NBD_ENOSPC if it receives a write request ... beyond the
                // size of the device".
                Verdict::Reject(ErrorCode::ENOSPC)
            } else {
                Verdict::Run(Action::Write {
                    offset,
                    length,
                    fua,
                })
            }
        }
        Command::WRITE_ZEROES => {
            if !in_range {
                Verdict::Reject(ErrorCode::ENOSPC)
            } else {
                Verdict::Run(Action::WriteZeroes {
                    offset,
                    length,
                    fua,
                })
            }
        }
        Command::TRIM => {
            if !in_range {
                Verdict::Reject(ErrorCode::EINVAL)
            } else {
                Verdict::Run(Action::Trim {
                    offset,
                    length,
                    fua,
                })
            }
        }
        Command::FLUSH => {
            // "For a flush request, length and offset are reserved, and MUST be set to
            // all-zero."
            if offset != 0 || length != 0 {
                Verdict::Reject(ErrorCode::EINVAL)
            } else {
                Verdict::Run(Action::Flush)
            }
        }
        Command::CACHE => {
            if !in_range {
                Verdict::Reject(ErrorCode::EINVAL)
            } else {
                Verdict::Run(Action::Cache)
            }
        }
        Command::DISC => Verdict::Run(Action::Disconnect),
        // BLOCK_STATUS needs metadata contexts (never negotiated here), RESIZE was never
        // offered; "SHOULD return NBD_EINVAL if it receives an unknown command".
        _ => Verdict::Reject(ErrorCode::EINVAL),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: Limits = Limits {
        size: 1 << 20,
        max_payload: MAX_PAYLOAD,
    };

    fn req(command: Command, flags: u16, offset: u64, length: u32) -> Request {
        Request {
            flags: CommandFlags(flags),
            command,
            cookie: 7,
            offset,
            length,
        }
    }

    #[test]
    fn in_range_requests_run() {
        assert_eq!(
            check(&req(Command::READ, 0, 1000, 100), &LIMITS),
            Verdict::Run(Action::Read {
                offset: 1000,
                length: 100
            })
        );
        assert_eq!(
            check(&req(Command::WRITE, 1, (1 << 20) - 512, 512), &LIMITS),
            Verdict::Run(Action::Write {
                offset: (1 << 20) - 512,
                length: 512,
                fua: true
            })
        );
        assert_eq!(
            check(&req(Command::WRITE_ZEROES, 3, 0, 4096), &LIMITS),
            Verdict::Run(Action::WriteZeroes {
                offset: 0,
                length: 4096,
                fua: true
            })
        );
        assert_eq!(
            check(&req(Command::FLUSH, 0, 0, 0), &LIMITS),
            Verdict::Run(Action::Flush)
        );
        assert_eq!(
            check(&req(Command::DISC, 0, 0, 0), &LIMITS),
            Verdict::Run(Action::Disconnect)
        );
    }

    #[test]
    fn past_the_end_gets_the_spec_errno() {
        let end = 1u64 << 20;
        assert_eq!(
            check(&req(Command::READ, 0, end - 1, 2), &LIMITS),
            Verdict::Reject(ErrorCode::EINVAL)
        );
        assert_eq!(
            check(&req(Command::WRITE, 0, end, 1), &LIMITS),
            Verdict::Reject(ErrorCode::ENOSPC)
        );
        assert_eq!(
            check(&req(Command::WRITE_ZEROES, 0, u64::MAX, 1), &LIMITS),
            Verdict::Reject(ErrorCode::ENOSPC)
        );
        assert_eq!(
            check(&req(Command::TRIM, 0, u64::MAX, u32::MAX), &LIMITS),
            Verdict::Reject(ErrorCode::EINVAL)
        );
    }

    #[test]
    fn oversized_unknown_and_bad_flags() {
        assert_eq!(
            check(&req(Command::READ, 0, 0, MAX_PAYLOAD + 1), &LIMITS),
            Verdict::Reject(ErrorCode::EINVAL)
        );
        assert_eq!(
            check(&req(Command::WRITE, 0, 0, MAX_PAYLOAD + 1), &LIMITS),
            Verdict::HardDisconnect
        );
        assert_eq!(
            check(&req(Command(42), 0, 0, 0), &LIMITS),
            Verdict::Reject(ErrorCode::EINVAL)
        );
        assert_eq!(
            check(&req(Command::BLOCK_STATUS, 0, 0, 512), &LIMITS),
            Verdict::Reject(ErrorCode::EINVAL)
        );
        // NO_HOLE only on WRITE_ZEROES, DF never offered.
        assert_eq!(
            check(&req(Command::WRITE, 2, 0, 512), &LIMITS),
            Verdict::Reject(ErrorCode::EINVAL)
        );
        assert_eq!(
            check(&req(Command::READ, 4, 0, 512), &LIMITS),
            Verdict::Reject(ErrorCode::EINVAL)
        );
        assert_eq!(
            check(&req(Command::FLUSH, 0, 1, 0), &LIMITS),
            Verdict::Reject(ErrorCode::EINVAL)
        );
    }
}
