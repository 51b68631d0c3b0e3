//! [`eventually`]: the one bounded poll loop of the harness. Every "wait until" of the tests
//! goes through it: a description for the panic message, a time bound, a poll interval, and
//! the value the condition produced once it holds.
//!
//! ```ignore
//! let body = eventually("/readyz answers 503", Duration::from_secs(10))
//!     .every(Duration::from_millis(20))
//!     .holds_async(|| async { ... })
//!     .await;
//! ```

use std::fmt::{Debug, Display};
use std::future::Future;
use std::time::{Duration, Instant};

/// The poll interval unless [`Eventually::every`] says otherwise.
pub const POLL_EVERY: Duration = Duration::from_millis(50);

/// Poll a condition until it holds, for at most `within`; panics naming `what` after that.
/// The condition is checked at once, then every [`POLL_EVERY`] (see [`Eventually::every`]).
pub fn eventually(what: impl Into<String>, within: Duration) -> Eventually {
    Eventually {
        what: what.into(),
        within,
        every: POLL_EVERY,
    }
}

/// A bounded wait, run by [`Eventually::holds`], [`Eventually::holds_async`] or
/// [`Eventually::holds_blocking`].
#[must_use = "an Eventually waits only when one of its `holds` methods runs it"]
pub struct Eventually {
    what: String,
    within: Duration,
    every: Duration,
}

/// What a polled condition returns: `true`, `Some(value)` or `Ok(value)` once it holds.
/// `Err(e)` means "not yet" and `e` (the last one) is shown if time runs out.
pub trait Outcome {
    type Value;
    /// `Ok(value)` when the condition holds, else what to show about the last check.
    fn into_result(self) -> Result<Self::Value, Option<String>>;
}

impl Outcome for bool {
    type Value = ();
    fn into_result(self) -> Result<(), Option<String>> {
        if self {
            Ok(())
        } else {
            Err(None)
        }
    }
}

impl<T> Outcome for Option<T> {
    type Value = T;
    fn into_result(self) -> Result<T, Option<String>> {
        self.ok_or(None)
    }
}

impl<T, E: Display> Outcome for Result<T, E> {
    type Value = T;
    fn into_result(self) -> Result<T, Option<String>> {
        self.map_err(|e| Some(e.to_string()))
    }
}

impl Eventually {
    /// Poll every `interval` instead of every [`POLL_EVERY`].
    pub fn every(mut self, interval: Duration) -> Eventually {
        self.every = interval;
        self
    }

    /// Wait (sleeping on the tokio timer) until `check` holds; returns its value.
    pub async fn holds<O: Outcome>(self, mut check: impl FnMut() -> O) -> O::Value {
        self.holds_async(|| std::future::ready(check())).await
    }

    /// [`Eventually::holds`] for a condition that must be awaited.
    pub async fn holds_async<O, F, Fut>(self, mut check: F) -> O::Value
    where
        O: Outcome,
        F: FnMut() -> Fut,
        Fut: Future<Output = O>,
    {
        let mut polls = Polls::new(&self);
        loop {
            if let Some(value) = polls.judge(check().await) {
                return value;
            }
            tokio::time::sleep(self.every).await;
        }
    }

    /// Poll `fetch` until `cond` holds on the value it produced; returns that value. The
    /// last value is shown if time runs out.
    pub async fn holds_on<T, F, Fut>(self, mut fetch: F, cond: impl Fn(&T) -> bool) -> T
    where
        T: Debug,
        F: FnMut() -> Fut,
        Fut: Future<Output = T>,
    {
        let cond = &cond;
        self.holds_async(|| {
            let value = fetch();
            async move {
                let value = value.await;
                if cond(&value) {
                    Ok(value)
                } else {
                    Err(format!("{value:?}"))
                }
            }
        })
        .await
    }

    /// [`Eventually::holds_async`] for a wait that may run out: `None` once time is up,
    /// instead of a panic (for a test that then tries again another way).
    pub async fn may_hold_async<O, F, Fut>(self, mut check: F) -> Option<O::Value>
    where
        O: Outcome,
        F: FnMut() -> Fut,
        Fut: Future<Output = O>,
    {
        let start = Instant::now();
        loop {
            match check().await.into_result() {
                Ok(value) => return Some(value),
                Err(_) if start.elapsed() < self.within => {
                    tokio::time::sleep(self.every).await;
                }
                Err(_) => return None,
            }
        }
    }

    /// [`Eventually::holds`] outside an async context (the thread sleeps between checks).
    pub fn holds_blocking<O: Outcome>(self, mut check: impl FnMut() -> O) -> O::Value {
        let mut polls = Polls::new(&self);
        loop {
            if let Some(value) = polls.judge(check()) {
                return value;
            }
            std::thread::sleep(self.every);
        }
    }
}

/// The checks of one wait so far.
struct Polls<'a> {
    wait: &'a Eventually,
    start: Instant,
    count: u32,
}

impl<'a> Polls<'a> {
    fn new(wait: &'a Eventually) -> Polls<'a> {
        Polls {
            wait,
            start: Instant::now(),
            count: 0,
        }
    }

    /// The value if `outcome` holds; `None` to poll again; a panic once time is up.
    fn judge<O: Outcome>(&mut self, outcome: O) -> Option<O::Value> {
        self.count += 1;
        match outcome.into_result() {
            Ok(value) => Some(value),
            Err(_) if self.start.elapsed() < self.wait.within => None,
            Err(last) => {
                let last = last.map_or(String::new(), |l| format!("; last: {l}"));
                panic!(
                    "{}: not within {:?} ({} checks){last}",
                    self.wait.what, self.wait.within, self.count
                )
            }
        }
    }
}
