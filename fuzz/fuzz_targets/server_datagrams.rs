//! The server fed arbitrary datagrams from a few addresses, with time
//! passing: it never panics, everything it sends decodes, and it never
//! holds more connections than its limit.
#![no_main]
use std::net::SocketAddr;
use std::time::Duration;

use atou::proto::wire::{Packet, ACK_MAX_LEN, CONTROL_MAX_LEN};
use atou::proto::{Server, ServerLimits, Time};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|input: Vec<(u8, u16, Vec<u8>)>| {
    let limits = ServerLimits {
        max_rcvsegs: 64,
        max_connections: 4,
    };
    let mut server = Server::new(limits, 1 << 20);
    let mut now = Time::ZERO;
    let mut buf = [0u8; ACK_MAX_LEN + CONTROL_MAX_LEN];
    for (who, millis, datagram) in input {
        now += Duration::from_millis(u64::from(millis));
        let from = SocketAddr::from(([127, 0, 0, 1], 1000 + u16::from(who % 4)));
        server.handle_datagram(now, from, &datagram);
        if server.poll_timeout().is_some_and(|t| t <= now) {
            server.handle_timeout(now);
        }
        while let Some((_, n)) = server.poll_transmit(now, &mut buf) {
            assert!(Packet::decode(&buf[..n]).is_ok());
        }
        while server.poll_report().is_some() {}
        while server.poll_notice().is_some() {}
        assert!(server.open_connections() <= 4);
    }
});
