//! `atou copy` over ssh (the ssh bootstrap): push and pull through a
//! private sshd on 127.0.0.1, the way scripts/bench-transfer.sh runs one
//! (installed with apt-get when missing and the tests run as root; skipped,
//! with the reason printed, otherwise). The remote atou is this build's
//! binary (`--remote-atou`).
//!
//! Covered: a tree pushed and pulled arrives byte for byte with its modes
//! and symlinks; no atou on the remote and a failing ssh give one clear
//! line and write nothing; a transfer killed at either end, in either
//! direction, completes when run again; no UDP port stays open.

mod common;

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::{symlink, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::{noise, say, TestDir, ATOU};

/// The path cache of the atou processes this test starts: its own, so
/// that neither the user's entries nor another test's hint its runs.
const TEST_CACHE: &str = concat!(env!("CARGO_TARGET_TMPDIR"), "/path-cache-", module_path!());

const MIB: usize = 1 << 20;

/// A directory of the test's own that sshd's user can reach (StrictModes
/// is off, but root's temporary directories are 0700).
fn dir_for_sshd(test: &str) -> TestDir {
    let dir = TestDir::new(&format!("ssh-{test}"));
    fs::set_permissions(dir.root(), fs::Permissions::from_mode(0o755)).unwrap();
    dir
}

fn run(cmd: &mut Command) -> Output {
    cmd.output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"))
}

fn is_root() -> bool {
    String::from_utf8_lossy(&run(Command::new("id").arg("-u")).stdout).trim() == "0"
}

/// sshd and ssh are there, installed now if need be (as root, with
/// apt-get, keeping the package's own sshd from starting); or why not.
/// One test at a time: the tests run in parallel, and a second apt-get
/// run while the first holds dpkg's lock fails, or finds the package half
/// installed (a CI run once skipped one test and saw "Privilege
/// separation user sshd does not exist" in another).
fn have_openssh() -> Result<(), String> {
    static INSTALLING: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one_at_a_time = INSTALLING.lock().unwrap_or_else(|e| e.into_inner());
    let present = || {
        Path::new("/usr/sbin/sshd").exists()
            && ["ssh", "ssh-keygen"].iter().all(|c| {
                Command::new(c)
                    .arg("-V")
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .status()
                    .is_ok()
            })
    };
    if present() {
        return Ok(());
    }
    if !is_root() {
        return Err("no sshd/ssh here and not root to install openssh-server".into());
    }
    let policy = Path::new("/usr/sbin/policy-rc.d");
    let ours = !policy.exists();
    if ours {
        fs::write(policy, "#!/bin/sh\nexit 101\n").unwrap();
        fs::set_permissions(policy, fs::Permissions::from_mode(0o755)).unwrap();
    }
    let install = |update: bool| {
        let mut sh = String::from("export DEBIAN_FRONTEND=noninteractive; ");
        if update {
            sh += "apt-get update -qq && ";
        }
        sh += "apt-get install -y -qq openssh-server openssh-client";
        Command::new("sh")
            .args(["-c", &sh])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    };
    let ok = install(false) || install(true);
    if ours {
        let _ = fs::remove_file(policy);
    }
    if ok && present() {
        Ok(())
    } else {
        Err("could not install openssh-server with apt-get".into())
    }
}

/// Where a private sshd runs (`far`) and where ssh and atou copy run
/// (`near`): two network namespaces.
#[derive(Clone, Copy)]
struct Placed<'a> {
    far: &'a str,
    near: &'a str,
}

/// A private sshd on 127.0.0.1 with its own host key and one client key,
/// or in a namespace of [`Namespaces`] or [`ThreeHosts`].
struct Sshd {
    child: Child,
    port: u16,
    user: String,
    key: PathBuf,
    /// Where it listens.
    addr: String,
    /// The namespace atou and ssh run in, when sshd runs in another.
    near: Option<String>,
}

impl Drop for Sshd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_tcp_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

impl Sshd {
    /// Started in `dir`, or `None` (said why) when this host cannot.
    fn start(dir: &Path, test: &str) -> Option<Sshd> {
        Sshd::start_at(dir, test, "127.0.0.1", None)
    }

