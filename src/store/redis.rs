//! The Redis store: counters shared by every gateway instance.
//!
//! All of a request's limits are checked by one call of one Lua script (EVALSHA; on NOSCRIPT
//! the script is loaded and that call retried once, which is safe because NOSCRIPT means it
//! did not run). There is one script per algorithm and one for requests that mix algorithms
//! (see [`SCRIPTS`]). The script reads the clock with `TIME`, so gateway clocks do not matter,
//! checks every limit, and consumes only if all enforcing limits admit.
//!
//! Keys: `{<prefix>:<limit>:<hash>}:<algorithm>` (`sw`, `fw`, `log`, `tb`, `gcra`), plus a
//! suffix for some algorithms (see `lua/`), so every key of one limit and caller shares one
//! cluster slot. In Redis Cluster the limits of one request can live in different slots: they
//! are grouped per slot, one script call per group, run in sequence and stopped at the first
//! denial. Within a group the check is all-or-nothing; across groups a denial in a later group
//! does not undo what earlier groups consumed.
//!
//! Phase: `request_filter`. Every call has its own deadline (`store.timeout`), kept by the
//! store's one timer thread ([`super::deadlines`]).

use std::pin::pin;
use std::time::Duration;

use arc_swap::ArcSwapOption;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::cluster_async::ClusterConnection;
use redis::sentinel::{SentinelClient, SentinelServerType};
use redis::{FromRedisValue, RedisError, Script};
use std::sync::{Arc, LazyLock};
use tokio::sync::Mutex as AsyncMutex;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Instant;

use super::breaker::{Admission, Breaker, State as BreakerState, Transition};
use super::deadlines::{Deadlines, Elapsed};
use super::{Check, ErrorKind, Local, StoreError, FALLBACK_MAX_KEYS};
use crate::config::{BreakerSettings, Topology};
use crate::limit::Algorithm;
use call::Call;

/// One script call (EVALSHA, NOSCRIPT handled), built without per-argument allocations.
mod call;
/// Rate-limit checks, with quota leases: the check script's calls.
mod check;
/// Concurrency slots (`kind: concurrency`): their own take and release scripts.
mod concurrency;
/// Over-limit cache invalidations over pub/sub.
mod invalidate;
pub use check::Took;
/// Leased units given back.
mod lease;
/// Usage read and reset, for the quota admin API.
mod usage;

/// A check script: the prelude, the given algorithm files, and the all-or-nothing dispatcher.
macro_rules! check_script {
    ($($algorithm:literal),+) => {
        concat!(
            include_str!("../../lua/prelude.lua"),
            $(include_str!(concat!("../../lua/", $algorithm, ".lua")),)+
            include_str!("../../lua/check.lua"),
        )
    };
}

/// The check scripts, indexed by `algorithm_code - 1`: one per algorithm, for the calls
/// whose limits all use it (nearly all: most requests have one limit). Each carries only its
/// own algorithm, because every call runs the whole script body, and defining unused
/// algorithms costs Redis time on every call.
pub const SCRIPTS: [&str; 5] = [
    check_script!("sliding_window"),
    check_script!("fixed_window"),
    check_script!("sliding_log"),
    check_script!("token_bucket"),
    check_script!("gcra"),
];

/// The check script for calls whose limits mix algorithms: all five.
pub const MIXED_SCRIPT: &str = check_script!(
    "sliding_window",
    "fixed_window",
    "sliding_log",
    "token_bucket",
    "gcra"
);

/// The scripts with their SHA1s, computed once per process.
struct Scripts {
    by_algorithm: [Script; 5],
    mixed: Script,
}

static CHECK_SCRIPTS: LazyLock<Scripts> = LazyLock::new(|| Scripts {
    by_algorithm: SCRIPTS.map(Script::new),
    mixed: Script::new(MIXED_SCRIPT),
});

impl Scripts {
    /// The script for the checks at `idx`: their algorithm's, or the mixed one.
    fn for_checks(&self, checks: &[Check], idx: &[usize]) -> &Script {
        let mut algorithms = idx.iter().map(|&i| checks[i].quota.algorithm);
        match algorithms.next() {
            Some(first) if algorithms.all(|a| a == first) => {
                &self.by_algorithm[usize::from(algorithm_code(first)) - 1]
            }
            Some(_) => &self.mixed,
            None => &self.by_algorithm[0],
        }
    }
}

