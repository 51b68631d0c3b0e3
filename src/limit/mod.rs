//! Rate-limit algorithms and the [`Decision`] they produce.
//!
//! Phase: pure computation, used by the stores while they hold a key's state. The clock is
//! always a parameter (`now`, ms since the Unix epoch); see [`Clock`] for where it comes from.

pub mod algorithm;

use std::fmt;
use std::str::FromStr;
use std::time::SystemTime;

pub use algorithm::{check, Outcome, State};

/// Which algorithm a limit uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Algorithm {
    /// Two fixed-window counters, the previous one weighted by how much of it still overlaps
    /// the sliding window. O(1) memory, no boundary double burst. The default.
    #[default]
    SlidingWindow,
    /// One counter per window aligned to the Unix epoch. Cheapest; allows up to 2× the limit
    /// across a window boundary.
    FixedWindow,
    /// Every admitted request's timestamp. Exact in any interval, memory grows with the limit.
    SlidingLog,
    /// A bucket of `burst` tokens refilled at `limit / window`.
    TokenBucket,
    /// Generic cell rate algorithm: a token bucket kept as one timestamp.
    Gcra,
}

impl Algorithm {
    pub const ALL: [Algorithm; 5] = [
        Algorithm::SlidingWindow,
        Algorithm::FixedWindow,
        Algorithm::SlidingLog,
        Algorithm::TokenBucket,
        Algorithm::Gcra,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Algorithm::SlidingWindow => "sliding_window",
            Algorithm::FixedWindow => "fixed_window",
            Algorithm::SlidingLog => "sliding_log",
            Algorithm::TokenBucket => "token_bucket",
            Algorithm::Gcra => "gcra",
        }
    }
}

impl fmt::Display for Algorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A word that names no algorithm.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "{0:?} is not an algorithm (sliding_window, fixed_window, sliding_log, token_bucket, gcra)"
)]
pub struct UnknownAlgorithm(pub String);

impl FromStr for Algorithm {
    type Err = UnknownAlgorithm;
    fn from_str(s: &str) -> Result<Self, UnknownAlgorithm> {
        Algorithm::ALL
            .into_iter()
            .find(|a| a.as_str() == s)
            .ok_or_else(|| UnknownAlgorithm(s.to_string()))
    }
}

/// How much a limit admits. Validation guarantees `limit ≥ 1`, `window_ms ≥ 1`, `burst ≥ 1`
/// and that `max(limit, burst) × window_ms ≤ 2^53`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Quota {
    pub algorithm: Algorithm,
    pub limit: u64,
    pub window_ms: u64,
    /// Bucket capacity for `token_bucket` and `gcra` (defaults to `limit`); unused otherwise.
    pub burst: u64,
}

/// The largest `limit × window_ms` (and `burst × window_ms`) a quota may have, so that Lua's
/// doubles represent every intermediate value exactly.
pub const MAX_SCALED: u64 = 1 << 53;

impl Quota {
    pub fn new(algorithm: Algorithm, limit: u64, window_ms: u64) -> Self {
        Quota {
            algorithm,
            limit,
            window_ms,
            burst: limit,
        }
    }

    pub fn with_burst(mut self, burst: u64) -> Self {
        self.burst = burst;
        self
    }
}

/// The outcome of checking one limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decision {
    pub allowed: bool,
    pub limit: u64,
    /// Units still available after this request (0 when denied and nothing is left).
    pub remaining: u64,
    /// Milliseconds until the quota is fully restored.
    pub reset_after_ms: u64,
    /// Milliseconds until a request of the same cost could be admitted; 0 when allowed.
    pub retry_after_ms: u64,
}

impl Decision {
    pub fn allow(limit: u64, remaining: u64, reset_after_ms: u64) -> Self {
        Decision {
            allowed: true,
            limit,
            remaining,
            reset_after_ms,
            retry_after_ms: 0,
        }
    }

    pub fn deny(limit: u64, remaining: u64, reset_after_ms: u64, retry_after_ms: u64) -> Self {
        Decision {
            allowed: false,
            limit,
            remaining,
            reset_after_ms,
            retry_after_ms: retry_after_ms.max(1),
        }
    }

    /// Which of two decisions is more restrictive: a denial over an admission, then the longer
    /// wait, then the fewer remaining units, then the smaller limit.
    pub fn more_restrictive_than(&self, other: &Decision) -> bool {
        match (self.allowed, other.allowed) {
            (false, true) => true,
            (true, false) => false,
            (false, false) => self.retry_after_ms > other.retry_after_ms,
            (true, true) => {
                (
                    self.remaining,
                    self.limit,
                    std::cmp::Reverse(self.reset_after_ms),
                ) < (
                    other.remaining,
                    other.limit,
                    std::cmp::Reverse(other.reset_after_ms),
                )
            }
        }
    }
}

/// Where "now" comes from. The gateway uses [`SystemClock`]; tests use a fake.
pub trait Clock: Send + Sync + 'static {
    /// Milliseconds since the Unix epoch.
    fn now_ms(&self) -> u64;

    /// What [`Clock::now_ms`] says while the system clock reads `wall`, which the caller has
    /// just read for a timing of its own: the system clock converts `wall` rather than being
    /// read again (a read costs about 20 ns on a virtual machine); another clock tells its
    /// own time.
    fn ms_at(&self, wall: SystemTime) -> u64 {
        let _ = wall;
        self.now_ms()
    }
}

/// The process clock.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_ms(&self) -> u64 {
        self.ms_at(SystemTime::now())
    }

    fn ms_at(&self, wall: SystemTime) -> u64 {
        wall.duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64)
    }
}

#[cfg(test)]
mod tests;