    /// Started in `dir` on `addr`, in the far namespace of `net` if any
    /// (atou and ssh then run in its near one).
    fn start_at(dir: &Path, test: &str, addr: &str, net: Option<Placed<'_>>) -> Option<Sshd> {
        if let Err(why) = have_openssh() {
            common::cannot_run(test, &why);
            return None;
        }
        let ssh = dir.join("ssh");
        fs::create_dir_all(&ssh).unwrap();
        fs::set_permissions(&ssh, fs::Permissions::from_mode(0o700)).unwrap();
        for (name, comment) in [("host_key", "atou-test-host"), ("client_key", "atou-test")] {
            let out = run(Command::new("ssh-keygen")
                .args(["-q", "-t", "ed25519", "-N", "", "-C", comment, "-f"])
                .arg(ssh.join(name)));
            assert!(out.status.success(), "ssh-keygen: {out:?}");
        }
        fs::copy(ssh.join("client_key.pub"), ssh.join("authorized_keys")).unwrap();
        if is_root() {
            fs::create_dir_all("/run/sshd").unwrap();
            fs::set_permissions("/run/sshd", fs::Permissions::from_mode(0o755)).unwrap();
        }
        let user = String::from_utf8_lossy(&run(Command::new("id").arg("-un")).stdout)
            .trim()
            .to_string();
        for _attempt in 0..5 {
            let port = free_tcp_port();
            let config = ssh.join("sshd_config");
            fs::write(
                &config,
                format!(
                    "Port {port}\nListenAddress {addr}\nHostKey {s}/host_key\n\
                     PidFile {s}/sshd.pid\nAuthorizedKeysFile {s}/authorized_keys\n\
                     PermitRootLogin yes\nPubkeyAuthentication yes\nPasswordAuthentication no\n\
                     KbdInteractiveAuthentication no\nUsePAM no\nStrictModes no\nUseDNS no\n\
                     PrintMotd no\n",
                    s = ssh.display()
                ),
            )
            .unwrap();
            let mut sshd = Command::new("/usr/sbin/sshd");
            if let Some(net) = net {
                sshd = Command::new("ip");
                sshd.args(["netns", "exec", net.far, "/usr/sbin/sshd"]);
            }
            let child = sshd
                .args(["-D", "-f"])
                .arg(&config)
                .arg("-E")
                .arg(ssh.join("sshd.log"))
                .stdin(Stdio::null())
                .spawn()
                .expect("run sshd");
            let sshd = Sshd {
                child,
                port,
                user: user.clone(),
                key: ssh.join("client_key"),
                addr: addr.to_string(),
                near: net.map(|n| n.near.to_string()),
            };
            let deadline = Instant::now() + Duration::from_secs(10);
            while Instant::now() < deadline {
                let ok = sshd
                    .here("sh")
                    .args(["-c", &format!("{} {}@{addr} true", sshd.ssh(), user)])
                    .stdin(Stdio::null())
                    .stderr(Stdio::null())
                    .status()
                    .is_ok_and(|s| s.success());
                if ok {
                    return Some(sshd);
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            let log = fs::read_to_string(ssh.join("sshd.log")).unwrap_or_default();
            say(&format!(
                "{test}: sshd on {port} did not take a login: {log}"
            ));
        }
        if !is_root() {
            // sshd may want /run/sshd, which only root can make.
            common::cannot_run(
                test,
                "not root, and the private sshd does not start (see above)",
            );
            return None;
        }
        panic!("{test}: cannot start a private sshd (see above)");
    }

    /// The `--ssh` command.
    fn ssh(&self) -> String {
        format!(
            "ssh -p {} -i {} -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null \
             -o BatchMode=yes -o LogLevel=ERROR",
            self.port,
            self.key.display()
        )
    }

    /// `USER@ADDR:PATH`.
    fn at(&self, path: &Path) -> String {
        format!("{}@{}:{}", self.user, self.addr, path.display())
    }

    /// `program`, run where ssh runs.
    fn here(&self, program: &str) -> Command {
        match &self.near {
            Some(near) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", near, program]);
                c
            }
            None => Command::new(program),
        }
    }

    /// `atou copy ARGS... --ssh ... --remote-atou THIS-BUILD`.
    fn copy(&self, args: &[&str]) -> Command {
        self.copy_with(ATOU, args)
    }

    /// `atou copy ARGS... --ssh ... --remote-atou REMOTE_ATOU`.
    fn copy_with(&self, remote_atou: &str, args: &[&str]) -> Command {
        let mut c = self.here(ATOU);
        c.env("XDG_CACHE_HOME", TEST_CACHE);
        c.arg("copy")
            .args(args)
            .args(["--ssh", &self.ssh(), "--remote-atou", remote_atou]);
        c
    }
}

/// A small tree with every kind: files of several sizes (empty, one
/// byte, over a chunk), odd modes, a subdirectory, an empty directory,
/// a symlink, a name with a space.
fn make_tree(root: &Path) {
    fs::create_dir_all(root.join("sub/deeper")).unwrap();
    fs::create_dir_all(root.join("empty dir")).unwrap();
    fs::write(root.join("empty"), b"").unwrap();
    fs::write(root.join("one"), b"1").unwrap();
    fs::write(root.join("sub/big.bin"), noise(2 * MIB + 12345, 1)).unwrap();
    fs::write(root.join("sub/deeper/with space.txt"), b"hello over ssh\n").unwrap();
    fs::write(root.join("run.sh"), b"#!/bin/sh\necho hi\n").unwrap();
    fs::set_permissions(root.join("run.sh"), fs::Permissions::from_mode(0o750)).unwrap();
    fs::set_permissions(root.join("one"), fs::Permissions::from_mode(0o600)).unwrap();
    fs::set_permissions(root.join("sub"), fs::Permissions::from_mode(0o711)).unwrap();
    symlink("sub/big.bin", root.join("link")).unwrap();
}

/// Every entry under `root`: kind, permission bits, contents or target.
fn snapshot(root: &Path) -> BTreeMap<String, (char, u32, Vec<u8>)> {
    let mut out = BTreeMap::new();
    let mut todo = vec![root.to_path_buf()];
    while let Some(dir) = todo.pop() {
        for e in fs::read_dir(&dir).unwrap() {
            let p = e.unwrap().path();
            let rel = p.strip_prefix(root).unwrap().display().to_string();
            let m = fs::symlink_metadata(&p).unwrap();
            let mode = m.mode() & 0o7777;
            let v = if m.file_type().is_symlink() {
                (
                    'l',
                    0,
                    fs::read_link(&p)
                        .unwrap()
                        .into_os_string()
                        .into_encoded_bytes(),
                )
            } else if m.is_dir() {
                todo.push(p.clone());
                ('d', mode, Vec::new())
            } else {
                ('f', mode, fs::read(&p).unwrap())
            };
            out.insert(rel, v);
        }
    }
    out
}

fn assert_same_tree(a: &Path, b: &Path) {
    let (x, y) = (snapshot(a), snapshot(b));
    let names = |m: &BTreeMap<String, (char, u32, Vec<u8>)>| m.keys().cloned().collect::<Vec<_>>();
    assert_eq!(
        names(&x),
        names(&y),
        "{} and {} list different names",
        a.display(),
        b.display()
    );
    for (k, v) in &x {
        let w = &y[k];
        assert_eq!((v.0, v.1), (w.0, w.1), "{k}: kind or mode differs");
        assert!(v.2 == w.2, "{k}: contents differ");
    }
}

fn text(o: &Output) -> String {
    format!(
        "status {}\nstdout: {}\nstderr: {}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// UDP ports bound on this host now (IPv4 and IPv6), from /proc/net.
fn udp_ports() -> Vec<u16> {
    let mut ports = Vec::new();
    for f in ["/proc/net/udp", "/proc/net/udp6"] {
        for line in fs::read_to_string(f).unwrap_or_default().lines().skip(1) {
            let local = line.split_whitespace().nth(1).unwrap_or("");
            if let Some((_, port)) = local.rsplit_once(':') {
                if let Ok(p) = u16::from_str_radix(port, 16) {
                    ports.push(p);
                }
            }
        }
    }
    ports
}

/// UDP ports of `ports` still open after `wait`: atou returns once the
/// transfer is verified, and the remote end exits a round trip later,
/// when ssh's tear-down reaches it.
fn still_open_after(ports: &[u16], wait: std::time::Duration) -> Vec<u16> {
    let until = std::time::Instant::now() + wait;
    loop {
        let open: Vec<u16> = udp_ports()
            .into_iter()
            .filter(|p| ports.contains(p))
            .collect();
        if open.is_empty() || std::time::Instant::now() >= until {
            return open;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// Two free consecutive UDP ports.
fn free_udp_pair() -> u16 {
    for _ in 0..100 {
        let a = std::net::UdpSocket::bind("0.0.0.0:0").unwrap();
        let p = a.local_addr().unwrap().port();
        if p < u16::MAX && std::net::UdpSocket::bind(("0.0.0.0", p + 1)).is_ok() {
            return p;
        }
    }
    panic!("no two free consecutive UDP ports");
}

#[test]
fn push_and_pull_a_tree_and_leave_no_port_open() {
    let s = dir_for_sshd("tree");
    let Some(sshd) = Sshd::start(s.root(), "push_and_pull_a_tree") else {
        return;
    };
    let src = s.path("data");
    make_tree(&src);

    // Push into a directory that does not exist yet, on a fixed UDP port.
    let port = free_udp_pair();
    let dest = s.path("pushed");
    let out = run(&mut sshd.copy(&[
        src.to_str().unwrap(),
        &sshd.at(&dest),
        "--port",
        &port.to_string(),
    ]));
    assert!(out.status.success(), "push: {}", text(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    say(&format!("push: {}", err.trim()));
    assert!(err.contains("every file verified"), "{err}");
    assert!(err.contains("path: udp"), "{err}");
    assert_same_tree(&src, &dest.join("data"));
    assert!(!dest.join(".atou-staging").exists());
    let open = still_open_after(&[port], std::time::Duration::from_secs(5));
    assert!(
        open.is_empty(),
        "UDP port {port} still open 5 s after the push"
    );

    // Pull it back, two streams on two fixed ports.
    let back = s.path("pulled");
    let range = format!("{port}-{}", port + 1);
    let out = run(&mut sshd.copy(&[
        &sshd.at(&dest.join("data")),
        back.to_str().unwrap(),
        "--port",
        &range,
        "--streams",
        "2",
    ]));
    assert!(out.status.success(), "pull: {}", text(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    say(&format!("pull: {}", err.trim()));
    assert!(err.contains("every file verified"), "{err}");
    assert!(err.contains("path: udp"), "{err}");
    assert_same_tree(&src, &back.join("data"));
    let open = still_open_after(&[port, port + 1], std::time::Duration::from_secs(5));
    assert!(
        open.is_empty(),
        "UDP ports {open:?} still open 5 s after the pull"
    );

    // A relative remote path is under the remote user's home, as scp's;
    // `~/` means the same. (A directory of the test's own there, removed.)
    let Some(home) = std::env::var_os("HOME").map(PathBuf::from) else {
        common::cannot_run(
            "push_and_pull_a_tree (a path relative to the remote home)",
            "no HOME",
        );
        return;
    };
    let in_home = tempfile::Builder::new()
        .prefix(".atou-ssh-test-")
        .tempdir_in(&home)
        .unwrap();
    let name = in_home.path().file_name().unwrap().to_str().unwrap();
    let out = run(&mut sshd.copy(&[
        src.join("one").to_str().unwrap(),
        &format!("{}@127.0.0.1:{name}/in", sshd.user),
    ]));
    assert!(out.status.success(), "relative push: {}", text(&out));
    assert_eq!(fs::read(in_home.path().join("in/one")).unwrap(), b"1");
    let out = run(&mut sshd.copy(&[
        &format!("{}@127.0.0.1:~/{name}/in/one", sshd.user),
        s.path("rel").to_str().unwrap(),
    ]));
    assert!(out.status.success(), "relative pull: {}", text(&out));
    assert_eq!(fs::read(s.path("rel/one")).unwrap(), b"1");
}

#[test]
fn no_atou_on_the_remote_and_a_failing_ssh_say_so_and_write_nothing() {
    let s = dir_for_sshd("errors");
    let Some(sshd) = Sshd::start(s.root(), "no_atou_on_the_remote") else {
        return;
    };
    let src = s.path("data");
    make_tree(&src);
    let dest = s.path("never");
    let local = s.path("never-local");

    // Push and pull with a remote atou that is not there.
    let out = run(&mut sshd.copy_with(
        "/nonexistent/atou",
        &[src.to_str().unwrap(), &sshd.at(&dest)],
    ));
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    say(&format!("no atou (push): {}", err.trim()));
    assert!(err.contains("no atou on 127.0.0.1"), "{err}");
    assert!(err.contains("--remote-atou"), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "one line: {err}");
    assert!(!dest.exists(), "the push wrote {}", dest.display());

    let out = run(&mut sshd.copy_with(
        "/nonexistent/atou",
        &[&sshd.at(&src), local.to_str().unwrap()],
    ));
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no atou on 127.0.0.1"));
    assert!(!local.exists(), "the pull wrote {}", local.display());

    // ssh itself fails: nothing listens on the port it is given.
    let dead = free_tcp_port();
    let bad_ssh = sshd
        .ssh()
        .replace(&format!("-p {}", sshd.port), &format!("-p {dead}"));
    let out = run(Command::new(ATOU).env("XDG_CACHE_HOME", TEST_CACHE).args([
        "copy",
        src.to_str().unwrap(),
        &sshd.at(&dest),
        "--ssh",
        &bad_ssh,
        "--remote-atou",
        ATOU,
    ]));
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    say(&format!("bad ssh port: {}", err.trim()));
    assert!(err.starts_with("atou: ssh to 127.0.0.1 failed: "), "{err}");
    assert!(err.contains("refused"), "{err}");
    assert!(!dest.exists());

    // A remote that claims an address nobody has is not believed: UDP
    // goes to the host ssh reached, resolved here (tests/hostile_remote.rs
    // has the lying remote whose punches a victim would have heard, and
    // UDP that never arrives).
    let wrapper = s.path("elsewhere-atou");
    fs::write(
        &wrapper,
        format!("#!/bin/sh\nSSH_CONNECTION='127.0.0.1 1 192.0.2.1 22' exec {ATOU} \"$@\"\n"),
    )
    .unwrap();
    fs::set_permissions(&wrapper, fs::Permissions::from_mode(0o755)).unwrap();
    let out = run(&mut sshd.copy_with(
        wrapper.to_str().unwrap(),
        &[&sshd.at(&src), local.to_str().unwrap(), "--maxidle", "5"],
    ));
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert_same_tree(&src, &local.join("data"));
    let out = run(&mut sshd.copy_with(
        wrapper.to_str().unwrap(),
        &[src.to_str().unwrap(), &sshd.at(&dest), "--maxidle", "5"],
    ));
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert_same_tree(&src, &dest.join("data"));
}

/// The partial file of the one file being received under `dest`.
fn part_with(dest: &Path, at_least: u64, deadline: Instant) -> bool {
    while Instant::now() < deadline {
        let parts = fs::read_dir(dest.join(".atou-staging"))
            .map(|d| d.filter_map(|e| e.ok()).collect::<Vec<_>>())
            .unwrap_or_default();
        if parts
            .iter()
            .any(|e| e.metadata().is_ok_and(|m| m.blocks() * 512 >= at_least))
        {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    false
}

/// The pid of the remote end's atou whose command line names `marker`.
fn remote_pid(marker: &Path) -> Option<u32> {
    let marker = marker.to_str().unwrap();
    for e in fs::read_dir("/proc").ok()?.flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let cmd = fs::read(e.path().join("cmdline")).unwrap_or_default();
        let args: Vec<&[u8]> = cmd.split(|&b| b == 0).collect();
        if args.first().is_some_and(|a| a.ends_with(b"atou"))
            && args.contains(&b"__remote".as_slice())
            && args.contains(&marker.as_bytes())
        {
            return Some(pid);
        }
    }
    None
}

#[test]
fn a_transfer_killed_at_either_end_completes_when_run_again() {
    let s = dir_for_sshd("resume");
    let Some(sshd) = Sshd::start(s.root(), "a_transfer_killed_at_either_end") else {
        return;
    };
    let src = s.path("data");
    fs::create_dir_all(&src).unwrap();
    fs::write(src.join("big.bin"), noise(6 * MIB, 7)).unwrap();
    // One segment in flight, each ACK delayed: about half a MiB a second.
    let slow = [
        "--streams",
        "1",
        "--rcvwin",
        "1",
        "--delack",
        "1ms",
        "--maxidle",
        "3",
    ];

    for (direction, kill_remote) in [
        ("push", false),
        ("push", true),
        ("pull", false),
        ("pull", true),
    ] {
        let what = format!(
            "{direction}, {} end killed",
            if kill_remote { "remote" } else { "local" }
        );
        let dest = s.path(&format!("{direction}-{kill_remote}"));
        let (from, to, receiving) = if direction == "push" {
            (
                src.to_str().unwrap().to_string(),
                sshd.at(&dest),
                dest.clone(),
            )
        } else {
            (
                sshd.at(&src),
                dest.to_str().unwrap().to_string(),
                dest.clone(),
            )
        };
        let mut first = sshd.copy(&[&from, &to]);
        first
            .args(slow)
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let mut child = first.spawn().unwrap();
        let deadline = Instant::now() + Duration::from_secs(60);
        assert!(
            part_with(&receiving, MIB as u64, deadline),
            "{what}: no partial file grew to 1 MiB"
        );
        if kill_remote {
            let marker = if direction == "push" { &dest } else { &src };
            let pid = remote_pid(marker).unwrap_or_else(|| panic!("{what}: no remote atou"));
            let _ = Command::new("kill")
                .args(["-KILL", &pid.to_string()])
                .status();
        } else {
            let _ = child.kill();
        }
        let out = child.wait_with_output().unwrap();
        assert!(!out.status.success(), "{what}: the first run succeeded");
        say(&format!(
            "{what}: first run: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ));
        assert!(
            !dest.join("data/big.bin").exists(),
            "{what}: a partial file took its name"
        );
        // Wait for the far end of the killed run to go before the rerun.
        if !kill_remote {
            let marker = if direction == "push" { &dest } else { &src };
            let until = Instant::now() + Duration::from_secs(10);
            while remote_pid(marker).is_some() && Instant::now() < until {
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        let out = run(&mut sshd.copy(&[&from, &to]));
        assert!(out.status.success(), "{what}: rerun: {}", text(&out));
        let err = String::from_utf8_lossy(&out.stderr);
        say(&format!("{what}: rerun: {}", err.trim()));
        assert!(
            err.contains("resumed"),
            "{what}: nothing was resumed: {err}"
        );
        assert_same_tree(&src, &dest.join("data"));
        assert!(!dest.join(".atou-staging").exists(), "{what}: staging left");
    }
}

/// The remote end of a push, run here without ssh: it accepts only the
/// one-time key the channel named, and nothing plain.
#[test]
fn the_remote_end_takes_only_the_key_named_on_the_ssh_channel() {
    use std::io::{BufRead, BufReader};
    let s = dir_for_sshd("pinned");
    let dest = s.path("dest");
    let file = s.path("f");
    fs::write(&file, b"pinned").unwrap();
    let (_, told) = common::keygen(s.root(), "told", TEST_CACHE);
    common::keygen(s.root(), "stranger", TEST_CACHE);
    let told_b64 = told.split_whitespace().nth(1).unwrap().to_string();
    let mut far = Command::new(ATOU)
        .env("XDG_CACHE_HOME", TEST_CACHE)
        .args(["__remote", "--hello"])
        .arg(format!("ATOU-BOOTSTRAP 2 {told_b64}"))
        .args([
            "receive", "--buffer", "67108864", "--rcvbuf", "4194304", "--",
        ])
        .arg(&dest)
        .env_remove("SSH_CONNECTION")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // Held open and never written: the answer must not wait for stdin
    // (ssh sends stdin only a round trip after the command).
    let stdin = far.stdin.take().unwrap();
    let mut line = String::new();
    BufReader::new(far.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let words: Vec<&str> = line.split_whitespace().collect();
    assert_eq!(words.len(), 5, "{line}");
    let (port, key) = (words[2], words[3]);
    let to = format!("127.0.0.1:{port}");
    let send = |extra: &[&str]| {
        run(Command::new(ATOU)
            .env("XDG_CACHE_HOME", TEST_CACHE)
            .arg("send")
            .arg(&file)
            .arg(&to)
            .args(["--maxidle", "3", "--quiet"])
            .args(extra))
    };
    let stranger = send(&[
        "--identity",
        s.path("stranger").to_str().unwrap(),
        "--server-key",
        key,
    ]);
    assert!(
        !stranger.status.success(),
        "a stranger's key: {}",
        text(&stranger)
    );
    say(&format!(
        "pinned: a stranger's key: {}",
        String::from_utf8_lossy(&stranger.stderr).trim()
    ));
    let plain = send(&["--no-auth"]);
    assert!(!plain.status.success(), "plain: {}", text(&plain));
    say(&format!(
        "pinned: plain: {}",
        String::from_utf8_lossy(&plain.stderr).trim()
    ));
    assert!(!dest.join("f").exists());
    let told = send(&[
        "--identity",
        s.path("told").to_str().unwrap(),
        "--server-key",
        key,
    ]);
    assert!(told.status.success(), "the told key: {}", text(&told));
    assert_eq!(fs::read(dest.join("f")).unwrap(), b"pinned");
    drop(stdin);
    assert!(far.wait().unwrap().success());
}

/// rsync's everyday options over ssh: a push's `--dry-run` lists what would go
/// and leaves the remote PATH as it is (a missing one is not created; an
/// existing one gains no staging directory and no new directory), and a
/// pull's `--exclude` reaches the remote sender.
#[test]
fn a_push_dry_run_changes_nothing_and_a_pull_excludes() {
    let s = dir_for_sshd("dry");
    let Some(sshd) = Sshd::start(s.root(), "a_push_dry_run") else {
        return;
    };
    let src = s.path("data");
    make_tree(&src);
    let missing = s.path("nowhere/pushed");
    let out = run(&mut sshd.copy(&["-n", src.to_str().unwrap(), &sshd.at(&missing)]));
    assert!(out.status.success(), "dry push: {}", text(&out));
    let listed = String::from_utf8_lossy(&out.stdout);
    assert!(
        listed.contains("data/sub/big.bin") && listed.contains("dry run: would send 5 of 5 files"),
        "{listed}"
    );
    assert!(!s.path("nowhere").exists(), "the remote PATH was created");

    let dest = s.path("pushed");
    fs::create_dir_all(&dest).unwrap();
    let out = run(&mut sshd.copy(&["-n", src.to_str().unwrap(), &sshd.at(&dest)]));
    assert!(out.status.success(), "dry push: {}", text(&out));
    assert_eq!(
        fs::read_dir(&dest).unwrap().count(),
        0,
        "the dry run wrote into PATH"
    );

    // A pull with excludes: the remote sender leaves them out.
    let back = s.path("pulled");
    let out = run(&mut sshd.copy(&[
        &sshd.at(&src),
        back.to_str().unwrap(),
        "--exclude",
        "*.bin",
        "--exclude",
        "deeper/",
    ]));
    assert!(out.status.success(), "pull: {}", text(&out));
    assert!(back.join("data/one").exists());
    assert!(!back.join("data/sub/big.bin").exists());
    assert!(!back.join("data/sub/deeper").exists());
}

/// Three pushes with `--shard K/3` at once into one remote PATH, then
/// three pulls with `--shard K/3` at once into one local DEST: the remote
/// ends take `--shard` (a push's receiver keeps its staging directory for
/// the others, a pull's sender sends its part) and the tree arrives whole.
#[test]
fn shards_push_and_pull_at_once_into_one_directory() {
    let s = dir_for_sshd("shard");
    let Some(sshd) = Sshd::start(s.root(), "shards_push_and_pull") else {
        return;
    };
    let src = s.path("data");
    make_tree(&src);
    let at_once = |from: String, to: String| {
        let running: Vec<std::process::Child> = (1..=3)
            .map(|k| {
                sshd.copy(&["--quiet", "--shard", &format!("{k}/3"), &from, &to])
                    .stdout(std::process::Stdio::null())
                    .stderr(std::process::Stdio::piped())
                    .spawn()
                    .expect("start atou copy")
            })
            .collect();
        for (k, c) in running.into_iter().enumerate() {
            let out = c.wait_with_output().unwrap();
            assert!(out.status.success(), "shard {}/3: {}", k + 1, text(&out));
        }
    };
    let pushed = s.path("pushed");
    at_once(src.display().to_string(), sshd.at(&pushed));
    assert_same_tree(&src, &pushed.join("data"));
    let pulled = s.path("pulled");
    at_once(sshd.at(&pushed.join("data")), pulled.display().to_string());
    assert_same_tree(&src, &pulled.join("data"));
}

/// Two network namespaces joined by a veth pair: `near` (10.77.0.1, where
/// atou copy and ssh run) and `far` (10.77.0.2, the private sshd's and
/// the remote atou's). Removed, with the pair, when dropped.
struct Namespaces {
    near: String,
    far: String,
}

impl Namespaces {
    const NEAR: &'static str = "10.77.0.1";
    const FAR: &'static str = "10.77.0.2";

    /// Made for `test`, or `None` (said why) where this host cannot: not
    /// root, or no `ip` or `nft`.
    fn new(test: &str, tag: &str) -> Option<Namespaces> {
        if !is_root() {
            common::cannot_run(test, "not root: network namespaces need it");
            return None;
        }
        for tool in ["ip", "nft"] {
            let there = Command::new(tool)
                .arg("-V")
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success());
            if !there {
                common::cannot_run(test, &format!("no `{tool}` here (.ci/run installs it)"));
                return None;
            }
        }
        let id = format!("{}{tag}", std::process::id());
        let net = Namespaces {
            near: format!("atou-ssh-{id}-n"),
            far: format!("atou-ssh-{id}-f"),
        };
        let (veth_near, veth_far) = (format!("a{id}n"), format!("a{id}f"));
        let ip = |args: &[&str]| {
            let out = run(Command::new("ip").args(args));
            assert!(out.status.success(), "ip {args:?}: {}", text(&out));
        };
        ip(&["netns", "add", &net.near]);
        ip(&["netns", "add", &net.far]);
        ip(&[
            "link", "add", &veth_near, "type", "veth", "peer", "name", &veth_far,
        ]);
        for (ns, veth, addr) in [
            (&net.near, &veth_near, Self::NEAR),
            (&net.far, &veth_far, Self::FAR),
        ] {
            ip(&["link", "set", veth, "netns", ns]);
            ip(&["-n", ns, "addr", "add", &format!("{addr}/24"), "dev", veth]);
            ip(&["-n", ns, "link", "set", veth, "up"]);
            ip(&["-n", ns, "link", "set", "lo", "up"]);
        }
        Some(net)
    }

    fn placed(&self) -> Placed<'_> {
        Placed {
            far: &self.far,
            near: &self.near,
        }
    }

    /// `program` run in namespace `ns`.
    fn exec(&self, ns: &str, program: &str) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", ns, program]);
        c
    }

    /// A firewall in `ns` that drops every UDP datagram coming in from
    /// the veth (loopback, as on a real host, passes).
    fn drop_udp_into(&self, ns: &str) {
        for rule in [
            "add table inet f",
            "add chain inet f input { type filter hook input priority 0; }",
            "add rule inet f input iifname != \"lo\" meta l4proto udp drop",
        ] {
            let out = run(self.exec(ns, "nft").args(rule.split(' ')));
            assert!(out.status.success(), "nft {rule}: {}", text(&out));
        }
    }
}

impl Drop for Namespaces {
    fn drop(&mut self) {
        for ns in [&self.near, &self.far] {
            let _ = Command::new("ip").args(["netns", "del", ns]).status();
        }
    }
}

/// The field `"path"` of a `--json` report, as text.
fn json_path(stdout: &[u8]) -> String {
    let v: serde_json::Value = serde_json::from_slice(stdout).expect("a --json report");
    v["path"].as_str().unwrap_or("(none)").to_string()
}

#[test]
fn a_push_goes_through_ssh_when_a_firewall_drops_udp_both_ways() {
    let test = "a_push_goes_through_ssh_when_a_firewall_drops_udp_both_ways";
    let Some(net) = Namespaces::new(test, "p") else {
        return;
    };
    net.drop_udp_into(&net.near);
    net.drop_udp_into(&net.far);
    let s = dir_for_sshd("tunnel-push");
    let Some(sshd) = Sshd::start_at(s.root(), test, Namespaces::FAR, Some(net.placed())) else {
        return;
    };
    let src = s.path("data");
    make_tree(&src);
    let dest = s.path("pushed");
    let out = run(&mut sshd.copy(&[src.to_str().unwrap(), &sshd.at(&dest)]));
    assert!(out.status.success(), "push: {}", text(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    say(&format!("push through ssh: {}", err.trim()));
    assert!(err.contains("no UDP reply from"), "{err}");
    assert!(err.contains("every file verified"), "{err}");
    assert!(err.contains("path: ssh"), "{err}");
    assert_same_tree(&src, &dest.join("data"));

    // --json says it too. Through the tunnel the datagrams go at lo's
    // size, not at the base size of the UDP attempt before it: the
    // relays' cost is per frame.
    let dest = s.path("pushed-json");
    let out = run(&mut sshd.copy(&[src.to_str().unwrap(), &sshd.at(&dest), "--json"]));
    assert!(out.status.success(), "push --json: {}", text(&out));
    assert_eq!(json_path(&out.stdout), "ssh", "{}", text(&out));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["path_mtu"]["from"], "tunnel", "{v}");
    assert_eq!(v["path_mtu"]["datagram"], 8972, "{v}");
    assert_same_tree(&src, &dest.join("data"));

    // The ssh connection stalls mid-transfer (its client stopped): the
    // reason names the ssh tunnel, not a blocked UDP.
    let slow = s.path("slow.bin");
    fs::write(&slow, noise(4 * MIB, 3)).unwrap();
    let dest = s.path("stalled");
    let mut copy = sshd.copy(&[
        slow.to_str().unwrap(),
        &sshd.at(&dest),
        "--bwlimit",
        "8mbit",
        "--maxidle",
        "2",
    ]);
    let mut child = copy.stderr(Stdio::piped()).spawn().unwrap();
    let mut lines = std::io::BufReader::new(child.stderr.take().unwrap());
    let mut err = String::new();
    while !err.contains("goes through the ssh connection") {
        let read = std::io::BufRead::read_line(&mut lines, &mut err).unwrap();
        assert!(read > 0, "no switch to the tunnel: {err}");
    }
    // The local atou's children: its ssh client.
    let ssh = Command::new("pgrep")
        .args(["-P", &child.id().to_string()])
        .output()
        .unwrap();
    let ssh = String::from_utf8_lossy(&ssh.stdout).trim().to_string();
    assert!(!ssh.is_empty(), "no ssh client under atou");
    for pid in ssh.lines() {
        Command::new("kill").args(["-STOP", pid]).status().unwrap();
    }
    std::io::Read::read_to_string(&mut lines, &mut err).unwrap();
    let status = child.wait().unwrap();
    for pid in ssh.lines() {
        let _ = Command::new("kill").args(["-CONT", pid]).status();
    }
    say(&format!("stalled tunnel: {}", err.trim()));
    assert!(!status.success(), "{err}");
    let last = err.trim().lines().last().unwrap_or_default();
    assert!(last.contains("through the ssh tunnel"), "{err}");
    assert!(!last.contains("blocked?"), "{err}");
}

/// UDP dropped only on its way back (into the local end): the remote's
/// receiver hears the key query but its answer never arrives; the push
/// goes through ssh all the same, and the receiver, which serves one
/// transfer, takes it.
#[test]
fn a_push_goes_through_ssh_when_only_the_answers_are_dropped() {
    let test = "a_push_goes_through_ssh_when_only_the_answers_are_dropped";
    let Some(net) = Namespaces::new(test, "q") else {
        return;
    };
    net.drop_udp_into(&net.near);
    let s = dir_for_sshd("tunnel-one-way");
    let Some(sshd) = Sshd::start_at(s.root(), test, Namespaces::FAR, Some(net.placed())) else {
        return;
    };
    let src = s.path("data");
    make_tree(&src);
    let dest = s.path("pushed");
    let out = run(&mut sshd.copy(&[src.to_str().unwrap(), &sshd.at(&dest), "--json"]));
    assert!(out.status.success(), "push: {}", text(&out));
    assert_eq!(json_path(&out.stdout), "ssh", "{}", text(&out));
    assert_same_tree(&src, &dest.join("data"));
}

/// A pull (the remote sends) through a firewall that drops UDP: both
/// ways, only into the local end (the punches get through, the remote's
/// datagrams do not), only into the remote (no punch gets through). Each
/// time the tree arrives whole through the ssh connection and the report
/// says so, on stderr and in --json.
#[test]
fn a_pull_goes_through_ssh_when_a_firewall_drops_udp_either_way() {
    let test = "a_pull_goes_through_ssh_when_a_firewall_drops_udp_either_way";
    for (tag, into_near, into_far) in [("b", true, true), ("n", true, false), ("f", false, true)] {
        let Some(net) = Namespaces::new(test, tag) else {
            return;
        };
        if into_near {
            net.drop_udp_into(&net.near);
        }
        if into_far {
            net.drop_udp_into(&net.far);
        }
        let s = dir_for_sshd(&format!("tunnel-pull-{tag}"));
        let Some(sshd) = Sshd::start_at(s.root(), test, Namespaces::FAR, Some(net.placed())) else {
            return;
        };
        let src = s.path("data");
        make_tree(&src);
        let dest = s.path("pulled");
        let out = run(&mut sshd.copy(&[&sshd.at(&src), dest.to_str().unwrap(), "--streams", "2"]));
        assert!(out.status.success(), "pull ({tag}): {}", text(&out));
        let err = String::from_utf8_lossy(&out.stderr);
        say(&format!("pull through ssh ({tag}): {}", err.trim()));
        assert!(err.contains("no UDP reply from"), "{err}");
        assert!(err.contains("every file verified"), "{err}");
        assert!(err.contains("path: ssh"), "{err}");
        assert_same_tree(&src, &dest.join("data"));
        assert!(!dest.join(".atou-staging").exists());

        let dest = s.path("pulled-json");
        let out = run(&mut sshd.copy(&[&sshd.at(&src), dest.to_str().unwrap(), "--json"]));
        assert!(out.status.success(), "pull --json ({tag}): {}", text(&out));
        assert_eq!(json_path(&out.stdout), "ssh", "{}", text(&out));
        assert_same_tree(&src, &dest.join("data"));
    }
}

/// Three hosts on one LAN, each a network namespace with a veth to a
/// bridge in a fourth: `here` (where `atou copy` and ssh run), `a` and
/// `b`, each of the last two with a private sshd. Removed when dropped.
struct ThreeHosts {
    /// What this instance's namespace and interface names carry.
    id: String,
    here: String,
    a: String,
    b: String,
    lan: String,
    /// here's end of its veth, whose counters say what crossed here.
    here_if: String,
}

impl ThreeHosts {
    const HERE: &'static str = "10.78.0.1";
    const A: &'static str = "10.78.0.2";
    const B: &'static str = "10.78.0.3";

    fn new(test: &str) -> Option<ThreeHosts> {
        // Each its own names: tests run side by side in one process.
        static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        // Namespaces::new checks what is needed; its pair is not used.
        let _ = Namespaces::new(test, &format!("c{n}"))?;
        let id = format!("{}x{n}", std::process::id());
        let ns = |n: &str| format!("atou-3p-{id}-{n}");
        let hosts = ThreeHosts {
            id: id.clone(),
            here: ns("here"),
            a: ns("a"),
            b: ns("b"),
            lan: ns("lan"),
            here_if: format!("t{id}h"),
        };
        let ip = |args: &[&str]| {
            let out = run(Command::new("ip").args(args));
            assert!(out.status.success(), "ip {args:?}: {}", text(&out));
        };
        for n in [&hosts.lan, &hosts.here, &hosts.a, &hosts.b] {
            ip(&["netns", "add", n]);
        }
        ip(&["-n", &hosts.lan, "link", "add", "br0", "type", "bridge"]);
        ip(&["-n", &hosts.lan, "link", "set", "br0", "up"]);
        for (n, tag, addr) in [
            (&hosts.here, "h", Self::HERE),
            (&hosts.a, "a", Self::A),
            (&hosts.b, "b", Self::B),
        ] {
            let (host_if, lan_if) = (format!("t{id}{tag}"), format!("t{id}{tag}l"));
            ip(&[
                "link", "add", &host_if, "type", "veth", "peer", "name", &lan_if,
            ]);
            ip(&["link", "set", &host_if, "netns", n]);
            ip(&["link", "set", &lan_if, "netns", &hosts.lan]);
            ip(&[
                "-n", &hosts.lan, "link", "set", &lan_if, "master", "br0", "up",
            ]);
            ip(&[
                "-n",
                n,
                "addr",
                "add",
                &format!("{addr}/24"),
                "dev",
                &host_if,
            ]);
            ip(&["-n", n, "link", "set", &host_if, "up"]);
            ip(&["-n", n, "link", "set", "lo", "up"]);
        }
        Some(hosts)
    }

    /// Bytes in and out of here's interface so far.
    fn bytes_here(&self) -> u64 {
        ["rx_bytes", "tx_bytes"]
            .iter()
            .map(|c| {
                let out = run(Command::new("ip").args([
                    "netns",
                    "exec",
                    &self.here,
                    "cat",
                    &format!("/sys/class/net/{}/statistics/{c}", self.here_if),
                ]));
                String::from_utf8_lossy(&out.stdout)
                    .trim()
                    .parse::<u64>()
                    .unwrap()
            })
            .sum()
    }

    /// Gives host `a` or `b` a second address, `addr`, in the LAN's
    /// subnet: an alias, which the kernel never picks as a source (the
    /// first address of the subnet's route is preferred).
    fn alias(&self, host: &str, addr: &str) {
        let (ns, tag) = match host {
            "a" => (&self.a, "a"),
            _ => (&self.b, "b"),
        };
        let dev = format!("t{}{tag}", self.id);
        let out = run(Command::new("ip").args([
            "-n",
            ns,
            "addr",
            "add",
            &format!("{addr}/24"),
            "dev",
            &dev,
        ]));
        assert!(out.status.success(), "ip addr add {addr}: {}", text(&out));
    }

    /// A firewall at `b` that drops UDP from `a` (ssh from here passes).
    fn b_drops_udp_from_a(&self) {
        for rule in [
            "add table inet f".to_string(),
            "add chain inet f input { type filter hook input priority 0; }".to_string(),
            format!(
                "add rule inet f input ip saddr {} meta l4proto udp drop",
                Self::A
            ),
        ] {
            let out = run(Command::new("ip")
                .args(["netns", "exec", &self.b, "nft"])
                .args(rule.split(' ')));
            assert!(out.status.success(), "nft {rule}: {}", text(&out));
        }
    }
}

impl Drop for ThreeHosts {
    fn drop(&mut self) {
        for ns in [&self.here, &self.a, &self.b, &self.lan] {
            let _ = Command::new("ip").args(["netns", "del", ns]).status();
        }
    }
}

/// An sshd in `a` and one in `b`, at the addresses given, and the `--ssh`
/// that reaches both as `a` and `b`: a config with a `Host` block each
/// (so the address atou sends to comes from `ssh -G`, as for a user's
/// aliases). `None` where sshd cannot run here.
fn three_host_ssh(
    hosts: &ThreeHosts,
    s: &TestDir,
    test: &str,
    (at_a, at_b): (&str, &str),
) -> Option<(Vec<Sshd>, String)> {
    let mut sshds = Vec::new();
    let mut text_of_config = String::new();
    for (name, ns, addr) in [("a", &hosts.a, at_a), ("b", &hosts.b, at_b)] {
        let dir = s.path(name);
        fs::create_dir_all(&dir).unwrap();
        let placed = Placed {
            far: ns,
            near: &hosts.here,
        };
        let sshd = Sshd::start_at(&dir, test, addr, Some(placed))?;
        text_of_config += &format!(
            "Host {name}\n  HostName {}\n  Port {}\n  IdentityFile {}\n  User {}\n",
            sshd.addr,
            sshd.port,
            sshd.key.display(),
            sshd.user
        );
        sshds.push(sshd);
    }
    text_of_config += "Host *\n  StrictHostKeyChecking no\n  UserKnownHostsFile /dev/null\n  \
                       BatchMode yes\n  LogLevel ERROR\n";
    let config = s.path("ssh_config");
    fs::write(&config, text_of_config).unwrap();
    Some((sshds, format!("ssh -F {}", config.display())))
}

/// Issue 30 point 1: `atou copy a:SRC b:DEST` run at a third host moves
/// the data from a to b directly (here's interface carries only the two
/// ssh connections), or, with `--via-local`, through here; where b drops
/// UDP from a, the copy says so and goes through here by itself.
#[test]
fn a_third_party_copy_goes_from_host_to_host_and_only_control_crosses_here() {
    let test = "a_third_party_copy_goes_from_host_to_host_and_only_control_crosses_here";
    let Some(hosts) = ThreeHosts::new(test) else {
        return;
    };
    let s = dir_for_sshd("third-party");
    let Some((_sshds, ssh)) = three_host_ssh(&hosts, &s, test, (ThreeHosts::A, ThreeHosts::B))
    else {
        return;
    };
    let copy = |args: &[&str]| {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &hosts.here, ATOU])
            .env("XDG_CACHE_HOME", TEST_CACHE)
            .arg("copy")
            .args(args)
            .args(["--ssh", &ssh, "--remote-atou", ATOU]);
        run(&mut c)
    };
    let src = s.path("a/data");
    make_tree(&src);
    let big = 16 * MIB;
    fs::write(src.join("big.bin"), noise(big, 30)).unwrap();
    let at_a = format!("a:{}", src.display());

    // A dry run: the source's plan, answered by b, which makes nothing.
    let dest = s.path("b/direct");
    let out = copy(&["-n", &at_a, &format!("b:{}", dest.display())]);
    assert!(out.status.success(), "-n: {}", text(&out));
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(said.contains("dry run: would send"), "{}", text(&out));
    assert!(said.contains("big.bin"), "{}", text(&out));
    assert!(!dest.exists(), "a dry run made {}", dest.display());

    // Straight from a to b.
    let before = hosts.bytes_here();
    let out = copy(&[&at_a, &format!("b:{}", dest.display())]);
    let crossed = hosts.bytes_here() - before;
    say(&format!(
        "third-party, direct: {crossed} bytes crossed here for {big} of data: {}",
        text(&out)
    ));
    assert!(out.status.success(), "direct: {}", text(&out));
    assert_same_tree(&src, &dest.join("data"));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("straight to the destination"), "{err}");
    assert!(err.contains("every file verified"), "{err}");
    // Two ssh log-ins and a few lines each way; none of the data.
    assert!(crossed < (big / 8) as u64, "{crossed} bytes crossed here");

    // Through here.
    let dest = s.path("b/relayed");
    let before = hosts.bytes_here();
    let out = copy(&[&at_a, &format!("b:{}", dest.display()), "--via-local"]);
    let crossed = hosts.bytes_here() - before;
    say(&format!(
        "third-party, --via-local: {crossed} bytes crossed here"
    ));
    assert!(out.status.success(), "--via-local: {}", text(&out));
    assert_same_tree(&src, &dest.join("data"));
    assert!(crossed > 2 * big as u64, "{crossed} bytes crossed here");

    // b drops UDP from a: the copy says so and goes through here by
    // itself, as --via-local.
    hosts.b_drops_udp_from_a();
    let dest = s.path("b/blocked");
    let out = copy(&[&at_a, &format!("b:{}", dest.display()), "--maxidle", "3"]);
    say(&format!("third-party, UDP blocked: {}", text(&out)));
    assert!(out.status.success(), "UDP blocked: {}", text(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("copying through this host instead"),
        "{}",
        text(&out)
    );
    assert_same_tree(&src, &dest.join("data"));
}

/// Two hosts with a second address each, an alias in the LAN's subnet,
/// at which ssh reaches them: A sends to B's second address, and B's
/// receiver, bound to every address, answers from that one, so the copy
/// goes straight from A to B (only control crosses here). Before, B
/// answered from its first address (the kernel's choice by route), A's
/// connected socket dropped every answer, and after `--maxidle` the copy
/// went through here instead.
#[test]
fn a_third_party_copy_between_hosts_reached_at_their_second_address_goes_straight() {
    let test = "a_third_party_copy_between_hosts_reached_at_their_second_address_goes_straight";
    let Some(hosts) = ThreeHosts::new(test) else {
        return;
    };
    let (second_a, second_b) = ("10.78.0.12", "10.78.0.13");
    hosts.alias("a", second_a);
    hosts.alias("b", second_b);
    let s = dir_for_sshd("third-party-aliases");
    let Some((_sshds, ssh)) = three_host_ssh(&hosts, &s, test, (second_a, second_b)) else {
        return;
    };
    let src = s.path("a/data");
    fs::create_dir_all(&src).unwrap();
    let size = 4 * MIB;
    fs::write(src.join("big.bin"), noise(size, 31)).unwrap();
    let dest = s.path("b/direct");
    let before = hosts.bytes_here();
    let mut c = Command::new("ip");
    c.args(["netns", "exec", &hosts.here, ATOU])
        .env("XDG_CACHE_HOME", TEST_CACHE)
        .arg("copy")
        .arg(format!("a:{}", src.display()))
        .arg(format!("b:{}", dest.display()))
        .args(["--maxidle", "3", "--ssh", &ssh, "--remote-atou", ATOU]);
    let out = run(&mut c);
    let crossed = hosts.bytes_here() - before;
    say(&format!(
        "third-party between second addresses: {crossed} bytes crossed here: {}",
        text(&out)
    ));
    assert!(out.status.success(), "{}", text(&out));
    assert_same_tree(&src, &dest.join("data"));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!err.contains("copying through this host instead"), "{err}");
    assert!(err.contains("straight to the destination"), "{err}");
    assert!(crossed < (size / 4) as u64, "{crossed} bytes crossed here");
}