/// `rediss://` uses rustls with the `ring` provider, installed once per process.
fn install_tls_provider() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // Err means a provider is installed already, which is as good.
        let _ = rustls::crypto::ring::default_provider().install_default();
    });
}

/// How long a connection attempt may take.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);

/// The code the script uses for each algorithm.
pub fn algorithm_code(a: Algorithm) -> u8 {
    match a {
        Algorithm::SlidingWindow => 1,
        Algorithm::FixedWindow => 2,
        Algorithm::SlidingLog => 3,
        Algorithm::TokenBucket => 4,
        Algorithm::Gcra => 5,
    }
}

/// A key's quota as every script reads it: the algorithm's code, limit, window (ms) and
/// burst; the caller adds what its script takes next.
pub(super) fn quota<'s, 'a>(inv: &'s mut Call<'a>, q: &crate::limit::Quota) -> &'s mut Call<'a> {
    inv.arg(algorithm_code(q.algorithm))
        .arg(q.limit)
        .arg(q.window_ms)
        .arg(q.burst)
}

enum Conn {
    Single(redis::Client, Lazy<ConnectionManager>),
    Cluster(Lazy<ClusterConnection>),
    Sentinel(SentinelConn),
}

/// A connection made on first use and again after it fails, one attempt at a time.
struct Lazy<C> {
    current: ArcSwapOption<C>,
    connecting: AsyncMutex<()>,
}

impl<C> Lazy<C> {
    fn new() -> Self {
        Lazy {
            current: ArcSwapOption::empty(),
            connecting: AsyncMutex::new(()),
        }
    }

    /// The current connection, or a new one made by `connect`. Only the first branch runs on
    /// every call; the connecting one is boxed, because a connection's setup future (a
    /// cluster's is kilobytes) would otherwise be part of every call's future, which the
    /// store boxes and so copies whole on every request.
    async fn get<F, Fut>(&self, connect: F) -> Result<Arc<C>, RedisError>
    where
        F: FnOnce() -> Fut,
        Fut: std::future::Future<Output = Result<C, RedisError>>,
    {
        match self.current.load_full() {
            Some(c) => Ok(c),
            None => Box::pin(self.connect(connect)).await,
        }
    }

    /// One attempt at a time: a call that waited for another's takes the connection it made.
    async fn connect<F, Fut>(&self, connect: F) -> Result<Arc<C>, RedisError>
    where
        F: FnOnce() -> Fut,
        Fut: std::future::Future<Output = Result<C, RedisError>>,
    {
        let _one = self.connecting.lock().await;
        if let Some(c) = self.current.load_full() {
            return Ok(c);
        }
        let c = Arc::new(connect().await?);
        self.current.store(Some(c.clone()));
        Ok(c)
    }

    fn reset(&self) {
        self.current.store(None);
    }
}

struct SentinelConn {
    client: AsyncMutex<SentinelClient>,
    master: Lazy<ConnectionManager>,
}

pub struct RedisStore {
    conn: Conn,
    topology: Topology,
    prefix: String,
    /// The deadlines of calls that wait `store.timeout` ([`RedisStore::timeout`]): one timer
    /// thread, not a timer per call.
    deadlines: Deadlines,
    /// Production: false, the script reads Redis's clock. Tests replaying decision sequences
    /// pass their own time.
    explicit_time: bool,
    breaker: Breaker,
    /// The in-process counters and slots that limits with `on_error: local` fall back to.
    pub fallback: Local,
    pub stats: RedisStats,
    /// The last store call succeeded.
    healthy: AtomicBool,
}

/// A single node's connection that has answered nothing for this long while a call missed its
/// deadline is replaced: its replies may have stopped for good (a peer gone without a reset,
/// a half-open connection), which nothing else would notice. Only answers within a deadline
/// are seen (a later reply is discarded by the client), so a Redis slower than every deadline
/// looks the same and is reconnected to once per this period too: long enough that this stays
/// rare, short enough that a dead connection is not kept for long.
const SILENT_CONNECTION: Duration = Duration::from_secs(5);

