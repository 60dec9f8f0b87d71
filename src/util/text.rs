//! Text that came from a peer or from a file system, made safe to print.
//!
//! Names in a manifest, abort reasons, a SUBDIR, symlink targets: any of
//! them may hold control characters, escape sequences or bidi overrides
//! meant to drive a terminal or forge a log line. Everything the peer
//! chose goes through [`shown`] before a person sees it.

use std::fmt;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// Bytes shown for a person: lossy UTF-8 with control and bidi characters
/// escaped, so a hostile name cannot drive the terminal or disguise itself.
pub(crate) struct Escaped<'a>(pub &'a [u8]);

impl fmt::Display for Escaped<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for chunk in self.0.utf8_chunks() {
            for c in chunk.valid().chars() {
                match c {
                    '\n' => f.write_str("\\n")?,
                    '\t' => f.write_str("\\t")?,
                    '\r' => f.write_str("\\r")?,
                    c if c.is_ascii_control() => write!(f, "\\x{:02x}", c as u32)?,
                    c if c.is_control() || is_layout_control(c) => {
                        write!(f, "\\u{{{:x}}}", c as u32)?
                    }
                    c => write!(f, "{c}")?,
                }
            }
            if !chunk.invalid().is_empty() {
                f.write_str("\u{fffd}")?;
            }
        }
        Ok(())
    }
}

/// Bidi overrides and line separators: they reorder or break what follows.
fn is_layout_control(c: char) -> bool {
    let bidi = matches!(
        c,
        '\u{061c}' | '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}'
    );
    bidi || matches!(c, '\u{2028}' | '\u{2029}' | '\u{2066}'..='\u{2069}')
}

pub(crate) fn shown(bytes: &[u8]) -> Escaped<'_> {
    Escaped(bytes)
}

pub(crate) fn shown_path(path: &Path) -> Escaped<'_> {
    Escaped(path.as_os_str().as_bytes())
}

/// `bytes` escaped, as a `String`.
pub(crate) fn escape(bytes: &[u8]) -> String {
    Escaped(bytes).to_string()
}

/// An I/O error in words without its `(os error N)` tail: "No such
/// device (os error 19)" is shown as "No such device".
pub(crate) fn io_error(e: &std::io::Error) -> String {
    let text = e.to_string();
    match text.find(" (os error") {
        Some(at) => text[..at].to_string(),
        None => text,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_characters_escape_sequences_and_bidi_overrides_are_escaped() {
        assert_eq!(escape(b"ok name"), "ok name");
        assert_eq!(
            escape(b"x\n127.0.0.1 transfer done; every file verified\x1b[2J"),
            "x\\n127.0.0.1 transfer done; every file verified\\x1b[2J"
        );
        assert_eq!(escape(b"a\nb\x1b[31m"), "a\\nb\\x1b[31m");
        assert_eq!(escape("\u{202e}gpj.exe".as_bytes()), "\\u{202e}gpj.exe");
        assert_eq!(escape(b"\xff"), "\u{fffd}");
    }
}
