//! Sealing off the protocol's thread: one pipeline thread per sending
//! connection seals a transmit batch while the driver sends the batch
//! before it and fills the next.
//!
//! The endpoint still assigns every packet number, in order
//! (`frame::prepare`: the key update and the integrity limit count on its
//! side); the thread here only runs the AEAD over bytes whose header is
//! written (`SealJob::seal`). Batches come back in the order they went,
//! so datagrams leave in the order the endpoint wrote them. One thread,
//! not a pool: one core seals faster than one protocol thread fills
//! batches (docs/security.md, "What it costs"), and a second batch in
//! flight would only add latency.

use std::io;
use std::sync::mpsc;
use std::thread;

use super::socket::TxBatch;

/// A thread that seals [`TxBatch`]es, one in flight at a time.
pub(crate) struct SealPipeline {
    to_worker: Option<mpsc::SyncSender<TxBatch>>,
    from_worker: mpsc::Receiver<TxBatch>,
    worker: Option<thread::JoinHandle<()>>,
    in_flight: bool,
    /// A batch sealed on the driver's thread because the worker was gone.
    sealed_here: Option<TxBatch>,
}

impl SealPipeline {
    pub(crate) fn start() -> io::Result<SealPipeline> {
        let (to_worker, inbox) = mpsc::sync_channel::<TxBatch>(1);
        let (outbox, from_worker) = mpsc::sync_channel(1);
        let worker = thread::Builder::new()
            .name("atou-seal".into())
            .spawn(move || {
                while let Ok(mut batch) = inbox.recv() {
                    batch.seal_all();
                    if outbox.send(batch).is_err() {
                        return;
                    }
                }
            })?;
        Ok(SealPipeline {
            to_worker: Some(to_worker),
            from_worker,
            worker: Some(worker),
            in_flight: false,
            sealed_here: None,
        })
    }

    /// Hands `batch` over to be sealed and returns the batch handed over
    /// before it, sealed (waiting for it if need be), or `None` if none
    /// was in flight.
    pub(crate) fn exchange(&mut self, batch: TxBatch) -> Option<TxBatch> {
        let earlier = self.finish();
        let sent = match &self.to_worker {
            Some(to_worker) => to_worker.send(batch),
            None => Err(mpsc::SendError(batch)),
        };
        match sent {
            Ok(()) => self.in_flight = true,
            // The thread is gone (only a bug stops it): seal here rather
            // than lose the batch.
            Err(mpsc::SendError(mut batch)) => {
                batch.seal_all();
                self.sealed_here = Some(batch);
            }
        }
        earlier
    }

    /// Whether a batch is being sealed (or waits to be sent).
    pub(crate) fn in_flight(&self) -> bool {
        self.in_flight || self.sealed_here.is_some()
    }

    /// The batch in flight, sealed, if any.
    pub(crate) fn finish(&mut self) -> Option<TxBatch> {
        if let Some(batch) = self.sealed_here.take() {
            return Some(batch);
        }
        if !std::mem::take(&mut self.in_flight) {
            return None;
        }
        self.from_worker.recv().ok()
    }
}

impl Drop for SealPipeline {
    fn drop(&mut self) {
        self.to_worker = None;
        if let Some(worker) = self.worker.take() {
            let _ = worker.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::crypto::frame::{self, PN_LEN};
    use crate::proto::crypto::{Cipher, Opener, Sealer, TrafficSecret};
    use crate::proto::wire::Ack;
    use std::net::SocketAddr;

    const TO: &str = "127.0.0.1:9";

    fn sealer() -> Sealer {
        // An update every 5 packets: batches straddle key updates.
        Sealer::with_interval(Cipher::Aes256Gcm, TrafficSecret::new([3; 32]), 5)
    }

    /// Writes ack `k` at `buf[PN_LEN..]`: its inner length.
    fn ack(k: u64, buf: &mut [u8]) -> usize {
        Ack::new(1, k as u32, k, 64)
            .emit(&mut buf[PN_LEN..])
            .unwrap()
    }

    /// Batches sealed on the pipeline's thread come back in the order
    /// they went, each datagram byte for byte what sealing inline (as the
    /// endpoint did before) makes, across key updates; the receiver opens
    /// them all.
    #[test]
    fn batches_sealed_on_the_pipeline_are_the_inline_bytes_in_order() {
        let to: SocketAddr = TO.parse().unwrap();
        let (mut inline, mut prepared) = (sealer(), sealer());
        let mut opener = Opener::new(Cipher::Aes256Gcm, TrafficSecret::new([3; 32]));
        let mut pipeline = SealPipeline::start().unwrap();
        let mut expected = vec![];
        let mut got = vec![];
        let mut k = 0;
        for _ in 0..4 {
            let mut batch = TxBatch::new();
            for _ in 0..7 {
                let mut buf = vec![0u8; 128];
                let n = ack(k, &mut buf);
                let len = frame::seal(&mut inline, 0xAB, &mut buf, n).unwrap();
                expected.push(buf[..len].to_vec());
                let mut job = None;
                batch.push_with(128, |b| {
                    let n = ack(k, b);
                    let j = frame::prepare(&mut prepared, 0xAB, b, n).unwrap();
                    let len = j.len();
                    job = Some(j);
                    Some((to, len))
                });
                batch.seal_later(job.unwrap());
                k += 1;
            }
            assert!(batch.has_unsealed());
            if let Some(sealed) = pipeline.exchange(batch) {
                got.extend(sealed.datagrams());
            }
        }
        got.extend(pipeline.finish().unwrap().datagrams());
        assert!(pipeline.finish().is_none());
        assert_eq!(got.len(), 28);
        assert_eq!(got, expected);
        for mut d in got {
            assert!(frame::open(&mut opener, 1, &mut d).is_ok());
        }
        assert_eq!(opener.generation(), 5);
    }
}
