//! The server side of NBD option haggling (fixed newstyle), as a sans-IO state machine:
//! bytes from the client go in, bytes for the client and the outcome come out.
//!
//! ```text
//!   new() ── greeting queued ──> ClientFlags ──(flags known)──> Options <──────────┐
//!                                    │                            │  INFO/LIST/    │
//!                              (unknown flag:                     │  unknown ──────┘
//!                               MUST drop)                        │  over-long ──> Skipping ──(data skipped,
//!                                                                 │                  ERR_TOO_BIG)──> Options
//!                                                                 ├─ GO / EXPORT_NAME ──> Transmission
//!                                                                 └─ ABORT (ACK sent) ──> Aborted
//! ```

use bytes::{BufMut, Bytes, BytesMut};

use super::proto::{
    ClientFlags, ExportNameReply, Greeting, HandshakeFlags, Info, InfoRequest, InfoType,
    OptionCode, OptionReply, OptionRequest, ProtoError, ReplyType, TransmissionFlags,
};

/// Longest option data accepted; export names are at most 4096 bytes ("Conventions"), so
/// anything longer than this is skipped and answered with `NBD_REP_ERR_TOO_BIG`.
pub const MAX_OPTION_DATA: u32 = 64 * 1024;

/// What the server tells clients about its one export.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExportInfo {
    pub name: String,
    pub size: u64,
    pub flags: TransmissionFlags,
    pub minimum_block: u32,
    pub preferred_block: u32,
    pub maximum_payload: u32,
}

impl ExportInfo {
    /// Whether a client asking for `name` gets this export (the empty name is the default
    /// export, "NBD_OPT_EXPORT_NAME").
    fn matches(&self, name: &[u8]) -> bool {
        name.is_empty() || name == self.name.as_bytes()
    }
}

/// How the client entered transmission.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Negotiated {
    /// The client used `NBD_OPT_GO` and asked for `NBD_INFO_BLOCK_SIZE`, so it promised to
    /// honour the block size constraints ("Size constraints").
    pub honours_block_size: bool,
}

/// Where the handshake stands after consuming input.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Progress {
    /// Send the queued output, then wait for more input.
    NeedInput,
    /// Send the queued output; the transmission phase starts with the next input byte.
    Transmission(Negotiated),
    /// The client sent `NBD_OPT_ABORT`: send the queued ACK and close.
    Aborted,
}

/// A client that must be dropped (a hard disconnect, "Termination of the session").
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HandshakeError {
    /// "the server MUST drop the TCP connection if the client sets an unknown flag".
    #[error("client sent unknown flags {0:#x}")]
    UnknownClientFlags(u32),
    /// "If the chosen export does not exist ... the server MUST terminate the session."
    #[error("client asked for unknown export {0:?} with NBD_OPT_EXPORT_NAME")]
    UnknownExport(String),
    #[error("client sent a malformed option: {0}")]
    Protocol(ProtoError),
    #[error("handshake already finished")]
    Finished,
}

#[derive(Debug)]
enum State {
    ClientFlags,
    Options {
        no_zeroes: bool,
    },
    Skipping {
        option: OptionCode,
        remaining: u64,
        no_zeroes: bool,
    },
    Done,
}

/// See the module documentation.
#[derive(Debug)]
pub struct Handshake {
    export: ExportInfo,
    state: State,
    output: BytesMut,
}

impl Handshake {
    /// Starts a handshake; the greeting is queued as the first output.
    pub fn new(export: ExportInfo) -> Handshake {
        let mut output = BytesMut::with_capacity(256);
        Greeting {
            flags: HandshakeFlags::FIXED_NEWSTYLE | HandshakeFlags::NO_ZEROES,
        }
        .encode(&mut output);
        Handshake {
            export,
            state: State::ClientFlags,
            output,
        }
    }

    /// Bytes to send to the client now.
    pub fn take_output(&mut self) -> Bytes {
        self.output.split().freeze()
    }

    /// Consumes as much of `input` as forms whole messages and answers them.
    pub fn handle(&mut self, input: &mut BytesMut) -> Result<Progress, HandshakeError> {
        loop {
            match std::mem::replace(&mut self.state, State::Done) {
                State::Done => return Err(HandshakeError::Finished),
                State::ClientFlags => match ClientFlags::decode(input) {
                    Ok(flags) => {
                        if flags.0 & !ClientFlags::KNOWN.0 != 0 {
                            return Err(HandshakeError::UnknownClientFlags(flags.0));
                        }
                        self.state = State::Options {
                            no_zeroes: flags.contains(ClientFlags::NO_ZEROES),
                        };
                    }
                    Err(ProtoError::Incomplete { .. }) => {
                        self.state = State::ClientFlags;
                        return Ok(Progress::NeedInput);
                    }
                    Err(e) => return Err(HandshakeError::Protocol(e)),
                },
                State::Skipping {
                    option,
                    remaining,
                    no_zeroes,
                } => {
                    let take = remaining.min(input.len() as u64);
                    let _ = input.split_to(take as usize);
                    if take < remaining {
                        self.state = State::Skipping {
                            option,
                            remaining: remaining - take,
                            no_zeroes,
                        };
                        return Ok(Progress::NeedInput);
                    }
                    self.error(option, ReplyType::ERR_TOO_BIG, "option data too long");
                    self.state = State::Options { no_zeroes };
                }
                State::Options { no_zeroes } => {
                    match OptionRequest::decode(input, MAX_OPTION_DATA) {
                        Ok(request) => {
                            if let Some(progress) = self.option(request, no_zeroes)? {
                                return Ok(progress);
                            }
                        }
                        Err(ProtoError::Incomplete { .. }) => {
                            self.state = State::Options { no_zeroes };
                            return Ok(Progress::NeedInput);
                        }
                        Err(ProtoError::TooLarge { len, .. }) => {
                            let mut peek: &[u8] = input.as_ref();
                            let header = super::proto::OptionHeader::decode(&mut peek)
                                .map_err(HandshakeError::Protocol)?;
                            let _ = input.split_to(super::proto::OptionHeader::LEN);
                            self.state = State::Skipping {
                                option: header.option,
                                remaining: len,
                                no_zeroes,
                            };
                        }
                        Err(e) => return Err(HandshakeError::Protocol(e)),
                    }
                }
            }
        }
    }

