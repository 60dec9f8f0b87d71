//! The server's `authorized_keys`, parsed: which client keys may connect
//! and what each may do.
//!
//! One key a line, `[OPTIONS] atou-x25519 BASE64 [COMMENT]`, OPTIONS a
//! comma-separated list of `subdir=PATH` (the key may write only beneath
//! PATH, relative to `--dir`), `overwrite` (the key may replace files,
//! if the server allows it at all), `delete` (the key may ask
//! `--delete`, if the server allows it at all), and `owners`, `xattrs`
//! and `acls` (the key may ask `-o`/`-g`, `-X`, `-A`, where the server
//! allows them: `--allow-owners`, `--allow-xattrs`, `--allow-acls`). Blank lines and `#` comments are
//! skipped; any malformed line refuses the whole file, naming the line.
//! Reading the file (and refusing one others could change) is
//! `src/config/keys.rs`'s; this is the pure part the handshake consults.

use std::path::{Component, Path, PathBuf};

use super::key_text::{decode_key, key_file_lines, KeyTextError, LineError, KEY_TYPE};
use super::PublicKey;

/// What an authorized key may do, from its options.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KeyOptions {
    /// `subdir=PATH`: writes only beneath this path of `--dir` (relative,
    /// no `..`).
    pub subdir: Option<PathBuf>,
    /// `overwrite`: may replace files, where the server allows it.
    pub overwrite: bool,
    /// `delete`: may remove what it does not send (`--delete`), where the
    /// server allows it.
    pub delete: bool,
    /// `owners`: may give what it sends owners and groups (`-o`/`-g`),
    /// where the server allows it.
    pub owners: bool,
    /// `xattrs`: may set extended attributes (`-X`), where the server
    /// allows it.
    pub xattrs: bool,
    /// `acls`: may set POSIX ACLs (`-A`), where the server allows it.
    pub acls: bool,
}

/// One line of `authorized_keys`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuthorizedKey {
    pub key: PublicKey,
    pub options: KeyOptions,
    pub comment: String,
    /// Line in the file, for messages.
    pub line: usize,
}

/// A parsed `authorized_keys` file.
#[derive(Debug, Clone, Default)]
pub struct AuthorizedKeys {
    entries: Vec<AuthorizedKey>,
}

impl AuthorizedKeys {
    /// Parses the bytes of an `authorized_keys` file; any malformed line
    /// refuses them all.
    pub fn parse(bytes: &[u8]) -> Result<AuthorizedKeys, LineError> {
        let mut entries: Vec<AuthorizedKey> = Vec::new();
        for item in key_file_lines(bytes) {
            let (line, text) = item?;
            let refuse = |reason| LineError { line, reason };
            let entry = parse_authorized_line(text, line).map_err(refuse)?;
            if let Some(prev) = entries.iter().find(|e| e.key == entry.key) {
                return Err(refuse(KeyTextError::DuplicateKey(prev.line)));
            }
            entries.push(entry);
        }
        Ok(AuthorizedKeys { entries })
    }

    /// The line that authorizes `key`, with its options; `None`: the key
    /// is not authorized.
    pub fn find(&self, key: &PublicKey) -> Option<&AuthorizedKey> {
        self.entries.iter().find(|e| e.key == *key)
    }

    /// Keys listed (one per line; no key twice).
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }

    /// No key listed: no authenticated client is accepted.
    pub(crate) fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

fn parse_authorized_line(text: &str, line: usize) -> Result<AuthorizedKey, KeyTextError> {
    let mut words = text.split_ascii_whitespace();
    let first = words.next().ok_or(KeyTextError::EmptyLine)?;
    let options = if first == KEY_TYPE {
        KeyOptions::default()
    } else {
        let o = parse_options(first)?;
        if words.next() != Some(KEY_TYPE) {
            return Err(KeyTextError::NotAuthorizedLine);
        }
        o
    };
    let b64 = words.next().ok_or(KeyTextError::NoKeyAfterType)?;
    let key = PublicKey(decode_key(b64)?);
    let comment = words.collect::<Vec<_>>().join(" ");
    Ok(AuthorizedKey {
        key,
        options,
        comment,
        line,
    })
}

fn parse_options(s: &str) -> Result<KeyOptions, KeyTextError> {
    let mut o = KeyOptions::default();
    for opt in s.split(',') {
        let flag = match opt {
            "overwrite" => Some(("overwrite", &mut o.overwrite)),
            "delete" => Some(("delete", &mut o.delete)),
            "owners" => Some(("owners", &mut o.owners)),
            "xattrs" => Some(("xattrs", &mut o.xattrs)),
            "acls" => Some(("acls", &mut o.acls)),
            _ => None,
        };
        if let Some((name, flag)) = flag {
            if *flag {
                return Err(KeyTextError::OptionTwice(name));
            }
            *flag = true;
        } else if let Some(dir) = opt.strip_prefix("subdir=") {
            if o.subdir.is_some() {
                return Err(KeyTextError::OptionTwice("subdir="));
            }
            o.subdir = Some(parse_subdir(dir)?);
        } else {
            return Err(KeyTextError::UnknownOption(crate::util::text::escape(
                opt.as_bytes(),
            )));
        }
    }
    Ok(o)
}

