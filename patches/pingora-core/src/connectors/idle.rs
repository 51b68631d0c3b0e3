// Copyright 2026 Cloudflare, Inc.
//
// Licensed under the Apache License, Version 2.0 (the "License");
// you may not use this file except in compliance with the License.
// You may obtain a copy of the License at
//
// http://www.apache.org/licenses/LICENSE-2.0
//
// Unless required by applicable law or agreed to in writing, software
// distributed under the License is distributed on an "AS IS" BASIS,
// WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
// See the License for the specific language governing permissions and
// limitations under the License.

//! The idle connections of a [super::TransportConnector]'s pool, watched by one task per
//! connector instead of one task per released connection.
//!
//! A released connection is put in the pool with the time its idle timeout ends, and noted
//! here. Every [SWEEP_INTERVAL], one task tests each noted connection that is still in the
//! pool: one past its idle timeout, closed or reset by its peer, or holding data nobody asked
//! for is taken out of the pool and closed. A connection is never reused past its idle
//! timeout ([PooledStream::expired] is checked on reuse), and its liveness is tested again on
//! reuse, as before.

use super::test_reusable_stream;
use crate::protocols::{Stream, UniqueIDType};
use crate::utils::coarse_time;
use parking_lot::Mutex as SyncMutex;
use pingora_pool::{ConnectionMeta, ConnectionPool};
use std::collections::HashMap;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, ReadBuf};
use tokio::sync::Mutex;

/// How often the idle connections are swept: a connection past its idle timeout, or closed by
/// its peer, is closed within this much time (and never reused meanwhile).
pub const SWEEP_INTERVAL: Duration = Duration::from_secs(1);

/// A connection in the pool, and the time from which it must not be reused.
pub(crate) struct PooledStream {
    pub(crate) stream: Stream,
    /// On the coarse monotonic clock (see [coarse_time]): an idle timeout is counted in
    /// seconds, and a connection is released and reused once per request.
    deadline: Option<Duration>,
}

impl PooledStream {
    /// `stream`, released now, to be closed after `idle_timeout` (`None`: kept until reused,
    /// evicted or closed by its peer).
    pub(crate) fn new(stream: Stream, idle_timeout: Option<Duration>) -> Self {
        PooledStream {
            stream,
            deadline: idle_timeout.map(|t| coarse_time::monotonic() + t),
        }
    }

    /// Whether the idle timeout has passed (the clock is read only when there is one).
    pub(crate) fn expired(&self) -> bool {
        self.deadline.is_some() && self.expired_at(coarse_time::monotonic())
    }

    fn expired_at(&self, now: Duration) -> bool {
        self.deadline.is_some_and(|d| now >= d)
    }
}

// `ConnectionPool::idle_poll` reads from the connection it watches.
impl AsyncRead for PooledStream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

pub(crate) type Pooled = Arc<Mutex<PooledStream>>;
pub(crate) type Pool = ConnectionPool<Pooled>;

/// The connections released to one pool, for its sweeping task.
#[derive(Default)]
pub(crate) struct IdleWatch {
    /// By connection id: a connection released again replaces its own entry. Hashed with
    /// aHash, not SipHash: ids are file descriptors, not chosen by a client.
    released: SyncMutex<HashMap<UniqueIDType, Watched, ahash::RandomState>>,
    /// Whether the sweeping task runs.
    sweeping: AtomicBool,
}

struct Watched {
    meta: ConnectionMeta,
    /// Gone once the connection left the pool: reused, evicted or closed.
    conn: Weak<Mutex<PooledStream>>,
}

impl IdleWatch {
    /// Note the connection `conn` refers to, just put in `pool` as `meta`. The first one
    /// starts the sweeping task.
    pub(crate) fn watch(
        self: &Arc<Self>,
        pool: &Arc<Pool>,
        meta: ConnectionMeta,
        conn: Weak<Mutex<PooledStream>>,
        unexpected_data_conn_count: &Arc<AtomicU64>,
    ) {
        self.released.lock().insert(meta.id, Watched { meta, conn });
        if !self.sweeping.load(Ordering::Relaxed) && !self.sweeping.swap(true, Ordering::AcqRel) {
            let sweeper = Sweeper {
                watch: Arc::downgrade(self),
                pool: Arc::downgrade(pool),
                unexpected_data_conn_count: unexpected_data_conn_count.clone(),
            };
            pingora_runtime::current_handle().spawn(sweeper.run());
        }
    }