/// Counters of the store's failures, for `/readyz` and logs.
#[derive(Debug, Default)]
pub struct RedisStats {
    /// Calls that failed (timeout, connection, server error).
    pub failures: AtomicU64,
    /// Calls not made because the breaker was open.
    pub rejected: AtomicU64,
    /// Times the breaker opened.
    pub opened: AtomicU64,
    /// Times it went half-open (a probe), and closed again.
    pub half_opened: AtomicU64,
    pub closed: AtomicU64,
    /// Failed calls by kind: timeout, connection, script, other (`ErrorKind` order).
    pub errors: [AtomicU64; 4],
}

/// The connection manager of a single node or a Sentinel master. It has no response timeout
/// of its own: every call runs under [`RedisStore::guarded`]'s deadline, which is never later
/// (the client's was `max(timeout, 100 ms)`), and a second timer per call cost about 1.1k
/// instructions per Redis-store check (`loadtest/log/2026-11-25-redis-calling-side.md`). A
/// call that misses the deadline
/// is dropped, as the client's timeout would drop it; either way its reply is discarded when it
/// comes. A connection that stops answering altogether is replaced by
/// [`RedisStore::on_deadline`].
fn manager_config() -> ConnectionManagerConfig {
    ConnectionManagerConfig::new()
        .set_connection_timeout(Some(CONNECT_TIMEOUT))
        .set_response_timeout(None)
        .set_number_of_retries(2)
        .set_max_delay(Duration::from_secs(2))
}

impl RedisStore {
    /// Set up the store. No connection is made yet: the first check connects, so the gateway
    /// starts while Redis is down (`/readyz` says it is unreachable).
    pub fn new(topology: Topology, prefix: &str, timeout: Duration) -> Result<Self, StoreError> {
        install_tls_provider();
        let bad = StoreError::Other;
        let conn = match &topology {
            Topology::Single { url } => {
                // The manager (and its driver task) is made on first use, inside the runtime
                // that serves requests.
                Conn::Single(redis::Client::open(url.as_str()).map_err(bad)?, Lazy::new())
            }
            Topology::Cluster { .. } => Conn::Cluster(Lazy::new()),
            Topology::Sentinel {
                master_name,
                nodes,
                url,
            } => {
                let info = url
                    .as_deref()
                    .map(redis::IntoConnectionInfo::into_connection_info)
                    .transpose()
                    .map_err(bad)?;
                let node_info = redis::sentinel::SentinelNodeConnectionInfo::default();
                let node_info = match info {
                    Some(i) => node_info.set_redis_connection_info(i.redis_settings().clone()),
                    None => node_info,
                };
                let client = SentinelClient::build(
                    nodes.clone(),
                    master_name.clone(),
                    Some(node_info),
                    SentinelServerType::Master,
                )
                .map_err(bad)?;
                Conn::Sentinel(SentinelConn {
                    client: AsyncMutex::new(client),
                    master: Lazy::new(),
                })
            }
        };
        Ok(RedisStore {
            conn,
            topology,
            prefix: prefix.to_string(),
            deadlines: Deadlines::new(timeout),
            explicit_time: false,
            breaker: Breaker::new(BreakerSettings::default(), Instant::now()),
            fallback: Local::new(FALLBACK_MAX_KEYS),
            stats: RedisStats::default(),
            healthy: AtomicBool::new(true),
        })
    }

    /// Use these circuit-breaker settings.
    pub fn with_breaker(mut self, settings: BreakerSettings) -> Self {
        self.breaker = Breaker::new(settings, Instant::now());
        self
    }

    /// The breaker's state now.
    pub fn breaker_state(&self) -> BreakerState {
        self.breaker.state()
    }

    fn log_transition(&self, t: Option<Transition>) {
        match t {
            Some(Transition::Opened) => {
                self.stats.opened.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(
                    "redis circuit breaker opened: store calls fail fast until the cooldown ends"
                );
            }
            Some(Transition::HalfOpened) => {
                self.stats.half_opened.fetch_add(1, Ordering::Relaxed);
                tracing::info!("redis circuit breaker half-open: probing");
            }
            Some(Transition::Closed) => {
                self.stats.closed.fetch_add(1, Ordering::Relaxed);
                tracing::info!("redis circuit breaker closed: redis answers again")
            }
            None => {}
        }
    }

