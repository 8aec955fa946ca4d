//! Reading back a protocol's `mode=` line of a detached lock ([`Protocol::to_text`](crate::engine::Protocol::to_text)): what each
//! protocol's `from_text` shares, and the check of a reentrant owner id.

use std::time::Duration;

use crate::error::Error;

/// A detached lock's field that does not read back.
pub(crate) fn bad(reason: &str) -> Error {
    Error::invalid("detached lock", reason.to_owned())
}

/// Milliseconds written by [`Protocol::to_text`].
pub(crate) fn ms(text: &str) -> Result<Duration, Error> {
    text.parse()
        .map(Duration::from_millis)
        .map_err(|_| bad("the mode's duration is not a number"))
}

/// A reentrant owner id, if it is 1 to 256 bytes without control characters.
pub(crate) fn checked_owner(owner: &str) -> Result<String, Error> {
    if owner.is_empty() || owner.len() > 256 || owner.chars().any(char::is_control) {
        return Err(Error::invalid(
            "owner id",
            format!("{owner:?} must be 1 to 256 bytes without control characters"),
        ));
    }
    Ok(owner.to_owned())
}
