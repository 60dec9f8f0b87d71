//! The documentation stays true to the code.

use atou::proto::tuning::KNOBS;
use atou::proto::Tuning;

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
