// What a test does when this host cannot run it. Included, not a module,
// by tests/common/mod.rs and by the unit tests in src/ that need root.

/// A line on stderr, past the test harness's capture (it captures the
/// print macros only), so a long scenario's figures show as it runs.
pub fn say(line: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr().lock(), "{line}");
}

/// Whether this is a CI run (`CI` set and not `false`/`0`, as `.ci/run`
/// is run): there, as root with every tool `.ci/run` installs, a test
/// that cannot run is a failure, not a skip that passes by not running.
pub fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| !v.is_empty() && v != "false" && v != "0")
}

/// `test` cannot run here, because `why`: skipped with the reason said
/// (the caller returns), or, in CI, failed with it.
pub fn cannot_run(test: &str, why: &str) {
    assert!(!in_ci(), "{test}: cannot run in CI: {why}");
    say(&format!("SKIPPED {test}: {why}"));
}
