//! `atou sim` as a person and a script use it.

mod common;

use std::path::PathBuf;
use std::process::{Command, Output, Stdio};

/// The path cache of the atou processes this test starts: its own, so
/// that neither the user's entries nor another test's hint its runs.
const TEST_CACHE: &str = concat!(env!("CARGO_TARGET_TMPDIR"), "/path-cache-", module_path!());

fn atou(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_atou"))
        .env("XDG_CACHE_HOME", TEST_CACHE)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run atou")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// `name` in this suite's directory, which is kept, as it always was.
fn tmp(name: &str) -> PathBuf {
    static DIR: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    DIR.get_or_init(|| common::kept_dir("cli")).join(name)
}

const LOSSY: &[&str] = &[
    "sim",
    "--bytes",
    "2MB",
    "--fwd",
    "rate 100mbit delay 50ms limit 1000 loss 1%",
    "--rev",
    "delay 50ms",
];

#[test]
fn a_lossy_transfer_prints_atous_summary() {
    let o = atou(LOSSY);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    for line in [
        "config: mss 1472 rcvwin 32768 recovery rack",
        "cc bbr",
        "good bytes goodput",
        "pkts in",
        "rxmts ",
        "minrtt ",
        "rto ",
        "snd_nxt 1383 snd_cwnd",
        "verified 2000000 bytes in order",
    ] {
        assert!(out.contains(line), "missing `{line}` in:\n{out}");
    }
}

#[test]
fn json_uses_atous_names() {
    let mut args = LOSSY.to_vec();
    args.push("--json");
    let o = atou(&args);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("valid JSON");
    for key in [
        "bytes",
        "secs",
        "goodput_bps",
        "rxmts",
        "dup3s",
        "packs",
        "timeouts",
        "dups",
        "badacks",
        "minrtt",
        "maxrtt",
        "avgrtt",
        "rto",
        "srtt",
        "rttvar",
        "snd_nxt",
        "snd_una",
        "snd_max",
        "cwnd",
        "ssthresh",
        "maxburst",
        "tuning",
    ] {
        assert!(v.get(key).is_some(), "no `{key}` in {v}");
    }
    assert_eq!(v["bytes"], 2_000_000);
    // The defaults: bbr with rack unless told otherwise, named in the
    // JSON with the controller's state.
    assert_eq!(v["tuning"]["recovery"], "rack");
    assert_eq!(v["tuning"]["cc"], "bbr");
    assert!(v["controller"]["state"].is_string(), "{v}");
    assert_eq!(v["tuning"]["min_rto"], 0.2);
    assert!(v["rxmts"].as_u64().unwrap() > 0);
}

#[test]
fn the_same_seed_writes_the_same_trace() {
    let run = |seed: &str, name: &str| {
        let path = tmp(name);
        let mut args = LOSSY.to_vec();
        args.extend(["--seed", seed, "--trace", path.to_str().unwrap()]);
        let o = atou(&args);
        assert!(o.status.success(), "{}", stderr(&o));
        std::fs::read(path).unwrap()
    };
    let a = run("5", "a.trace");
    assert_eq!(a, run("5", "b.trace"));
    assert_ne!(a, run("6", "c.trace"));
    let text = String::from_utf8(a).unwrap();
    assert!(text.starts_with("# atou trace"));
    assert!(text.contains("recovery rack"), "{text}");
    assert!(text.contains("cc bbr"), "{text}");
    let body: Vec<&str> = text.lines().filter(|l| !l.starts_with('#')).collect();
    assert!(body
        .iter()
        .any(|l| l.ends_with(" xmt") && l.split(' ').count() == 3));
    assert!(body
        .iter()
        .any(|l| l.ends_with(" ack") && l.split(' ').count() == 6));
}

#[test]
fn events_go_to_stderr_in_atous_words() {
    let mut args = LOSSY.to_vec();
    args.push("--events");
    let o = atou(&args);
    let err = stderr(&o);
    assert!(err.lines().any(|l| l.contains(" 3duprxmit pkt ")), "{err}");
    assert!(err.lines().any(|l| l.contains(" leave_recovery ")), "{err}");
}

#[test]
fn atous_own_config_file_loads_verbatim_and_flags_win() {
    let path = tmp("fack.conf");
    // atou appendix B, the FACK example, verbatim.
    std::fs::write(
        &path,
        "newreno 0\nfack 1\nsack 1\nrampdown 1\nrcvrwin 26\nmaxtime 10\ndroplist 200 200\ndebug 4\n",
    )
    .unwrap();
    let o = atou(&[
        "sim",
        "--bytes",
        "1MB",
        "--config",
        path.to_str().unwrap(),
        "--rcvwin",
        "30",
        "--json",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["tuning"]["recovery"], "fack");
    assert_eq!(
        v["tuning"]["cc"], "aimd",
        "a config file means atou's baseline"
    );
    assert_eq!(v["tuning"]["undo"], false);
    assert_eq!(v["tuning"]["rampdown"], true);
    assert_eq!(v["tuning"]["rcvwin"], 30, "the flag overrides the file");
    assert_eq!(v["timeouts"], 1, "segment 200 dropped twice");
    assert!(
        stderr(&o).contains("debug 4"),
        "the ignored line is reported"
    );
}

#[test]
fn mistakes_get_one_line_naming_the_token_and_exit_2() {
    let bad_conf = tmp("bad.conf");
    std::fs::write(&bad_conf, "mss 1472\ndup_thresh three\n").unwrap();
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (vec!["sim", "--fwd", "rate 10mbit wobble 3"], "wobble"),
        (vec!["sim", "--fwd", "rate fast"], "fast"),
        (vec!["sim", "--rev", "loss 150%"], "150%"),
        (vec!["sim", "--dup-thresh", "0"], "--dup-thresh"),
        (vec!["sim", "--recovery", "vegas"], "vegas"),
        (vec!["sim", "--delack", "forever"], "forever"),
        (vec!["sim", "--bytes", "lots"], "lots"),
        (vec!["sim", "--no-such-flag"], "--no-such-flag"),
        (
            vec!["sim", "--config", bad_conf.to_str().unwrap()],
            "line 2",
        ),
        (vec!["sim", "--config", "/no/such/file"], "/no/such/file"),
        (vec!["sim", "--trace", "/no/such/dir/t"], "/no/such/dir/t"),
        (vec!["send", "x", "h", "--progress", "xml"], "xml"),
        (vec!["send", "x", "h", "--progress-interval", "0"], "0"),
        // rsync's options: a rate needs its unit, a
        // pattern must parse, the list must be there, and a pull has no
        // dry run yet.
        (vec!["sim", "--bwlimit", "10M"], "needs a unit"),
        (
            vec!["send", "x", "127.0.0.1", "--bwlimit", "1000"],
            "--bwlimit",
        ),
        (vec!["send", "x", "127.0.0.1", "--exclude", "a[bc"], "a[bc"),
        (
            vec!["send", "x", "127.0.0.1", "--filter", ". merge-file"],
            "merge files",
        ),
        (
            vec!["send", "x", "127.0.0.1", "--exclude-from", "/no/such/list"],
            "/no/such/list",
        ),
        (vec!["serve", "--hellos-per-sec", "0"], "--hellos-per-sec"),
        (
            vec!["serve", "--hellos-per-sec-per-source", "0"],
            "--hellos-per-sec-per-source",
        ),
        (
            vec![
                "copy",
                "host:x",
                "host:y",
                "/tmp/d",
                "--files-from",
                "/tmp/list",
            ],
            "one remote SRC",
        ),
        (
            vec![
                "send",
                "/tmp",
                "/usr",
                "127.0.0.1",
                "--files-from",
                "/tmp/list",
            ],
            "one SRC",
        ),
        (vec!["send", "x", "127.0.0.1", "-c"], "--skip-existing"),
        // A pull's sender is the far end: no JSON progress here to give.
        (
            vec!["copy", "host:x", "/tmp/d", "--progress", "json"],
            "--progress json",
        ),
    ];
    for (args, needle) in cases {
        let o = atou(&args);
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
        assert_eq!(err.lines().count(), 1, "{args:?}: {err}");
        assert!(
            err.contains(needle),
            "{args:?} should name `{needle}`: {err}"
        );
        assert!(!err.contains("panicked"), "{err}");
    }
}

#[test]
fn a_failed_transfer_exits_1_with_the_reason() {
    let o = atou(&[
        "sim",
        "--bytes",
        "100KB",
        "--fwd",
        "delay 10ms loss 100%",
        "--maxidle",
        "2",
    ]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stdout(&o).contains("status: failed: no ACK for 2 s (maxidle)"),
        "{}",
        stdout(&o)
    );
}

#[test]
fn help_explains_every_knob_with_unit_and_default() {
    let o = atou(&["sim", "--help"]);
    assert!(o.status.success());
    let help = stdout(&o);
    for k in atou::internals::tuning::KNOBS {
        let flag = format!("--{}", k.name.replace('_', "-"));
        assert!(help.contains(&flag), "{flag} missing from --help");
        assert!(
            help.contains(k.value_name),
            "{} has no unit in --help",
            k.name
        );
    }
    // Read as words: clap wraps its lines wherever the width falls.
    let words = help.split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(words.contains("[default: 1472]"));
    assert!(help.contains("--rcvrwin"), "atou's alias is shown");
}

#[test]
fn a_closed_pipe_is_not_an_error() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_atou"))
        .env("XDG_CACHE_HOME", TEST_CACHE)
        .args(["sim", "--bytes", "1MB"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    let o = child.wait_with_output().unwrap();
    assert!(!stderr(&o).contains("panicked"), "{}", stderr(&o));
    assert!(o.status.success());
}

/// Every receiver policy and budget flag of `atou serve` is in
/// docs/security.md's tables, with the default `--help` gives.
#[test]
fn security_md_documents_every_receiver_flag_with_its_default() {
    let help = stdout(&atou(&["serve", "--help"]));
    let doc =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/security.md")).unwrap();
    let section = help
        .split("Receiver policy")
        .nth(1)
        .expect("a receiver policy heading in serve --help");
    // Each flag's entry: its line (six spaces, then the flag) and the
    // wrapped lines after it.
    let mut entries: Vec<String> = Vec::new();
    for line in section.lines() {
        if line.starts_with("      --") {
            entries.push(line.trim().to_string());
        } else if let Some(e) = entries.last_mut().filter(|_| line.starts_with("        ")) {
            e.push(' ');
            e.push_str(line.trim());
        }
    }
    let flags = entries.len();
    for e in &entries {
        let flag = e.split_whitespace().next().unwrap();
        let row = doc
            .lines()
            .find(|l| l.starts_with('|') && l.contains(&format!("`{flag}")))
            .unwrap_or_else(|| panic!("docs/security.md has no row for {flag}"));
        if let Some(d) = e
            .split("[default: ")
            .nth(1)
            .and_then(|d| d.split(']').next())
        {
            assert!(row.contains(d), "{flag}: default {d} not in `{row}`");
        }
    }
    assert!(flags >= 10, "only {flags} flags found under the heading");
}

/// docs/man holds the man pages the clap definitions make: a flag added or
/// changed without regenerating them fails here.
#[test]
fn man_pages_in_docs_are_current() {
    let scratch = common::TestDir::new("man");
    let dir = scratch.path("man");
    let out = atou(&["__man", dir.to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    let committed = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/man");
    let mut stale = Vec::new();
    let mut names: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    names.sort();
    assert!(names.len() >= 8, "{names:?}");
    for name in &names {
        let fresh = std::fs::read(dir.join(name)).unwrap();
        let old = std::fs::read(std::path::Path::new(committed).join(name)).unwrap_or_default();
        if fresh != old {
            stale.push(name.to_string_lossy().to_string());
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    assert!(
        stale.is_empty(),
        "stale man pages in docs/man: {stale:?}; run `cargo run -- __man docs/man`"
    );
}

#[test]
fn completions_name_every_subcommand() {
    for shell in ["bash", "zsh", "fish"] {
        let out = atou(&["completions", shell]);
        assert!(out.status.success(), "{}", stderr(&out));
        let text = stdout(&out);
        for sub in ["send", "copy", "serve", "probe", "sim", "keygen"] {
            assert!(text.contains(sub), "{shell}: no `{sub}`");
        }
    }
}

#[test]
fn a_server_key_file_others_can_write_is_refused_unless_told() {
    let dir = tmp("pinned-key");
    std::fs::create_dir_all(&dir).unwrap();
    let key = dir.join("server.pub");
    std::fs::write(
        &key,
        "atou-x25519 AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA= a-server\n",
    )
    .unwrap();
    std::fs::set_permissions(&key, std::os::unix::fs::PermissionsExt::from_mode(0o666)).unwrap();
    let k = key.to_str().unwrap();
    // Nothing listens at port 9: the key is read before anything is sent.
    let args = ["probe", "127.0.0.1:9", "--server-key", k, "--maxidle", "1"];
    let out = atou(&args);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("chmod go-w"), "{}", stderr(&out));
    let mut lax = args.to_vec();
    lax.push("--no-strict-modes");
    let out = atou(&lax);
    assert!(!stderr(&out).contains("chmod go-w"), "{}", stderr(&out));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn no_auth_with_authorized_keys_is_refused() {
    let dir = tmp("no-auth-keys");
    std::fs::create_dir_all(&dir).unwrap();
    let keys = dir.join("authorized_keys");
    std::fs::write(&keys, "").unwrap();
    let k = keys.to_str().unwrap();
    let d = dir.to_str().unwrap();
    let mut server = Command::new(env!("CARGO_BIN_EXE_atou"))
        .args(["serve", "--bind", "127.0.0.1:0", "--dir", d, "--no-auth"])
        .args(["--authorized-keys", k])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // A server that starts anyway is the failure: stop it, then say so.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let status = loop {
        if let Some(status) = server.try_wait().unwrap() {
            break Some(status);
        }
        if std::time::Instant::now() > deadline {
            let _ = server.kill();
            let _ = server.wait();
            break None;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    let mut err = String::new();
    std::io::Read::read_to_string(&mut server.stderr.take().unwrap(), &mut err).unwrap();
    assert_eq!(status.and_then(|s| s.code()), Some(2), "{err}");
    assert!(err.contains("would not apply"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `atou __cipher-cost` (bench-crypto's yardstick): seals and opens, with
/// the crate's own keys, the datagrams that carry --bytes of a
/// connection's data at --mss, and says what each cost per GB.
#[test]
fn the_cipher_cost_counts_the_datagrams_a_connection_would_send() {
    for (cipher, mss, data) in [
        ("aes-256-gcm", "1472", 1423),
        ("chacha20-poly1305", "8972", 8923),
    ] {
        let out = atou(&[
            "__cipher-cost",
            "--bytes",
            "1MB",
            "--mss",
            mss,
            "--cipher",
            cipher,
        ]);
        assert!(out.status.success(), "{out:?}");
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(v["cipher"], cipher, "{v}");
        assert_eq!(v["data_per_datagram"], data, "{v}");
        assert_eq!(v["datagrams"], 1_000_000_u64.div_ceil(data), "{v}");
        for k in ["seal_cpu_s_per_gb", "open_cpu_s_per_gb"] {
            assert!(v[k].as_f64().unwrap() > 0.0, "{k}: {v}");
        }
    }
    let out = atou(&["__cipher-cost", "--mss", "40"]);
    assert!(!out.status.success());
}
