//! The file format: serde structs that mirror `gateway.yaml` one to one.
//!
//! Nothing here is trusted or defaulted; the section files of [`super`] turn these into
//! runtime types.
//! Every struct denies unknown keys, so a misspelled `limt:` is an error, not a silently
//! missing limit.

use serde::Deserialize;

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Server {
    pub listen: Option<String>,
    pub admin_listen: Option<String>,
    /// Worker threads of the proxy; defaults to the number of CPUs.
    pub threads: Option<usize>,
    /// One work-stealing runtime for all threads (`true`) or one single-threaded runtime per
    /// thread (`false`); defaults to `true` with more than one thread.
    pub work_stealing: Option<bool>,
    /// How long in-flight requests get to finish on shutdown.
    pub grace_period: Option<String>,
    /// How long the proxy keeps serving (with `Connection: close`) after SIGTERM/SIGINT.
    pub drain_period: Option<String>,
    /// The whole head of every request must arrive within this.
    pub header_timeout: Option<String>,
    /// An idle keep-alive connection is closed after this.
    pub keepalive_timeout: Option<String>,
    /// Connections the proxy listener holds at most.
    pub max_connections: Option<usize>,
    /// Idle upstream connections kept for reuse per worker thread, over all upstreams.
    pub upstream_keepalive_pool: Option<usize>,
    pub max_request_header_bytes: Option<usize>,
    pub max_uri_bytes: Option<usize>,
    pub max_body_bytes: Option<u64>,
    /// `normalize` (default) or `reject`.
    pub path_normalization: Option<String>,
    /// `keep` (default) or `reject`.
    pub escaped_slashes: Option<String>,
    /// The Unix socket a `--upgrade` process takes the listening sockets over through.
    pub upgrade_sock: Option<String>,
    /// Forward HTTP/1 header names with the case they arrived in; defaults to `false`.
    pub preserve_header_case: Option<bool>,
    /// `/readyz` answers 503 while the store is unreachable; defaults to `false`.
    pub ready_requires_store: Option<bool>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Store {
    pub backend: Option<String>,
    pub url: Option<String>,
    pub timeout: Option<String>,
    pub key_prefix: Option<String>,
    pub on_error: Option<String>,
    /// Memory store: the most keys it keeps before evicting those closest to expiry.
    pub max_keys: Option<usize>,
    /// `redis_cluster`: seed nodes (`redis://host:port`).
    pub cluster_nodes: Option<Vec<String>>,
    /// `redis_sentinel`: the master's name and the sentinels.
    pub sentinel: Option<Sentinel>,
    /// Circuit breaker in front of Redis.
    pub breaker: Option<Breaker>,
    /// `on_error: local` limits admit `limit × local_share` on the local fallback limiter.
    pub local_share: Option<f64>,
    /// Redis: answer callers already over a limit from this gateway's memory.
    pub over_limit_cache: Option<OverLimitCache>,
    /// Quota leasing for every limit that can lease and sets none of its own.
    pub lease: Option<Lease>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Lease {
    /// The most units one store call takes for a caller (the request's own included).
    pub max: u64,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OverLimitCache {
    /// The most denials kept (0: off).
    pub max_entries: Option<usize>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Breaker {
    pub failures: Option<u32>,
    pub failure_ratio: Option<f64>,
    pub min_calls: Option<u32>,
    pub window: Option<String>,
    pub cooldown: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Sentinel {
    pub master_name: String,
    pub nodes: Vec<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Identity {
    pub api_key_header: Option<String>,
    pub trusted_proxies: Option<Vec<String>>,
    /// Per-IP counters group IPv6 clients by this prefix length (default 64).
    pub ipv6_prefix: Option<i64>,
    pub jwt: Option<Jwt>,
    /// Keys neither in `api_keys` nor in the quota store get 401 instead of `default_tier`.
    pub require_known_keys: Option<bool>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Jwt {
    pub header: Option<String>,
    pub hs256_secret_env: String,
    pub user_claim: Option<String>,
    pub tier_claim: Option<String>,
    /// Clock skew allowed when checking `exp` and `nbf` (default 0s).
    pub leeway: Option<String>,
    /// The `aud` values accepted: a string or a list of strings.
    pub audience: Option<serde_yaml::Value>,
    /// The `iss` values accepted: a string or a list of strings.
    pub issuer: Option<serde_yaml::Value>,
    /// Refuse tokens without `exp` (default true).
    pub require_exp: Option<bool>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Limit {
    pub name: String,
    /// `rate` (default) or `concurrency`.
    pub kind: Option<String>,
    pub key: Option<Vec<String>>,
    pub algorithm: Option<String>,
    pub limit: u64,
    /// Rate limits only (and required there).
    pub window: Option<String>,
    /// Concurrency limits only (and required there): how long a slot is held at most.
    pub timeout: Option<String>,
    pub burst: Option<u64>,
    pub anonymous_only: Option<bool>,
    pub shadow: Option<bool>,
    pub on_error: Option<String>,
    /// Rate limits only: whether the over-limit cache may answer for it (default true).
    pub over_limit_cache: Option<bool>,
    /// Rate limits only: quota leasing (`{ max: 50 }`), overriding `store.lease`.
    pub lease: Option<Lease>,
    /// Top-level limits only: the routes the limit applies to (all when absent).
    pub routes: Option<Vec<String>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Route {
    pub name: String,
    #[serde(rename = "match")]
    pub matcher: Match,
    pub upstream: String,
    pub cost: Option<u64>,
    /// The priority class for load shedding: critical, post, get or test (default: by method).
    pub priority: Option<String>,
    /// Overrides `server.max_body_bytes` for this route.
    pub max_body_bytes: Option<u64>,
    pub limits: Option<Vec<serde_yaml::Value>>,
}

/// An upstream written as a mapping (a plain list is just its servers).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Upstream {
    pub servers: Vec<String>,
    pub timeouts: Option<Timeouts>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Timeouts {
    pub connect: Option<String>,
    pub read: Option<String>,
    pub write: Option<String>,
    pub idle: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Match {
    pub methods: Option<Vec<String>>,
    pub path_prefix: Option<String>,
    pub host: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Headers {
    pub ietf: Option<bool>,
    pub legacy: Option<bool>,
    pub on_admitted: Option<bool>,
}

/// `shedding`: priority load shedding by requests in flight.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Shedding {
    pub max_in_flight: u64,
    pub thresholds: Option<Thresholds>,
    pub test_traffic: Option<TestTraffic>,
}

/// Fractions of `max_in_flight` at which each class is shed (`critical` never is).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Thresholds {
    pub test: Option<f64>,
    pub get: Option<f64>,
    pub post: Option<f64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TestTraffic {
    pub header: Option<String>,
    pub api_key_prefix: Option<String>,
}

/// `quotas`: per-key overrides in a database.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Quotas {
    pub database: String,
    pub refresh: Option<String>,
}

// ---- observability (issue 12) ----

/// `access_log`: one line per request, written off the request path.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AccessLog {
    pub enabled: Option<bool>,
    /// `text` or `json` (default: `json` with `--log-format json`, else `text`).
    pub format: Option<String>,
    /// A file to append to (default: standard output).
    pub path: Option<String>,
    /// The fraction of requests logged, in (0, 1].
    pub sample: Option<f64>,
    /// Lines waiting for the writer at most; more are dropped and counted.
    pub buffer: Option<usize>,
}

/// `admin`: the admin listener's authentication.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Admin {
    /// The environment variable that holds the admin bearer token.
    pub token_env: Option<String>,
    /// Host names the admin listener answers to, besides IP literals and `localhost`.
    pub allowed_hosts: Option<Vec<String>>,
    /// Connections the admin listener holds at most.
    pub max_connections: Option<usize>,
}

// ---- end observability ----

/// The top-level keys, in the order they are read and reported.
pub const SECTIONS: &[&str] = &[
    "server",
    "store",
    "identity",
    "tiers",
    "api_keys",
    "default_tier",
    "upstreams",
    "routes",
    "limits",
    "shedding",
    "headers",
    "quotas",
    "access_log",
    "admin",
];
