//! [`Tracked`]: the downstream byte stream with its connection's deadlines and head size,
//! applied in `poll_read` (see the parent module).

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use async_trait::async_trait;
use pingora_core::protocols::raw_connect::ProxyDigest;
use pingora_core::protocols::{
    GetProxyDigest, GetSocketDigest, GetTimingDigest, Peek, Shutdown, SocketDigest, Ssl, Stream,
    TimingDigest, UniqueID, UniqueIDType,
};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Sleep;

use super::head_size::ends_within;
use super::{ConnState, BUSY, DEADLINE_UNSET, IDLE, KILLED};

/// Bytes a refused head may still have waiting that are read and dropped before the
/// connection closes, so that it ends with a FIN after the `431` rather than a reset.
const DISCARD_AT_CLOSE: usize = 64 * 1024;

/// The downstream byte stream with the connection's deadlines.
#[derive(Debug)]
pub struct Tracked {
    inner: Stream,
    pub(super) state: Arc<ConnState>,
    sleep: Option<Pin<Box<Sleep>>>,
    armed_for: u64,
    /// The waker the timer was last polled with: while the timer is still pending and this
    /// waker would wake the same task, the timer need not be polled again.
    timer_waker: Option<Waker>,
    /// The waker last left in the connection's state for [`ConnState::kill`]: while a read
    /// would wake the same task, it is there already, and the state's lock is not taken.
    kill_waker: Option<Waker>,
    /// Bytes of the head arriving read so far (Pingora's pipelined leftovers aside).
    head_read: usize,
    /// The head passed the limit: how much of the `431` has been written.
    refusing: Option<usize>,
}

impl Tracked {
    pub(super) fn new(inner: Stream, state: Arc<ConnState>) -> Tracked {
        Tracked {
            inner,
            state,
            sleep: None,
            armed_for: 0,
            timer_waker: None,
            kill_waker: None,
            head_read: 0,
            refusing: None,
        }
    }

    /// Wait, at most until the head's deadline, for the first byte of the first request
    /// (peeked: Pingora reads it again); then the connection has a head arriving, a request in
    /// flight. `false` when the client closed or sent nothing in time, or (in the admin table)
    /// the connection was closed meanwhile to make room ([`ConnState::kill`]).
    pub(super) async fn first_byte(&mut self) -> bool {
        let state = &self.state;
        let deadline_ms = state.deadline_ms.load(Ordering::Acquire);
        let at = state.table.origin + Duration::from_millis(deadline_ms.saturating_sub(1));
        let mut byte = [0u8; 1];
        let peek = tokio::time::timeout_at(at, self.inner.try_peek(&mut byte));
        let mut peek = std::pin::pin!(peek);
        let peeked = std::future::poll_fn(|cx| {
            if let Poll::Ready(peeked) = peek.as_mut().poll(cx) {
                return Poll::Ready(Some(peeked));
            }
            if state.table.evict_silent {
                *state.waker.lock() = Some(cx.waker().clone());
                if state.phase.load(Ordering::Acquire) == KILLED {
                    return Poll::Ready(None);
                }
            }
            Poll::Pending
        })
        .await;
        match peeked {
            Some(Ok(Ok(true))) => {
                self.state.head_started();
                true
            }
            None | Some(Ok(_)) => false,
            Some(Err(_)) => {
                let stats = &self.state.table.stats;
                stats.head_timeouts.fetch_add(1, Ordering::Relaxed);
                false
            }
        }
    }

