// Copyright 2026 Cloudflare, Inc.
//
// Licensed under the Apache License, Version 2.0 (the "License");
// you may not use this file except in compliance with the License.
// You may obtain a copy of the License at
//
//     http://www.apache.org/licenses/LICENSE-2.0
//
// Unless required by applicable law or agreed to in writing, software
// distributed under the License is distributed on an "AS IS" BASIS,
// WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
// See the License for the specific language governing permissions and
// limitations under the License.

//! A bounded pipe of [`HttpTask`]s between the two halves of one proxied HTTP/1 request.
//!
//! The downstream and the upstream halves of a request run in one `try_join!`, in one task,
//! and the pipes between them live in the frame that joins them. So a pipe is borrowed by its
//! two ends rather than shared through an `Arc`: making one allocates nothing, and a task
//! moves through it under an uncontended lock instead of a channel's block list, semaphore
//! and atomic wakers. The lock is a spin lock: only one task holds the ends, so it never
//! waits for it, and releasing it is a plain store where a `std::sync::Mutex` swaps (one
//! atomic read-modify-write less per lock, of about ten per request). It offers the part of `tokio::sync::mpsc`'s bounded channel that the
//! proxy uses, with the same meaning: [`PipeSender::send`], [`PipeSender::reserve`] and
//! [`PipeSender::try_reserve`] wait for (or check) capacity, counting reserved slots, and fail
//! once the receiver is gone; [`PipeReceiver::recv`] returns the tasks in order and `None`
//! once the sender is gone and the pipe is empty.

use spin::mutex::{SpinMutex, SpinMutexGuard};
use std::fmt;
use std::future::poll_fn;
use std::task::{Context, Poll, Waker};

use pingora_core::protocols::http::HttpTask;

/// The tasks a pipe holds, waiting or reserved.
pub(crate) const CAPACITY: usize = crate::TASK_BUFFER_SIZE;

/// A pipe's state; see the module's documentation. Make one with [`TaskPipe::new`] and take
/// its two ends with [`TaskPipe::ends`].
pub(crate) struct TaskPipe {
    inner: SpinMutex<Inner>,
}

struct Inner {
    /// A ring of `len` tasks starting at `head`.
    tasks: [Option<HttpTask>; CAPACITY],
    head: usize,
    len: usize,
    /// Slots reserved by permits not yet used.
    reserved: usize,
    sender_alive: bool,
    receiver_alive: bool,
    /// The receiver waiting for a task, and the sender waiting for capacity.
    receiver_waiting: Option<Waker>,
    sender_waiting: Option<Waker>,
}

/// The receiver has gone: nothing sent now would be read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PipeClosed;

impl fmt::Display for PipeClosed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("the task pipe's receiver is gone")
    }
}

impl std::error::Error for PipeClosed {}

/// Why [`PipeSender::try_reserve`] gave no permit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TryReserveError {
    /// Every slot holds a task or is reserved.
    Full,
    /// The receiver has gone.
    Closed,
}

impl fmt::Display for TryReserveError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TryReserveError::Full => f.write_str("the task pipe is full"),
            TryReserveError::Closed => PipeClosed.fmt(f),
        }
    }
}

impl std::error::Error for TryReserveError {}

/// Store `cx`'s waker in `slot`, unless it already holds one that wakes the same task.
fn register(slot: &mut Option<Waker>, waker: &Waker) {
    match slot {
        Some(w) if w.will_wake(waker) => {}
        _ => *slot = Some(waker.clone()),
    }
}

/// Wake `waker`, if any: called with the lock released.
fn wake(waker: Option<Waker>) {
    if let Some(w) = waker {
        w.wake();
    }
}

/// Put `task` in the pipe `inner` has locked (it has room), release the lock, and wake the
/// receiver if it waits.
fn push_and_wake(mut inner: SpinMutexGuard<'_, Inner>, task: HttpTask) {
    inner.push(task);
    let waiting = inner.receiver_waiting.take();
    drop(inner);
    wake(waiting);
}

impl TaskPipe {
    pub(crate) fn new() -> Self {
        TaskPipe {
            inner: SpinMutex::new(Inner {
                tasks: Default::default(),
                head: 0,
                len: 0,
                reserved: 0,
                sender_alive: true,
                receiver_alive: true,
                receiver_waiting: None,
                sender_waiting: None,
            }),
        }
    }

