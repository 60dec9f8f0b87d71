//! The text form of a public key, and the lines of a key file, as ssh
//! writes them: `atou-x25519 BASE64 [COMMENT]`.
//!
//! Keys are base64 (RFC 4648 §4, standard alphabet, padded) of the 32
//! bytes of an X25519 key. Pure: bytes in, keys or a reason out; reading
//! the files is `src/config/keys.rs`'s.

use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use thiserror::Error;

use super::PublicKey;

/// The key type word of a public key line.
pub const KEY_TYPE: &str = "atou-x25519";
/// Longest line read from a key file (ssh allows 8 KiB too).
pub const MAX_LINE: usize = 8192;

/// Why a key, or a line of a key file, was refused. The messages name no
/// file: whoever read the bytes adds the path and line.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum KeyTextError {
    #[error("the key is not valid base64 ({0})")]
    Base64(base64::DecodeError),
    #[error("the key is {0} bytes, not 32")]
    Length(usize),
    #[error("an empty key")]
    EmptyKey,
    #[error("no key after the key type")]
    NoKeyAfterType,
    #[error("an empty line")]
    EmptyLine,
    #[error("a line of {0} bytes, over the {MAX_LINE} allowed")]
    LineTooLong(usize),
    #[error("a NUL byte")]
    Nul,
    #[error("not UTF-8")]
    NotUtf8,
    #[error("a control character")]
    ControlCharacter,
    #[error("expected `[OPTIONS] {KEY_TYPE} BASE64 [COMMENT]`")]
    NotAuthorizedLine,
    /// An option given twice.
    #[error("`{0}` given twice")]
    OptionTwice(&'static str),
    /// Held escaped: it is a peer's, or a stranger's, text.
    #[error(
        "unknown option `{0}` (known: subdir=PATH, overwrite, delete, owners, xattrs, acls), or a key type other than {KEY_TYPE}"
    )]
    UnknownOption(String),
    #[error("subdir= needs a relative path beneath --dir")]
    SubdirNotRelative,
    #[error("subdir= may not contain `..`")]
    SubdirEscapes,
    #[error("the same key as line {0} (which options apply?)")]
    DuplicateKey(usize),
}

/// A key file's line that was refused, numbered from 1.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("line {line}: {reason}")]
pub struct LineError {
    pub line: usize,
    pub reason: KeyTextError,
}

/// `atou-x25519 BASE64 COMMENT`.
pub fn format_public_key(key: &PublicKey, comment: &str) -> String {
    let b64 = STANDARD.encode(key.0);
    if comment.is_empty() {
        format!("{KEY_TYPE} {b64}")
    } else {
        format!("{KEY_TYPE} {b64} {comment}")
    }
}

/// The 32 bytes of a key from its base64.
pub fn decode_key(b64: &str) -> Result<[u8; 32], KeyTextError> {
    let bytes = STANDARD.decode(b64).map_err(KeyTextError::Base64)?;
    <[u8; 32]>::try_from(bytes.as_slice()).map_err(|_| KeyTextError::Length(bytes.len()))
}

/// A public key as written: `atou-x25519 BASE64 [COMMENT]` or the bare
/// BASE64 (`--server-key`).
pub fn parse_public_key(s: &str) -> Result<PublicKey, KeyTextError> {
    let mut words = s.split_ascii_whitespace();
    let first = words.next().ok_or(KeyTextError::EmptyKey)?;
    let b64 = if first == KEY_TYPE {
        words.next().ok_or(KeyTextError::NoKeyAfterType)?
    } else {
        first
    };
    decode_key(b64).map(PublicKey)
}

/// The lines of a key file, numbered from 1, each checked for length,
/// NUL bytes and UTF-8; blank lines and `#` comments left out.
pub fn key_file_lines(bytes: &[u8]) -> impl Iterator<Item = Result<(usize, &str), LineError>> {
    bytes
        .split(|&b| b == b'\n')
        .enumerate()
        .filter_map(|(i, raw)| {
            let line = i + 1;
            let err = |reason| Some(Err(LineError { line, reason }));
            if raw.len() > MAX_LINE {
                return err(KeyTextError::LineTooLong(raw.len()));
            }
            if raw.contains(&0) {
                return err(KeyTextError::Nul);
            }
            let Ok(text) = std::str::from_utf8(raw) else {
                return err(KeyTextError::NotUtf8);
            };
            let text = text.strip_suffix('\r').unwrap_or(text).trim();
            if text.is_empty() || text.starts_with('#') {
                return None;
            }
            if text.chars().any(|c| c.is_control() && c != '\t') {
                return err(KeyTextError::ControlCharacter);
            }
            Some(Ok((line, text)))
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn public_keys_parse_with_or_without_the_type() {
        let k = PublicKey([7; 32]);
        let b64 = STANDARD.encode(k.0);
        assert_eq!(parse_public_key(&b64).unwrap(), k);
        assert_eq!(parse_public_key(&format!("{KEY_TYPE} {b64} c")).unwrap(), k);
        assert!(parse_public_key("").is_err());
        assert!(parse_public_key("atou-x25519").is_err());
        assert!(parse_public_key(&"A".repeat(100_000)).is_err());
    }
}
