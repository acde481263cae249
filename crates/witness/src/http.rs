//! A sans-IO HTTP/1.1 exchange, just what etcd's JSON gateway needs: one POST with a JSON body
//! and `Connection: close`, and a response parser fed whatever bytes arrive (Content-Length,
//! chunked, or a body ending at end of stream), with a size limit.

/// Largest response accepted (the epoch key's value is a few dozen bytes).
pub const MAX_RESPONSE: usize = 1 << 20;

/// The bytes of `POST path` to `host` with a JSON `body`.
pub fn post(host: &str, path: &str, body: &[u8]) -> Vec<u8> {
    let mut out = format!(
        "POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    )
    .into_bytes();
    out.extend_from_slice(body);
    out
}

/// A complete response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Response {
    pub status: u16,
    pub body: Vec<u8>,
}

/// Why a response could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HttpError {
    #[error("bad status line {0:?}")]
    StatusLine(String),
    #[error("bad header {0:?}")]
    Header(String),
    #[error("bad chunk size {0:?}")]
    Chunk(String),
    #[error("response larger than {MAX_RESPONSE} bytes")]
    TooLarge,
    #[error("the connection closed before the response was complete")]
    Truncated,
}

/// Collects a response from the bytes read so far.
#[derive(Debug, Default)]
pub struct ResponseReader {
    buf: Vec<u8>,
}

impl ResponseReader {
    /// Adds bytes read from the connection.
    pub fn feed(&mut self, bytes: &[u8]) -> Result<(), HttpError> {
        if self.buf.len() + bytes.len() > MAX_RESPONSE {
            return Err(HttpError::TooLarge);
        }
        self.buf.extend_from_slice(bytes);
        Ok(())
    }

    /// The response, if the bytes so far hold all of it; `eof` says the peer closed.
    pub fn response(&self, eof: bool) -> Result<Option<Response>, HttpError> {
        let Some(head_end) = find(&self.buf, b"\r\n\r\n") else {
            return if eof {
                Err(HttpError::Truncated)
            } else {
                Ok(None)
            };
        };
        let head = String::from_utf8_lossy(&self.buf[..head_end]);
        let mut lines = head.split("\r\n");
        let status_line = lines.next().unwrap_or_default();
        let status = parse_status(status_line)?;
        let mut length = None;
        let mut chunked = false;
        for line in lines {
            let (name, value) = line
                .split_once(':')
                .ok_or_else(|| HttpError::Header(line.to_string()))?;
            let value = value.trim();
            if name.eq_ignore_ascii_case("content-length") {
                let n: usize = value
                    .parse()
                    .map_err(|_| HttpError::Header(line.to_string()))?;
                if n > MAX_RESPONSE {
                    return Err(HttpError::TooLarge);
                }
                length = Some(n);
            } else if name.eq_ignore_ascii_case("transfer-encoding") {
                chunked = value.eq_ignore_ascii_case("chunked");
            }
        }
        let rest = &self.buf[head_end + 4..];
        let body = if chunked {
            match dechunk(rest)? {
                Some(body) => body,
                None if eof => return Err(HttpError::Truncated),
                None => return Ok(None),
            }
        } else if let Some(n) = length {
            if rest.len() < n {
                return if eof {
                    Err(HttpError::Truncated)
                } else {
                    Ok(None)
                };
            }
            rest[..n].to_vec()
        } else if eof {
            rest.to_vec()
        } else {
            return Ok(None);
        };
        Ok(Some(Response { status, body }))
    }
}

