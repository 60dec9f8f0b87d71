//! `--exclude PATTERN` and `--exclude-from FILE`: rsync's pattern rules
//! for the common cases (man rsync, "INCLUDE/EXCLUDE PATTERN RULES").
//!
//! A pattern is matched against an entry's path relative to the transfer
//! root, `NAME/sub/file`, NAME being the SRC's final component (atou
//! sends every SRC as rsync sends a SRC without a trailing slash):
//!
//! - `*` matches any run of characters but `/`; `**` (or more stars)
//!   matches anything, `/` included; `?` matches one character but `/`;
//!   `[a-z]`, `[!abc]` or `[^abc]` and `[[:digit:]]`-style classes match
//!   one character of (or not of) the class, never `/`. In a pattern with
//!   wildcards a backslash makes the next character literal; a pattern
//!   without any is matched as plain text, backslashes included.
//! - A trailing `/` matches directories only.
//! - A leading `/` anchors the pattern at the transfer root: it must match
//!   the whole path from NAME on.
//! - Otherwise a pattern with a `/` (other than a trailing one) or a `**`
//!   matches the end of the path at a component boundary (`b/*.o` matches
//!   `a/b/x.o`, not `ab/x.o`), and a pattern without either matches the
//!   final component, at any depth.
//! - `DIR/***` matches DIR (a directory) and everything in it.
//!
//! Rules are exclude (`--exclude`, `- PATTERN`) or include (`--include`,
//! `+ PATTERN`); the first rule whose pattern matches an entry decides, and
//! an entry no rule matches is sent. An excluded directory is not
//! descended into, so an include below it never applies: as in rsync,
//! `--include='*.c' --exclude='*'` sends only the `.c` files at SRC's top
//! unless `--include='*/'` comes first. `!` (or `clear`) drops every rule
//! before it. `--filter` takes the rule forms `- P`, `+ P`, `exclude P`,
//! `include P`, `!` and `clear`; merge files, modifiers and the
//! receiver-side rules (protect, risk, hide, show) are refused rather than
//! read as names. Matching works on bytes: names need not be UTF-8.

use std::fmt;

use thiserror::Error;

/// Longest pattern accepted, in bytes: as long as the longest path.
const MAX_PATTERN: usize = super::manifest::MAX_PATH_LEN;

#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum PatternError {
    #[error("an empty pattern")]
    Empty,
    #[error("`{0}`: a pattern is at most 4096 bytes")]
    TooLong(String),
    #[error("`{0}`: a `[` without its closing `]`")]
    UnclosedClass(String),
    #[error("`{pattern}`: unknown character class `[:{class}:]`")]
    UnknownClass { pattern: String, class: String },
    #[error(
        "`{0}`: not a rule atou reads: give `- PATTERN`, `+ PATTERN`, `exclude PATTERN`, `include PATTERN`, `!` or `clear` (merge files, modifiers and the receiver's rules are not supported)"
    )]
    UnknownRule(String),
    #[error("{file} line {line}: {error}")]
    InFile {
        file: String,
        line: usize,
        error: Box<PatternError>,
    },
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Tok {
    Byte(u8),
    /// `?`
    One,
    /// `*`: any run without `/`.
    Star,
    /// `**`: any run.
    Globstar,
    /// `[...]`: inclusive byte ranges, negated or not.
    Class {
        negated: bool,
        ranges: Vec<(u8, u8)>,
    },
}

/// One parsed pattern.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Rule {
    /// As the user wrote it, for messages.
    text: String,
    /// An include (`+`) rule: a match sends the entry.
    include: bool,
    dir_only: bool,
    /// Matched at the root only (leading `/`).
    anchored: bool,
    /// Matched against the path's end rather than its final component.
    whole_path: bool,
    toks: Vec<Tok>,
}

/// The filter rules of one transfer, in order; empty excludes nothing.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Filters {
    rules: Vec<Rule>,
}

