//! Data segments: a valid header prefix, then anything.
#![no_main]
use atou::fuzzing::wire::{Packet, MAGIC, VERSION};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let mut buf = Vec::with_capacity(12 + data.len());
    buf.extend_from_slice(&MAGIC);
    buf.extend_from_slice(&[VERSION, 1, 0, 0, 0, 0, 0, 0, 0, 1]);
    buf.extend_from_slice(data);
    if let Ok(Packet::Data(seg)) = Packet::decode(&buf) {
        assert!(seg.header.seg.checked_add(1).is_some());
    }
});
