//! Downstream connections of the proxy listener. Pingora 0.9 reads request heads with
//! per-read timeouts only, and keeps a reused keep-alive connection waiting for its next head
//! with none at all. This module wraps every connection to bound what Pingora leaves open:
//!
//! - **the whole head** of every request, first or reused, must arrive within
//!   `server.header_timeout`, whatever the pace of its bytes (a head trickled a byte at a time
//!   is cut); a connection that sends nothing is cut at the same deadline;
//! - **an idle keep-alive connection** is closed after `server.keepalive_timeout`, measured
//!   from the end of its last request, whatever the client's `Keep-Alive: timeout=` says;
//! - **at most `server.max_connections`** connections: at the cap the oldest idle keep-alive
//!   connection is closed to make room, and only when none is idle is a new one refused;
//! - **draining**: at shutdown every idle connection is closed at once.
//!
//! It also counts the requests in flight (a head arriving, or a request in progress), which the
//! shutdown waits for.
//!
//! [`Guard`] is a Pingora `ServerApp` around the HTTP proxy; [`Tracked`] wraps the byte stream
//! and applies the deadlines in `poll_read`. The proxy's hooks reach a connection's state with
//! [`ConnState::of`]: `early_request_filter` marks it busy, `logging` idle.
//!
//! Phase: connection, before, between and after requests. The per-request cost is two atomic
//! stores; the registry's mutex is taken on connect and close only, and scanned only at the cap.

use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use async_trait::async_trait;
use http::HeaderValue;
use parking_lot::Mutex;
use pingora_core::apps::ServerApp;
use pingora_core::protocols::raw_connect::ProxyDigest;
use pingora_core::protocols::{
    GetProxyDigest, GetSocketDigest, GetTimingDigest, Peek, Shutdown, SocketDigest, Ssl, Stream,
    TimingDigest, UniqueID, UniqueIDType,
};
use pingora_core::server::ShutdownWatch;
use pingora_proxy::Session;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::{Instant, Sleep};

/// Accepted; no byte of a head yet.
const FRESH: u8 = 0;
/// A head is arriving.
const HEAD: u8 = 1;
/// A request is in progress (its head was read).
const BUSY: u8 = 2;
/// Between requests.
const IDLE: u8 = 3;
/// Closed by the gateway: reads see the end of the stream.
const KILLED: u8 = 4;

/// `deadline_ms` of a head that has started on a reused connection and has no deadline yet:
/// the next read of it sets one ([`ConnState::head_started`]).
const DEADLINE_UNSET: u64 = u64::MAX;

fn in_flight(phase: u8) -> bool {
    phase == HEAD || phase == BUSY
}

/// Counters for `/stats`.
#[derive(Debug, Default)]
pub struct ConnStats {
    pub accepted: AtomicU64,
    /// New connections refused at the cap with no idle one to close.
    pub refused: AtomicU64,
    /// Idle keep-alive connections closed to make room at the cap.
    pub evicted_idle: AtomicU64,
    /// Connections cut because a head did not arrive within `header_timeout`.
    pub head_timeouts: AtomicU64,
    /// Idle keep-alive connections closed after `keepalive_timeout`.
    pub idle_timeouts: AtomicU64,
}

/// Every connection of the proxy listener.
#[derive(Debug)]
pub struct Connections {
    cap: usize,
    header_timeout: Duration,
    origin: Instant,
    open: AtomicUsize,
    /// Requests in flight: a head arriving, or a request in progress.
    active: AtomicUsize,
    next_id: AtomicU64,
    live: Mutex<HashMap<u64, Weak<ConnState>>>,
    pub stats: ConnStats,
}

/// One connection's phase and deadline.
#[derive(Debug)]
pub struct ConnState {
    id: u64,
    table: Arc<Connections>,
    phase: AtomicU8,
    /// ms since the table's origin; 0: none.
    deadline_ms: AtomicU64,
    idle_since_ms: AtomicU64,
    waker: Mutex<Option<Waker>>,
    /// The client's address and its text, made once for every request of the connection
    /// (the `X-Forwarded-For` a request without one gets).
    peer: Option<(IpAddr, HeaderValue)>,
}

impl Connections {
    /// At most `cap` connections; every head within `header_timeout`.
    pub fn new(cap: usize, header_timeout: Duration) -> Arc<Connections> {
        Arc::new(Connections {
            cap: cap.max(1),
            header_timeout,
            origin: Instant::now(),
            open: AtomicUsize::new(0),
            active: AtomicUsize::new(0),
            next_id: AtomicU64::new(1),
            live: Mutex::new(HashMap::new()),
            stats: ConnStats::default(),
        })
    }

    fn now_ms(&self) -> u64 {
        self.ms_at(Instant::now())
    }

    /// `at` in the table's milliseconds (since its origin, plus one: 0 means no deadline).
    fn ms_at(&self, at: Instant) -> u64 {
        at.saturating_duration_since(self.origin).as_millis() as u64 + 1
    }

    /// Connections open now.
    pub fn open(&self) -> usize {
        self.open.load(Ordering::Relaxed)
    }

