//! The default of every optional setting of `gateway.yaml`, in one place. docs/configuration.md
//! shows the same values.

use std::time::Duration;

use super::{
    BreakerSettings, EscapedSlashes, HeaderSettings, KeyPart, OnError, PathNormalization,
    UpstreamTimeouts,
};
use crate::limit::Algorithm;

// server
pub const LISTEN: &str = "0.0.0.0:8080";
pub const ADMIN_LISTEN: &str = "127.0.0.1:9901";
/// How long in-flight requests get to finish on shutdown.
pub const GRACE_PERIOD: Duration = Duration::from_secs(5);
/// How long the proxy keeps serving, with `Connection: close`, after SIGTERM or SIGINT.
pub const DRAIN_PERIOD: Duration = Duration::ZERO;
/// The whole head of every request must arrive within this.
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(30);
/// An idle keep-alive connection is closed after this.
pub const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(60);
/// Idle upstream connections kept for reuse per worker thread, all upstreams together
/// (Pingora's own default is 128, which a gateway with more requests in flight than that
/// outgrows: see `ServerSettings::upstream_keepalive_pool`).
pub const UPSTREAM_KEEPALIVE_POOL: usize = 1024;
/// `max_connections` is this share of the open-file limit (after raising soft to hard).
pub const MAX_CONNECTIONS_SHARE: f64 = 0.9;
/// File descriptors kept out of both listeners' caps (listening sockets, logs, the store's and
/// upstreams' connections): `max_connections` defaults to at most the open-file limit less
/// `admin.max_connections` and this.
pub const RESERVED_FILES: usize = 64;
pub const MAX_REQUEST_HEADER_BYTES: usize = 64 * 1024;
pub const MAX_URI_BYTES: usize = 8 * 1024;
pub const PATH_NORMALIZATION: PathNormalization = PathNormalization::Normalize;
pub const ESCAPED_SLASHES: EscapedSlashes = EscapedSlashes::Keep;
/// HTTP/1 header names forwarded titled or lowercase, not as they arrived.
pub const PRESERVE_HEADER_CASE: bool = false;
/// Readiness does not follow the store: a gateway serves by its limits' `on_error` policies
/// while the store is unreachable, and a balancer should keep sending it traffic.
pub const READY_REQUIRES_STORE: bool = false;

// admin
/// Connections the admin listener holds at most (`admin.max_connections`).
pub const ADMIN_MAX_CONNECTIONS: usize = 64;

// upstreams
pub const UPSTREAM_TIMEOUTS: UpstreamTimeouts = UpstreamTimeouts {
    connect: Duration::from_secs(3),
    read: Duration::from_secs(60),
    write: Duration::from_secs(60),
    idle: Duration::from_secs(90),
};

// store
/// Deadline of every store call.
pub const STORE_TIMEOUT: Duration = Duration::from_millis(25);
pub const KEY_PREFIX: &str = "tollgate";
/// The most counters the memory store keeps.
pub const MAX_KEYS: usize = 1_000_000;
/// Denials the over-limit cache keeps at most (`store.over_limit_cache.max_entries`).
pub const OVER_LIMIT_ENTRIES: usize = 100_000;
/// `store.url` of `backend: redis`.
pub const REDIS_URL: &str = "redis://127.0.0.1:6379/0";
/// Failure policy of limits that set none (`store.on_error`).
pub const ON_ERROR: OnError = OnError::Allow;
/// `on_error: local` limits admit `limit × local_share` on the fallback limiter.
pub const LOCAL_SHARE: f64 = 1.0;
pub const BREAKER: BreakerSettings = BreakerSettings {
    failures: 3,
    failure_ratio: 0.5,
    min_calls: 20,
    window: Duration::from_secs(10),
    cooldown: Duration::from_secs(5),
};

// identity
pub const API_KEY_HEADER: &str = "x-api-key";
/// Per-IP limits count IPv6 clients by this prefix length.
pub const IPV6_PREFIX: u8 = 64;
pub const JWT_HEADER: &str = "authorization";
pub const JWT_USER_CLAIM: &str = "sub";
pub const JWT_TIER_CLAIM: &str = "tier";
/// Clock skew allowed when checking `exp` and `nbf`.
pub const JWT_LEEWAY: Duration = Duration::ZERO;

// limits and routes
pub const ALGORITHM: Algorithm = Algorithm::SlidingWindow;
/// The key of a tier's limits that set none; other limits default to `[]`.
pub const TIER_LIMIT_KEY: &[KeyPart] = &[KeyPart::ApiKey];
/// Units each request of a route consumes.
pub const COST: u64 = 1;
pub const PATH_PREFIX: &str = "/";
/// The limit that `--upstream` without a config file runs with.
pub const CATCH_ALL_LIMIT: &str = "{ name: per-ip, key: [client_ip], limit: 600, window: 1m }";
/// The route that `--upstream` without a `routes` section runs with.
pub const CATCH_ALL_ROUTE: &str = "{ name: default, match: { path_prefix: / }, upstream: default }";
/// The upstream `--upstream` defines.
pub const FLAG_UPSTREAM: &str = "default";

// quotas
/// Every gateway reloads the overrides this often.
pub const QUOTA_REFRESH: Duration = Duration::from_secs(30);

// shedding
/// `shedding.thresholds` of `test`, `get` and `post`.
pub const SHED_THRESHOLDS: [f64; 3] = [0.7, 0.8, 0.9];

// headers
pub const HEADERS: HeaderSettings = HeaderSettings {
    ietf: true,
    legacy: true,
    on_admitted: true,
};

// access_log
pub const ACCESS_LOG_ENABLED: bool = true;
/// Every request is logged.
pub const ACCESS_LOG_SAMPLE: f64 = 1.0;
/// Lines waiting for the writer at most; more are dropped (and counted).
pub const ACCESS_LOG_BUFFER: usize = 8192;