/// A relative path that stays beneath `--dir`: no root, no `..`.
fn parse_subdir(s: &str) -> Result<PathBuf, KeyTextError> {
    let p = Path::new(s);
    if s.is_empty() || p.is_absolute() {
        return Err(KeyTextError::SubdirNotRelative);
    }
    if p.components()
        .any(|c| !matches!(c, Component::Normal(_) | Component::CurDir))
    {
        return Err(KeyTextError::SubdirEscapes);
    }
    Ok(p.to_path_buf())
}

#[cfg(test)]
mod tests {
    use base64::engine::general_purpose::STANDARD;
    use base64::Engine;

    use super::*;
    use crate::proto::crypto::key_text::{format_public_key, MAX_LINE};

    fn key(b: u8) -> PublicKey {
        PublicKey([b; 32])
    }

    fn line_of(k: &PublicKey) -> String {
        format_public_key(k, "")
    }

    fn line_error(r: Result<AuthorizedKeys, LineError>) -> (usize, String) {
        match r {
            Err(LineError { line, reason }) => (line, reason.to_string()),
            Ok(keys) => panic!("expected a line error, got {keys:?}"),
        }
    }

    #[test]
    fn authorized_keys_with_options_comments_and_blank_lines() {
        let (a, b, c) = (key(1), key(2), key(3));
        let text = format!(
            "# the team\n\n{} alice@laptop\nsubdir=projects/x,overwrite {} bob\r\ndelete,overwrite,owners,xattrs,acls {}\n",
            line_of(&a),
            line_of(&b),
            line_of(&c)
        );
        let keys = AuthorizedKeys::parse(text.as_bytes()).unwrap();
        assert_eq!(keys.len(), 3);
        let ka = keys.find(&a).unwrap();
        assert_eq!(
            (ka.comment.as_str(), ka.line, &ka.options),
            ("alice@laptop", 3, &KeyOptions::default())
        );
        let kb = keys.find(&b).unwrap();
        assert_eq!(kb.options.subdir.as_deref(), Some(Path::new("projects/x")));
        assert!(kb.options.overwrite && !kb.options.delete);
        assert_eq!(kb.comment, "bob");
        let kc = &keys.find(&c).unwrap().options;
        assert!(kc.overwrite && kc.delete && kc.owners && kc.xattrs && kc.acls);
        assert!(!kb.options.owners && !kb.options.xattrs && !kb.options.acls);
        assert!(keys.find(&key(4)).is_none());
    }

    #[test]
    fn malformed_authorized_keys_lines_are_refused_by_number() {
        let good = line_of(&key(1));
        let cases: Vec<(String, &str)> = vec![
            ("atou-x25519 not!base64".into(), "base64"),
            ("atou-x25519 AAAA".into(), "3 bytes"),
            ("atou-x25519".into(), "no key"),
            (format!("subdir=../etc {good}"), ".."),
            (format!("subdir=/etc {good}"), "relative"),
            (format!("subdir= {good}"), "relative"),
            (format!("overwrite,overwrite {good}"), "twice"),
            (format!("xattrs,acls,xattrs {good}"), "`xattrs` given twice"),
            (format!("delete,overwrite,delete {good}"), "twice"),
            (format!("command=\"rm -rf\" {good}"), "unknown option"),
            (
                "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIA x".into(),
                "unknown option",
            ),
            (
                format!("overwrite ssh-rsa {}", STANDARD.encode([1u8; 32])),
                "expected",
            ),
            (format!("{good}\0"), "NUL"),
            (format!("{good} \x1b[31m"), "control"),
            ("x".repeat(MAX_LINE + 1), "over the"),
        ];
        for (bad, why) in cases {
            let text = format!("{good}\n# ok\n{bad}\n");
            let (line, reason) = line_error(AuthorizedKeys::parse(text.as_bytes()));
            assert_eq!(line, 3, "{bad:?}");
            assert!(reason.contains(why), "{why}: {reason}");
        }
        let (line, reason) = line_error(AuthorizedKeys::parse(b"\n\xff\xfe\n"));
        assert_eq!((line, reason.as_str()), (2, "not UTF-8"));
        let dup = format!("{good}\noverwrite {good}\n");
        let (line, reason) = line_error(AuthorizedKeys::parse(dup.as_bytes()));
        assert_eq!(line, 2);
        assert!(reason.contains("line 1"));
    }

    #[test]
    fn a_hostile_option_is_escaped_in_the_message() {
        let text = format!("evil\u{202e}x {}\n", line_of(&key(1)));
        let err = AuthorizedKeys::parse(text.as_bytes())
            .unwrap_err()
            .to_string();
        assert!(!err.contains('\u{202e}'), "{err}");
    }
}
