//! Config files: parsing never panics, and an accepted tuning prints to a
//! config that loads back to the same tuning.
#![no_main]
use atou::Tuning;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let mut t = Tuning::default();
    if t.apply_config(text).is_ok() {
        let mut back = Tuning::default();
        back.apply_config(&t.config_lines().join("\n"))
            .expect("printed config loads");
        assert_eq!(back, t);
    }
});
