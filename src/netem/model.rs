//! The queueing discipline itself: sch_netem's enqueue and dequeue, driven
//! by a caller-supplied clock.

use std::cmp::{Ordering, Reverse};
use std::collections::{BinaryHeap, VecDeque};
use std::time::Duration;

use rand_chacha::ChaCha8Rng;
use rand_core::{Rng, SeedableRng};
use serde::Serialize;

use super::random::{happens, scaled, tabledist, Correlated};
use super::spec::{Chance, FourState, GilbertElliott, Loss, NetemSpec, QdiscSpec, Rate, SlotDelay};
use crate::proto::Time;

/// What the model carries: a datagram, or a datagram with a destination.
pub trait Datagram: Clone {
    /// Bytes on the wire, for `rate` and `slot bytes`.
    fn wire_len(&self) -> usize;
    /// The bytes `corrupt` may flip a bit in.
    fn bytes_mut(&mut self) -> &mut [u8];
}

impl Datagram for Vec<u8> {
    fn wire_len(&self) -> usize {
        self.len()
    }
    fn bytes_mut(&mut self) -> &mut [u8] {
        self
    }
}

/// What happened to the packets one direction was offered.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct NetemStats {
    /// Packets offered (copies made by `duplicate` not counted).
    pub offered: u64,
    /// Packets that left.
    pub delivered: u64,
    /// Dropped by the loss model.
    pub lost: u64,
    /// Dropped because `limit` packets were already held.
    pub limit_drops: u64,
    /// Extra copies made by `duplicate`.
    pub duplicated: u64,
    /// Sent ahead of the delay by `reorder`.
    pub reordered: u64,
    /// Had a bit flipped by `corrupt`.
    pub corrupted: u64,
}

impl NetemStats {
    /// Everything dropped, for whatever reason.
    pub(crate) fn dropped(&self) -> u64 {
        self.lost + self.limit_drops
    }
}

struct Held<P> {
    at: Time,
    /// Order of entry: equal times leave first in, first out.
    seq: u64,
    packet: P,
}

impl<P> PartialEq for Held<P> {
    fn eq(&self, other: &Self) -> bool {
        (self.at, self.seq) == (other.at, other.seq)
    }
}
impl<P> Eq for Held<P> {}
impl<P> PartialOrd for Held<P> {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl<P> Ord for Held<P> {
    fn cmp(&self, other: &Self) -> Ordering {
        (self.at, self.seq).cmp(&(other.at, other.seq))
    }
}

#[derive(Debug, Clone, Copy)]
struct SlotState {
    /// When the current slot opens.
    next: Time,
    packets_left: i64,
    bytes_left: i64,
}

/// The 4-state model's states (sch_netem's `TX_IN_GAP_PERIOD` etc.).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum LossState {
    /// 1: good reception in a gap.
    GapReceive,
    /// 2: good reception within a burst.
    BurstReceive,
    /// 3: loss within a burst.
    BurstLoss,
    /// 4: an isolated loss in a gap.
    GapLoss,
}

/// One netem qdisc.
pub(crate) struct Qdisc<P> {
    spec: QdiscSpec,
    rng: ChaCha8Rng,
    loss_corr: Correlated,
    dup_corr: Correlated,
    corrupt_corr: Correlated,
    reorder_corr: Correlated,
    delay_corr: Correlated,
    loss_state: LossState,
    /// Gilbert-Elliott: in the bad state.
    ge_bad: bool,
    /// Packets delayed normally since the last one sent ahead (`gap`).
    reorder_counter: u32,
    /// Packets sent ahead by `reorder`: they leave at once, last in first.
    ahead: VecDeque<(Time, P)>,
    /// The delay line, by departure time (the kernel's tfifo).
    tfifo: BinaryHeap<Reverse<Held<P>>>,
    /// The latest departure time in the tfifo: `rate` serialises after it.
    tfifo_last: Option<Time>,
    slot: Option<SlotState>,
    /// Bytes below the datagram each packet carries on the wire (14 for
    /// Ethernet under a TUN bridge, to match netem on a veth).
    frame_overhead: usize,
    seq: u64,
    stats: NetemStats,
}