    /// Take out of `pool` and close every noted connection that is past its idle timeout,
    /// closed or reset by its peer, or holding unexpected data. Returns how many it closed.
    pub(crate) fn sweep(&self, pool: &Pool, unexpected_data_conn_count: &AtomicU64) -> usize {
        let mut closing = Vec::new();
        let now = coarse_time::monotonic();
        self.released.lock().retain(|_, w| {
            let Some(conn) = w.conn.upgrade() else {
                return false; // no longer in the pool
            };
            let Ok(mut idle) = conn.try_lock() else {
                return true; // being taken for reuse, which tests it itself
            };
            if idle.expired_at(now)
                || !test_reusable_stream(&mut idle.stream, unexpected_data_conn_count)
            {
                closing.push(w.meta.clone());
                return false;
            }
            true
        });
        // Out of the pool, which drops the last reference: the connection closes.
        for meta in &closing {
            pool.pop_closed(meta);
        }
        closing.len()
    }

    #[cfg(test)]
    pub(crate) fn watched(&self) -> usize {
        self.released.lock().len()
    }
}

/// The sweeping task of one pool. It ends when its connector is dropped; if its runtime
/// drops it first, the next connection released starts another.
struct Sweeper {
    watch: Weak<IdleWatch>,
    pool: Weak<Pool>,
    unexpected_data_conn_count: Arc<AtomicU64>,
}

impl Sweeper {
    async fn run(self) {
        loop {
            pingora_timeout::sleep(SWEEP_INTERVAL).await;
            let (Some(watch), Some(pool)) = (self.watch.upgrade(), self.pool.upgrade()) else {
                return;
            };
            watch.sweep(&pool, &self.unexpected_data_conn_count);
        }
    }
}

impl Drop for Sweeper {
    fn drop(&mut self) {
        if let Some(watch) = self.watch.upgrade() {
            watch.sweeping.store(false, Ordering::Release);
        }
    }
}

#[cfg(all(test, unix))]
mod tests {
    use super::*;
    use crate::connectors::{ConnectorOptions, TransportConnector};
    use crate::upstreams::peer::{BasicPeer, Peer};
    use std::sync::atomic::AtomicUsize;
    use std::time::Instant;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::{TcpListener, TcpStream};