fn class_ranges(name: &str) -> Option<Vec<(u8, u8)>> {
    Some(match name {
        "alpha" => vec![(b'a', b'z'), (b'A', b'Z')],
        "digit" => vec![(b'0', b'9')],
        "alnum" => vec![(b'a', b'z'), (b'A', b'Z'), (b'0', b'9')],
        "upper" => vec![(b'A', b'Z')],
        "lower" => vec![(b'a', b'z')],
        "space" => vec![(b' ', b' '), (b'\t', b'\r')],
        "xdigit" => vec![(b'0', b'9'), (b'a', b'f'), (b'A', b'F')],
        "punct" => vec![(b'!', b'/'), (b':', b'@'), (b'[', b'`'), (b'{', b'~')],
        _ => return None,
    })
}

/// Reads a `[...]` class starting after its `[`; returns it and the
/// index after its `]`.
fn parse_class(p: &[u8], mut i: usize, text: &str) -> Result<(Tok, usize), PatternError> {
    let unclosed = || PatternError::UnclosedClass(text.to_string());
    let negated = matches!(p.get(i), Some(b'!' | b'^'));
    if negated {
        i += 1;
    }
    let mut ranges = Vec::new();
    let mut first = true;
    loop {
        let Some(&c) = p.get(i) else {
            return Err(unclosed());
        };
        // A `]` right after `[` (or `[!`) is a member, as in glob(7).
        if c == b']' && !first {
            return Ok((Tok::Class { negated, ranges }, i + 1));
        }
        first = false;
        if c == b'[' && p.get(i + 1) == Some(&b':') {
            let rest = &p[i + 2..];
            let end = rest
                .windows(2)
                .position(|w| w == b":]")
                .ok_or_else(unclosed)?;
            let name = String::from_utf8_lossy(&rest[..end]).into_owned();
            let r = class_ranges(&name).ok_or_else(|| PatternError::UnknownClass {
                pattern: text.to_string(),
                class: name,
            })?;
            ranges.extend(r);
            i += 2 + end + 2;
            continue;
        }
        let lo = if c == b'\\' {
            i += 1;
            *p.get(i).ok_or_else(unclosed)?
        } else {
            c
        };
        i += 1;
        if p.get(i) == Some(&b'-') && p.get(i + 1).is_some_and(|&h| h != b']') {
            let hi = p[i + 1];
            ranges.push((lo.min(hi), lo.max(hi)));
            i += 2;
        } else {
            ranges.push((lo, lo));
        }
    }
}

fn tokens(p: &[u8], text: &str) -> Result<Vec<Tok>, PatternError> {
    let wild = p.iter().any(|b| matches!(b, b'*' | b'?' | b'['));
    if !wild {
        // rsync: without wildcards the pattern is plain text.
        return Ok(p.iter().map(|&b| Tok::Byte(b)).collect());
    }
    let mut toks = Vec::with_capacity(p.len());
    let mut i = 0;
    while i < p.len() {
        match p[i] {
            b'*' => {
                let run = p[i..].iter().take_while(|&&b| b == b'*').count();
                toks.push(if run >= 2 { Tok::Globstar } else { Tok::Star });
                i += run;
            }
            b'?' => {
                toks.push(Tok::One);
                i += 1;
            }
            b'[' => {
                let (tok, next) = parse_class(p, i + 1, text)?;
                toks.push(tok);
                i = next;
            }
            b'\\' if i + 1 < p.len() => {
                toks.push(Tok::Byte(p[i + 1]));
                i += 2;
            }
            b => {
                toks.push(Tok::Byte(b));
                i += 1;
            }
        }
    }
    Ok(toks)
}

impl Rule {
    fn parse(text: &str, include: bool) -> Result<Rule, PatternError> {
        let mut p = text.as_bytes();
        let anchored = p.first() == Some(&b'/');
        if anchored {
            p = &p[1..];
        }
        let dir_only = p.last() == Some(&b'/');
        if dir_only {
            p = &p[..p.len() - 1];
        }
        if p.is_empty() {
            return Err(PatternError::Empty);
        }
        let whole_path = anchored || p.contains(&b'/') || p.windows(2).any(|w| w == b"**");
        Ok(Rule {
            text: text.to_string(),
            include,
            dir_only,
            anchored,
            whole_path,
            toks: tokens(p, text)?,
        })
    }