    /// Whether the deadline (ms since the origin) has passed; arms the timer that wakes the
    /// read when it does. The timer is moved only when it would fire too late: every request
    /// pushes the deadline later, and a timer that fires early (at an older deadline) is then
    /// re-armed once, instead of being moved twice per request (a timer-wheel removal and
    /// insertion each time).
    fn deadline_passed(&mut self, cx: &mut Context<'_>, deadline_ms: u64) -> bool {
        // Between requests the deadline only moves later, and the timer, armed at an earlier
        // one, still holds this task's waker from the last request: nothing to poll. A timer
        // that has fired (no longer pending) goes the long way, which re-arms it.
        let armed = self.sleep.as_ref().is_some_and(|s| !s.is_elapsed());
        let same_task = self
            .timer_waker
            .as_ref()
            .is_some_and(|w| w.will_wake(cx.waker()));
        if armed && same_task && self.armed_for <= deadline_ms {
            return false;
        }
        let origin = self.state.table.origin;
        let at = |ms: u64| origin + Duration::from_millis(ms.saturating_sub(1));
        let sleep = match &mut self.sleep {
            Some(sleep) => sleep,
            None => {
                self.armed_for = deadline_ms;
                self.sleep
                    .insert(Box::pin(tokio::time::sleep_until(at(deadline_ms))))
            }
        };
        if self.armed_for > deadline_ms {
            sleep.as_mut().reset(at(deadline_ms));
            self.armed_for = deadline_ms;
        }
        loop {
            if sleep.as_mut().poll(cx).is_pending() {
                if !same_task {
                    self.timer_waker = Some(cx.waker().clone());
                }
                return false;
            }
            if self.armed_for == deadline_ms {
                return true;
            }
            // Fired at an older, earlier deadline: wait for this one.
            sleep.as_mut().reset(at(deadline_ms));
            self.armed_for = deadline_ms;
        }
    }

    /// Read a head from the client; its first bytes start its deadline. A read that takes the
    /// head past `max_request_header_bytes`, unless the head ends within the limit, is not
    /// handed on: the connection answers `431` and closes instead.
    fn read_into(&mut self, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let read = Pin::new(&mut *self.inner).poll_read(cx, buf);
        let n = buf.filled().len() - before;
        if n > 0 {
            self.state.head_started();
            self.head_read += n;
            let max = self.state.table.max_head.load(Ordering::Relaxed);
            if self.head_read > max {
                let room = (max + n).saturating_sub(self.head_read);
                if !ends_within(&buf.filled()[before..], room) {
                    buf.set_filled(before);
                    let stats = &self.state.table.stats;
                    stats.heads_too_large.fetch_add(1, Ordering::Relaxed);
                    self.refusing = Some(0);
                    return self.poll_refuse(cx);
                }
            }
        }
        read
    }

    /// Write the `431`, half-close, drop what the client has already sent, and end the
    /// stream with an error (Pingora then closes the connection). A client that does not read
    /// the answer is cut at the head's deadline.
    fn poll_refuse(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let mut sent = self.refusing.unwrap_or(0);
        let len = self.state.table.too_large.len();
        while sent < len {
            let rest = &self.state.table.too_large[sent..];
            match Pin::new(&mut *self.inner).poll_write(cx, rest) {
                Poll::Ready(Ok(k)) if k > 0 => sent += k,
                Poll::Ready(_) => break,
                Poll::Pending => {
                    self.refusing = Some(sent);
                    let mut deadline = self.state.deadline_ms.load(Ordering::Acquire);
                    if deadline == DEADLINE_UNSET {
                        let table = &self.state.table;
                        deadline = table.now_ms() + table.header_timeout.as_millis() as u64;
                        self.state.deadline_ms.store(deadline, Ordering::Release);
                    }
                    if deadline != 0 && self.deadline_passed(cx, deadline) {
                        break;
                    }
                    return Poll::Pending;
                }
            }
        }
        self.refusing = Some(len);
        let _ = Pin::new(&mut *self.inner).poll_flush(cx);
        let _ = Pin::new(&mut *self.inner).poll_shutdown(cx);
        let mut dropped = 0;
        let mut scratch = [0u8; 4096];
        while dropped < DISCARD_AT_CLOSE {
            let mut rb = ReadBuf::new(&mut scratch);
            match Pin::new(&mut *self.inner).poll_read(cx, &mut rb) {
                Poll::Ready(Ok(())) if !rb.filled().is_empty() => dropped += rb.filled().len(),
                _ => break,
            }
        }
        let max = self.state.table.max_head.load(Ordering::Relaxed);
        Poll::Ready(Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!(
                "the request head passed server.max_request_header_bytes ({max}): answered 431 \
                 and closed"
            ),
        )))
    }

    /// A read between requests. The next head's first bytes, when they are already there, are
    /// read without looking at the idle deadline (a timer poll and a waker stored per request);
    /// only a read that has to wait arms the deadline and leaves its waker for [`ConnState::kill`].
    fn poll_read_idle(
        &mut self,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        // The next head starts here.
        self.head_read = 0;
        let read = self.read_into(cx, buf);
        if read.is_ready() || self.refusing.is_some() {
            return read;
        }
        // Left for [`ConnState::kill`] once per task (a kill wakes it and leaves it there).
        if !self
            .kill_waker
            .as_ref()
            .is_some_and(|w| w.will_wake(cx.waker()))
        {
            let waker = cx.waker().clone();
            *self.state.waker.lock() = Some(waker.clone());
            self.kill_waker = Some(waker);
        }
        // Killed before the waker was there to be woken: see it now.
        if self.state.phase.load(Ordering::Acquire) == KILLED {
            return Poll::Ready(Ok(()));
        }
        let deadline = self.state.deadline_ms.load(Ordering::Acquire);
        if deadline != 0 && self.deadline_passed(cx, deadline) {
            let stats = &self.state.table.stats;
            stats.idle_timeouts.fetch_add(1, Ordering::Relaxed);
            self.state.kill();
            return Poll::Ready(Ok(()));
        }
        Poll::Pending
    }
}

