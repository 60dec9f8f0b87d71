//! The path cache from the command line: `atou copy` saves what it learnt
//! under $XDG_CACHE_HOME/atou/paths, a corrupt entry costs a warning and
//! not the transfer, and `--no-path-cache` neither reads nor writes.

mod common;

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use common::{TestDir, ATOU};

/// A directory of the test's own holding `src/f`, a file to copy.
fn with_a_file_to_copy(test: &str) -> TestDir {
    let dir = TestDir::new(&format!("path-cache-cli-{test}"));
    fs::write(dir.dir("src").join("f"), vec![7u8; 300_000]).unwrap();
    dir
}

fn copy(dir: &Path, extra: &[&str]) -> Output {
    let out = Command::new(ATOU)
        .arg("copy")
        .arg("--quiet")
        .args(extra)
        .arg(dir.join("src"))
        .arg(dir.join("dst"))
        .arg("--overwrite")
        .env("XDG_CACHE_HOME", dir.join("cache"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "atou copy failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn entries(dir: &Path) -> Vec<PathBuf> {
    match fs::read_dir(dir.join("cache/atou/paths")) {
        Ok(d) => d.map(|e| e.unwrap().path()).collect(),
        Err(_) => Vec::new(),
    }
}

#[test]
fn no_path_cache_neither_writes_nor_reads_the_cache() {
    let tmp = with_a_file_to_copy("off");
    let dir = tmp.root();
    copy(dir, &["--no-path-cache"]);
    assert!(entries(dir).is_empty(), "written despite --no-path-cache");
    copy(dir, &[]);
    let saved = entries(dir);
    assert_eq!(saved.len(), 1, "one entry for 127.0.0.1: {saved:?}");
    let text = fs::read_to_string(&saved[0]).unwrap();
    assert!(text.starts_with("atou-path-memory 1\n"), "{text}");
    // A corrupt entry is not read with --no-path-cache (no warning) ...
    fs::write(&saved[0], "atou-path-memory 1\nsrtt_us banana\n").unwrap();
    let quiet = copy(dir, &["--no-path-cache"]);
    assert!(
        quiet.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&quiet.stderr)
    );
    assert_eq!(
        fs::read_to_string(&saved[0]).unwrap(),
        "atou-path-memory 1\nsrtt_us banana\n",
        "nor rewritten"
    );
    // ... and without it, costs a warning, not the transfer, and is replaced.
    let warned = copy(dir, &[]);
    let stderr = String::from_utf8_lossy(&warned.stderr);
    assert!(
        stderr.contains("warning: ignoring the path cache entry"),
        "{stderr}"
    );
    let text = fs::read_to_string(&saved[0]).unwrap();
    assert!(
        text.contains("srtt_us "),
        "replaced by a good entry: {text}"
    );
}

/// A 300 KB copy never leaves BBR's Startup: the bandwidth it reached is
/// a lower bound (on loopback, sometimes no model at all), and it does not
/// replace the larger one a big transfer saved (planted here, saved a
/// moment ago); the rest of the entry is the new connection's. Before,
/// the small copy's rate replaced it, and the next large transfer started
/// from a small jump (tests/path_memory.rs).
#[test]
fn a_small_copy_keeps_the_larger_bandwidth_saved() {
    let tmp = with_a_file_to_copy("lower-bound");
    let dir = tmp.root();
    copy(dir, &[]);
    let saved = entries(dir);
    assert_eq!(saved.len(), 1, "{saved:?}");
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let planted = format!(
        "atou-path-memory 1\nsaved_at {now}\nsrtt_us 777777\nrttvar_us 1000\n\
         btl_bw_bps 9000000000000\nmin_rtt_us 20\n"
    );
    fs::write(&saved[0], &planted).unwrap();
    copy(dir, &[]);
    let after = fs::read_to_string(&saved[0]).unwrap();
    assert!(
        after.contains("btl_bw_bps 9000000000000\n"),
        "the larger bandwidth kept: {after}"
    );
    assert!(
        !after.contains("srtt_us 777777\n"),
        "the rest replaced: {after}"
    );
}