    fn matches(&self, path: &[u8], is_dir: bool) -> bool {
        if self.dir_only && !is_dir {
            return false;
        }
        let text = if self.whole_path {
            path
        } else {
            let start = path.iter().rposition(|&b| b == b'/').map_or(0, |i| i + 1);
            &path[start..]
        };
        // reach[j]: the tokens so far can match text[start..j] for some
        // allowed start. Starts: the beginning, and for an unanchored
        // whole-path rule every component boundary (rsync matches such a
        // pattern against the end of the path).
        let mut reach = vec![false; text.len() + 1];
        reach[0] = true;
        if self.whole_path && !self.anchored {
            for (i, &b) in text.iter().enumerate() {
                if b == b'/' {
                    reach[i + 1] = true;
                }
            }
        }
        let mut next = vec![false; text.len() + 1];
        for tok in &self.toks {
            next.fill(false);
            match tok {
                Tok::Star | Tok::Globstar => {
                    let cross = matches!(tok, Tok::Globstar);
                    for j in 0..=text.len() {
                        next[j] =
                            reach[j] || (j > 0 && next[j - 1] && (cross || text[j - 1] != b'/'));
                    }
                }
                _ => {
                    for j in 0..text.len() {
                        let c = text[j];
                        let ok = match tok {
                            Tok::Byte(b) => c == *b,
                            Tok::One => c != b'/',
                            Tok::Class { negated, ranges } => {
                                c != b'/'
                                    && ranges.iter().any(|&(lo, hi)| (lo..=hi).contains(&c))
                                        != *negated
                            }
                            Tok::Star | Tok::Globstar => unreachable!("handled above"),
                        };
                        next[j + 1] = reach[j] && ok;
                    }
                }
            }
            std::mem::swap(&mut reach, &mut next);
            if !reach.iter().any(|&r| r) {
                return false;
            }
        }
        reach[text.len()]
    }
}

impl Filters {
    /// Adds one `--exclude` pattern. As in rsync, a `+ ` prefix makes it
    /// an include, a `- ` prefix is dropped, and `!` clears.
    pub fn add_exclude(&mut self, pattern: &str) -> Result<(), PatternError> {
        self.add_prefixed(pattern, false)
    }

    /// Adds one `--include` pattern (prefixes as for [`Self::add_exclude`]).
    pub fn add_include(&mut self, pattern: &str) -> Result<(), PatternError> {
        self.add_prefixed(pattern, true)
    }

    /// rsync's "old prefixes", read in `--include`, `--exclude` and
    /// their files: `- ` and `+ ` say the rule, a lone `!` clears, and
    /// anything else is a pattern of the flag's own kind.
    fn add_prefixed(&mut self, pattern: &str, include: bool) -> Result<(), PatternError> {
        if pattern == "!" || pattern.starts_with("- ") || pattern.starts_with("+ ") {
            self.add_rule(pattern)
        } else {
            self.push(pattern, include)
        }
    }

    /// Adds one `--filter` rule: `- P`, `+ P`, `exclude P`, `include P`,
    /// `!` or `clear` (man rsync, "FILTER RULES"; a rule's name and its
    /// pattern are separated by one space; modifiers are refused).
    pub fn add_rule(&mut self, rule: &str) -> Result<(), PatternError> {
        if matches!(rule, "!" | "clear") {
            self.rules.clear();
            return Ok(());
        }
        let (name, pattern) = rule.split_once(' ').unwrap_or((rule, ""));
        match name {
            "-" | "exclude" => self.push(pattern, false),
            "+" | "include" => self.push(pattern, true),
            _ => Err(PatternError::UnknownRule(rule.to_string())),
        }
    }

    fn push(&mut self, pattern: &str, include: bool) -> Result<(), PatternError> {
        if pattern.len() > MAX_PATTERN {
            let head: String = pattern.chars().take(48).collect();
            return Err(PatternError::TooLong(format!("{head}…")));
        }
        // rsync's `DIR/***`: the directory and everything below it.
        if let Some(dir) = pattern.strip_suffix("/***").filter(|d| !d.is_empty()) {
            let mut whole = Rule::parse(&format!("{dir}/"), include)?;
            let below = Rule::parse(&format!("{dir}/**"), include)?;
            // Read back as written, once (the second half says nothing).
            whole.text = pattern.to_string();
            self.rules.push(whole);
            self.rules.push(Rule {
                text: String::new(),
                ..below
            });
            return Ok(());
        }
        self.rules.push(Rule::parse(pattern, include)?);
        Ok(())
    }

