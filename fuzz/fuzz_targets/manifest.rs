//! Any bytes as a manifest: decoding never panics, and what decodes
//! re-encodes to a manifest that decodes to the same entries.
#![no_main]
use atou::fuzzing::transfer::manifest::Manifest;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(m) = Manifest::decode(data) {
        let again = Manifest::decode(&m.encode()).expect("re-encoded manifest decodes");
        assert_eq!(m, again);
    }
});
