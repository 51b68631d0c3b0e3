//! Deadlines of store calls that all wait the same time, kept by one timer thread per store
//! instead of one tokio timer per call.
//!
//! A tokio timer costs each call an entry inserted into and removed from the runtime's timer
//! wheel, and the runtime's parking then accounts for it: about 2.5k instructions of a Redis
//! check's 29k (`loadtest/log/2026-11-25-redis-deadlines-timer-thread.md`). Calls that wait
//! the same time expire in the order
//! they started, so one queue in start order and one thread that sleeps until the oldest
//! unfinished call's deadline can keep them all. A call registers in the queue, checks its
//! flag when polled, and marks its entry finished when it ends; the thread is woken only when
//! it had nothing to wait for. Under steady traffic it wakes about once per deadline period,
//! finds the calls it waited for long finished, and waits for the oldest call still open; it
//! wakes a call only when that call's time is up.
//!
//! Calls on different threads register in the order they take the lock, from instants each
//! read a moment before: a queue out of order by that moment delays an expiry by as much,
//! microseconds.
//!
//! Phase: every Redis store call, around the client's future.

use std::collections::VecDeque;
use std::future::{poll_fn, Future};
use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::task::{Poll, Waker};
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex, MutexGuard};

/// A call's deadline passed before it finished.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Elapsed;

/// The deadlines of calls that may each take at most `after`.
pub struct Deadlines {
    after: Duration,
    shared: Arc<Shared>,
    /// Whether the timer thread started (once, at the first call).
    started: OnceLock<bool>,
}

struct Shared {
    state: Mutex<State>,
    /// The timer thread waits on it.
    wake: Condvar,
}

#[derive(Default)]
struct State {
    /// One per call in progress, reused: `free` lists the unused ones.
    slots: Vec<Slot>,
    free: Vec<u32>,
    /// Calls in the order they started: slot, its generation then, deadline.
    queue: VecDeque<(u32, u32, Instant)>,
    /// When the timer thread wakes next; `None` while it waits for a call to start.
    armed: Option<Instant>,
    /// The store is gone: the thread ends.
    closed: bool,
}

#[derive(Default)]
struct Slot {
    /// Moves on each time the slot is given back, so that the queue's stale entries for it
    /// are told apart from its current call.
    generation: u32,
    expired: bool,
    waker: Option<Waker>,
}

impl Deadlines {
    pub fn new(after: Duration) -> Deadlines {
        Deadlines {
            after,
            shared: Arc::new(Shared {
                state: Mutex::new(State::default()),
                wake: Condvar::new(),
            }),
            started: OnceLock::new(),
        }
    }

    /// The time every call may take.
    pub fn after(&self) -> Duration {
        self.after
    }

    /// `fut`, started at `now`, or [`Elapsed`] once `after` has passed since then without it
    /// finishing (the caller then drops it, as `tokio::time::timeout` drops it). `fut` is
    /// `Unpin`, a `Pin<&mut _>` of the caller's future in practice: a client's call future is
    /// large, and moving it into this one would copy it (about 1k instructions a call).
    pub async fn within<F: Future + Unpin>(
        &self,
        now: Instant,
        mut fut: F,
    ) -> Result<F::Output, Elapsed> {
        if !self.thread_started() {
            // No thread to keep the deadline (the process is out of them): tokio's timer.
            return tokio::time::timeout(self.after, fut)
                .await
                .map_err(|_| Elapsed);
        }
        let ticket = self.register(now + self.after);
        poll_fn(|cx| {
            if let Poll::Ready(out) = Pin::new(&mut fut).poll(cx) {
                return Poll::Ready(Ok(out));
            }
            let mut st = self.shared.state.lock();
            let slot = &mut st.slots[ticket.slot as usize];
            if slot.expired {
                return Poll::Ready(Err(Elapsed));
            }
            match &slot.waker {
                Some(w) if w.will_wake(cx.waker()) => {}
                _ => slot.waker = Some(cx.waker().clone()),
            }
            Poll::Pending
        })
        .await
    }

    fn thread_started(&self) -> bool {
        *self.started.get_or_init(|| {
            let shared = self.shared.clone();
            std::thread::Builder::new()
                .name("tollgate deadlines".into())
                .spawn(move || watch(&shared))
                .is_ok()
        })
    }

    fn register(&self, at: Instant) -> Ticket<'_> {
        let mut st = self.shared.state.lock();
        let slot = match st.free.pop() {
            Some(i) => i,
            None => {
                st.slots.push(Slot::default());
                (st.slots.len() - 1) as u32
            }
        };
        let generation = st.slots[slot as usize].generation;
        st.queue.push_back((slot, generation, at));
        // The thread waits for nothing: it has a deadline to wait for now.
        let notify = st.armed.is_none();
        if notify {
            st.armed = Some(at);
        }
        drop(st);
        if notify {
            self.shared.wake.notify_one();
        }
        Ticket {
            deadlines: self,
            slot,
        }
    }
}

impl Drop for Deadlines {
    fn drop(&mut self) {
        self.shared.state.lock().closed = true;
        self.shared.wake.notify_one();
    }
}

/// A call's place in the queue, given back when the call ends, however it ends.
struct Ticket<'a> {
    deadlines: &'a Deadlines,
    slot: u32,
}

