//! Which callers are warm enough to lease: a fixed table of request counts per caller hash,
//! for the current period of [`PERIOD_MS`] and the one before, read and bumped with one atomic
//! operation and no lock. Callers whose hashes share a slot share its count, so a count is
//! never below the caller's own: a caller the table calls cold (seen fewer than twice in both
//! periods) can take no lease, and skips the lease table entirely. That keeps leasing's cost
//! for many cold callers to this one operation per request. A caller it calls warm may still
//! be cold (a collision): the lease table, which counts each caller exactly, decides.
//!
//! Phase: `request_filter`.

use std::sync::atomic::{AtomicU64, Ordering};

use super::PERIOD_MS;
use crate::store::CounterKey;

/// Slots: 128 KiB. With callers spread evenly at R requests a second in all, a slot sees
/// R / 16,384 a second, so a cold caller looks warm only at tens of thousands of requests a
/// second per gateway, and then costs what it cost before this table existed.
const SLOTS: usize = 1 << 14;

/// Request counts per caller hash for the current and previous period.
pub struct Heat {
    /// Each: the period's number (low 32 bits), then the count in it (16 bits), then the
    /// count in the period before (16 bits).
    slots: Box<[AtomicU64]>,
}

impl Heat {
    pub fn new() -> Heat {
        Heat {
            slots: (0..SLOTS).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    /// Count a request of `key` at `now` (monotonic ms); whether its slot saw at least two
    /// requests in this period (this one included) or in the one before.
    pub fn touch(&self, key: &CounterKey, now: u64) -> bool {
        let mut index = [0; 8];
        index.copy_from_slice(&key.0[8..]);
        let slot = &self.slots[u64::from_le_bytes(index) as usize & (SLOTS - 1)];
        let period = (now / PERIOD_MS) as u32;
        let mut counts = (0, 0);
        let _ = slot.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |packed| {
            let (p, seen, before) = (packed as u32, (packed >> 32) as u16, (packed >> 48) as u16);
            let (seen, before) = if p == period {
                (seen, before)
            } else if p.wrapping_add(1) == period {
                (0, seen)
            } else {
                (0, 0)
            };
            counts = (seen.saturating_add(1), before);
            Some(u64::from(period) | u64::from(counts.0) << 32 | u64::from(counts.1) << 48)
        });
        counts.0 >= 2 || counts.1 >= 2
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(n: u8) -> CounterKey {
        let mut k = CounterKey([0; 16]);
        k.0[8] = n;
        k
    }

    #[test]
    fn warm_from_the_second_request_in_a_period_and_through_the_next() {
        let h = Heat::new();
        assert!(!h.touch(&key(1), 1000), "first sight");
        assert!(!h.touch(&key(2), 1000), "another caller");
        assert!(h.touch(&key(1), 1099), "second in the period");
        assert!(h.touch(&key(1), 1100), "the period before saw two");
        assert!(h.touch(&key(1), 1150));
        // Seen once in each of the next periods: cold again.
        assert!(!h.touch(&key(1), 1300));
        assert!(!h.touch(&key(1), 1400));
        // A pause longer than a period forgets everything.
        assert!(h.touch(&key(1), 1420));
        assert!(!h.touch(&key(1), 1700));
    }

    #[test]
    fn callers_sharing_a_slot_share_its_count() {
        let h = Heat::new();
        let mut other = key(1);
        other.0[15] = 9; // the same low bits of the hash
        assert!(!h.touch(&key(1), 0));
        assert!(h.touch(&other, 1), "never below either caller's own count");
    }
}
