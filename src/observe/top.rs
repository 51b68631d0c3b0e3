//! The top limited callers, without label explosion: a bounded heavy-hitters structure fed by
//! denials, one space-saving sketch per minute over the last [`MINUTES`] minutes.
//!
//! Space-saving keeps at most [`CAPACITY`] (limit, caller) pairs per minute. A new pair in a
//! full sketch replaces the pair with the fewest denials and starts from that count plus one,
//! so a caller denied often is never lost, and a count is over by at most the replaced count
//! (reported as `error`). Callers are never metric labels; they are named as
//! [`crate::fingerprint`] names API keys, `user:<claim>` for JWT users and `ip:<address>`.
//!
//! Phase: `request_filter`, only for denied requests: one short lock, an allocation for a
//! caller not yet counted.

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::Mutex;
use serde::Serialize;

/// Minutes of denials `/top` covers.
pub const MINUTES: usize = 5;
/// (limit, caller) pairs one minute's sketch keeps at most.
pub const CAPACITY: usize = 256;

type Key = (Arc<str>, String);

#[derive(Default)]
struct Sketch {
    /// The minute (since the Unix epoch) it counts; another minute clears it.
    minute: u64,
    /// Pair -> (denials, overestimate).
    counts: HashMap<Key, (u64, u64)>,
}

impl Sketch {
    fn add(&mut self, key: Key) {
        if let Some(c) = self.counts.get_mut(&key) {
            c.0 += 1;
            return;
        }
        if self.counts.len() < CAPACITY {
            self.counts.insert(key, (1, 0));
            return;
        }
        let (least, &(n, _)) = self
            .counts
            .iter()
            .min_by_key(|(_, c)| c.0)
            .expect("a full sketch has entries");
        let least = least.clone();
        self.counts.remove(&least);
        self.counts.insert(key, (n + 1, n));
    }
}

/// The heavy hitters of the last minutes.
#[derive(Default)]
pub struct TopCallers {
    minutes: Mutex<[Sketch; MINUTES]>,
}

/// One row of `GET /top`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TopEntry {
    #[serde(serialize_with = "as_str")]
    pub limit: Arc<str>,
    pub caller: String,
    pub denials: u64,
    /// How much `denials` may be over (space-saving's bound).
    pub error: u64,
}

fn as_str<S: serde::Serializer>(s: &Arc<str>, ser: S) -> Result<S::Ok, S::Error> {
    ser.serialize_str(s)
}

impl TopCallers {
    /// One denial of `caller` by `limit` at `now_s` (seconds since the Unix epoch).
    pub fn record(&self, limit: &Arc<str>, caller: String, now_s: u64) {
        let minute = now_s / 60;
        let mut m = self.minutes.lock();
        let sketch = &mut m[(minute % MINUTES as u64) as usize];
        if sketch.minute != minute {
            sketch.minute = minute;
            sketch.counts.clear();
        }
        sketch.add((limit.clone(), caller));
    }

    /// The `n` pairs with the most denials over the last [`MINUTES`] minutes, most first.
    pub fn top(&self, n: usize, now_s: u64) -> Vec<TopEntry> {
        let now = now_s / 60;
        let mut sum: HashMap<Key, (u64, u64)> = HashMap::new();
        {
            let m = self.minutes.lock();
            for s in m
                .iter()
                .filter(|s| now.saturating_sub(s.minute) < MINUTES as u64)
            {
                for (k, c) in &s.counts {
                    let e = sum.entry(k.clone()).or_default();
                    e.0 += c.0;
                    e.1 += c.1;
                }
            }
        }
        let mut rows: Vec<TopEntry> = sum
            .into_iter()
            .map(|((limit, caller), (denials, error))| TopEntry {
                limit,
                caller,
                denials,
                error,
            })
            .collect();
        rows.sort_by(|a, b| {
            (b.denials, &a.limit, &a.caller).cmp(&(a.denials, &b.limit, &b.caller))
        });
        rows.truncate(n);
        rows
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_exactly_while_under_capacity_and_forgets_old_minutes() {
        let t = TopCallers::default();
        let l: Arc<str> = "per-ip".into();
        for _ in 0..3 {
            t.record(&l, "ip:10.0.0.1".into(), 600);
        }
        t.record(&l, "ip:10.0.0.2".into(), 661);
        let top = t.top(10, 700);
        assert_eq!(top[0].caller, "ip:10.0.0.1");
        assert_eq!((top[0].denials, top[0].error), (3, 0));
        assert_eq!(top[1].denials, 1);
        // Five minutes later the first minute is gone.
        assert_eq!(t.top(10, 600 + 5 * 60).len(), 1);
        assert!(t.top(10, 661 + 5 * 60).is_empty());
    }

    #[test]
    fn a_heavy_hitter_survives_a_flood_of_one_off_callers() {
        let t = TopCallers::default();
        let l: Arc<str> = "global".into();
        for i in 0..10_000u32 {
            if i % 10 == 0 {
                t.record(&l, "fp:deadbeef".into(), 60);
            }
            t.record(&l, format!("ip:10.0.{}.{}", i / 256, i % 256), 60);
        }
        let top = t.top(1, 60);
        assert_eq!(top[0].caller, "fp:deadbeef");
        assert!(top[0].denials >= 1_000 && top[0].denials - top[0].error <= 1_000);
    }
}
