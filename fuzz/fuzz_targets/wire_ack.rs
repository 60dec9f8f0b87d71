//! ACKs: a valid header prefix, then anything. Whatever decodes has
//! non-empty SACK blocks above the cumulative ACK, at most four.
#![no_main]
use atou::fuzzing::wire::{Packet, MAGIC, MAX_SACK_BLOCKS, VERSION};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let mut buf = Vec::with_capacity(12 + data.len());
    buf.extend_from_slice(&MAGIC);
    buf.extend_from_slice(&[VERSION, 2, 0, 0, 0, 0, 0, 0, 0, 1]);
    buf.extend_from_slice(data);
    if let Ok(Packet::Ack(ack)) = Packet::decode(&buf) {
        assert!(ack.sack_blocks().len() <= MAX_SACK_BLOCKS);
        for b in ack.sack_blocks() {
            assert!(b.start > ack.cum_ack && b.end > b.start);
        }
        if let Some(d) = ack.dsack {
            assert!(d.end > d.start);
        }
    }
});