    /// Decide with the caller's `now` instead of Redis's clock (for replaying sequences).
    pub fn with_explicit_time(mut self) -> Self {
        self.explicit_time = true;
        self
    }

    /// Every call's deadline, `store.timeout` (kept once, by the deadlines).
    fn timeout(&self) -> Duration {
        self.deadlines.after()
    }

    /// One call through the circuit breaker, with a deadline.
    async fn guarded<T: FromRedisValue>(
        &self,
        inv: &Call<'_>,
        deadline: Duration,
    ) -> Result<T, StoreError> {
        let started = Instant::now();
        let (admission, t) = self.breaker.admit(started);
        self.log_transition(t);
        if admission == Admission::Reject {
            self.stats.rejected.fetch_add(1, Ordering::Relaxed);
            return Err(StoreError::CircuitOpen);
        }
        let call = pin!(self.invoke(inv));
        let outcome = if deadline == self.timeout() {
            self.deadlines.within(started, call).await
        } else {
            // The few calls with a longer deadline (readiness, invalidation).
            tokio::time::timeout(deadline, call)
                .await
                .map_err(|_| Elapsed)
        };
        // A success is dated when the call started: one clock read fewer per call, and what
        // the date is for (the breaker's window, the connection's last answer) counts seconds,
        // where a call takes at most its deadline.
        let now = match outcome {
            Ok(Ok(_)) => started,
            _ => Instant::now(),
        };
        let result = match outcome {
            Err(_) => {
                self.on_deadline(now);
                Err(StoreError::Timeout(deadline))
            }
            Ok(Err(e)) => {
                if matches!(e.kind(), redis::ErrorKind::Server(_)) {
                    self.breaker.answered(now);
                }
                self.on_error(&e);
                Err(StoreError::from_redis(e))
            }
            // Recorded as an answer by the breaker below.
            Ok(Ok(r)) => Ok(r),
        };
        self.log_transition(self.breaker.record(result.is_ok(), now));
        if let Err(e) = &result {
            self.stats.failures.fetch_add(1, Ordering::Relaxed);
            let kind = match e.kind() {
                ErrorKind::Timeout => 0,
                ErrorKind::Connection => 1,
                ErrorKind::Script => 2,
                ErrorKind::Other | ErrorKind::CircuitOpen => 3,
            };
            self.stats.errors[kind].fetch_add(1, Ordering::Relaxed);
            // The first failure after a success starts an outage: the local fallback limiter
            // starts it from empty counters.
            if self.healthy.swap(false, Ordering::Relaxed) {
                self.fallback.counters.clear();
            }
        } else {
            self.healthy.store(true, Ordering::Relaxed);
        }
        result
    }

    async fn invoke<T: FromRedisValue>(&self, inv: &Call<'_>) -> Result<T, RedisError> {
        match &self.conn {
            Conn::Single(client, lazy) => {
                let m = lazy
                    .get(|| async {
                        // A new connection has not been silent yet (`on_deadline`).
                        self.breaker.answered(Instant::now());
                        ConnectionManager::new_lazy_with_config(client.clone(), manager_config())
                    })
                    .await?;
                inv.invoke(&mut (*m).clone()).await
            }
            Conn::Cluster(lazy) => {
                let nodes = match &self.topology {
                    Topology::Cluster { nodes } => nodes.clone(),
                    _ => unreachable!("cluster connection has cluster topology"),
                };
                let timeout = self.timeout();
                let c = lazy
                    .get(|| async move {
                        redis::cluster::ClusterClient::builder(nodes)
                            .connection_timeout(CONNECT_TIMEOUT)
                            .response_timeout(timeout.max(Duration::from_millis(100)))
                            .build()?
                            .get_async_connection()
                            .await
                    })
                    .await?;
                inv.invoke(&mut (*c).clone()).await
            }
            Conn::Sentinel(s) => {
                let m = s
                    .master
                    .get(|| async {
                        let client = s.client.lock().await.async_get_client().await?;
                        ConnectionManager::new_lazy_with_config(client, manager_config())
                    })
                    .await?;
                inv.invoke(&mut (*m).clone()).await
            }
        }
    }

