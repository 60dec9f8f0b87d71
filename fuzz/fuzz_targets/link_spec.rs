//! Link specs: parsing never panics, and what parses prints to a spec that
//! parses to the same link.
#![no_main]
use atou::sim::LinkSpec;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    if let Ok(spec) = text.parse::<LinkSpec>() {
        let again: LinkSpec = spec.to_string().parse().expect("printed spec parses");
        assert_eq!(again, spec);
    }
});