impl<P: Datagram> Qdisc<P> {
    /// A qdisc; `seed` is used unless the spec names its own.
    pub(crate) fn new(spec: QdiscSpec, seed: u64) -> Qdisc<P> {
        let slot = spec.slot.map(|slot| {
            let (packets_left, bytes_left) = slot_budget(slot);
            // The kernel opens the first slot when the qdisc is configured.
            SlotState {
                next: Time::ZERO,
                packets_left,
                bytes_left,
            }
        });
        Qdisc {
            rng: ChaCha8Rng::seed_from_u64(spec.seed.unwrap_or(seed)),
            loss_corr: Correlated::new(match spec.loss {
                Loss::Random(c) => c.corr,
                _ => Default::default(),
            }),
            dup_corr: Correlated::new(spec.duplicate.corr),
            corrupt_corr: Correlated::new(spec.corrupt.corr),
            reorder_corr: Correlated::new(spec.reorder.corr),
            delay_corr: Correlated::new(spec.delay_corr),
            spec,
            loss_state: LossState::GapReceive,
            ge_bad: false,
            reorder_counter: 0,
            ahead: VecDeque::new(),
            tfifo: BinaryHeap::new(),
            tfifo_last: None,
            slot,
            frame_overhead: 0,
            seq: 0,
            stats: NetemStats::default(),
        }
    }

    pub(crate) fn set_frame_overhead(&mut self, bytes: usize) {
        self.frame_overhead = bytes;
    }

    /// What happened to the packets offered so far.
    pub(crate) fn stats(&self) -> NetemStats {
        self.stats
    }

    /// sch_netem's `loss_event`.
    fn loss_event(&mut self) -> bool {
        match self.spec.loss {
            Loss::None => false,
            Loss::Random(c) => chance(&mut self.rng, &mut self.loss_corr, c),
            // Counts packets offered, not the copies `duplicate` makes.
            Loss::Every(n) => self.stats.offered % n == 0,
            Loss::State(m) => self.loss_4state(&m),
            Loss::Gemodel(m) => self.loss_gilb_ell(&m),
        }
    }

    /// sch_netem `loss_4state`; one draw per packet.
    fn loss_4state(&mut self, m: &FourState) -> bool {
        let rnd = u64::from(self.rng.next_u32());
        let p = |x| u64::from(scaled(x));
        let (p13, p31, p32, p23, p14) = (p(m.p13), p(m.p31), p(m.p32), p(m.p23), p(m.p14));
        use LossState::*;
        let (next, lost) = match self.loss_state {
            GapReceive if rnd < p14 => (GapLoss, true),
            GapReceive if rnd < p14 + p13 => (BurstLoss, true),
            GapReceive => (GapReceive, false),
            BurstReceive if rnd < p23 => (BurstLoss, true),
            BurstReceive => (BurstReceive, false),
            BurstLoss if rnd < p32 => (BurstReceive, false),
            BurstLoss if rnd < p32 + p31 => (GapReceive, false),
            BurstLoss => (BurstLoss, true),
            GapLoss => (GapReceive, false),
        };
        self.loss_state = next;
        lost
    }

    /// sch_netem `loss_gilb_ell`: the transition is drawn first, the loss
    /// with the probability of the state the packet found.
    fn loss_gilb_ell(&mut self, m: &GilbertElliott) -> bool {
        let (move_p, loss_p) = if self.ge_bad {
            (m.r, m.one_minus_h)
        } else {
            (m.p, m.one_minus_k)
        };
        if self.rng.next_u32() < scaled(move_p) {
            self.ge_bad = !self.ge_bad;
        }
        let rnd = self.rng.next_u32();
        happens(scaled(loss_p), rnd)
    }

