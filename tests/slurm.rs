//! docs/scale-out.md's Slurm job array, as written there, under a real
//! one-node Slurm (Debian's slurmctld, slurmd and munged, configured in a
//! temp dir and run as this test's children): its 4 tasks of `atou send
//! --shard auto/4` into one `atou serve` deliver the tree, and a task
//! cancelled mid-part and resubmitted alone (`sbatch --array=3`) resumes
//! its part. Needs root (slurmd runs jobs as their user) and the
//! packages (`.ci/run` installs them); skipped, saying why, without.

mod common;
mod netem_support;

use std::fs;
use std::net::TcpListener;
use std::os::unix::fs::{symlink, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::{noise, TestDir};
use netem_support::{say, u, Daemon, Server, ATOU, TEST_CACHE};
use serde_json::Value;

const MIB: u64 = 1 << 20;
const TOOLS: [&str; 6] = [
    "munged",
    "slurmctld",
    "slurmd",
    "sbatch",
    "scancel",
    "squeue",
];
/// The doc's placeholders, replaced by this test's source and receiver.
const DOC_SOURCE: &str = "/lustre/project/dataset";
const DOC_RECEIVER: &str = "receiver.example.org:7890";

fn run(cmd: &mut Command) -> Output {
    cmd.output().unwrap_or_else(|e| panic!("run {cmd:?}: {e}"))
}

/// Why this host cannot run the test, if it cannot.
fn unavailable() -> Option<String> {
    let uid = run(Command::new("id").arg("-u"));
    if String::from_utf8_lossy(&uid.stdout).trim() != "0" {
        return Some("not root (slurmd runs a job as the user who submitted it)".into());
    }
    let missing: Vec<&str> = TOOLS
        .iter()
        .copied()
        .filter(|t| {
            !Command::new("sh")
                .args(["-c", &format!("command -v {t}")])
                .stdout(Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
        })
        .collect();
    (!missing.is_empty()).then(|| {
        format!(
            "{} not installed (apt-get install slurmctld slurmd slurm-client munge)",
            missing.join(", ")
        )
    })
}

/// The first ```bash block after "## A Slurm job array" in
/// docs/scale-out.md, so that what runs here is what the doc shows.
fn doc_job_script() -> String {
    let doc = fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/scale-out.md"))
        .expect("read docs/scale-out.md");
    let section = &doc[doc
        .find("## A Slurm job array")
        .expect("the doc's Slurm section")..];
    let start = section.find("```bash\n").expect("a ```bash block") + "```bash\n".len();
    let end = start + section[start..].find("```").expect("the block's end");
    section[start..end].to_string()
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A one-node cluster: munged, slurmctld and slurmd in the foreground,
/// killed (with every job of this controller cancelled first) on drop.
struct Cluster {
    conf: PathBuf,
    daemons: Vec<Daemon>,
}

impl Cluster {
    fn start(root: &Path) -> Cluster {
        for d in ["munge", "sock", "state", "spool", "log"] {
            fs::create_dir_all(root.join(d)).unwrap();
        }
        // munged refuses a socket directory others cannot enter, and a key
        // others can read.
        for d in [root, &root.join("sock")] {
            fs::set_permissions(d, fs::Permissions::from_mode(0o755)).unwrap();
        }
        fs::set_permissions(root.join("munge"), fs::Permissions::from_mode(0o700)).unwrap();
        let key = root.join("munge/munge.key");
        let bytes: Vec<u8> = (0..1024u32)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
            .collect();
        fs::write(&key, bytes).unwrap();
        fs::set_permissions(&key, fs::Permissions::from_mode(0o400)).unwrap();
        let socket = root.join("sock/munge.sock");
        let p = |rel: &str| root.join(rel).display().to_string();
        // CPUs=16 with config_overrides: the doc's tasks ask 4 CPUs each,
        // and all 4 run at once on a host of fewer cores.
        let conf = format!(
            "ClusterName=atoutest\n\
             SlurmctldHost=localhost\n\
             SlurmUser=root\n\
             SlurmdUser=root\n\
             SlurmctldPort={}\n\
             SlurmdPort={}\n\
             AuthType=auth/munge\n\
             AuthInfo=socket={}\n\
             MailProg=/bin/true\n\
             StateSaveLocation={}\n\
             SlurmdSpoolDir={}\n\
             SlurmctldPidFile={}\n\
             SlurmdPidFile={}\n\
             ProctrackType=proctrack/linuxproc\n\
             TaskPlugin=task/none\n\
             MpiDefault=none\n\
             SlurmdParameters=config_overrides\n\
             SchedulerType=sched/builtin\n\
             SelectType=select/cons_tres\n\
             SelectTypeParameters=CR_Core\n\
             ReturnToService=2\n\
             JobAcctGatherType=jobacct_gather/none\n\
             AccountingStorageType=accounting_storage/none\n\
             SlurmctldLogFile={}\n\
             SlurmdLogFile={}\n\
             NodeName=localhost CPUs=16 State=UNKNOWN\n\
             PartitionName=debug Nodes=localhost Default=YES MaxTime=INFINITE State=UP\n",
            free_port(),
            free_port(),
            socket.display(),
            p("state"),
            p("spool"),
            p("slurmctld.pid"),
            p("slurmd.pid"),
            p("log/slurmctld.log"),
            p("log/slurmd.log"),
        );
        let conf_path = root.join("slurm.conf");
        fs::write(&conf_path, conf).unwrap();
        fs::write(root.join("cgroup.conf"), "").unwrap();
        let daemon = |cmd: &mut Command| {
            Daemon::new(
                cmd.stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .spawn()
                    .unwrap_or_else(|e| panic!("start {cmd:?}: {e}")),
            )
        };
        let mut cluster = Cluster {
            conf: conf_path.clone(),
            daemons: Vec::new(),
        };
        cluster.daemons.push(daemon(
            Command::new("munged")
                .arg("-F")
                .arg(format!("--key-file={}", key.display()))
                .arg(format!("--socket={}", socket.display()))
                .arg(format!("--pid-file={}", p("munged.pid")))
                .arg(format!("--log-file={}", p("log/munged.log")))
                .arg(format!("--seed-file={}", p("munge/seed"))),
        ));
        wait_for(&socket, "munged's socket", root);
        cluster.daemons.push(daemon(
            Command::new("slurmctld")
                .args(["-D", "-c", "-f"])
                .arg(&conf_path),
        ));
        cluster.daemons.push(daemon(
            Command::new("slurmd").args(["-D", "-f"]).arg(&conf_path),
        ));
        // Up when the node is idle.
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let out = run(cluster.command("sinfo").args(["-h", "-N", "-o", "%T"]));
            if String::from_utf8_lossy(&out.stdout).trim() == "idle" {
                return cluster;
            }
            assert!(
                Instant::now() < deadline,
                "the node is not idle after 30 s: {out:?}; logs in {}",
                root.join("log").display()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    fn command(&self, tool: &str) -> Command {
        let mut c = Command::new(tool);
        c.env("SLURM_CONF", &self.conf);
        c
    }

    /// Submits `script` (in `dir`, where its output files go); the job id.
    fn submit(&self, dir: &Path, env: &[(&str, &Path)], args: &[&str]) -> u64 {
        let mut c = self.command("sbatch");
        for (k, v) in env {
            c.env(k, v);
        }
        let out = run(c
            .arg("--parsable")
            .arg(format!("--chdir={}", dir.display()))
            .args(args)
            .arg(dir.join("ship.sh")));
        assert!(out.status.success(), "sbatch {args:?}: {out:?}");
        let id = String::from_utf8_lossy(&out.stdout);
        id.trim()
            .split(';')
            .next()
            .unwrap()
            .parse()
            .unwrap_or_else(|_| panic!("sbatch said `{id}`"))
    }

    /// Whether any task of `job` is still queued or running.
    fn running(&self, job: u64) -> bool {
        let out =
            run(self
                .command("squeue")
                .args(["-h", "-r", "-o", "%i", "-j", &job.to_string()]));
        !String::from_utf8_lossy(&out.stdout).trim().is_empty()
    }

    fn wait(&self, job: u64) {
        let deadline = Instant::now() + Duration::from_secs(120);
        while self.running(job) {
            assert!(
                Instant::now() < deadline,
                "job {job} still running after 120 s"
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = self.command("scancel").args(["--user=root"]).output();
        // slurmd, then slurmctld, then munged: the reverse of the start.
        while let Some(d) = self.daemons.pop() {
            drop(d);
        }
    }
}

fn wait_for(path: &Path, what: &str, root: &Path) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !path.exists() {
        assert!(
            Instant::now() < deadline,
            "no {what} after 10 s; logs in {}",
            root.join("log").display()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A task's report: the JSON line of its output file `atou-JOB_K.out`.
fn task_report(dir: &Path, job: u64, k: u32) -> Value {
    let path = dir.join(format!("atou-{job}_{k}.out"));
    let text = fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let report = text
        .find('{')
        .zip(text.rfind('}'))
        .and_then(|(a, b)| serde_json::from_str::<Value>(&text[a..=b]).ok())
        .unwrap_or_else(|| panic!("no report in {}: {text}", path.display()));
    assert_eq!(report["verified"], true, "task {k} of job {job}: {report}");
    report
}

/// Directories, small files, an empty file, a symlink, and a 64 MiB file
/// above total/4, so split 16 MiB to each of the 4 shards.
fn build_tree(root: &Path) {
    fs::create_dir_all(root.join("a/b")).unwrap();
    fs::create_dir_all(root.join("empty")).unwrap();
    fs::write(root.join("big.bin"), noise(64 * MIB as usize, 1)).unwrap();
    for i in 0..12u64 {
        let n = i as usize;
        fs::write(root.join(format!("a/f{i}")), noise(1000 * n + 1, 2 + i)).unwrap();
        fs::write(root.join(format!("a/b/g{i}")), noise(300 * n, 100 + i)).unwrap();
    }
    fs::set_permissions(root.join("a/f3"), fs::Permissions::from_mode(0o600)).unwrap();
    symlink("../big.bin", root.join("a/link")).unwrap();
}

/// Every entry of `src` is in `dst` and nothing else: kind, bytes (or
/// link target), mode and mtime; with `dir_times_and_modes` false, a
/// directory's kind only.
fn assert_same_tree(src: &Path, dst: &Path, dir_times_and_modes: bool) -> usize {
    let listing = |root: &Path| {
        let mut out = Vec::new();
        walk(root, Path::new(""), dir_times_and_modes, &mut out);
        out
    };
    fn walk(root: &Path, rel: &Path, dirs: bool, out: &mut Vec<(PathBuf, String)>) {
        let mut names: Vec<_> = fs::read_dir(root.join(rel))
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        names.sort();
        for name in names {
            let rel = rel.join(name);
            let path = root.join(&rel);
            let m = fs::symlink_metadata(&path).unwrap();
            let what = if m.is_symlink() {
                format!("link {:?}", fs::read_link(&path).unwrap())
            } else if m.is_dir() {
                walk(root, &rel, dirs, out);
                if dirs {
                    format!("dir {:o} {}.{}", m.mode(), m.mtime(), m.mtime_nsec())
                } else {
                    "dir".to_string()
                }
            } else {
                let hash = blake3::hash(&fs::read(&path).unwrap());
                format!(
                    "file {:o} {}.{} {hash}",
                    m.mode(),
                    m.mtime(),
                    m.mtime_nsec()
                )
            };
            out.push((rel, what));
        }
    }
    let (a, b) = (listing(src), listing(dst));
    assert_eq!(a, b, "{} and {} differ", src.display(), dst.display());
    a.len()
}

/// The one partial file of a split file in DEST's staging directory, and
/// the bytes of it on disk.
fn staged_bytes(dest: &Path) -> u64 {
    fs::read_dir(dest.join(".atou-staging"))
        .map(|d| {
            d.map(|e| e.unwrap().path())
                .filter(|p| p.extension().is_some_and(|x| x == "part"))
                .map(|p| fs::metadata(p).map_or(0, |m| m.blocks() * 512))
                .sum()
        })
        .unwrap_or(0)
}

/// `atou serve --dir DEST` with the test's keys; its address.
fn serve(dest: &Path, keys: &Path) -> (Server, String) {
    let flags = [
        "--dir".into(),
        dest.as_os_str().to_owned(),
        "--identity".into(),
        keys.join("server").into_os_string(),
        "--authorized-keys".into(),
        keys.join("authorized_keys").into_os_string(),
    ];
    let server: Server = Server::start_with(None, "127.0.0.1:0", &flags);
    let target = server.addr.to_string();
    (server, target)
}

/// A dry run to `target`: first contact records the server's key (trust
/// on first use), once, before the tasks would race to record it.
fn first_contact(config: &Path, src: &Path, target: &str) {
    let first = run(Command::new(ATOU)
        .env("XDG_CONFIG_HOME", config)
        .env("XDG_CACHE_HOME", TEST_CACHE)
        .args(["send", "--quiet", "--dry-run"])
        .arg(src)
        .arg(target));
    assert!(
        first.status.success(),
        "first contact with {target}: {first:?}"
    );
}

/// The doc's job script, sending `src` to `target`, in `job_dir`.
fn write_job(job_dir: &Path, script: &str, src: &Path, target: &str) {
    let job = script
        .replace(DOC_SOURCE, &src.display().to_string())
        .replace(DOC_RECEIVER, target);
    fs::write(job_dir.join("ship.sh"), job).unwrap();
}

#[test]
fn the_docs_job_array_delivers_the_tree_and_a_resubmitted_task_resumes() {
    let name = "the_docs_job_array_delivers_the_tree_and_a_resubmitted_task_resumes";
    if let Some(why) = unavailable() {
        say(&format!("{name}: skipped: {why}"));
        return;
    }
    let started = Instant::now();
    let scratch = TestDir::new("slurm");
    let root = scratch.root();
    let src = root.join("src/dataset");
    build_tree(&src);
    // The client's key and the server's recorded in its known_hosts, where
    // the doc's `atou send` (no key flags) looks: $XDG_CONFIG_HOME/atou.
    let keys = scratch.dir("keys");
    let config = scratch.dir("config");
    let (_, client_line) = common::keygen(&keys, "client", TEST_CACHE);
    common::keygen(&keys, "server", TEST_CACHE);
    fs::write(keys.join("authorized_keys"), client_line).unwrap();
    fs::create_dir_all(config.join("atou")).unwrap();
    fs::set_permissions(config.join("atou"), fs::Permissions::from_mode(0o700)).unwrap();
    fs::copy(keys.join("client"), config.join("atou/id_x25519")).unwrap();
    fs::set_permissions(
        config.join("atou/id_x25519"),
        fs::Permissions::from_mode(0o600),
    )
    .unwrap();
    // `atou` on the tasks' PATH: this build, or (for the cancelled run) a
    // wrapper that slows it so that it can be cancelled half way.
    let bin = scratch.dir("bin");
    symlink(ATOU, bin.join("atou")).unwrap();
    let slow_bin = scratch.dir("slow-bin");
    fs::write(
        slow_bin.join("atou"),
        format!(
            "#!/bin/sh\ncmd=$1; shift\nexec {ATOU} \"$cmd\" --streams 1 --bwlimit 100mbit \"$@\"\n"
        ),
    )
    .unwrap();
    fs::set_permissions(slow_bin.join("atou"), fs::Permissions::from_mode(0o755)).unwrap();
    let path_with = |dir: &Path| {
        PathBuf::from(format!(
            "{}:{}",
            dir.display(),
            std::env::var("PATH").unwrap_or_default()
        ))
    };
    let (fast_path, slow_path) = (path_with(&bin), path_with(&slow_bin));
    let script = doc_job_script();
    for placeholder in [DOC_SOURCE, DOC_RECEIVER] {
        assert_eq!(
            script.matches(placeholder).count(),
            1,
            "the doc's job script no longer names {placeholder} once:\n{script}"
        );
    }
    let cluster = Cluster::start(&scratch.dir("slurm"));
    let slurm_up = started.elapsed();

    // 1. The array as written: 4 tasks at once into one `atou serve`.
    // The doc's DEST is `HOST:PORT:dataset`, SRC `.../dataset`: the tree
    // arrives as DEST/dataset/dataset.
    let dest = scratch.dir("dest");
    let (_server, target) = serve(&dest, &keys);
    first_contact(&config, &src, &target);
    let job_dir = scratch.dir("job1");
    write_job(&job_dir, &script, &src, &target);
    let env = [
        ("PATH", fast_path.as_path()),
        ("XDG_CONFIG_HOME", config.as_path()),
        ("XDG_CACHE_HOME", Path::new(TEST_CACHE)),
    ];
    let job = cluster.submit(&job_dir, &env, &[]);
    cluster.wait(job);
    let mut sent = 0;
    for k in 1..=4 {
        let r = task_report(&job_dir, job, k);
        assert_eq!(r["shard"], format!("{k}/4"), "task {k}: {r}");
        sent += u(&r["bytes_sent"]);
    }
    let entries = assert_same_tree(&src, &dest.join("dataset/dataset"), true);
    let first_array = started.elapsed() - slurm_up;
    assert!(sent >= 64 * MIB, "the 4 tasks sent {sent} bytes");

    // 2. Task 3 alone, slowed, cancelled half way through its 16 MiB part;
    // resubmitted alone, it resumes; then the other 3 finish the tree.
    let dest2 = scratch.dir("dest2");
    let (_server2, target2) = serve(&dest2, &keys);
    let job_dir2 = scratch.dir("job2");
    write_job(&job_dir2, &script, &src, &target2);
    let slow_env = [
        ("PATH", slow_path.as_path()),
        ("XDG_CONFIG_HOME", config.as_path()),
        ("XDG_CACHE_HOME", Path::new(TEST_CACHE)),
    ];
    // Its key is recorded for server (1)'s address only.
    first_contact(&config, &src, &target2);
    let cancelled = cluster.submit(&job_dir2, &slow_env, &["--array=3"]);
    let deadline = Instant::now() + Duration::from_secs(60);
    while staged_bytes(&dest2) < 6 * MIB {
        assert!(
            cluster.running(cancelled),
            "task 3 ended before 6 MiB of its part were in"
        );
        assert!(Instant::now() < deadline, "task 3 wrote too little in 60 s");
        std::thread::sleep(Duration::from_millis(10));
    }
    let out = run(cluster.command("scancel").arg(cancelled.to_string()));
    assert!(out.status.success(), "scancel: {out:?}");
    cluster.wait(cancelled);
    let at_cancel = staged_bytes(&dest2);
    assert!(!dest2.join("dataset/dataset/big.bin").exists());
    let rerun = cluster.submit(&job_dir2, &env, &["--array=3"]);
    cluster.wait(rerun);
    let r = task_report(&job_dir2, rerun, 3);
    let (resent, skipped) = (u(&r["bytes_sent"]), u(&r["bytes_skipped"]));
    assert_eq!(r["shard"], "3/4", "{r}");
    assert!(skipped > 0, "task 3 resubmitted did not resume: {r}");
    let rest = cluster.submit(&job_dir2, &env, &["--array=1,2,4"]);
    cluster.wait(rest);
    for k in [1, 2, 4] {
        let r = task_report(&job_dir2, rest, k);
        assert_eq!(r["shard"], format!("{k}/4"), "task {k}: {r}");
    }
    // Every entry as the source's, directories included: the cancelled
    // session created them (mode 0700 until a finish) and left their
    // pending records, so its rerun gave them their modes.
    let tree2 = dest2.join("dataset/dataset");
    let private_dirs = ["", "a", "a/b", "empty"]
        .iter()
        .filter(|d| fs::metadata(tree2.join(d)).unwrap().mode() & 0o777 == 0o700)
        .count();
    assert_eq!(private_dirs, 0, "directories left private after the rerun");
    assert_same_tree(&src, &tree2, true);
    say(&format!(
        "{name}: Slurm up in {:.1} s; the array of 4 delivered {entries} entries \
         ({sent} bytes) in {:.1} s; task 3 cancelled with {at_cancel} bytes of the \
         split file staged, resubmitted: sent {resent}, skipped {skipped}; \
         {private_dirs} of 4 directories left mode 0700; {:.1} s in all",
        slurm_up.as_secs_f64(),
        first_array.as_secs_f64(),
        started.elapsed().as_secs_f64()
    ));
    drop(cluster);
}