    /// Requests in flight now, heads still arriving included.
    pub fn in_flight(&self) -> usize {
        self.active.load(Ordering::Relaxed)
    }

    pub fn cap(&self) -> usize {
        self.cap
    }

    /// Register a new connection, closing the oldest idle one at the cap; `None`: refused.
    fn admit(self: &Arc<Self>, peer: Option<IpAddr>) -> Option<Arc<ConnState>> {
        if self.open.fetch_add(1, Ordering::AcqRel) >= self.cap && !self.evict_oldest_idle() {
            self.open.fetch_sub(1, Ordering::AcqRel);
            self.stats.refused.fetch_add(1, Ordering::Relaxed);
            return None;
        }
        self.stats.accepted.fetch_add(1, Ordering::Relaxed);
        let state = Arc::new(ConnState {
            id: self.next_id.fetch_add(1, Ordering::Relaxed),
            table: self.clone(),
            phase: AtomicU8::new(FRESH),
            deadline_ms: AtomicU64::new(self.now_ms() + self.header_timeout.as_millis() as u64),
            idle_since_ms: AtomicU64::new(0),
            waker: Mutex::new(None),
            peer: peer.and_then(|ip| {
                let mut text = Vec::with_capacity(15);
                crate::observe::format::push_ip(&mut text, ip);
                HeaderValue::from_maybe_shared(bytes::Bytes::from(text))
                    .ok()
                    .map(|v| (ip, v))
            }),
        });
        self.live.lock().insert(state.id, Arc::downgrade(&state));
        Some(state)
    }

    fn close(&self, state: &ConnState) {
        state.set_phase(KILLED);
        self.live.lock().remove(&state.id);
        self.open.fetch_sub(1, Ordering::AcqRel);
    }

    fn idle_connections(&self) -> Vec<Arc<ConnState>> {
        self.live
            .lock()
            .values()
            .filter_map(Weak::upgrade)
            .filter(|c| c.phase.load(Ordering::Acquire) == IDLE)
            .collect()
    }

    fn evict_oldest_idle(&self) -> bool {
        let mut idle = self.idle_connections();
        idle.sort_by_key(|c| c.idle_since_ms.load(Ordering::Relaxed));
        let evicted = idle.iter().any(|c| c.kill());
        if evicted {
            self.stats.evicted_idle.fetch_add(1, Ordering::Relaxed);
        }
        evicted
    }

    /// Connections accepted that have not sent a byte yet (the shutdown waits a little for
    /// their requests). Scans every connection: for the shutdown, not per request.
    pub fn fresh(&self) -> usize {
        self.live
            .lock()
            .values()
            .filter_map(Weak::upgrade)
            .filter(|c| c.phase.load(Ordering::Acquire) == FRESH)
            .count()
    }

    /// Close every idle keep-alive connection now (the gateway is draining).
    pub fn close_idle(&self) -> usize {
        self.idle_connections().iter().filter(|c| c.kill()).count()
    }

    /// Counters for `/stats`.
    pub fn stats_json(&self) -> serde_json::Value {
        let s = &self.stats;
        let n = |a: &AtomicU64| a.load(Ordering::Relaxed);
        serde_json::json!({
            "open": self.open(),
            "max": self.cap,
            "requests_in_flight": self.in_flight(),
            "accepted": n(&s.accepted),
            "refused_at_cap": n(&s.refused),
            "idle_closed_at_cap": n(&s.evicted_idle),
            "head_timeouts": n(&s.head_timeouts),
            "idle_timeouts": n(&s.idle_timeouts),
        })
    }
}

impl ConnState {
    /// The state of the connection a request arrived on.
    pub fn of(session: &Session) -> Option<&Arc<ConnState>> {
        let stream = session.stream()?;
        stream.as_any().downcast_ref::<Tracked>().map(|t| &t.state)
    }

    /// The client's address and its text form, when it is an IP address.
    pub fn peer(&self) -> Option<&(IpAddr, HeaderValue)> {
        self.peer.as_ref()
    }

    fn set_phase(&self, to: u8) -> u8 {
        let from = self.phase.swap(to, Ordering::AcqRel);
        self.count(from, to);
        from
    }

    fn count(&self, from: u8, to: u8) {
        match (in_flight(from), in_flight(to)) {
            (false, true) => self.table.active.fetch_add(1, Ordering::AcqRel),
            (true, false) => self.table.active.fetch_sub(1, Ordering::AcqRel),
            _ => 0,
        };
    }

    /// The request's head is read: no deadline while it is in progress.
    pub fn busy(&self) {
        self.deadline_ms.store(0, Ordering::Release);
        if self.phase.load(Ordering::Acquire) != KILLED {
            self.set_phase(BUSY);
        }
    }

    /// The request ended at `now`: the connection may wait `keepalive` for its next head.
    pub fn idle(&self, keepalive: Duration, now: std::time::Instant) {
        let now = self.table.ms_at(Instant::from_std(now));
        self.idle_since_ms.store(now, Ordering::Relaxed);
        self.deadline_ms
            .store(now + keepalive.as_millis() as u64, Ordering::Release);
        if self.phase.load(Ordering::Acquire) != KILLED {
            self.set_phase(IDLE);
        }
    }