    /// Offers a packet at `now` (sch_netem's `netem_enqueue`).
    pub(crate) fn enqueue(&mut self, now: Time, packet: P) {
        self.stats.offered += 1;
        self.enqueue_one(now, packet, true);
    }

    fn enqueue_one(&mut self, now: Time, mut packet: P, may_duplicate: bool) {
        let mut count = 1;
        if may_duplicate && chance(&mut self.rng, &mut self.dup_corr, self.spec.duplicate) {
            count += 1;
        }
        if self.loss_event() {
            count -= 1;
        }
        if count == 0 {
            self.stats.lost += 1;
            return;
        }
        if count > 1 {
            // The kernel re-enqueues the copy at the root with duplication
            // off, so it meets loss, corruption and delay on its own.
            self.stats.duplicated += 1;
            self.enqueue_one(now, packet.clone(), false);
        }
        if chance(&mut self.rng, &mut self.corrupt_corr, self.spec.corrupt) {
            let bytes = packet.bytes_mut();
            if !bytes.is_empty() {
                let at = ((u64::from(self.rng.next_u32()) * bytes.len() as u64) >> 32) as usize;
                bytes[at] ^= 1 << (self.rng.next_u32() % 8);
            }
            self.stats.corrupted += 1;
        }
        if self.tfifo.len() >= self.spec.limit() as usize {
            self.stats.limit_drops += 1;
            return;
        }
        let gap = self.spec.gap();
        let in_order = gap == 0
            || self.reorder_counter < gap - 1
            || !chance(&mut self.rng, &mut self.reorder_corr, self.spec.reorder);
        if !in_order {
            // Sent ahead: to the head of the queue, leaving at once.
            self.reorder_counter = 0;
            self.stats.reordered += 1;
            self.ahead.push_front((now, packet));
            return;
        }
        let rnd = if self.spec.jitter.is_zero() {
            0
        } else {
            self.delay_corr.next(&mut self.rng)
        };
        let mut delay = tabledist(
            nanos(self.spec.delay),
            nanos(self.spec.jitter),
            rnd,
            self.spec.distribution,
        );
        let mut from = i128::from(now.as_nanos());
        if let Some(rate) = self.spec.rate {
            // The last packet queued is the reference point: this one is
            // serialised after it, or after its own delay if that is later.
            if let Some(last) = self.tfifo_last {
                let last = i128::from(last.as_nanos());
                delay = (delay - (last - from)).max(0);
                from = last;
            }
            delay += i128::from(self.packet_time(&rate, packet.wire_len()));
        }
        let at = Time::from_nanos((from + delay).max(0) as u64);
        self.reorder_counter += 1;
        self.tfifo_last = Some(self.tfifo_last.map_or(at, |l| l.max(at)));
        self.seq += 1;
        self.tfifo.push(Reverse(Held {
            at,
            seq: self.seq,
            packet,
        }));
    }

    /// sch_netem's `packet_time_ns`: serialisation time of `len` bytes.
    fn packet_time(&self, rate: &Rate, len: usize) -> u64 {
        let mut len = (len + self.frame_overhead) as i64 + i64::from(rate.packet_overhead);
        if rate.cell_size > 0 {
            let cell = i64::from(rate.cell_size);
            let cells = (len.max(0) + cell - 1) / cell;
            len = cells * (cell + i64::from(rate.cell_overhead));
        }
        (len.max(0) as u128 * 8 * 1_000_000_000 / u128::from(rate.bits)) as u64
    }

    fn open_next_slot(&mut self, now: Time) {
        let Some(spec) = self.spec.slot else { return };
        let delay = match spec.delay {
            SlotDelay::Range { min, max } => {
                let span = nanos(max) - nanos(min);
                nanos(min) + ((u128::from(self.rng.next_u32()) * u128::from(span)) >> 32) as u64
            }
            SlotDelay::Distribution {
                dist,
                delay,
                jitter,
            } => {
                let rnd = self.rng.next_u32();
                tabledist(nanos(delay), nanos(jitter), rnd, Some(dist)).max(0) as u64
            }
        };
        let (packets, bytes) = slot_budget(spec);
        self.slot = Some(SlotState {
            next: now + Duration::from_nanos(delay),
            packets_left: packets,
            bytes_left: bytes,
        });
    }

