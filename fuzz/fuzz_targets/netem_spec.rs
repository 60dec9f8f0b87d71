//! Netem specs: parsing never panics; what parses prints to a spec that
//! parses to the same thing; and the model runs any of them over a burst of
//! packets without panicking, delivering no more than it was offered plus
//! its duplicates.
#![no_main]
use atou::netem::{Netem, NetemSpec};
use atou::Time;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(spec) = text.parse::<NetemSpec>() else {
        return;
    };
    let again: NetemSpec = spec.to_string().parse().expect("printed spec parses");
    assert_eq!(again, spec);
    let mut link: Netem<Vec<u8>> = Netem::new(spec, 1);
    let mut delivered = 0u64;
    for i in 0..200u64 {
        let now = Time::from_nanos(i * 50_000);
        link.enqueue(now, vec![i as u8; (i % 7) as usize * 200]);
        while link.poll(now).is_some() {
            delivered += 1;
        }
    }
    // Drain, bounding the steps: a slot may take a poll to open.
    for _ in 0..10_000 {
        let Some(at) = link.next_release() else { break };
        if link.poll(at).is_some() {
            delivered += 1;
        }
    }
    let s = link.stats();
    assert_eq!(delivered, s.delivered);
    assert!(s.delivered <= s.offered + s.duplicated);
});
