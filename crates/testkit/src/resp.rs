//! A tiny hand-written RESP2 encoder/decoder, enough for test assertions.

use std::fmt;
use std::io::{self, BufRead, Read};

/// Longest status/error/integer line accepted from a server (bytes).
const MAX_LINE: u64 = 64 * 1024;
/// Largest bulk string accepted (Redis' own `proto-max-bulk-len` default).
const MAX_BULK: i64 = 512 * 1024 * 1024;
/// Deepest array nesting accepted.
const MAX_DEPTH: usize = 64;

/// One RESP2 reply from a Redis server.
///
/// `Debug` is derived (exact structure); `Display` renders like `redis-cli`
/// (`(integer) 1`, `(nil)`, `(error) ERR ...`, `"bulk"`, `[a, b]`).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Reply {
    /// A simple string (`+OK`, `+PONG`).
    Status(String),
    /// An error reply (`-ERR ...`, `-NOAUTH ...`), without the leading `-`.
    Error(String),
    /// An integer reply (`:1`).
    Int(i64),
    /// A bulk string; `None` is the nil bulk string (`$-1`).
    Bulk(Option<Vec<u8>>),
    /// An array; `None` is the nil array (`*-1`).
    Array(Option<Vec<Reply>>),
}

impl Reply {
    /// The text of a status reply, or of a non-nil bulk string that is valid
    /// UTF-8. `None` for everything else (errors included: see [`Reply::as_error`]).
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Reply::Status(s) => Some(s),
            Reply::Bulk(Some(b)) => std::str::from_utf8(b).ok(),
            _ => None,
        }
    }

    /// The raw bytes of a non-nil bulk string or status reply.
    pub fn as_bytes(&self) -> Option<&[u8]> {
        match self {
            Reply::Status(s) => Some(s.as_bytes()),
            Reply::Bulk(Some(b)) => Some(b),
            _ => None,
        }
    }

    /// The value of an integer reply, or of a status/bulk reply holding a
    /// decimal integer (so `GET counter` works too).
    pub fn as_int(&self) -> Option<i64> {
        match self {
            Reply::Int(i) => Some(*i),
            other => other.as_str().and_then(|s| s.parse().ok()),
        }
    }

    /// The elements of a non-nil array reply.
    pub fn as_array(&self) -> Option<&[Reply]> {
        match self {
            Reply::Array(Some(items)) => Some(items),
            _ => None,
        }
    }

    /// The message of an error reply (e.g. `NOAUTH Authentication required.`).
    pub fn as_error(&self) -> Option<&str> {
        match self {
            Reply::Error(e) => Some(e),
            _ => None,
        }
    }

    /// `true` for the nil bulk string and the nil array.
    pub fn is_nil(&self) -> bool {
        matches!(self, Reply::Bulk(None) | Reply::Array(None))
    }

    /// `true` for an error reply.
    pub fn is_error(&self) -> bool {
        matches!(self, Reply::Error(_))
    }
}

impl fmt::Display for Reply {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Reply::Status(s) => f.write_str(s),
            Reply::Error(e) => write!(f, "(error) {e}"),
            Reply::Int(i) => write!(f, "(integer) {i}"),
            Reply::Bulk(None) | Reply::Array(None) => f.write_str("(nil)"),
            Reply::Bulk(Some(b)) => write!(f, "\"{}\"", b.escape_ascii()),
            Reply::Array(Some(items)) if items.is_empty() => f.write_str("(empty array)"),
            Reply::Array(Some(items)) => {
                f.write_str("[")?;
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        f.write_str(", ")?;
                    }
                    write!(f, "{item}")?;
                }
                f.write_str("]")
            }
        }
    }
}

/// Appends one command, as a RESP array of bulk strings, to `out`.
pub(crate) fn encode_command(out: &mut Vec<u8>, args: &[&str]) {
    out.extend_from_slice(format!("*{}\r\n", args.len()).as_bytes());
    for arg in args {
        out.extend_from_slice(format!("${}\r\n", arg.len()).as_bytes());
        out.extend_from_slice(arg.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
}

/// Reads one complete reply.
pub(crate) fn read_reply<R: BufRead>(r: &mut R) -> io::Result<Reply> {
    read_at_depth(r, 0)
}

fn invalid(msg: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg.into())
}

fn read_line<R: BufRead>(r: &mut R) -> io::Result<String> {
    let mut buf = Vec::new();
    r.by_ref().take(MAX_LINE).read_until(b'\n', &mut buf)?;
    if buf.is_empty() {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "connection closed before a reply",
        ));
    }
    if !buf.ends_with(b"\r\n") {
        return Err(invalid("reply line not terminated by CRLF"));
    }
    buf.truncate(buf.len() - 2);
    String::from_utf8(buf).map_err(|_| invalid("reply line is not UTF-8"))
}

fn parse_len(s: &str, what: &str) -> io::Result<i64> {
    s.parse()
        .map_err(|_| invalid(format!("bad {what} length {s:?}")))
}