    /// The pipe's sending and receiving ends. Each is taken once: the pipe is closed to the
    /// other end when one is dropped.
    pub(crate) fn ends(&mut self) -> (PipeSender<'_>, PipeReceiver<'_>) {
        let pipe: &TaskPipe = self;
        (PipeSender { pipe }, PipeReceiver { pipe })
    }

    fn lock(&self) -> SpinMutexGuard<'_, Inner> {
        // Not poisoned by a panic: no update of the ring panics halfway (each is a few field
        // assignments).
        self.inner.lock()
    }
}

impl Inner {
    fn has_room(&self) -> bool {
        self.len + self.reserved < CAPACITY
    }

    fn push(&mut self, task: HttpTask) {
        debug_assert!(self.len < CAPACITY);
        self.tasks[(self.head + self.len) % CAPACITY] = Some(task);
        self.len += 1;
    }

    fn pop(&mut self) -> Option<HttpTask> {
        if self.len == 0 {
            return None;
        }
        let task = self.tasks[self.head].take();
        self.head = (self.head + 1) % CAPACITY;
        self.len -= 1;
        task
    }
}

/// The sending end of a [`TaskPipe`].
pub(crate) struct PipeSender<'a> {
    pipe: &'a TaskPipe,
}

/// A reserved slot of a [`TaskPipe`]: [`PipePermit::send`] fills it; dropping it unused frees
/// it.
pub(crate) struct PipePermit<'a> {
    pipe: &'a TaskPipe,
}

impl fmt::Debug for PipePermit<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("PipePermit")
    }
}

impl PipeSender<'_> {
    /// Send `task`, waiting for a free slot. Fails, dropping the task, once the receiver is
    /// gone. A slot free now is filled under the one lock (not reserved, then filled).
    pub(crate) async fn send(&self, task: HttpTask) -> Result<(), PipeClosed> {
        let mut task = Some(task);
        poll_fn(|cx| {
            self.poll_room(cx).map_ok(|inner| {
                if let Some(task) = task.take() {
                    push_and_wake(inner, task);
                }
            })
        })
        .await
    }

    /// Reserve a slot, waiting for one to be free. Fails once the receiver is gone. The permit
    /// borrows the sender, so the sender outlives every permit (as with tokio's channel): a
    /// receiver told that the sender is gone gets no task after that.
    pub(crate) async fn reserve(&self) -> Result<PipePermit<'_>, PipeClosed> {
        poll_fn(|cx| {
            self.poll_room(cx).map_ok(|mut inner| {
                inner.reserved += 1;
                PipePermit { pipe: self.pipe }
            })
        })
        .await
    }

    /// The locked pipe once a slot is free; `PipeClosed` once the receiver is gone; else
    /// `Pending`, with this task's waker left for the receiver.
    fn poll_room(
        &self,
        cx: &mut Context<'_>,
    ) -> Poll<Result<SpinMutexGuard<'_, Inner>, PipeClosed>> {
        let mut inner = self.pipe.lock();
        if !inner.receiver_alive {
            return Poll::Ready(Err(PipeClosed));
        }
        if inner.has_room() {
            return Poll::Ready(Ok(inner));
        }
        register(&mut inner.sender_waiting, cx.waker());
        Poll::Pending
    }

    /// Reserve a slot if one is free now.
    pub(crate) fn try_reserve(&self) -> Result<PipePermit<'_>, TryReserveError> {
        let mut inner = self.pipe.lock();
        if !inner.receiver_alive {
            Err(TryReserveError::Closed)
        } else if inner.has_room() {
            inner.reserved += 1;
            Ok(PipePermit { pipe: self.pipe })
        } else {
            Err(TryReserveError::Full)
        }
    }

    /// Whether the receiver is gone.
    pub(crate) fn is_closed(&self) -> bool {
        !self.pipe.lock().receiver_alive
    }
}

impl Drop for PipeSender<'_> {
    fn drop(&mut self) {
        let waiting = {
            let mut inner = self.pipe.lock();
            inner.sender_alive = false;
            inner.receiver_waiting.take()
        };
        wake(waiting);
    }
}

impl PipePermit<'_> {
    /// Put `task` in the reserved slot. If the receiver has gone meanwhile, the task is
    /// dropped, as nothing would read it.
    pub(crate) fn send(self, task: HttpTask) {
        let pipe = self.pipe;
        // The slot is given back here, not by `Drop`.
        std::mem::forget(self);
        let mut inner = pipe.lock();
        inner.reserved -= 1;
        if inner.receiver_alive {
            push_and_wake(inner, task);
        } else {
            // Dropped outside the lock.
            drop(inner);
            drop(task);
        }
    }
}

