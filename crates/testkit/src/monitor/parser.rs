//! The `MONITOR` line parser: one line of the server's stream as an [`Entry`].

/// Where a monitored command came from, or the interruption marker.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Source {
    /// Run by a script (`redis.call`/`redis.pcall`), shown as `lua`. It
    /// belongs to the nearest preceding script call (`EVAL`, `FCALL`, ...).
    Lua,
    /// A TCP client, by its address as the server prints it
    /// (`127.0.0.1:58326`, `[::1]:58326`).
    Client(String),
    /// A client on the server's unix socket, by the socket's path.
    Unix(String),
    /// Not a server line: the monitor connection dropped here (the server
    /// was killed or restarted), so commands may have run unseen and the
    /// keys' state is unknown from here on. `time_us` is the local wall
    /// clock when the drop was noticed; `db` is 0 and `args` empty.
    Interrupted,
}

/// One recorded monitor line (or an interruption marker, see
/// [`Source::Interrupted`]).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Entry {
    /// The server's wall clock when it printed the line, in microseconds
    /// since the Unix epoch.
    pub time_us: u64,
    /// The database the command ran in.
    pub db: u32,
    /// Who ran the command.
    pub source: Source,
    /// The command's arguments, name first, unescaped (bytes that are not
    /// UTF-8 become U+FFFD).
    pub args: Vec<String>,
}

impl Entry {
    /// `true` for the marker of a dropped monitor connection.
    pub fn is_interruption(&self) -> bool {
        self.source == Source::Interrupted
    }

    /// The command name in upper case (`""` for an interruption).
    pub fn command(&self) -> String {
        self.args
            .first()
            .map(|a| a.to_ascii_uppercase())
            .unwrap_or_default()
    }
}

/// Parses one monitor line, with or without the RESP `+` in front:
/// `1795325555.103214 [0 lua] "SET" "k" "tok\"en" "NX" "PX" "500"`.
///
/// `None` if the line does not have exactly that shape (timestamp with six
/// digits of microseconds, `[db source]`, at least one argument, every
/// argument quoted, only the escapes Redis writes: `\\ \" \n \r \t \a \b
/// \xHH`). Never panics.
pub fn parse_line(line: &str) -> Option<Entry> {
    let line = line.strip_prefix('+').unwrap_or(line);
    let (time, rest) = line.split_once(' ')?;
    let (secs, micros) = time.split_once('.')?;
    if micros.len() != 6 {
        return None;
    }
    let time_us = parse_digits(secs)?
        .checked_mul(1_000_000)?
        .checked_add(parse_digits(micros)?)?;
    let rest = rest.strip_prefix('[')?;
    let (db, rest) = rest.split_once(' ')?;
    let db = u32::try_from(parse_digits(db)?).ok()?;
    // The source may itself contain `]` (an IPv6 address); the arguments
    // start at the first `] "`.
    let end = rest.find("] \"")?;
    let source = match &rest[..end] {
        "" => return None,
        "lua" => Source::Lua,
        s => match s.strip_prefix("unix:") {
            Some(path) => Source::Unix(path.to_owned()),
            None => Source::Client(s.to_owned()),
        },
    };
    let args = parse_args(&rest[end + 2..])?;
    Some(Entry {
        time_us,
        db,
        source,
        args,
    })
}

/// A non-empty run of ASCII digits as a number (no sign, no spaces).
fn parse_digits(s: &str) -> Option<u64> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

/// `"a" "b\n"` → `["a", "b\n"]`: Redis' `sdscatrepr` quoting undone.
fn parse_args(s: &str) -> Option<Vec<String>> {
    let mut args = Vec::new();
    let mut bytes = s.bytes();
    loop {
        if bytes.next()? != b'"' {
            return None;
        }
        let mut arg = Vec::new();
        loop {
            match bytes.next()? {
                b'"' => break,
                b'\\' => arg.push(match bytes.next()? {
                    b'\\' => b'\\',
                    b'"' => b'"',
                    b'n' => b'\n',
                    b'r' => b'\r',
                    b't' => b'\t',
                    b'a' => 0x07,
                    b'b' => 0x08,
                    b'x' => {
                        let hex = [bytes.next()?, bytes.next()?];
                        if !hex.iter().all(u8::is_ascii_hexdigit) {
                            return None;
                        }
                        u8::from_str_radix(std::str::from_utf8(&hex).ok()?, 16).ok()?
                    }
                    _ => return None,
                }),
                b => arg.push(b),
            }
        }
        args.push(String::from_utf8_lossy(&arg).into_owned());
        match bytes.next() {
            None => return Some(args),
            Some(b' ') => {}
            Some(_) => return None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_lines_with_escapes() {
        let e = parse_line(
            r#"+1795325555.103104 [0 127.0.0.1:58326] "eval" "redis.call(...)" "1" "fencelock:{lab:x}" "tok\"en\\n\x01\xff\t\xc3\xa9\r\n\a\b""#,
        )
        .unwrap();
        assert_eq!(e.time_us, 1_795_325_555_103_104);
        assert_eq!(e.db, 0);
        assert_eq!(e.source, Source::Client("127.0.0.1:58326".into()));
        assert_eq!(e.command(), "EVAL");
        assert_eq!(
            e.args,
            [
                "eval",
                "redis.call(...)",
                "1",
                "fencelock:{lab:x}",
                "tok\"en\\n\u{1}\u{fffd}\té\r\n\u{7}\u{8}"
            ]
        );
        let e = parse_line(r#"1795325555.000001 [3 lua] "DEL" """#).unwrap();
        assert_eq!((e.time_us, e.db), (1_795_325_555_000_001, 3));
        assert_eq!(
            (e.source, e.args),
            (Source::Lua, vec!["DEL".into(), "".into()])
        );
        let e = parse_line(r#"1.000000 [0 unix:/tmp/r.sock] "ping""#).unwrap();
        assert_eq!(e.source, Source::Unix("/tmp/r.sock".into()));
        let e = parse_line(r#"1.000000 [0 [::1]:6000] "ping""#).unwrap();
        assert_eq!(e.source, Source::Client("[::1]:6000".into()));
    }

    #[test]
    fn malformed_lines_are_none() {
        for line in [
            "",
            "+",
            "+OK",
            "-ERR x",
            "1795325555.103104",
            "1795325555.1031 [0 lua] \"DEL\"",
            "x.103104 [0 lua] \"DEL\"",
            "-1.103104 [0 lua] \"DEL\"",
            "99999999999999999999.000000 [0 lua] \"DEL\"",
            "1.000000 [0 lua]",
            "1.000000 [0 lua] ",
            "1.000000 [0 lua] DEL",
            "1.000000 [x lua] \"DEL\"",
            "1.000000 [0 ] \"DEL\"",
            "1.000000 0 lua] \"DEL\"",
            "1.000000 [0 lua] \"DEL",
            "1.000000 [0 lua] \"DEL\"  \"k\"",
            "1.000000 [0 lua] \"DEL\"x",
            "1.000000 [0 lua] \"D\\qEL\"",
            "1.000000 [0 lua] \"D\\x4\"",
            "1.000000 [0 lua] \"D\\xzz\"",
            "1.000000 [0 lua] \"D\\x+f\"",
            "1.000000 [0 lua] \"D\\",
            "1.000000 [0 lua] \"é\\xé\"",
        ] {
            assert_eq!(parse_line(line), None, "{line:?}");
        }
    }
}
