//! Downstream connections of the proxy listener. Pingora 0.9 reads request heads with
//! per-read timeouts only, and keeps a reused keep-alive connection waiting for its next head
//! with none at all. This module wraps every connection to bound what Pingora leaves open:
//!
//! - **the whole head** of every request, first or reused, must arrive within
//!   `server.header_timeout`, whatever the pace of its bytes (a head trickled a byte at a time
//!   is cut); a connection that sends nothing is cut at the same deadline;
//! - **an idle keep-alive connection** is closed after `server.keepalive_timeout`, measured
//!   from the end of its last request, whatever the client's `Keep-Alive: timeout=` says;
//! - **the size of every head** while it arrives: past `server.max_request_header_bytes` the
//!   connection answers `431` itself and closes, before Pingora has buffered more of it (its own
//!   cap is about 1 MB, a constant);
//! - **at most `server.max_connections`** connections: at the cap the oldest idle keep-alive
//!   connection is closed to make room, and only when none is idle is a new one refused;
//! - **draining**: at shutdown every idle connection is closed at once.
//!
//! The admin listener has a table of its own ([`Connections::admin`]), with its own small cap
//! (`admin.max_connections`), the same deadlines and head size, and at its cap it also closes
//! the oldest connection that has not sent a byte: idle admin connections can neither hold the
//! file descriptors the proxy needs nor keep `/healthz` out.
//!
//! It also tells how many requests are in flight (a head arriving, or a request in progress),
//! counted when asked, which the shutdown waits for.
//!
//! [`Guard`] is a Pingora `ServerApp` around the HTTP proxy; [`Tracked`] wraps the byte stream
//! and applies the deadlines in `poll_read`. The proxy's hooks reach a connection's state with
//! [`ConnState::of`]: `early_request_filter` marks it busy, `logging` idle.
//!
//! Phase: connection, before, between and after requests. The per-request cost is a few
//! atomic loads and stores and one compare-exchange (a head's start), and an addition and a
//! comparison per read of a head (its size); a head is scanned for its end only by the read
//! that takes it past the limit. The registry's mutex is taken on connect and close only, and
//! scanned only at the cap, by `/stats` and at shutdown.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::task::Waker;
use std::time::Duration;

use async_trait::async_trait;
use http::HeaderValue;
use parking_lot::Mutex;
use pingora_core::apps::ServerApp;
use pingora_core::protocols::Stream;
use pingora_core::server::ShutdownWatch;
use pingora_proxy::Session;
use tokio::time::Instant;

use crate::store::KeyMemo;

mod admin;
mod files;
mod head_size;
mod tracked;
pub use admin::Phased;
pub use files::proxy_cap;
pub use tracked::Tracked;

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
    /// Heads that passed `max_request_header_bytes` while arriving: answered `431`, closed.
    pub heads_too_large: AtomicU64,
}

/// Every connection of one listener: the proxy's, or the admin listener's
/// ([`Connections::admin`]).
#[derive(Debug)]
pub struct Connections {
    cap: usize,
    /// At the cap, a connection that has not sent a byte may be closed too (the admin table).
    evict_silent: bool,
    header_timeout: Duration,
    /// `server.max_request_header_bytes`, kept current by reloads.
    max_head: AtomicUsize,
    /// The `431` written to a head over `max_head`.
    too_large: Box<[u8]>,
    origin: Instant,
    open: AtomicUsize,
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
    keys: KeyMemo,
}

impl Connections {
    /// At most `cap` connections; every head within `header_timeout` and `max_head` bytes.
    pub fn new(cap: usize, header_timeout: Duration, max_head: usize) -> Arc<Connections> {
        Connections::build(cap, header_timeout, max_head, false)
    }

    /// The admin listener's table: as [`Connections::new`], and at the cap the oldest
    /// connection that is idle or has not sent a byte yet is closed to make room.
    pub fn admin(cap: usize, header_timeout: Duration, max_head: usize) -> Arc<Connections> {
        Connections::build(cap, header_timeout, max_head, true)
    }