impl Drop for PipePermit<'_> {
    fn drop(&mut self) {
        let waiting = {
            let mut inner = self.pipe.lock();
            inner.reserved -= 1;
            inner.sender_waiting.take()
        };
        wake(waiting);
    }
}

/// The receiving end of a [`TaskPipe`].
pub(crate) struct PipeReceiver<'a> {
    pipe: &'a TaskPipe,
}

impl PipeReceiver<'_> {
    /// The next task, waiting for one; `None` once the sender is gone and every task sent
    /// has been received.
    pub(crate) async fn recv(&mut self) -> Option<HttpTask> {
        poll_fn(|cx| {
            let mut inner = self.pipe.lock();
            if let Some(task) = inner.pop() {
                let waiting = inner.sender_waiting.take();
                drop(inner);
                wake(waiting);
                return Poll::Ready(Some(task));
            }
            if !inner.sender_alive {
                return Poll::Ready(None);
            }
            register(&mut inner.receiver_waiting, cx.waker());
            Poll::Pending
        })
        .await
    }

    /// The next task if one is waiting now.
    pub(crate) fn try_recv(&mut self) -> Option<HttpTask> {
        let mut inner = self.pipe.lock();
        let task = inner.pop()?;
        let waiting = inner.sender_waiting.take();
        drop(inner);
        wake(waiting);
        Some(task)
    }
}