    /// Answers one option. `Some` ends option haggling.
    fn option(
        &mut self,
        request: OptionRequest,
        no_zeroes: bool,
    ) -> Result<Option<Progress>, HandshakeError> {
        self.state = State::Options { no_zeroes };
        let option = request.option;
        match option {
            OptionCode::EXPORT_NAME => {
                if !self.export.matches(&request.data) {
                    self.state = State::Done;
                    return Err(HandshakeError::UnknownExport(
                        String::from_utf8_lossy(&request.data).into_owned(),
                    ));
                }
                ExportNameReply {
                    size: self.export.size,
                    flags: self.export.flags,
                    zero_padding: !no_zeroes,
                }
                .encode(&mut self.output);
                self.state = State::Done;
                return Ok(Some(Progress::Transmission(Negotiated {
                    honours_block_size: false,
                })));
            }
            OptionCode::ABORT => {
                // "The server MUST reply with NBD_REP_ACK."
                self.reply(option, ReplyType::ACK, Bytes::new());
                self.state = State::Done;
                return Ok(Some(Progress::Aborted));
            }
            OptionCode::LIST => {
                if !request.data.is_empty() {
                    self.error(option, ReplyType::ERR_INVALID, "NBD_OPT_LIST takes no data");
                } else {
                    let mut data = BytesMut::with_capacity(4 + self.export.name.len());
                    data.put_u32(self.export.name.len() as u32);
                    data.put_slice(self.export.name.as_bytes());
                    self.reply(option, ReplyType::SERVER, data.freeze());
                    self.reply(option, ReplyType::ACK, Bytes::new());
                }
            }
            OptionCode::INFO | OptionCode::GO => {
                let info = match InfoRequest::decode(request.data) {
                    Ok(info) => info,
                    Err(_) => {
                        self.error(option, ReplyType::ERR_INVALID, "malformed info request");
                        return Ok(None);
                    }
                };
                if !self.export.matches(&info.name) {
                    self.error(option, ReplyType::ERR_UNKNOWN, "no such export");
                    return Ok(None);
                }
                self.send_info(option, &info);
                if option == OptionCode::GO {
                    self.state = State::Done;
                    return Ok(Some(Progress::Transmission(Negotiated {
                        honours_block_size: info.requests.contains(&InfoType::BLOCK_SIZE),
                    })));
                }
            }
            // NOTLS mode: "MUST respond with NBD_REP_ERR_POLICY ... NBD_REP_ERR_UNSUP".
            // Structured replies, metadata contexts and extended headers are not offered, and
            // every option this server does not know is unsupported as well.
            _ => self.error(option, ReplyType::ERR_UNSUP, "option not supported"),
        }
        Ok(None)
    }

    /// `NBD_REP_INFO` replies, then `NBD_REP_ACK` ("NBD_OPT_INFO and NBD_OPT_GO": at least
    /// `NBD_INFO_EXPORT`; block sizes sent even if not asked for, which clients must ignore
    /// if they do not understand them).
    fn send_info(&mut self, option: OptionCode, request: &InfoRequest) {
        let mut infos = vec![
            Info::Export {
                size: self.export.size,
                flags: self.export.flags,
            },
            Info::BlockSize {
                minimum: self.export.minimum_block,
                preferred: self.export.preferred_block,
                maximum: self.export.maximum_payload,
            },
        ];
        if request.requests.contains(&InfoType::NAME) {
            infos.push(Info::Name(Bytes::from(self.export.name.clone())));
        }
        for info in infos {
            let mut data = BytesMut::with_capacity(16);
            info.encode(&mut data);
            self.reply(option, ReplyType::INFO, data.freeze());
        }
        self.reply(option, ReplyType::ACK, Bytes::new());
    }

    fn reply(&mut self, option: OptionCode, reply: ReplyType, data: Bytes) {
        OptionReply {
            option,
            reply,
            data,
        }
        .encode(&mut self.output);
    }

    /// An error reply with a message for the user ("All error replies MAY have some data
    /// set, in which case that data is an error message string").
    fn error(&mut self, option: OptionCode, reply: ReplyType, message: &'static str) {
        self.reply(option, reply, Bytes::from_static(message.as_bytes()));
    }
}
