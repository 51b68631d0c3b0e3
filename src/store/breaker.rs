//! A circuit breaker in front of a remote store.
//!
//! Closed: calls go through. It opens after `failures` consecutive failures, or when at least
//! `min_calls` calls in the last `window` failed at a ratio of `failure_ratio` or more. Open:
//! calls fail at once, without waiting on the store. After `cooldown` one call goes through as
//! a probe (half-open): success closes the breaker, failure opens it for another cooldown.
//!
//! The breaker also keeps when the store last answered (a success, an error reply, or a new
//! connection), for the store to tell a silent connection from a slow one: it is written under
//! the lock each outcome takes anyway.
//!
//! Phase: `request_filter`, around every Redis call. The state sits behind a mutex that is held
//! for a few instructions and never across an await. Time is a parameter, so tests need no
//! sleeps.

use std::time::{Duration, Instant};

use parking_lot::Mutex;

pub use crate::config::BreakerSettings;

/// What the breaker says about one call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    /// Go ahead.
    Call,
    /// Go ahead: this call is the half-open probe.
    Probe,
    /// Do not call the store.
    Reject,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    Closed,
    Open { until: Instant },
    HalfOpen,
}

#[derive(Debug)]
struct Inner {
    state: State,
    consecutive: u32,
    /// When the current window of `calls` and `failed` ends (`None`: a window too long for the
    /// clock never ends).
    window_end: Option<Instant>,
    calls: u32,
    failed: u32,
    /// When the store last answered.
    answered: Instant,
}

#[derive(Debug)]
pub struct Breaker {
    settings: BreakerSettings,
    inner: Mutex<Inner>,
}

/// A state change, for the caller to log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transition {
    Opened,
    HalfOpened,
    Closed,
}

impl Breaker {
    pub fn new(settings: BreakerSettings, now: Instant) -> Self {
        Breaker {
            settings,
            inner: Mutex::new(Inner {
                state: State::Closed,
                consecutive: 0,
                window_end: now.checked_add(settings.window),
                calls: 0,
                failed: 0,
                answered: now,
            }),
        }
    }

    pub fn state(&self) -> State {
        self.inner.lock().state
    }

    /// May a call go to the store now?
    pub fn admit(&self, now: Instant) -> (Admission, Option<Transition>) {
        let mut s = self.inner.lock();
        match s.state {
            State::Closed => (Admission::Call, None),
            State::Open { until } if now >= until => {
                s.state = State::HalfOpen;
                (Admission::Probe, Some(Transition::HalfOpened))
            }
            State::Open { .. } | State::HalfOpen => (Admission::Reject, None),
        }
    }

    /// The store answered at `now`, whatever the answer (an error reply too), or a new
    /// connection was made.
    pub fn answered(&self, now: Instant) {
        self.inner.lock().answered = now;
    }

    /// How long the store has not answered, at `now`.
    pub fn silent_for(&self, now: Instant) -> Duration {
        now.saturating_duration_since(self.inner.lock().answered)
    }