impl Drop for PipeReceiver<'_> {
    fn drop(&mut self) {
        let (waiting, unread) = {
            let mut inner = self.pipe.lock();
            inner.receiver_alive = false;
            // Usually there are none: then nothing is moved.
            let unread = (inner.len > 0).then(|| {
                inner.len = 0;
                std::mem::take(&mut inner.tasks)
            });
            (inner.sender_waiting.take(), unread)
        };
        // Tasks never read are dropped outside the lock.
        drop(unread);
        wake(waiting);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use futures::FutureExt;
    use std::future::Future;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use std::task::{Context, Wake};

    fn body(b: &'static [u8]) -> HttpTask {
        HttpTask::Body(Some(Bytes::from_static(b)), false)
    }

    fn bytes_of(task: Option<HttpTask>) -> Option<Bytes> {
        match task {
            Some(HttpTask::Body(b, _)) => b,
            other => panic!("not a body task: {other:?}"),
        }
    }

    /// A waker that counts its wakes.
    #[derive(Default)]
    struct Count(AtomicUsize);

    impl Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    #[test]
    fn tasks_come_out_in_order_and_none_after_the_sender_is_gone() {
        let mut pipe = TaskPipe::new();
        let (tx, mut rx) = pipe.ends();
        // More tasks than the pipe holds, a few at a time, so the ring wraps around.
        for round in 0..3u8 {
            for _ in 0..CAPACITY {
                tx.send(body(b"x")).now_or_never().unwrap().unwrap();
            }
            assert_eq!(
                tx.try_reserve().unwrap_err(),
                TryReserveError::Full,
                "{round}"
            );
            for _ in 0..CAPACITY {
                assert_eq!(bytes_of(rx.try_recv()), Some(Bytes::from_static(b"x")));
            }
            assert!(rx.try_recv().is_none());
        }
        tx.send(body(b"last")).now_or_never().unwrap().unwrap();
        drop(tx);
        // What was sent before the sender went is still read, then the end.
        assert_eq!(
            bytes_of(rx.recv().now_or_never().unwrap()),
            Some(Bytes::from_static(b"last"))
        );
        assert!(rx.recv().now_or_never().unwrap().is_none());
    }

    #[test]
    fn reserved_slots_count_against_capacity_until_used_or_dropped() {
        let mut pipe = TaskPipe::new();
        let (tx, mut rx) = pipe.ends();
        let permits: Vec<_> = (0..CAPACITY).map(|_| tx.try_reserve().unwrap()).collect();
        assert_eq!(tx.try_reserve().unwrap_err(), TryReserveError::Full);
        assert!(tx.reserve().now_or_never().is_none(), "no slot is free");

        let mut permits = permits.into_iter();
        permits.next().unwrap().send(body(b"a"));
        drop(permits.next());
        // The dropped permit's slot is free again; the used one's is taken by its task.
        let again = tx.try_reserve().expect("a dropped permit frees its slot");
        assert_eq!(tx.try_reserve().unwrap_err(), TryReserveError::Full);
        drop((again, permits));
        assert_eq!(bytes_of(rx.try_recv()), Some(Bytes::from_static(b"a")));
        assert!(rx.try_recv().is_none());
    }

    #[test]
    fn a_waiting_receiver_is_woken_by_a_send_and_by_the_senders_drop() {
        let count = Arc::new(Count::default());
        let waker = Waker::from(count.clone());
        let mut cx = Context::from_waker(&waker);
        let mut pipe = TaskPipe::new();
        let (tx, mut rx) = pipe.ends();

        let mut recv = Box::pin(rx.recv());
        assert!(recv.as_mut().poll(&mut cx).is_pending());
        tx.send(body(b"a")).now_or_never().unwrap().unwrap();
        assert_eq!(count.0.load(Ordering::SeqCst), 1);
        match recv.as_mut().poll(&mut cx) {
            Poll::Ready(t) => assert_eq!(bytes_of(t), Some(Bytes::from_static(b"a"))),
            Poll::Pending => panic!("the task was sent"),
        }
        drop(recv);

        let mut recv = Box::pin(rx.recv());
        assert!(recv.as_mut().poll(&mut cx).is_pending());
        drop(tx);
        assert_eq!(count.0.load(Ordering::SeqCst), 2);
        assert!(matches!(recv.as_mut().poll(&mut cx), Poll::Ready(None)));
    }

    #[test]
    fn a_waiting_sender_is_woken_by_a_receive_and_fails_once_the_receiver_is_gone() {
        let count = Arc::new(Count::default());
        let waker = Waker::from(count.clone());
        let mut cx = Context::from_waker(&waker);
        let mut pipe = TaskPipe::new();
        let (tx, mut rx) = pipe.ends();
        for _ in 0..CAPACITY {
            tx.send(body(b"x")).now_or_never().unwrap().unwrap();
        }

        let mut reserve = Box::pin(tx.reserve());
        assert!(reserve.as_mut().poll(&mut cx).is_pending());
        assert!(rx.try_recv().is_some());
        assert_eq!(count.0.load(Ordering::SeqCst), 1);
        let permit = match reserve.as_mut().poll(&mut cx) {
            Poll::Ready(p) => p.expect("the receiver is there"),
            Poll::Pending => panic!("a slot was freed"),
        };
        drop(reserve);
        permit.send(body(b"y"));

        // A waiting send fills the slot a receive frees, under one lock.
        let mut send = Box::pin(tx.send(body(b"z")));
        assert!(send.as_mut().poll(&mut cx).is_pending());
        assert_eq!(bytes_of(rx.try_recv()), Some(Bytes::from_static(b"x")));
        assert_eq!(count.0.load(Ordering::SeqCst), 2);
        assert_eq!(send.as_mut().poll(&mut cx), Poll::Ready(Ok(())));
        drop(send);
        assert_eq!(tx.try_reserve().unwrap_err(), TryReserveError::Full);

        let mut send = Box::pin(tx.send(body(b"w")));
        assert!(send.as_mut().poll(&mut cx).is_pending());
        assert!(!tx.is_closed());
        drop(rx);
        assert_eq!(count.0.load(Ordering::SeqCst), 3);
        assert_eq!(send.as_mut().poll(&mut cx), Poll::Ready(Err(PipeClosed)));
        drop(send);
        assert!(tx.is_closed());
        assert_eq!(tx.try_reserve().unwrap_err(), TryReserveError::Closed);
    }

    #[test]
    fn tasks_left_in_the_pipe_or_sent_after_the_receiver_is_gone_are_dropped() {
        let tracked = Bytes::from(vec![7u8; 64]);
        let mut pipe = TaskPipe::new();
        let (tx, rx) = pipe.ends();
        tx.send(HttpTask::Body(Some(tracked.clone()), false))
            .now_or_never()
            .unwrap()
            .unwrap();
        let late = tx.try_reserve().unwrap();
        drop(rx);
        late.send(HttpTask::Body(Some(tracked.clone()), true));
        // Only this handle is left: `Bytes::is_unique` says no task still holds the buffer.
        assert!(tracked.is_unique());
    }
}
