//! The delay fault's queue, without I/O: packets go in with the time they arrived and come out,
//! in the same order, once their delay has passed.
//!
//! Packet bytes live in one ring of bytes allocated up front, and each packet is read straight
//! into it (the caller asks for [`DelayLine::space`] and then [`DelayLine::commit`]s what it
//! read), so holding a packet costs no allocation and no copy. The ring bounds the queue: when
//! it is full the caller drops the packet, as a switch with a full buffer would.

#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::indexing_slicing))]

use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// Room a caller asks for before reading one packet: the largest IPv4 packet.
pub const MAX_PACKET: usize = 65_536;

/// One held packet: where its bytes are in the ring and when it may leave.
#[derive(Debug, Clone, Copy)]
struct Slot {
    start: usize,
    len: usize,
    due: Instant,
}

/// A bounded FIFO that releases each packet `delay` (± `jitter`) after it arrived.
#[derive(Debug)]
pub struct DelayLine {
    ring: Box<[u8]>,
    slots: VecDeque<Slot>,
    delay: Duration,
    jitter: Duration,
    /// Release time of the newest packet: with jitter, a later packet never leaves before an
    /// earlier one, so order is kept (TCP sees delay variation, not reordering).
    last_due: Option<Instant>,
    random: u64,
    dropped: u64,
}

impl DelayLine {
    /// A line holding at most `capacity` bytes (at least two of the largest packets).
    /// `seed` drives the jitter; any value but 0 works.
    pub fn new(capacity: usize, delay: Duration, jitter: Duration, seed: u64) -> Self {
        let capacity = capacity.max(2 * MAX_PACKET);
        Self {
            ring: vec![0; capacity].into_boxed_slice(),
            slots: VecDeque::new(),
            delay,
            jitter: jitter.min(delay),
            last_due: None,
            random: seed | 1,
            dropped: 0,
        }
    }

    /// Packets dropped because the line was full.
    pub fn dropped(&self) -> u64 {
        self.dropped
    }

    /// Packets held now.
    pub fn len(&self) -> usize {
        self.slots.len()
    }

    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    /// Free room for the next packet, at least [`MAX_PACKET`] bytes in one piece, or `None`
    /// when the line is full (then the packet must be dropped: call [`DelayLine::drop_one`]).
    pub fn space(&mut self) -> Option<&mut [u8]> {
        let range = self.free_range()?;
        self.ring.get_mut(range)
    }

    /// Counts a packet that found the line full.
    pub fn drop_one(&mut self) {
        self.dropped += 1;
    }

    /// Records the `len` bytes just written at the start of [`DelayLine::space`] as a packet
    /// that arrived at `now`.
    pub fn commit(&mut self, now: Instant, len: usize) {
        let Some(range) = self.free_range() else {
            return;
        };
        let len = len.min(range.len());
        let due = (now + self.sample_delay()).max(self.last_due.unwrap_or(now));
        self.last_due = Some(due);
        self.slots.push_back(Slot {
            start: range.start,
            len,
            due,
        });
    }

    /// When the oldest packet may leave.
    pub fn next_due(&self) -> Option<Instant> {
        self.slots.front().map(|s| s.due)
    }

    /// The oldest packet, if its time has come; it is released from the line.
    pub fn pop_due(&mut self, now: Instant) -> Option<&[u8]> {
        if self.slots.front()?.due > now {
            return None;
        }
        let slot = self.slots.pop_front()?;
        if self.slots.is_empty() {
            self.last_due = None;
        }
        self.ring.get(slot.start..slot.start + slot.len)
    }

    /// The contiguous free bytes where the next packet goes. Packets occupy the ring from the
    /// oldest slot's start to the newest slot's end, possibly wrapping past the end once.
    fn free_range(&self) -> Option<std::ops::Range<usize>> {
        let capacity = self.ring.len();
        let (Some(oldest), Some(newest)) = (self.slots.front(), self.slots.back()) else {
            return Some(0..capacity);
        };
        let tail = newest.start + newest.len;
        let range = if newest.start >= oldest.start {
            // Not wrapped: room after the newest packet, else from the ring's start up to the
            // oldest packet.
            if capacity - tail >= MAX_PACKET {
                tail..capacity
            } else {
                0..oldest.start
            }
        } else {
            tail..oldest.start
        };
        (range.len() >= MAX_PACKET).then_some(range)
    }