    /// Record the outcome of a call that [`Breaker::admit`] let through; a success is also an
    /// answer ([`Breaker::answered`]).
    pub fn record(&self, ok: bool, now: Instant) -> Option<Transition> {
        let mut s = self.inner.lock();
        // Compared, not subtracted: this runs on every call.
        if s.window_end.is_some_and(|end| now >= end) {
            s.window_end = now.checked_add(self.settings.window);
            s.calls = 0;
            s.failed = 0;
        }
        s.calls += 1;
        if ok {
            s.answered = now;
            s.consecutive = 0;
            // Only the probe's success closes the breaker; a call let through before it
            // opened proves nothing about now.
            if s.state == State::HalfOpen {
                s.state = State::Closed;
                s.calls = 0;
                s.failed = 0;
                return Some(Transition::Closed);
            }
            return None;
        }
        s.failed += 1;
        s.consecutive += 1;
        let ratio_tripped = s.calls >= self.settings.min_calls
            && f64::from(s.failed) >= self.settings.failure_ratio * f64::from(s.calls);
        let trip = match s.state {
            State::HalfOpen => true,
            State::Closed => s.consecutive >= self.settings.failures || ratio_tripped,
            State::Open { .. } => false,
        };
        if trip {
            s.state = State::Open {
                until: now + self.settings.cooldown,
            };
            return Some(Transition::Opened);
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(base: Instant, ms: u64) -> Instant {
        base + Duration::from_millis(ms)
    }

    #[test]
    fn opens_after_consecutive_failures_and_probes_after_cooldown() {
        let t0 = Instant::now();
        let b = Breaker::new(BreakerSettings::default(), t0);
        assert_eq!(b.record(false, at(t0, 1)), None);
        assert_eq!(b.record(false, at(t0, 2)), None);
        assert_eq!(b.record(false, at(t0, 3)), Some(Transition::Opened));
        assert_eq!(b.admit(at(t0, 4)).0, Admission::Reject);
        assert_eq!(b.admit(at(t0, 5_002)).0, Admission::Reject);
        // Cooldown over: exactly one probe.
        assert_eq!(
            b.admit(at(t0, 5_003)),
            (Admission::Probe, Some(Transition::HalfOpened))
        );
        assert_eq!(b.admit(at(t0, 5_004)).0, Admission::Reject);
        // A failed probe opens it again for a full cooldown.
        assert_eq!(b.record(false, at(t0, 5_010)), Some(Transition::Opened));
        assert_eq!(b.admit(at(t0, 10_009)).0, Admission::Reject);
        assert_eq!(b.admit(at(t0, 10_010)).0, Admission::Probe);
        assert_eq!(b.record(true, at(t0, 10_011)), Some(Transition::Closed));
        assert_eq!(b.admit(at(t0, 10_012)).0, Admission::Call);
    }

    #[test]
    fn success_resets_the_consecutive_count() {
        let t0 = Instant::now();
        // Ratio tripping off: only consecutive failures count here.
        let s = BreakerSettings {
            min_calls: 1_000,
            ..BreakerSettings::default()
        };
        let b = Breaker::new(s, t0);
        for i in 0..10 {
            b.record(false, at(t0, i * 3));
            b.record(false, at(t0, i * 3 + 1));
            assert_eq!(b.record(true, at(t0, i * 3 + 2)), None);
        }
        assert_eq!(b.state(), State::Closed);
    }

    #[test]
    fn opens_on_failure_ratio_within_the_window() {
        let t0 = Instant::now();
        let s = BreakerSettings {
            failures: 100,
            ..BreakerSettings::default()
        };
        let b = Breaker::new(s, t0);
        // Alternate: never 2 failures in a row, but half of all calls fail.
        let mut opened = None;
        for i in 0..22u64 {
            if let Some(t) = b.record(i % 2 == 1, at(t0, i)) {
                opened = Some((i, t));
            }
        }
        // 21 calls, 11 failed: over half. The success after it does not close the breaker.
        assert_eq!(opened, Some((20, Transition::Opened)));
        assert!(matches!(b.state(), State::Open { .. }));
    }

    #[test]
    fn ratio_window_rolls_over() {
        let t0 = Instant::now();
        let s = BreakerSettings {
            failures: 100,
            ..BreakerSettings::default()
        };
        let b = Breaker::new(s, t0);
        for i in 0..19u64 {
            b.record(i % 2 == 1, at(t0, i));
        }
        // A new window starts: the old calls no longer count.
        for i in 0..19u64 {
            assert_eq!(b.record(i % 2 == 1, at(t0, 10_000 + i)), None);
        }
        assert_eq!(b.state(), State::Closed);
    }

    #[test]
    fn silence_counts_from_the_last_answer_a_failure_is_not_one() {
        let t0 = Instant::now();
        let b = Breaker::new(BreakerSettings::default(), t0);
        // Made at t0: a new breaker counts as answered then.
        assert_eq!(b.silent_for(at(t0, 700)), Duration::from_millis(700));
        b.record(true, at(t0, 1_000));
        b.record(false, at(t0, 3_000));
        assert_eq!(b.silent_for(at(t0, 4_000)), Duration::from_millis(3_000));
        // An error reply is an answer, though a failed call.
        b.answered(at(t0, 3_500));
        assert_eq!(b.silent_for(at(t0, 4_000)), Duration::from_millis(500));
        // Never negative.
        assert_eq!(b.silent_for(at(t0, 3_000)), Duration::ZERO);
    }

    #[test]
    fn the_window_rolls_at_exactly_its_length_and_never_when_too_long_for_the_clock() {
        let t0 = Instant::now();
        let window = BreakerSettings::default().window;
        let s = BreakerSettings {
            failures: 100,
            min_calls: 4,
            ..BreakerSettings::default()
        };
        let b = Breaker::new(s, t0);
        // Three failures in the first window; the fourth call comes as the next one begins,
        // so it is the only call of its window and the ratio has too few calls to trip.
        for i in 0..3 {
            assert_eq!(b.record(false, at(t0, i)), None);
        }
        assert_eq!(b.record(false, t0 + window), None);
        let b = Breaker::new(s, t0);
        for i in 0..3 {
            assert_eq!(b.record(false, at(t0, i)), None);
        }
        // A millisecond earlier it is the fourth failure of four.
        assert_eq!(
            b.record(false, t0 + window - Duration::from_millis(1)),
            Some(Transition::Opened)
        );
        // A window past the clock's range never rolls.
        let s = BreakerSettings {
            window: Duration::MAX,
            ..s
        };
        let b = Breaker::new(s, t0);
        for i in 0..3 {
            assert_eq!(b.record(false, at(t0, i * 1_000_000)), None);
        }
        assert_eq!(b.record(false, at(t0, 4_000_000)), Some(Transition::Opened));
    }
}