    /// Adds the rules of an `--exclude-from` (`include` false) or
    /// `--include-from` file's `text`, one per line; blank lines and lines
    /// starting with `#` or `;` are skipped, `- ` and `+ ` prefixes say
    /// the rule and a lone `!` clears (rsync's rules for these files).
    /// `file` names it in errors.
    pub fn add_lines(&mut self, text: &str, file: &str, include: bool) -> Result<(), PatternError> {
        for (i, line) in text.lines().enumerate() {
            let line = line.strip_suffix('\r').unwrap_or(line);
            if line.is_empty() || line.starts_with('#') || line.starts_with(';') {
                continue;
            }
            self.add_prefixed(line, include)
                .map_err(|e| PatternError::InFile {
                    file: file.to_string(),
                    line: i + 1,
                    error: Box::new(e),
                })?;
        }
        Ok(())
    }

    /// Each rule as `--filter` reads it back, in order (a pull passes
    /// them to the remote sender this way).
    pub fn rules(&self) -> impl Iterator<Item = String> + '_ {
        self.rules
            .iter()
            .filter(|r| !r.text.is_empty())
            .map(|r| format!("{} {}", if r.include { '+' } else { '-' }, r.text))
    }

    pub fn is_empty(&self) -> bool {
        self.rules.is_empty()
    }

    /// Whether the entry at `path` (relative to the transfer root,
    /// `/`-separated) is left out: the first rule that matches decides.
    pub fn excludes(&self, path: &[u8], is_dir: bool) -> bool {
        self.rules
            .iter()
            .find(|r| r.matches(path, is_dir))
            .is_some_and(|r| !r.include)
    }

    /// Whether the entry at `path` is left out whatever kind of entry it
    /// is, so the walk need not look at it at all.
    pub fn excludes_any_kind(&self, path: &[u8]) -> bool {
        self.excludes(path, false) && self.excludes(path, true)
    }
}