impl Drop for Ticket<'_> {
    fn drop(&mut self) {
        let mut st = self.deadlines.shared.state.lock();
        let slot = &mut st.slots[self.slot as usize];
        slot.generation = slot.generation.wrapping_add(1);
        slot.expired = false;
        slot.waker = None;
        st.free.push(self.slot);
        // Calls mostly end in the order they started: dropping the finished ones from the
        // front here keeps the queue about as long as the calls in progress, however long
        // `after` is, instead of a deadline period's worth of calls.
        while let Some(&(i, generation, _)) = st.queue.front() {
            if st.slots[i as usize].generation == generation {
                break;
            }
            st.queue.pop_front();
        }
    }
}

/// The timer thread: wake every call whose deadline passed, then sleep until the oldest
/// unfinished call's deadline (or until a call starts, when none is open).
fn watch(shared: &Shared) {
    let mut st = shared.state.lock();
    let mut due: Vec<Waker> = Vec::new();
    loop {
        if st.closed {
            return;
        }
        let now = Instant::now();
        let next = expire(&mut st, now, &mut due);
        st.armed = next;
        if !due.is_empty() {
            // Woken outside the lock: a waker may run code of its own.
            MutexGuard::unlocked(&mut st, || due.drain(..).for_each(Waker::wake));
            continue;
        }
        match next {
            Some(at) => {
                shared.wake.wait_until(&mut st, at);
            }
            None => shared.wake.wait(&mut st),
        }
    }
}

/// Drop the queue's finished calls from its front and mark those due at `now` expired (their
/// wakers into `due`); the deadline of the oldest call still open.
fn expire(st: &mut State, now: Instant, due: &mut Vec<Waker>) -> Option<Instant> {
    while let Some(&(i, generation, at)) = st.queue.front() {
        let slot = &mut st.slots[i as usize];
        if slot.generation == generation {
            if at > now {
                return Some(at);
            }
            slot.expired = true;
            due.extend(slot.waker.take());
        }
        st.queue.pop_front();
    }
    None
}

#[cfg(test)]
mod tests {
    use std::pin::pin;

    use super::*;

    const AFTER: Duration = Duration::from_millis(30);

    /// A call that answers `v` after `ms`, well within [`AFTER`].
    async fn answer_in<T>(ms: u64, v: T) -> T {
        tokio::time::sleep(Duration::from_millis(ms)).await;
        v
    }

    /// `fut`'s output, or a failure (not a hang) when the timer thread never wakes it.
    async fn bounded<T>(fut: impl Future<Output = T>) -> T {
        tokio::time::timeout(Duration::from_secs(10), fut)
            .await
            .expect("a deadline was never kept: the call waited 10 s")
    }

    #[tokio::test]
    async fn a_call_that_does_not_finish_in_time_is_cut_at_its_deadline() {
        let d = Deadlines::new(AFTER);
        let start = Instant::now();
        let out = bounded(d.within(start, pin!(std::future::pending::<()>()))).await;
        assert_eq!(out, Err(Elapsed));
        assert!(start.elapsed() >= AFTER, "cut after {:?}", start.elapsed());
    }

    #[tokio::test]
    async fn a_call_that_finishes_keeps_its_answer_and_gives_its_slot_back() {
        let d = Deadlines::new(AFTER);
        for n in 0..100u32 {
            let out = d
                .within(
                    Instant::now(),
                    pin!(async {
                        tokio::task::yield_now().await;
                        n
                    }),
                )
                .await;
            assert_eq!(out, Ok(n));
        }
        let st = d.shared.state.lock();
        assert_eq!(st.slots.len(), 1, "one call at a time reuses one slot");
        assert_eq!(st.free.len(), 1);
        assert!(st.queue.is_empty(), "finished calls leave the queue");
    }

    #[tokio::test]
    async fn a_late_call_expires_while_later_ones_that_finish_do_not() {
        let d = Deadlines::new(AFTER);
        let start = Instant::now();
        let pending = pin!(std::future::pending::<()>());
        let slow = d.within(start, pending);
        let quick = async {
            // Calls that start and finish while the slow one waits, each in time.
            let mut answered = 0;
            for _ in 0..20 {
                let r = d.within(Instant::now(), pin!(answer_in(1, ()))).await;
                answered += usize::from(r.is_ok());
            }
            answered
        };
        let (slow, answered) = bounded(async { tokio::join!(slow, quick) }).await;
        assert_eq!(slow, Err(Elapsed));
        assert_eq!(answered, 20);
    }

    #[tokio::test]
    async fn the_slot_of_a_cut_call_is_not_expired_for_the_next_one() {
        let d = Deadlines::new(AFTER);
        let cut = bounded(d.within(Instant::now(), pin!(std::future::pending::<()>()))).await;
        assert_eq!(cut, Err(Elapsed));
        // The same slot, reused: a fresh call with its own deadline.
        let next = d.within(Instant::now(), pin!(async { 7 })).await;
        assert_eq!(next, Ok(7));
        let later = d.within(Instant::now(), pin!(answer_in(5, 8))).await;
        assert_eq!(later, Ok(8));
    }

    #[test]
    fn the_thread_ends_with_the_store() {
        let d = Deadlines::new(AFTER);
        assert!(d.thread_started());
        let shared = Arc::downgrade(&d.shared);
        drop(d);
        // The thread holds the shared state until it has seen `closed`.
        let give_up = Instant::now() + Duration::from_secs(10);
        while shared.strong_count() > 0 {
            assert!(Instant::now() < give_up, "the timer thread did not end");
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}
