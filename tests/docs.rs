//! The documentation stays true to the code.

use atou::internals::tuning::KNOBS;
use atou::Tuning;

/// The path cache of the atou processes this test starts: its own, so
/// that neither the user's entries nor another test's hint its runs.
const TEST_CACHE: &str = concat!(env!("CARGO_TARGET_TMPDIR"), "/path-cache-", module_path!());

/// docs/tuning.md has a table row for every knob, showing the default the
/// commands actually use.
#[test]
fn tuning_md_documents_every_knob_with_its_default() {
    let doc =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/tuning.md")).unwrap();
    let defaults = Tuning::command_default();
    for k in KNOBS {
        let row = doc
            .lines()
            .find(|l| l.starts_with(&format!("| `{}`", k.name)))
            .unwrap_or_else(|| panic!("docs/tuning.md has no row for `{}`", k.name));
        let default = defaults.get(k.name).unwrap();
        let cells: Vec<&str> = row.split('|').map(str::trim).collect();
        assert!(
            cells[3].split_whitespace().next() == Some(default.as_str()),
            "docs/tuning.md gives `{}` default `{}`, the code {}",
            k.name,
            cells[3],
            default
        );
        for alias in k.aliases {
            assert!(
                row.contains(alias),
                "alias `{alias}` of `{}` undocumented",
                k.name
            );
        }
    }
}

/// The README's table of exit statuses has a row for every status that
/// `atou --help` lists (made from src/cli/exit.rs), with the same word.
#[test]
fn readme_lists_every_exit_status_with_its_word() {
    let help = std::process::Command::new(env!("CARGO_BIN_EXE_atou"))
        .env("XDG_CACHE_HOME", TEST_CACHE)
        .arg("--help")
        .output()
        .unwrap();
    let help = String::from_utf8(help.stdout).unwrap();
    let table = help
        .split("Exit status:\n")
        .nth(1)
        .expect("`atou --help` lists the exit statuses");
    let rows: Vec<(u8, &str)> = table
        .lines()
        .map_while(|l| {
            let mut words = l.split_whitespace();
            Some((words.next()?.parse().ok()?, words.next()?))
        })
        .collect();
    assert!(rows.len() >= 10, "{table}");
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).unwrap();
    for (code, word) in rows {
        let row = format!("| {code} | `{word}` |");
        assert!(readme.contains(&row), "README.md has no row `{row}`");
    }
}