    /// After a connection-level failure or READONLY (a failed-over master), forget the
    /// connection so the next call resolves the topology again.
    fn on_error(&self, e: &RedisError) {
        let broken = e.is_io_error() || e.is_connection_dropped() || e.is_connection_refusal();
        let stale = broken || e.code() == Some("READONLY") || e.is_timeout();
        match &self.conn {
            // The connection manager would hand back its last failed reconnect attempt to the
            // next call (the breaker's probe), so a broken connection is replaced outright.
            Conn::Single(_, l) if broken => l.reset(),
            Conn::Single(..) => {}
            Conn::Cluster(l) if stale => l.reset(),
            Conn::Sentinel(s) if stale => s.master.reset(),
            Conn::Cluster(_) | Conn::Sentinel(_) => {}
        }
    }

    /// A call missed its deadline.
    /// - Sentinel: the master may be stopped rather than dead (it never answers, not even
    ///   READONLY), so ask the sentinels again on the next call.
    /// - A single node: the connection is replaced once it has answered nothing for
    ///   [`SILENT_CONNECTION`]. The client has no response timeout of its own (see
    ///   [`manager_config`]), and a connection whose replies stopped for good would otherwise
    ///   be kept, every call on it missing its deadline. A connection counts as having
    ///   answered when it is made (`invoke`), so a slow first handshake is not cut short, and a
    ///   Redis that stays silent is reconnected to at most once per [`SILENT_CONNECTION`].
    /// - Cluster: left to the cluster client, which keeps its own response timeout of
    ///   `max(timeout, 100 ms)` and node handling; not changed here.
    fn on_deadline(&self, now: Instant) {
        match &self.conn {
            Conn::Sentinel(s) => s.master.reset(),
            Conn::Single(_, l) => {
                if self.breaker.silent_for(now) >= SILENT_CONNECTION {
                    l.reset();
                }
            }
            Conn::Cluster(_) => {}
        }
    }

    /// Breaker state and failure counters, for `/readyz`.
    pub fn status(&self) -> serde_json::Value {
        serde_json::json!({
            "backend": "redis",
            "breaker": match self.breaker_state() {
                BreakerState::Closed => "closed",
                BreakerState::Open { .. } => "open",
                BreakerState::HalfOpen => "half-open",
            },
            "failures": self.stats.failures.load(Ordering::Relaxed),
            "rejected_by_breaker": self.stats.rejected.load(Ordering::Relaxed),
            "breaker_opened": self.stats.opened.load(Ordering::Relaxed),
        })
    }

    /// Whether Redis answers (a script call with no keys) within the deadline, through the
    /// circuit breaker: `false` while the breaker is open; after the cooldown this call can
    /// be the probe that closes it, so the breaker (and `/readyz`) recovers even without
    /// request traffic.
    pub async fn ping(&self) -> bool {
        let mut inv = Call::new(&CHECK_SCRIPTS.by_algorithm[0], std::iter::empty::<&str>());
        inv.arg("");
        self.guarded::<String>(&inv, self.timeout().max(Duration::from_millis(250)))
            .await
            .is_ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The store boxes a Redis check's future, copying it whole, on every request. Its
    /// size is the call's own state: the connection's setup (kilobytes for a cluster's) is
    /// boxed apart, and was 3 KiB of the 4.5 KiB this was before; a cluster's checks (keys as
    /// strings, slot groups, one call per slot) are boxed apart too, and were 0.6 KiB of the
    /// 1.5 KiB after that. The connection manager's send is in it, 1.2 KiB of its 2.1 KiB: not
    /// boxed, it costs a longer copy and saves an allocation, 187 instructions fewer per call.
    #[test]
    fn a_checks_future_holds_no_connection_setup_nor_a_clusters_state() {
        let url = "redis://127.0.0.1:1".to_string();
        let s = RedisStore::new(Topology::Single { url }, "p", Duration::from_millis(50))
            .expect("a store");
        let mut out = crate::store::Decisions::new();
        let size = std::mem::size_of_val(&s.check(&[], 0, &mut out));
        assert!(size < 2560, "a check's future is {size} bytes");
        let inv = Call::new(&CHECK_SCRIPTS.by_algorithm[0], std::iter::empty::<&str>());
        let size = std::mem::size_of_val(&s.invoke::<Vec<u8>>(&inv));
        assert!(size < 2048, "a call's future is {size} bytes");
    }
}