    /// When a packet may next come out. With `slot`, [`Qdisc::poll`] at this
    /// time may instead open the next slot and return nothing, as the
    /// kernel's dequeue does when a slot opened before its packet was due.
    pub(crate) fn next_release(&self) -> Option<Time> {
        if let Some((at, _)) = self.ahead.front() {
            return Some(*at);
        }
        let head = self.tfifo.peek()?.0.at;
        Some(match self.slot {
            Some(s) if s.next >= head => s.next,
            _ => head,
        })
    }

    /// The next packet due at or before `now`, with the time it left
    /// (sch_netem's `netem_dequeue`).
    pub(crate) fn poll_timed(&mut self, now: Time) -> Option<(Time, P)> {
        if let Some((at, p)) = self.ahead.pop_front() {
            self.stats.delivered += 1;
            return Some((at, p));
        }
        let head = self.tfifo.peek()?.0.at;
        if self.slot.is_some_and(|s| s.next < head) {
            self.open_next_slot(now);
        }
        let opens = self.slot.map_or(Time::ZERO, |s| s.next);
        if head > now || opens > now {
            return None;
        }
        let Reverse(held) = self.tfifo.pop()?;
        if self.tfifo.is_empty() {
            self.tfifo_last = None;
        }
        if let Some(s) = &mut self.slot {
            s.packets_left -= 1;
            s.bytes_left -= (held.packet.wire_len() + self.frame_overhead) as i64;
            if s.packets_left <= 0 || s.bytes_left <= 0 {
                self.open_next_slot(now);
            }
        }
        self.stats.delivered += 1;
        Some((held.at.max(opens), held.packet))
    }

    /// The next packet due at or before `now`, if any (sch_netem's
    /// `netem_dequeue`).
    pub(crate) fn poll(&mut self, now: Time) -> Option<P> {
        self.poll_timed(now).map(|(_, p)| p)
    }

    /// The packets it holds, in no particular order.
    fn held(&self) -> impl Iterator<Item = &P> {
        let ahead = self.ahead.iter().map(|(_, p)| p);
        ahead.chain(self.tfifo.iter().map(|h| &h.0.packet))
    }
}

/// A draw for `c`, correlated with the last one; none when `c` is zero, so
/// a spec without randomness consumes none.
fn chance(rng: &mut ChaCha8Rng, corr: &mut Correlated, c: Chance) -> bool {
    !c.is_zero() && happens(scaled(c.p), corr.next(rng))
}