    fn build(
        cap: usize,
        header_timeout: Duration,
        max_head: usize,
        evict_silent: bool,
    ) -> Arc<Connections> {
        Arc::new(Connections {
            cap: cap.max(1),
            evict_silent,
            header_timeout,
            max_head: AtomicUsize::new(max_head),
            too_large: crate::refusal::header_too_large_wire().into_boxed_slice(),
            origin: Instant::now(),
            open: AtomicUsize::new(0),
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

    /// Requests in flight now, heads still arriving included. Scans every connection (for
    /// `/stats` and the shutdown, not per request): a shared count kept up to date would cost
    /// every request two atomic read-modify-writes on one cache line.
    pub fn in_flight(&self) -> usize {
        self.in_phase(in_flight)
    }

    pub fn cap(&self) -> usize {
        self.cap
    }

    /// A reload's `server.max_request_header_bytes`, for the heads that start from now on.
    pub fn set_max_head(&self, bytes: usize) {
        self.max_head.store(bytes, Ordering::Relaxed);
    }

    /// Register a new connection, closing the oldest idle one at the cap; `None`: refused.
    fn admit(self: &Arc<Self>, peer: Option<IpAddr>) -> Option<Arc<ConnState>> {
        if self.open.fetch_add(1, Ordering::AcqRel) >= self.cap && !self.evict_oldest_idle() {
            self.open.fetch_sub(1, Ordering::AcqRel);
            self.stats.refused.fetch_add(1, Ordering::Relaxed);
            return None;
        }
        self.stats.accepted.fetch_add(1, Ordering::Relaxed);
        let now = self.now_ms();
        let state = Arc::new(ConnState {
            id: self.next_id.fetch_add(1, Ordering::Relaxed),
            table: self.clone(),
            phase: AtomicU8::new(FRESH),
            deadline_ms: AtomicU64::new(now + self.header_timeout.as_millis() as u64),
            // For the admin table's eviction of silent connections: the oldest first.
            idle_since_ms: AtomicU64::new(now),
            waker: Mutex::new(None),
            peer: peer.and_then(|ip| {
                let mut text = Vec::with_capacity(15);
                crate::observe::format::push_ip(&mut text, ip);
                HeaderValue::from_maybe_shared(bytes::Bytes::from(text))
                    .ok()
                    .map(|v| (ip, v))
            }),
            keys: KeyMemo::default(),
        });
        self.live.lock().insert(state.id, Arc::downgrade(&state));
        Some(state)
    }

    fn close(&self, state: &ConnState) {
        state.phase.store(KILLED, Ordering::Release);
        self.live.lock().remove(&state.id);
        self.open.fetch_sub(1, Ordering::AcqRel);
    }

    fn idle_connections(&self) -> Vec<Arc<ConnState>> {
        self.connections_in(|phase| phase == IDLE)
    }

    fn connections_in(&self, which: impl Fn(u8) -> bool) -> Vec<Arc<ConnState>> {
        self.live
            .lock()
            .values()
            .filter_map(Weak::upgrade)
            .filter(|c| which(c.phase.load(Ordering::Acquire)))
            .collect()
    }

    fn evict_oldest_idle(&self) -> bool {
        let silent = self.evict_silent;
        let mut idle = self.connections_in(|phase| phase == IDLE || (silent && phase == FRESH));
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
        self.in_phase(|phase| phase == FRESH)
    }

    /// The connections whose phase is one `which` takes.
    fn in_phase(&self, which: impl Fn(u8) -> bool) -> usize {
        self.live
            .lock()
            .values()
            .filter_map(Weak::upgrade)
            .filter(|c| which(c.phase.load(Ordering::Acquire)))
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
            "heads_too_large": n(&s.heads_too_large),
        })
    }
}

impl ConnState {
    /// The state of the connection a request arrived on.
    pub fn of(session: &Session) -> Option<&Arc<ConnState>> {
        ConnState::of_stream(session.stream())
    }

    /// The state of a tracked connection's stream.
    pub fn of_stream(stream: Option<&Stream>) -> Option<&Arc<ConnState>> {
        let stream = stream?;
        stream.as_any().downcast_ref::<Tracked>().map(|t| &t.state)
    }