impl AsyncRead for Tracked {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let phase = this.state.phase.load(Ordering::Acquire);
        match phase {
            BUSY => return Pin::new(&mut *this.inner).poll_read(cx, buf),
            KILLED => return Poll::Ready(Ok(())),
            IDLE => return this.poll_read_idle(cx, buf),
            _ => {}
        }
        // A head is arriving: its deadline holds on every read, so that a client that trickles
        // it byte by byte is cut off too.
        let mut deadline = this.state.deadline_ms.load(Ordering::Acquire);
        if deadline == DEADLINE_UNSET {
            let table = &this.state.table;
            deadline = table.now_ms() + table.header_timeout.as_millis() as u64;
            this.state.deadline_ms.store(deadline, Ordering::Release);
        }
        if this.refusing.is_some() {
            return this.poll_refuse(cx);
        }
        if deadline != 0 && this.deadline_passed(cx, deadline) {
            let stats = &this.state.table.stats;
            stats.head_timeouts.fetch_add(1, Ordering::Relaxed);
            return Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "the request head did not arrive within server.header_timeout",
            )));
        }
        this.read_into(cx, buf)
    }
}

impl AsyncWrite for Tracked {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, b: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut *self.get_mut().inner).poll_write(cx, b)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut *self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut *self.get_mut().inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut *self.get_mut().inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

#[async_trait]
impl Shutdown for Tracked {
    async fn shutdown(&mut self) {
        Shutdown::shutdown(&mut *self.inner).await
    }
}

impl UniqueID for Tracked {
    fn id(&self) -> UniqueIDType {
        self.inner.id()
    }
}

impl Ssl for Tracked {}

impl GetTimingDigest for Tracked {
    fn get_timing_digest(&self) -> Vec<Option<TimingDigest>> {
        self.inner.get_timing_digest()
    }
}

impl GetProxyDigest for Tracked {
    fn get_proxy_digest(&self) -> Option<Arc<ProxyDigest>> {
        self.inner.get_proxy_digest()
    }
}

impl GetSocketDigest for Tracked {
    fn get_socket_digest(&self) -> Option<Arc<SocketDigest>> {
        self.inner.get_socket_digest()
    }
}

#[async_trait]
impl Peek for Tracked {
    async fn try_peek(&mut self, buf: &mut [u8]) -> io::Result<bool> {
        self.inner.try_peek(buf).await
    }
}