    /// A listener on loopback and a peer for it.
    async fn upstream() -> (TcpListener, BasicPeer) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let peer = BasicPeer::new(&listener.local_addr().unwrap().to_string());
        (listener, peer)
    }

    /// A new connection to `peer`, and the upstream's end of it.
    async fn connect(
        connector: &TransportConnector,
        listener: &TcpListener,
        peer: &BasicPeer,
    ) -> (Stream, TcpStream) {
        let stream = connector.new_stream(peer).await.unwrap();
        let (upstream_end, _) = listener.accept().await.unwrap();
        (stream, upstream_end)
    }

    /// A new connection to `peer`, released to the pool to idle for `idle_timeout`, and the
    /// upstream's end of it.
    async fn released(
        connector: &TransportConnector,
        listener: &TcpListener,
        peer: &BasicPeer,
        idle_timeout: Option<Duration>,
    ) -> TcpStream {
        let (stream, end) = connect(connector, listener, peer).await;
        connector.release_stream(stream, peer.reuse_hash(), idle_timeout);
        end
    }

    fn tasks() -> usize {
        tokio::runtime::Handle::current()
            .metrics()
            .num_alive_tasks()
    }

    /// Whether the upstream's end sees its connection closed by the connector within
    /// `within`: the end of the stream, or a reset (closing a socket with unread data resets
    /// it).
    async fn closed_within(upstream_end: &mut TcpStream, within: Duration) -> bool {
        let mut buf = [0u8; 1];
        matches!(
            tokio::time::timeout(within, upstream_end.read(&mut buf)).await,
            Ok(Ok(0) | Err(_))
        )
    }

    #[tokio::test]
    async fn released_connections_share_one_task_and_are_reused() {
        let connector = TransportConnector::new(None);
        let (listener, peer) = upstream().await;
        // The upstream's ends, kept open while the connections idle.
        let mut ends = Vec::new();
        let mut ids = Vec::new();
        for _ in 0..3 {
            let (stream, end) = connect(&connector, &listener, &peer).await;
            ids.push(stream.id());
            ends.push(end);
            connector.release_stream(stream, peer.reuse_hash(), Some(Duration::from_secs(60)));
        }
        assert_eq!(tasks(), 1, "one sweeping task for three idle connections");
        assert_eq!(connector.idle.watched(), 3);

        // A sweep keeps connections that are within their timeout and open.
        let swept = connector.idle.sweep(
            &connector.connection_pool,
            &connector.unexpected_data_conn_count,
        );
        assert_eq!(swept, 0);
        let mut reused = Vec::new();
        for _ in 0..3 {
            let (stream, was_reused) = connector.get_stream(&peer).await.unwrap();
            assert!(was_reused);
            reused.push(stream.id());
        }
        reused.sort();
        ids.sort();
        assert_eq!(reused, ids);
        // Reused connections are forgotten by the next sweep.
        connector.idle.sweep(
            &connector.connection_pool,
            &connector.unexpected_data_conn_count,
        );
        assert_eq!(connector.idle.watched(), 0);

        // The task ends after its connector is dropped.
        drop(connector);
        tokio::time::sleep(SWEEP_INTERVAL + Duration::from_millis(500)).await;
        assert_eq!(tasks(), 0);
    }

    #[tokio::test]
    async fn a_connection_its_peer_closes_is_closed_by_the_sweep() {
        let connector = TransportConnector::new(None);
        let (listener, peer) = upstream().await;
        let mut end = released(&connector, &listener, &peer, None).await;
        // The upstream closes its side of the idle connection; the sweeping task closes ours.
        end.shutdown().await.unwrap();
        assert!(closed_within(&mut end, 3 * SWEEP_INTERVAL).await);
        assert_eq!(connector.idle.watched(), 0);
        assert!(connector.reused_stream(&peer).await.is_none());
    }

    #[tokio::test]
    async fn a_connection_past_its_idle_timeout_is_never_reused_and_is_closed() {
        let connector = TransportConnector::new(None);
        let (listener, peer) = upstream().await;
        let idle_timeout = Duration::from_millis(100);

        // Asked for after its timeout, before a sweep came: not reused, and closed.
        let mut end = released(&connector, &listener, &peer, Some(idle_timeout)).await;
        tokio::time::sleep(2 * idle_timeout).await;
        assert!(connector.reused_stream(&peer).await.is_none());
        assert!(closed_within(&mut end, Duration::from_millis(100)).await);

        // Left alone: closed by a sweep, and not before its timeout.
        let (stream, mut end) = connect(&connector, &listener, &peer).await;
        let released = Instant::now();
        connector.release_stream(stream, peer.reuse_hash(), Some(idle_timeout));
        assert!(closed_within(&mut end, 3 * SWEEP_INTERVAL).await);
        assert!(released.elapsed() >= idle_timeout);
        assert!(connector.reused_stream(&peer).await.is_none());
    }

    #[tokio::test]
    async fn a_connection_with_unexpected_data_is_closed_by_the_sweep() {
        let connector = TransportConnector::new(None);
        let (listener, peer) = upstream().await;
        let mut end = released(&connector, &listener, &peer, None).await;
        end.write_all(b"HTTP/1.1 200 OK\r\n\r\n").await.unwrap();
        assert!(closed_within(&mut end, 3 * SWEEP_INTERVAL).await);
        assert_eq!(
            connector.unexpected_data_conn_count.load(Ordering::Relaxed),
            1
        );
    }

    /// With a pool callback, each idle connection keeps a task of its own, which tells the
    /// callback when its connection is evicted.
    #[tokio::test]
    async fn a_pool_callback_hears_of_evictions() {
        let evicted = Arc::new(AtomicUsize::new(0));
        let mut options = ConnectorOptions::new(1);
        let counter = evicted.clone();
        options.keepalive_pool_callback = Some(Arc::new(move |_idle| {
            counter.fetch_add(1, Ordering::Relaxed);
        }));
        let connector = TransportConnector::new(Some(options));
        let (listener, peer) = upstream().await;
        let (first, mut first_end) = connect(&connector, &listener, &peer).await;
        let (second, _second_end) = connect(&connector, &listener, &peer).await;
        connector.release_stream(first, peer.reuse_hash(), None);
        assert_eq!(tasks(), 1);
        // A pool of one: the second evicts the first.
        connector.release_stream(second, peer.reuse_hash(), None);
        assert!(closed_within(&mut first_end, Duration::from_secs(2)).await);
        tokio::task::yield_now().await;
        assert_eq!(evicted.load(Ordering::Relaxed), 1);
        assert_eq!(tasks(), 1, "the second connection's own task");
        assert_eq!(connector.idle.watched(), 0);
    }
}