fn read_at_depth<R: BufRead>(r: &mut R, depth: usize) -> io::Result<Reply> {
    if depth > MAX_DEPTH {
        return Err(invalid("reply nested too deeply"));
    }
    let line = read_line(r)?;
    let Some(kind) = line.chars().next() else {
        return Err(invalid("empty reply line"));
    };
    let rest = &line[kind.len_utf8()..];
    match kind {
        '+' => Ok(Reply::Status(rest.to_owned())),
        '-' => Ok(Reply::Error(rest.to_owned())),
        ':' => rest
            .parse()
            .map(Reply::Int)
            .map_err(|_| invalid(format!("bad integer reply {rest:?}"))),
        '$' => match parse_len(rest, "bulk")? {
            -1 => Ok(Reply::Bulk(None)),
            n if (0..=MAX_BULK).contains(&n) => {
                let n = n as usize;
                let mut data = vec![0; n + 2];
                r.read_exact(&mut data)?;
                if !data.ends_with(b"\r\n") {
                    return Err(invalid("bulk string not terminated by CRLF"));
                }
                data.truncate(n);
                Ok(Reply::Bulk(Some(data)))
            }
            n => Err(invalid(format!("bad bulk length {n}"))),
        },
        '*' => match parse_len(rest, "array")? {
            -1 => Ok(Reply::Array(None)),
            n if n >= 0 => {
                // Don't trust the announced length for the allocation.
                let mut items = Vec::with_capacity((n as usize).min(1024));
                for _ in 0..n {
                    items.push(read_at_depth(r, depth + 1)?);
                }
                Ok(Reply::Array(Some(items)))
            }
            n => Err(invalid(format!("bad array length {n}"))),
        },
        other => Err(invalid(format!(
            "unexpected reply type {other:?} (not RESP2?)"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(bytes: &[u8]) -> io::Result<Reply> {
        read_reply(&mut io::Cursor::new(bytes))
    }

    #[test]
    fn encodes_command_as_array_of_bulk_strings() {
        let mut out = Vec::new();
        encode_command(&mut out, &["SET", "k", ""]);
        assert_eq!(out, b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$0\r\n\r\n");
    }

    #[test]
    fn parses_scalar_replies() {
        assert_eq!(parse(b"+OK\r\n").unwrap(), Reply::Status("OK".into()));
        assert_eq!(
            parse(b"-ERR wrong\r\n").unwrap(),
            Reply::Error("ERR wrong".into())
        );
        assert_eq!(parse(b":-42\r\n").unwrap(), Reply::Int(-42));
        assert_eq!(
            parse(b"$5\r\nhe\r\nl\r\n").unwrap(),
            Reply::Bulk(Some(b"he\r\nl".to_vec()))
        );
        assert!(parse(b"$-1\r\n").unwrap().is_nil());
        assert!(parse(b"*-1\r\n").unwrap().is_nil());
        assert_eq!(parse(b"$0\r\n\r\n").unwrap(), Reply::Bulk(Some(vec![])));
    }

    #[test]
    fn parses_nested_arrays() {
        let reply = parse(b"*3\r\n:1\r\n*2\r\n$1\r\na\r\n$-1\r\n+x\r\n").unwrap();
        assert_eq!(
            reply,
            Reply::Array(Some(vec![
                Reply::Int(1),
                Reply::Array(Some(vec![
                    Reply::Bulk(Some(b"a".to_vec())),
                    Reply::Bulk(None)
                ])),
                Reply::Status("x".into()),
            ]))
        );
        assert_eq!(reply.to_string(), "[(integer) 1, [\"a\", (nil)], x]");
    }

    #[test]
    fn rejects_malformed_input() {
        assert_eq!(parse(b"").unwrap_err().kind(), io::ErrorKind::UnexpectedEof);
        assert_eq!(
            parse(b"?what\r\n").unwrap_err().kind(),
            io::ErrorKind::InvalidData
        );
        assert_eq!(
            parse(b":12").unwrap_err().kind(),
            io::ErrorKind::InvalidData
        );
        assert_eq!(
            parse(b"$3\r\nab").unwrap_err().kind(),
            io::ErrorKind::UnexpectedEof
        );
        assert_eq!(
            parse(b"$-5\r\n").unwrap_err().kind(),
            io::ErrorKind::InvalidData
        );
    }

    #[test]
    fn helpers() {
        assert_eq!(Reply::Bulk(Some(b"12".to_vec())).as_int(), Some(12));
        assert_eq!(Reply::Int(3).as_int(), Some(3));
        assert_eq!(Reply::Status("PONG".into()).as_str(), Some("PONG"));
        assert_eq!(Reply::Error("NOAUTH x".into()).as_str(), None);
        assert_eq!(Reply::Error("NOAUTH x".into()).as_error(), Some("NOAUTH x"));
        assert_eq!(Reply::Array(Some(vec![])).to_string(), "(empty array)");
        assert_eq!(Reply::Error("ERR x".into()).to_string(), "(error) ERR x");
        assert_eq!(Reply::Bulk(None).to_string(), "(nil)");
        assert_eq!(
            Reply::Bulk(Some(b"a\"\x01".to_vec())).to_string(),
            "\"a\\\"\\x01\""
        );
    }
}