fn slot_budget(slot: super::spec::Slot) -> (i64, i64) {
    (
        slot.packets.map_or(i64::from(i32::MAX), i64::from),
        slot.bytes.map_or(i64::from(i32::MAX), i64::from),
    )
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// SplitMix64: independent seeds (each stage, each direction) from one.
pub(crate) fn mix_seed(seed: u64, stream: u64) -> u64 {
    let mut z = seed.wrapping_add(stream.wrapping_mul(0x9E37_79B9_7F4A_7C15));
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// One direction of a path: the qdiscs of a [`NetemSpec`] in a chain.
pub struct Netem<P> {
    stages: Vec<Qdisc<P>>,
}

impl<P: Datagram> Netem<P> {
    /// A path; each stage uses its own `seed` if it names one, else one
    /// derived from `seed`.
    pub fn new(spec: NetemSpec, seed: u64) -> Netem<P> {
        let stages = spec
            .stages
            .into_iter()
            .enumerate()
            .map(|(i, s)| Qdisc::new(s, mix_seed(seed, i as u64)))
            .collect();
        Netem { stages }
    }

    /// See [`Qdisc::set_frame_overhead`].
    pub(crate) fn set_frame_overhead(&mut self, bytes: usize) {
        for s in &mut self.stages {
            s.set_frame_overhead(bytes);
        }
    }

    /// Offers a packet at `now`.
    pub fn enqueue(&mut self, now: Time, packet: P) {
        self.advance(now);
        self.stages[0].enqueue(now, packet);
    }

    /// Moves packets due by `now` along the chain, each entering the next
    /// stage at the time it left the last.
    fn advance(&mut self, now: Time) {
        for i in 0..self.stages.len() - 1 {
            while let Some((at, p)) = self.stages[i].poll_timed(now) {
                self.stages[i + 1].enqueue(at, p);
            }
        }
    }

    /// When something may next come out of any stage.
    pub fn next_release(&self) -> Option<Time> {
        self.stages.iter().filter_map(Qdisc::next_release).min()
    }

    /// The next packet leaving the path at or before `now`.
    pub fn poll(&mut self, now: Time) -> Option<P> {
        self.advance(now);
        self.stages.last_mut().and_then(|s| s.poll(now))
    }

    /// The packets on the path, not yet delivered nor dropped, in no
    /// particular order: with what was offered and delivered, they tell
    /// what a path dropped of one kind of packet.
    pub(crate) fn held(&self) -> impl Iterator<Item = &P> {
        self.stages.iter().flat_map(Qdisc::held)
    }

    /// Totals over the chain: offered to the first stage, delivered by the
    /// last, every drop, copy, reordering and corruption on the way.
    pub fn stats(&self) -> NetemStats {
        let mut t = NetemStats {
            offered: self.stages[0].stats().offered,
            delivered: self.stages[self.stages.len() - 1].stats().delivered,
            ..NetemStats::default()
        };
        for s in &self.stages {
            let s = s.stats();
            t.lost += s.lost;
            t.limit_drops += s.limit_drops;
            t.duplicated += s.duplicated;
            t.reordered += s.reordered;
            t.corrupted += s.corrupted;
        }
        t
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    fn netem(spec: &str) -> Netem<Vec<u8>> {
        Netem::new(spec.parse().unwrap_or_else(|e| panic!("{spec}: {e}")), 1)
    }

    fn drain(l: &mut Netem<Vec<u8>>) -> Vec<(Time, Vec<u8>)> {
        let mut out = Vec::new();
        while let Some(t) = l.next_release() {
            if let Some(p) = l.poll(t) {
                out.push((t, p));
            }
        }
        out
    }

    /// Offers `n` numbered packets, one every `gap_ns`, and returns which
    /// were lost, as a run of booleans in offer order.
    fn loss_pattern(spec: &str, n: u32) -> Vec<bool> {
        let mut l = netem(spec);
        let mut seen = vec![false; n as usize];
        for i in 0..n {
            l.enqueue(Time::from_nanos(u64::from(i)), i.to_be_bytes().to_vec());
            while let Some(p) = l.poll(Time::from_nanos(u64::from(i))) {
                seen[u32::from_be_bytes(p[..4].try_into().unwrap()) as usize] = true;
            }
        }
        seen.iter().map(|s| !s).collect()
    }

    /// (loss rate, mean burst length) of a loss pattern.
    fn burst_stats(lost: &[bool]) -> (f64, f64) {
        let losses = lost.iter().filter(|&&l| l).count();
        let bursts = lost.windows(2).filter(|w| w[1] && !w[0]).count() + usize::from(lost[0]);
        (
            losses as f64 / lost.len() as f64,
            losses as f64 / bursts.max(1) as f64,
        )
    }

    fn within(what: &str, got: f64, want: f64, tolerance: f64) {
        assert!(
            (got - want).abs() <= want * tolerance,
            "{what}: {got:.5}, expected {want:.5} ± {:.0} %",
            tolerance * 100.0
        );
    }

    #[test]
    fn random_loss_of_one_percent_over_a_million_packets() {
        let (rate, burst) = burst_stats(&loss_pattern("loss 1%", 1_000_000));
        // 5 sigma of a binomial(10^6, 0.01) is 497 packets: 5 %.
        within("loss rate", rate, 0.01, 0.05);
        within("mean burst", burst, 1.0 / 0.99, 0.02);
    }

    #[test]
    fn correlated_loss_is_burstier_and_rarer_as_in_the_kernel() {
        let (plain_rate, plain) = burst_stats(&loss_pattern("loss 10%", 200_000));
        let (rate, correlated) = burst_stats(&loss_pattern("loss 10% 25%", 200_000));
        // P(loss | loss before) rises above P(loss)...
        let p_after_loss = 1.0 - 1.0 / correlated;
        assert!(p_after_loss > 1.5 * rate, "{p_after_loss} vs {rate}");
        assert!(correlated > plain);
        // ...and, as with sch_netem's get_crandom, the averaging narrows
        // the draws so the loss rate itself falls (docs/netem.md).
        assert!(rate < 0.6 * plain_rate, "{rate} vs {plain_rate}");
    }

    #[test]
    fn gilbert_elliott_burst_lengths() {
        // p = 1 %, r = 10 %, all lost in bad, none in good: bursts average
        // 1/r = 10 packets, loss is p/(p+r) = 1/11.
        let (rate, burst) = burst_stats(&loss_pattern("loss gemodel 1% 10%", 1_000_000));
        within("loss rate", rate, 1.0 / 11.0, 0.08);
        within("mean burst", burst, 10.0, 0.08);
        // Half the bad state's packets lost, 0.1 % of the good state's.
        let (rate, _) = burst_stats(&loss_pattern("loss gemodel 1% 10% 50% 0.1%", 1_000_000));
        within(
            "loss rate",
            rate,
            1.0 / 11.0 * 0.5 + 10.0 / 11.0 * 0.001,
            0.08,
        );
    }

    #[test]
    fn four_state_model() {
        // 1 → 3 at 5 %, 3 → 1 at 20 %: bursts of 1/0.2 = 5, loss 5/25.
        let (rate, burst) = burst_stats(&loss_pattern("loss state 5% 20%", 1_000_000));
        within("loss rate", rate, 0.2, 0.05);
        within("mean burst", burst, 5.0, 0.05);
        // Isolated losses only (1 → 4 at 10 %, 4 → 1 always): each is a
        // burst of one, and one in 11 packets is lost.
        let lost = loss_pattern("loss state 0 100% 0 100% 10%", 1_000_000);
        let (rate, burst) = burst_stats(&lost);
        within("isolated loss rate", rate, 1.0 / 11.0, 0.05);
        assert_eq!(burst, 1.0);
    }

    #[test]
    fn rate_serialises_after_the_delay() {
        // 1000-byte packets at 8 Mbit/s take 1 ms each, after 10 ms of delay.
        let mut l = netem("delay 10ms rate 8mbit");
        for _ in 0..3 {
            l.enqueue(Time::ZERO, vec![0; 1000]);
        }
        let times: Vec<u64> = drain(&mut l)
            .iter()
            .map(|(t, _)| t.as_nanos() / 1000)
            .collect();
        assert_eq!(times, vec![11_000, 12_000, 13_000]);
        // Overhead and cells: 976 + 24 = 1000 bytes; 1000 bytes in 48-byte
        // cells of 53 on the wire is 21 cells, 1113 bytes.
        for (spec, us) in [("rate 8mbit 24", 1000), ("rate 8mbit 0 48 5", 1113)] {
            let mut l = netem(spec);
            l.enqueue(Time::ZERO, vec![0; if us == 1000 { 976 } else { 1000 }]);
            assert_eq!(
                l.next_release(),
                Some(Time::from_nanos(us * 1000)),
                "{spec}"
            );
        }
    }

    #[test]
    fn rate_holds_over_a_long_run_and_limit_drops_the_excess() {
        // Offer 20 Mbit/s to a 10 Mbit/s link for one second.
        let mut l = netem("rate 10mbit limit 100");
        let mut delivered_bytes = 0u64;
        let mut last = Time::ZERO;
        for i in 0..2500u64 {
            let now = Time::from_nanos(i * 400_000);
            l.enqueue(now, vec![0; 1000]);
            while let Some(p) = l.poll(now) {
                delivered_bytes += p.len() as u64;
                last = now;
            }
        }
        let s = l.stats();
        assert!(s.limit_drops > 1000, "{s:?}");
        within(
            "throughput",
            delivered_bytes as f64 * 8.0 / last.as_secs_f64(),
            10e6,
            0.01,
        );
    }

    #[test]
    fn limit_counts_the_delay_line_as_in_the_kernel() {
        let mut l = netem("delay 100ms limit 10");
        for _ in 0..25 {
            l.enqueue(Time::ZERO, vec![0]);
        }
        assert_eq!(l.stats().limit_drops, 15);
        // A chain puts the limit on the bottleneck alone.
        let mut l = netem("rate 8mbit limit 2 | delay 100ms");
        for _ in 0..5 {
            l.enqueue(Time::ZERO, vec![0; 1000]);
        }
        assert_eq!(l.stats().limit_drops, 3);
        let times: Vec<u64> = drain(&mut l)
            .iter()
            .map(|(t, _)| t.as_nanos() / MS)
            .collect();
        assert_eq!(times, vec![101, 102]);
    }

    #[test]
    fn reorder_with_gap() {
        let mut l = netem("delay 10ms reorder 100% gap 3");
        let mut order = Vec::new();
        for i in 0..6u8 {
            let now = Time::from_nanos(u64::from(i) * MS);
            l.enqueue(now, vec![i]);
            while let Some(p) = l.poll(now) {
                order.push(p[0]);
            }
        }
        order.extend(drain(&mut l).iter().map(|(_, p)| p[0]));
        // Every third packet skips the delay and overtakes the two before it.
        assert_eq!(order, vec![2, 5, 0, 1, 3, 4]);
        // With gap 5 and 25 %: four in order, then a geometric wait with
        // mean 4; one packet in 8 goes ahead.
        let mut l = netem("delay 10ms reorder 25% gap 5 limit 100000");
        for i in 0..400_000u64 {
            let now = Time::from_nanos(i * 1000);
            l.enqueue(now, vec![0]);
            while l.poll(now).is_some() {}
        }
        within(
            "reordered",
            l.stats().reordered as f64 / 400_000.0,
            1.0 / 8.0,
            0.03,
        );
    }

    #[test]
    fn duplicate_and_corrupt() {
        let n = 200_000u32;
        let mut l = netem("duplicate 1% corrupt 1%");
        let original = vec![0x5au8; 64];
        let mut flipped_bits = Vec::new();
        for _ in 0..n {
            l.enqueue(Time::ZERO, original.clone());
            while let Some(p) = l.poll(Time::ZERO) {
                let bits: u32 = p
                    .iter()
                    .zip(&original)
                    .map(|(a, b)| (a ^ b).count_ones())
                    .sum();
                if bits > 0 {
                    flipped_bits.push(bits);
                }
            }
        }
        let s = l.stats();
        within("duplicated", s.duplicated as f64 / f64::from(n), 0.01, 0.1);
        within("corrupted", s.corrupted as f64 / f64::from(n), 0.01, 0.1);
        assert_eq!(s.delivered, u64::from(n) + s.duplicated);
        assert_eq!(flipped_bits.len() as u64, s.corrupted);
        assert!(
            flipped_bits.iter().all(|&b| b == 1),
            "one bit per corruption"
        );
    }

    #[test]
    fn jitter_distributions() {
        let delays = |spec: &str| -> Vec<f64> {
            let mut l = netem(spec);
            (0..50_000)
                .map(|_| {
                    l.enqueue(Time::ZERO, vec![0]);
                    let t = l.next_release().unwrap();
                    l.poll(t).unwrap();
                    t.as_nanos() as f64 / MS as f64
                })
                .collect()
        };
        let moments = |xs: &[f64]| {
            let mean = xs.iter().sum::<f64>() / xs.len() as f64;
            let var = xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / xs.len() as f64;
            (mean, var.sqrt())
        };
        let uniform = delays("delay 50ms 10ms");
        assert!(uniform.iter().all(|&d| (40.0..60.0).contains(&d)));
        let (mean, sd) = moments(&uniform);
        within("uniform mean", mean, 50.0, 0.01);
        within("uniform sd", sd, 10.0 / 3f64.sqrt(), 0.03);
        let (mean, sd) = moments(&delays("delay 50ms 10ms distribution normal"));
        within("normal mean", mean, 50.0, 0.01);
        within("normal sd", sd, 10.0, 0.03);
        let pareto = delays("delay 50ms 10ms distribution pareto");
        let (mean, _) = moments(&pareto);
        within("pareto mean", mean, 50.0, 0.02);
        assert!(pareto.iter().all(|&d| d >= 50.0 - 10.0 * 2.0 / 3.0 - 0.01));
    }

    #[test]
    fn jitter_reorders_unless_rate_is_set() {
        let order = |spec: &str| -> Vec<u32> {
            let mut l = netem(spec);
            for i in 0..1000u32 {
                l.enqueue(
                    Time::from_nanos(u64::from(i) * 100_000),
                    i.to_be_bytes().to_vec(),
                );
            }
            drain(&mut l)
                .iter()
                .map(|(_, p)| u32::from_be_bytes(p[..4].try_into().unwrap()))
                .collect()
        };
        let jittered = order("delay 20ms 5ms");
        assert!(jittered.windows(2).any(|w| w[1] < w[0]));
        let paced = order("delay 20ms 5ms rate 1gbit");
        assert!(paced.windows(2).all(|w| w[1] > w[0]));
    }

    #[test]
    fn slots_release_in_bursts() {
        let mut l = netem("slot 10ms packets 3");
        for i in 0..7u8 {
            l.enqueue(Time::ZERO, vec![i]);
        }
        let out = drain(&mut l);
        let times: Vec<u64> = out.iter().map(|(t, _)| t.as_nanos() / MS).collect();
        // The first slot opened when the qdisc was made; each burst of three
        // opens the next one 10 ms later.
        assert_eq!(times, vec![0, 0, 0, 10, 10, 10, 20]);
        let mut l = netem("slot 5ms bytes 2000");
        for _ in 0..4 {
            l.enqueue(Time::ZERO, vec![0; 1000]);
        }
        let times: Vec<u64> = drain(&mut l)
            .iter()
            .map(|(t, _)| t.as_nanos() / MS)
            .collect();
        assert_eq!(times, vec![0, 0, 5, 5]);
    }

    #[test]
    fn same_seed_same_fate_and_seed_in_the_spec_wins() {
        let run = |spec: &str, seed| {
            let mut l: Netem<Vec<u8>> = Netem::new(spec.parse().unwrap(), seed);
            for i in 0..2000u32 {
                l.enqueue(
                    Time::from_nanos(u64::from(i) * 10_000),
                    i.to_be_bytes().to_vec(),
                );
            }
            drain(&mut l)
        };
        let spec = "loss gemodel 2% 20% duplicate 5% corrupt 2% delay 5ms 4ms reorder 10% gap 2";
        assert_eq!(run(spec, 7), run(spec, 7));
        assert_ne!(run(spec, 7), run(spec, 8));
        let pinned = format!("{spec} seed 3");
        assert_eq!(run(&pinned, 7), run(&pinned, 8));
    }

    #[test]
    fn loss_every_nth() {
        let lost = loss_pattern("loss every 10", 100);
        assert_eq!(lost.iter().filter(|&&l| l).count(), 10);
        assert!(lost[9] && lost[99]);
    }
}