    /// The client's address and its text form, when it is an IP address.
    pub fn peer(&self) -> Option<&(IpAddr, HeaderValue)> {
        self.peer.as_ref()
    }

    /// The counter keys this connection's requests were given lately.
    pub fn keys(&self) -> &KeyMemo {
        &self.keys
    }

    /// The request's head is read: no deadline while it is in progress.
    pub fn busy(&self) {
        self.deadline_ms.store(0, Ordering::Release);
        if self.phase.load(Ordering::Acquire) != KILLED {
            self.phase.store(BUSY, Ordering::Release);
        }
    }

    /// The request ended at `now`: the connection may wait `keepalive` for its next head.
    pub fn idle(&self, keepalive: Duration, now: std::time::Instant) {
        let now = self.table.ms_at(Instant::from_std(now));
        self.idle_since_ms.store(now, Ordering::Relaxed);
        self.deadline_ms
            .store(now + keepalive.as_millis() as u64, Ordering::Release);
        if self.phase.load(Ordering::Acquire) != KILLED {
            self.phase.store(IDLE, Ordering::Release);
        }
    }

    /// Close the connection if it is idle (or, in the admin table, has not sent a byte): its
    /// next read sees the end of the stream.
    fn kill(&self) -> bool {
        let from = self.phase.load(Ordering::Acquire);
        if from != IDLE && !(from == FRESH && self.table.evict_silent) {
            return false;
        }
        let killed = self
            .phase
            .compare_exchange(from, KILLED, Ordering::AcqRel, Ordering::Acquire)
            .is_ok();
        if killed {
            // Woken by reference: the waker stays, as the stream remembers leaving it.
            if let Some(w) = self.waker.lock().as_ref() {
                w.wake_by_ref();
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
        if from == IDLE || from == FRESH {
            // Not a store: an idle connection may be killed meanwhile.
            let _ = self
                .phase
                .compare_exchange(from, HEAD, Ordering::AcqRel, Ordering::Acquire);
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Requests in flight are the connections with a head arriving or a request running,
    /// counted when asked.
    #[test]
    fn requests_in_flight_are_the_connections_with_a_head_arriving_or_a_request_running() {
        let table = Connections::new(10, Duration::from_secs(5), 65_536);
        let (a, b) = (table.admit(None).unwrap(), table.admit(None).unwrap());
        assert_eq!((table.in_flight(), table.fresh()), (0, 2));
        a.head_started();
        assert_eq!((table.in_flight(), table.fresh()), (1, 1));
        a.busy();
        b.head_started();
        assert_eq!(table.in_flight(), 2);
        a.idle(Duration::from_secs(5), std::time::Instant::now());
        assert_eq!(table.in_flight(), 1);
        a.head_started();
        assert_eq!(table.in_flight(), 2);
        table.close(&b);
        assert_eq!((table.in_flight(), table.fresh(), table.open()), (1, 0, 1));
    }

    /// At the cap the proxy's table refuses a new connection while the others have sent
    /// nothing; the admin table closes the oldest of them instead.
    #[test]
    fn at_the_cap_only_the_admin_table_closes_a_silent_connection() {
        let proxy = Connections::new(2, Duration::from_secs(5), 65_536);
        let (_a, _b) = (proxy.admit(None).unwrap(), proxy.admit(None).unwrap());
        assert!(proxy.admit(None).is_none());
        let admin = Connections::admin(2, Duration::from_secs(5), 65_536);
        let a = admin.admit(None).unwrap();
        std::thread::sleep(Duration::from_millis(2));
        let b = admin.admit(None).unwrap();
        b.head_started();
        let c = admin.admit(None).expect("the silent one made room");
        c.head_started();
        assert_eq!(a.phase.load(Ordering::Acquire), KILLED);
        assert_eq!(
            b.phase.load(Ordering::Acquire),
            HEAD,
            "a head arriving is kept"
        );
        assert!(admin.admit(None).is_none(), "no silent or idle one left");
    }
}