    /// Close the connection if it is idle: its next read sees the end of the stream.
    fn kill(&self) -> bool {
        let killed = self
            .phase
            .compare_exchange(IDLE, KILLED, Ordering::AcqRel, Ordering::Acquire)
            .is_ok();
        if killed {
            if let Some(w) = self.waker.lock().take() {
                w.wake();
            }
        }
        killed
    }

    /// The first bytes of a head arrived. On a fresh connection its deadline started at
    /// accept. On a reused one it starts at the next read of the head, which follows at once
    /// when the head is not whole, so the deadline is later only by the time taken to parse
    /// what came. A head that arrives whole, nearly every one, is read without a clock read.
    fn head_started(&self) {
        let from = self.phase.load(Ordering::Acquire);
        if from == IDLE {
            self.deadline_ms.store(DEADLINE_UNSET, Ordering::Release);
        }
        let moved = (from == IDLE || from == FRESH)
            && self
                .phase
                .compare_exchange(from, HEAD, Ordering::AcqRel, Ordering::Acquire)
                .is_ok();
        if moved {
            self.count(from, HEAD);
        }
    }
}

/// The proxy's `ServerApp`, with every connection tracked.
pub struct Guard<A> {
    inner: Arc<A>,
    table: Arc<Connections>,
}

impl<A> Guard<A> {
    pub fn new(inner: A, table: Arc<Connections>) -> Guard<A> {
        Guard {
            inner: Arc::new(inner),
            table,
        }
    }
}

#[async_trait]
impl<A: ServerApp + Send + Sync + 'static> ServerApp for Guard<A> {
    async fn process_new(
        self: &Arc<Self>,
        stream: Stream,
        shutdown: &ShutdownWatch,
    ) -> Option<Stream> {
        // A stream handed back for another round is already tracked.
        if stream.as_any().is::<Tracked>() {
            return self.inner.process_new(stream, shutdown).await;
        }
        let peer = stream
            .get_socket_digest()
            .and_then(|d| d.peer_addr().and_then(|a| a.as_inet()).map(|a| a.ip()));
        let state = self.table.admit(peer)?;
        let mut tracked = Tracked::new(stream, state.clone());
        // Pingora drops every connection parked waiting for a head when the listener shuts
        // down (a keep-alive connection, it assumes), which would lose the request of a client
        // whose connection was accepted just before: wait for its first byte here instead.
        if !tracked.first_byte().await {
            self.table.close(&state);
            return None;
        }
        let tracked: Stream = Box::new(tracked);
        let again = self.inner.process_new(tracked, shutdown).await;
        if again.is_none() {
            self.table.close(&state);
        }
        again
    }

    async fn cleanup(&self) {
        self.inner.cleanup().await
    }
}

/// The downstream byte stream with the connection's deadlines.
#[derive(Debug)]
pub struct Tracked {
    inner: Stream,
    state: Arc<ConnState>,
    sleep: Option<Pin<Box<Sleep>>>,
    armed_for: u64,
    /// The waker the timer was last polled with: while the timer is still pending and this
    /// waker would wake the same task, the timer need not be polled again.
    timer_waker: Option<Waker>,
}

impl Tracked {
    fn new(inner: Stream, state: Arc<ConnState>) -> Tracked {
        Tracked {
            inner,
            state,
            sleep: None,
            armed_for: 0,
            timer_waker: None,
        }
    }

    /// Wait, at most until the head's deadline, for the first byte of the first request
    /// (peeked: Pingora reads it again); then the connection has a head arriving, a request in
    /// flight. `false` when the client closed or sent nothing in time.
    async fn first_byte(&mut self) -> bool {
        let deadline_ms = self.state.deadline_ms.load(Ordering::Acquire);
        let at = self.state.table.origin + Duration::from_millis(deadline_ms.saturating_sub(1));
        let mut byte = [0u8; 1];
        match tokio::time::timeout_at(at, self.inner.try_peek(&mut byte)).await {
            Ok(Ok(true)) => {
                self.state.head_started();
                true
            }
            Ok(_) => false,
            Err(_) => {
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

    /// Read from the client; the first bytes of a head start its deadline.
    fn read_into(&mut self, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let read = Pin::new(&mut *self.inner).poll_read(cx, buf);
        if buf.filled().len() > before {
            self.state.head_started();
        }
        read
    }

    /// A read between requests. The next head's first bytes, when they are already there, are
    /// read without looking at the idle deadline (a timer poll and a waker stored per request);
    /// only a read that has to wait arms the deadline and leaves its waker for [`ConnState::kill`].
    fn poll_read_idle(
        &mut self,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let read = self.read_into(cx, buf);
        if read.is_ready() {
            return read;
        }
        {
            // Kept for [`ConnState::kill`]; the same task's waker is not cloned again.
            let mut waker = self.state.waker.lock();
            if !waker.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
                *waker = Some(cx.waker().clone());
            }
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