    /// `delay` plus a uniform offset in `-jitter..=jitter` (xorshift64*: cheap, and good enough
    /// to spread delays).
    fn sample_delay(&mut self) -> Duration {
        if self.jitter.is_zero() {
            return self.delay;
        }
        let mut x = self.random;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.random = x;
        let sample = x.wrapping_mul(0x2545_f491_4f6c_dd1d);
        let span = self.jitter.as_nanos() as u64 * 2 + 1;
        let offset = Duration::from_nanos(sample % span);
        (self.delay + offset).saturating_sub(self.jitter)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn push(line: &mut DelayLine, now: Instant, bytes: &[u8]) -> bool {
        match line.space() {
            Some(space) => {
                space[..bytes.len()].copy_from_slice(bytes);
                line.commit(now, bytes.len());
                true
            }
            None => {
                line.drop_one();
                false
            }
        }
    }

    #[test]
    fn packets_leave_after_the_delay_in_order() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let mut line = DelayLine::new(1 << 20, ms(50), Duration::ZERO, 1);
        assert!(push(&mut line, t0, b"first"));
        assert!(push(&mut line, t0 + ms(10), b"second"));
        assert_eq!(line.next_due(), Some(t0 + ms(50)));
        assert!(line.pop_due(t0 + ms(49)).is_none());
        assert_eq!(line.pop_due(t0 + ms(50)), Some(&b"first"[..]));
        assert!(line.pop_due(t0 + ms(59)).is_none());
        assert_eq!(line.pop_due(t0 + ms(60)), Some(&b"second"[..]));
        assert!(line.is_empty());
        assert!(line.pop_due(t0 + ms(1000)).is_none());
    }

    #[test]
    fn a_full_line_drops_and_wraps_around_once_it_drains() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        // Room for exactly four packets of MAX_PACKET bytes.
        let mut line = DelayLine::new(4 * MAX_PACKET, ms(5), Duration::ZERO, 1);
        let big = vec![7u8; MAX_PACKET];
        let mut held = 0;
        while push(&mut line, t0, &big) {
            held += 1;
        }
        assert_eq!(held, 4);
        assert_eq!(line.dropped(), 1);
        // Releasing the oldest frees the ring's start; the next packet goes there.
        assert_eq!(line.pop_due(t0 + ms(5)).map(<[u8]>::len), Some(MAX_PACKET));
        assert!(push(&mut line, t0 + ms(1), b"wrapped"));
        assert!(!push(&mut line, t0 + ms(1), b"full again"));
        for _ in 0..3 {
            assert_eq!(line.pop_due(t0 + ms(5)).map(<[u8]>::len), Some(MAX_PACKET));
        }
        assert!(line.pop_due(t0 + ms(5)).is_none(), "not due yet");
        assert_eq!(line.pop_due(t0 + ms(6)), Some(&b"wrapped"[..]));
        assert!(line.is_empty());
    }

    #[test]
    fn small_packets_share_the_ring() {
        let t0 = Instant::now();
        let mut line = DelayLine::new(4 * MAX_PACKET, Duration::from_millis(1), Duration::ZERO, 1);
        for i in 0..10_000u32 {
            assert!(push(&mut line, t0, &i.to_be_bytes()));
        }
        let later = t0 + Duration::from_millis(1);
        for i in 0..10_000u32 {
            assert_eq!(line.pop_due(later), Some(&i.to_be_bytes()[..]));
        }
    }

    #[test]
    fn jitter_stays_in_range_and_never_reorders() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let mut line = DelayLine::new(1 << 22, ms(50), ms(10), 42);
        let mut dues = Vec::new();
        // 15 ms apart: mostly independent delays, sometimes held back behind an earlier one.
        for i in 0..1000u64 {
            let now = t0 + ms(15 * i);
            assert!(push(&mut line, now, &i.to_be_bytes()));
            dues.push((now, line.slots.back().unwrap().due));
        }
        assert!(dues.windows(2).all(|w| w[0].1 <= w[1].1), "reordered");
        let delays: Vec<Duration> = dues.iter().map(|(now, due)| *due - *now).collect();
        assert!(delays.iter().all(|d| *d >= ms(40) && *d <= ms(60)));
        // The delays really vary.
        let low = delays.iter().filter(|d| **d < ms(45)).count();
        let high = delays.iter().filter(|d| **d > ms(55)).count();
        assert!(low > 10 && high > 10, "{low} {high}");
    }
}