impl fmt::Display for Filters {
    /// The rules, `, `-separated, as `--filter` reads them.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let rules: Vec<String> = self.rules().collect();
        f.write_str(&rules.join(", "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn ex(patterns: &[&str]) -> Filters {
        let mut e = Filters::default();
        for p in patterns {
            e.add_exclude(p).unwrap();
        }
        e
    }

    const FILE: bool = false;
    const DIR: bool = true;

    /// man rsync, "INCLUDE/EXCLUDE PATTERN RULES" and its examples, with
    /// paths from the transfer root. Each row: pattern, path, is_dir,
    /// excluded.
    #[test]
    fn rsync_documented_examples() {
        let table: &[(&str, &str, bool, bool)] = &[
            // "- *.o" excludes all names matching *.o, at any depth.
            ("*.o", "a.o", FILE, true),
            ("*.o", "t/sub/deep/x.o", FILE, true),
            ("*.o", "t/x.oo", FILE, false),
            ("*.o", "t/x.o/y", FILE, false),
            // "- /foo" excludes foo in the transfer root only.
            ("/foo", "foo", FILE, true),
            ("/foo", "foo", DIR, true),
            ("/foo", "t/foo", FILE, false),
            // "- foo/" excludes any directory named foo, not a file.
            ("foo/", "t/a/foo", DIR, true),
            ("foo/", "t/a/foo", FILE, false),
            ("foo/", "foo", DIR, true),
            // "- /foo/*/bar": bar two levels below /foo.
            ("/foo/*/bar", "foo/x/bar", FILE, true),
            ("/foo/*/bar", "foo/x/y/bar", FILE, false),
            ("/foo/*/bar", "foo/bar", FILE, false),
            // "- /foo/**/bar": two or more levels below.
            ("/foo/**/bar", "foo/x/bar", FILE, true),
            ("/foo/**/bar", "foo/x/y/z/bar", FILE, true),
            ("/foo/**/bar", "foo/bar", FILE, false),
            ("/foo/**/bar", "t/foo/x/bar", FILE, false),
            // "*" stops at slashes; "**" does not.
            ("/t/*", "t/a", FILE, true),
            ("/t/*", "t/a/b", FILE, false),
            ("/t/**", "t/a/b", FILE, true),
            // "?" matches one character but a slash.
            ("a?c", "t/abc", FILE, true),
            ("a?c", "t/ac", FILE, false),
            ("/t?a", "t/a", FILE, false),
            // A pattern with an inner slash matches the end of the path
            // at a component boundary.
            ("sub/*.o", "t/sub/x.o", FILE, true),
            ("sub/*.o", "t/xsub/x.o", FILE, false),
            ("sub/*.o", "t/sub/deep/x.o", FILE, false),
            ("b/c", "t/a/b/c", FILE, true),
            // "**" makes a pattern match the whole path: "**.o" crosses
            // directories; "foo/**" anything below any foo.
            ("**.o", "t/a/b.o", FILE, true),
            ("foo/**", "t/a/foo/x/y", FILE, true),
            ("foo/**", "t/a/foo", DIR, false),
            // "dir_name/***": the directory and everything in it.
            ("cache/***", "t/cache", DIR, true),
            ("cache/***", "t/cache/x", FILE, true),
            ("cache/***", "t/cache", FILE, false),
            // Character classes.
            ("[a-c]*.log", "t/b1.log", FILE, true),
            ("[a-c]*.log", "t/d1.log", FILE, false),
            ("[!a-c]*.log", "t/d1.log", FILE, true),
            ("file[[:digit:]]", "t/file7", FILE, true),
            ("file[[:digit:]]", "t/filex", FILE, false),
            // A backslash escapes a wildcard in a wildcard pattern ...
            ("\\*.txt*", "t/*.txt1", FILE, true),
            ("\\*.txt*", "t/a.txt1", FILE, false),
            // ... and is plain text in a pattern without one.
            ("a\\b", "t/a\\b", FILE, true),
            // rsync's "- " prefix is the exclude rule itself.
            ("- *.tmp", "t/x.tmp", FILE, true),
        ];
        for &(pattern, path, is_dir, want) in table {
            assert_eq!(
                ex(&[pattern]).excludes(path.as_bytes(), is_dir),
                want,
                "pattern `{pattern}` on {} `{path}`",
                if is_dir { "directory" } else { "file" }
            );
        }
    }

    #[test]
    fn bad_patterns_are_refused_with_a_reason() {
        let mut e = Filters::default();
        assert_eq!(e.add_exclude(""), Err(PatternError::Empty));
        assert_eq!(e.add_exclude("/"), Err(PatternError::Empty));
        assert!(matches!(
            e.add_exclude("a[bc"),
            Err(PatternError::UnclosedClass(_))
        ));
        assert!(matches!(
            e.add_exclude("[[:nope:]]"),
            Err(PatternError::UnknownClass { .. })
        ));
        for rule in [
            ". merge-file",
            ": .rsync-filter",
            "-! x",
            "P keep",
            "hide x",
            "x",
        ] {
            assert!(
                matches!(e.add_rule(rule), Err(PatternError::UnknownRule(_))),
                "{rule}"
            );
        }
        assert_eq!(e.add_rule("- "), Err(PatternError::Empty));
        assert!(e.add_exclude(&"a".repeat(5000)).is_err());
        assert!(e.is_empty(), "nothing added by a refused pattern");
    }

    #[test]
    fn exclude_from_skips_comments_and_blank_lines() {
        let mut e = Filters::default();
        e.add_lines(
            "# build output\n*.o\n\n; editor files\n*~\r\n- /t/tmp/\n+ keep.o\n",
            "list",
            false,
        )
        .unwrap();
        assert!(e.excludes(b"t/x.o", FILE));
        assert!(e.excludes(b"t/x~", FILE), "a CRLF line ends before its CR");
        assert!(e.excludes(b"t/tmp", DIR));
        assert!(!e.excludes(b"t/# build output", FILE));
        assert!(!e.excludes(b"t/x.c", FILE));
        // `+ keep.o` comes after `*.o`: the first match decides.
        assert!(e.excludes(b"t/keep.o", FILE));
        let err = e.add_lines("ok\n+ \n", "list", false).unwrap_err();
        assert!(err.to_string().starts_with("list line 2:"), "{err}");
    }

    /// rsync's order: the first rule that matches decides, `!` clears,
    /// and prefixes in --include/--exclude say the rule.
    #[test]
    fn the_first_matching_rule_decides() {
        let mut f = Filters::default();
        f.add_include("*/").unwrap();
        f.add_include("*.c").unwrap();
        f.add_exclude("*").unwrap();
        assert!(!f.excludes(b"t", DIR));
        assert!(!f.excludes(b"t/deep/a.c", FILE));
        assert!(f.excludes(b"t/deep/a.h", FILE));
        assert!(
            !f.excludes_any_kind(b"t/deep/a.h"),
            "a directory would be kept"
        );
        assert!(f.excludes_any_kind(b"t/never") == f.excludes(b"t/never", DIR));
        f.add_exclude("!").unwrap();
        assert!(f.is_empty());
        f.add_exclude("+ keep").unwrap();
        f.add_include("- drop").unwrap();
        f.add_rule("exclude *").unwrap();
        assert!(!f.excludes(b"t/keep", FILE));
        assert!(f.excludes(b"t/drop", FILE));
        assert!(f.excludes(b"t/other", FILE));
        // Read back as --filter rules, they make the same filters.
        let mut again = Filters::default();
        for rule in f.rules() {
            again.add_rule(&rule).unwrap();
        }
        assert_eq!(again, f);
        let mut dirs = Filters::default();
        dirs.add_include("cache/***").unwrap();
        dirs.add_exclude("*").unwrap();
        let back: Vec<String> = dirs.rules().collect();
        assert_eq!(back, ["+ cache/***", "- *"]);
        assert!(!dirs.excludes(b"cache/x/y", FILE));
    }

    /// A reference matcher, written the slow way: every split of the
    /// text for each star. Used to check the table-driven one.
    fn slow(toks: &[Tok], t: &[u8]) -> bool {
        match toks.split_first() {
            None => t.is_empty(),
            Some((Tok::Star, rest)) => (0..=t.len())
                .take_while(|&k| !t[..k].contains(&b'/'))
                .any(|k| slow(rest, &t[k..])),
            Some((Tok::Globstar, rest)) => (0..=t.len()).any(|k| slow(rest, &t[k..])),
            Some((Tok::Byte(b), rest)) => t.first() == Some(b) && slow(rest, &t[1..]),
            Some((Tok::One, rest)) => t.first().is_some_and(|&c| c != b'/') && slow(rest, &t[1..]),
            Some((Tok::Class { .. }, _)) => unreachable!("not generated"),
        }
    }

    proptest! {
        /// The matcher agrees with the slow reference for anchored
        /// patterns over a small alphabet where stars and slashes meet
        /// often.
        #[test]
        fn agrees_with_a_slow_reference(
            pat in "[ab/*?]{1,8}",
            path in "[ab/]{0,10}",
        ) {
            let pattern = format!("/{pat}");
            prop_assume!(!pattern.ends_with('/'));
            let rule = Rule::parse(&pattern, false).unwrap();
            prop_assert_eq!(
                rule.matches(path.as_bytes(), false),
                slow(&rule.toks, path.as_bytes())
            );
        }

        /// An unanchored pattern without a slash matches a path exactly
        /// when it matches the path's final component alone.
        #[test]
        fn a_slashless_pattern_matches_the_final_component(
            pat in "[ab*?]{1,6}",
            dirs in "([ab]{1,3}/){0,3}",
            name in "[ab]{1,4}",
        ) {
            prop_assume!(!pat.contains("**"));
            let e = ex(&[&pat]);
            let path = format!("{dirs}{name}");
            prop_assert_eq!(
                e.excludes(path.as_bytes(), false),
                e.excludes(name.as_bytes(), false)
            );
        }
    }
}