fn parse_status(line: &str) -> Result<u16, HttpError> {
    let mut parts = line.splitn(3, ' ');
    match (parts.next(), parts.next()) {
        (Some(v), Some(code)) if v.starts_with("HTTP/1.") && code.len() == 3 => code
            .parse()
            .map_err(|_| HttpError::StatusLine(line.to_string())),
        _ => Err(HttpError::StatusLine(line.to_string())),
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// A chunked body, or `None` while its last chunk has not arrived.
fn dechunk(mut rest: &[u8]) -> Result<Option<Vec<u8>>, HttpError> {
    let mut body = Vec::new();
    loop {
        let Some(line_end) = find(rest, b"\r\n") else {
            return Ok(None);
        };
        let line = String::from_utf8_lossy(&rest[..line_end]);
        let size_text = line.split(';').next().unwrap_or_default().trim();
        let size =
            usize::from_str_radix(size_text, 16).map_err(|_| HttpError::Chunk(line.to_string()))?;
        if size > MAX_RESPONSE {
            return Err(HttpError::TooLarge);
        }
        rest = &rest[line_end + 2..];
        if size == 0 {
            return Ok(Some(body));
        }
        if rest.len() < size + 2 {
            return Ok(None);
        }
        body.extend_from_slice(&rest[..size]);
        rest = &rest[size + 2..];
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read_in_pieces(
        bytes: &[u8],
        piece: usize,
        eof: bool,
    ) -> Result<Option<Response>, HttpError> {
        let mut reader = ResponseReader::default();
        let mut out = None;
        for chunk in bytes.chunks(piece) {
            reader.feed(chunk)?;
            if out.is_none() {
                out = reader.response(false)?;
            }
        }
        match out {
            Some(r) => Ok(Some(r)),
            None => reader.response(eof),
        }
    }

    #[test]
    fn a_request_is_one_post_with_its_length() {
        let req = post("127.0.0.1:2379", "/v3/kv/range", b"{}");
        let text = String::from_utf8(req).unwrap();
        assert!(text.starts_with("POST /v3/kv/range HTTP/1.1\r\nHost: 127.0.0.1:2379\r\n"));
        assert!(text.contains("Content-Length: 2\r\n"));
        assert!(text.ends_with("\r\n\r\n{}"));
    }

    #[test]
    fn content_length_chunked_and_close_delimited_bodies() {
        let plain = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 7\r\n\r\n{\"a\":1}";
        let chunked = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\n{\"a\r\n4;x=y\r\n\":1}\r\n0\r\n\r\n";
        let closed = b"HTTP/1.1 200 OK\r\n\r\n{\"a\":1}";
        for piece in [1, 3, 1000] {
            for bytes in [&plain[..], &chunked[..]] {
                let r = read_in_pieces(bytes, piece, false).unwrap().unwrap();
                assert_eq!((r.status, r.body.as_slice()), (200, &b"{\"a\":1}"[..]));
            }
            assert_eq!(read_in_pieces(closed, piece, false).unwrap(), None);
            let r = read_in_pieces(closed, piece, true).unwrap().unwrap();
            assert_eq!(r.body, b"{\"a\":1}");
        }
    }

    #[test]
    fn short_and_bad_responses_are_errors_not_panics() {
        let short = b"HTTP/1.1 200 OK\r\nContent-Length: 70\r\n\r\n{}";
        assert_eq!(read_in_pieces(short, 5, false).unwrap(), None);
        assert_eq!(read_in_pieces(short, 5, true), Err(HttpError::Truncated));
        assert!(matches!(
            read_in_pieces(b"SMTP ready\r\n\r\n", 4, true),
            Err(HttpError::StatusLine(_))
        ));
        assert!(matches!(
            read_in_pieces(b"HTTP/1.1 200 OK\r\nno colon\r\n\r\n", 4, true),
            Err(HttpError::Header(_))
        ));
        assert!(matches!(
            read_in_pieces(
                b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
                4,
                true
            ),
            Err(HttpError::Chunk(_))
        ));
        let huge = format!(
            "HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n",
            MAX_RESPONSE + 1
        );
        assert_eq!(
            read_in_pieces(huge.as_bytes(), 64, false),
            Err(HttpError::TooLarge)
        );
        // Any bytes at all: an answer or an error, never a panic.
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        for _ in 0..2000 {
            let mut bytes = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n".to_vec();
            for _ in 0..(seed % 40) {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                let alphabet = b"0123456789abcdef\r\n;xX ";
                bytes.push(alphabet[(seed % alphabet.len() as u64) as usize]);
            }
            let _ = read_in_pieces(&bytes, 7, true);
        }
    }
}
