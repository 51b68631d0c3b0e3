//! Configuration: `gateway.yaml` parsed into [`raw`] structs, then validated into the typed
//! runtime [`Config`] that every request reads through one [`arc_swap`] snapshot.
//!
//! Phase: startup and reload only. Nothing here runs per request except reading the
//! already-built [`Config`].

pub mod raw;
pub mod reload;
mod validate;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use http::header::HeaderName;
use http::{HeaderValue, Method};
use ipnet::IpNet;

use crate::limit::Quota;

pub use validate::{from_yaml, Overrides};

/// Defaults of every optional setting, in one place (documented in the README).
pub mod defaults {
    pub const LISTEN: &str = "0.0.0.0:8080";
    pub const ADMIN_LISTEN: &str = "127.0.0.1:9901";
    pub const STORE_TIMEOUT_MS: u64 = 25;
    pub const KEY_PREFIX: &str = "tollgate";
    pub const MAX_KEYS: usize = 1_000_000;
    pub const REDIS_URL: &str = "redis://127.0.0.1:6379/0";
    pub const API_KEY_HEADER: &str = "x-api-key";
    pub const IPV6_PREFIX: u8 = 64;
    pub const JWT_HEADER: &str = "authorization";
    pub const JWT_USER_CLAIM: &str = "sub";
    pub const JWT_TIER_CLAIM: &str = "tier";
    pub const GRACE_PERIOD_S: u64 = 5;
    /// The limit that `--upstream` without a config file runs with.
    pub const CATCH_ALL_LIMIT: &str = "{ name: per-ip, key: [client_ip], limit: 600, window: 1m }";
    /// `shedding.thresholds` of `test`, `get` and `post`.
    pub const SHED_THRESHOLDS: [f64; 3] = [0.7, 0.8, 0.9];
}

/// Every error found in one file, each already prefixed with the file and the field path.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}", .0.join("\n"))]
pub struct ConfigErrors(pub Vec<String>);

/// Read and validate a config file.
pub fn load(path: &Path, overrides: &Overrides) -> Result<Config, ConfigErrors> {
    let label = path.display().to_string();
    let text = std::fs::read_to_string(path)
        .map_err(|e| ConfigErrors(vec![format!("{label}: cannot read: {e}")]))?;
    from_yaml(&label, &text, overrides)
}

/// The validated, immutable configuration. A reload builds a new one and swaps it in whole.
#[derive(Debug)]
pub struct Config {
    /// Where it came from (a file path, or `<flags>`).
    pub source: String,
    pub server: ServerSettings,
    pub store: StoreSettings,
    pub identity: IdentitySettings,
    /// Every rate limit: top-level, tier and route limits. Names are unique.
    pub limits: Vec<Limit>,
    pub tiers: Vec<Tier>,
    pub api_keys: HashMap<String, TierId>,
    pub default_tier: Option<TierId>,
    pub upstreams: Vec<Upstream>,
    /// Routes in match order: longest `path_prefix` first, host-specific before host-less,
    /// then file order.
    pub routes: Vec<Route>,
    pub headers: HeaderSettings,
    /// Every concurrency limit (`kind: concurrency`): top-level, tier and route limits.
    pub concurrency: Vec<crate::concurrency::ConcurrencyLimit>,
    /// Priority load shedding; `None` sheds nothing.
    pub shedding: Option<crate::shed::Shedding>,
}

pub type TierId = usize;
pub type LimitId = usize;
pub type UpstreamId = usize;

#[derive(Debug, Clone)]
pub struct ServerSettings {
    pub listen: SocketAddr,
    pub admin_listen: SocketAddr,
    pub threads: usize,
    pub grace_period: Duration,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Memory,
    Redis,
    RedisCluster,
    RedisSentinel,
}

/// What a limit does when its store cannot answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnError {
    /// Fail open: the request proceeds without this limit.
    Allow,
    /// Fail closed: 503.
    Deny,
    /// Decide on an in-process limiter of the same algorithm.
    Local,
}

#[derive(Debug, Clone)]
pub struct StoreSettings {
    pub backend: Backend,
    /// Where Redis is; `None` for the memory store.
    pub redis: Option<crate::store::Topology>,
    pub timeout: Duration,
    pub key_prefix: String,
    pub on_error: OnError,
    pub max_keys: usize,
    pub breaker: crate::store::breaker::BreakerSettings,
    pub local_share: f64,
}

#[derive(Debug, Clone)]
pub struct IdentitySettings {
    pub api_key_header: HeaderName,
    pub trusted_proxies: Vec<IpNet>,
    /// `client_ip` keys of IPv6 clients keep this many leading bits (1-128): one counter per
    /// network, because a single client commonly holds a whole /64.
    pub ipv6_prefix: u8,
    pub jwt: Option<JwtSettings>,
}

#[derive(Clone)]
pub struct JwtSettings {
    pub header: HeaderName,
    pub key: jsonwebtoken::DecodingKey,
    pub user_claim: String,
    pub tier_claim: String,
    /// Seconds of clock skew allowed for `exp` and `nbf`.
    pub leeway_s: u64,
}

impl std::fmt::Debug for JwtSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JwtSettings")
            .field("header", &self.header)
            .field("key", &"<redacted>")
            .field("user_claim", &self.user_claim)
            .field("tier_claim", &self.tier_claim)
            .finish()
    }
}

/// One part of a limit's counter key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyPart {
    ApiKey,
    User,
    ClientIp,
    Route,
    Method,
    Tier,
    Header(HeaderName),
}

#[derive(Debug)]
pub struct Limit {
    pub name: Arc<str>,
    /// The counter key; empty means one counter for everybody.
    pub key: Vec<KeyPart>,
    pub quota: Quota,
    pub anonymous_only: bool,
    pub shadow: bool,
    pub on_error: OnError,
    /// The quota on the local fallback limiter (`limit × store.local_share`, at least 1).
    pub local_quota: Quota,
    /// Pre-built `RateLimit-Policy` item: `"name";q=100;w=60`.
    pub policy_header: HeaderValue,
    /// The window as written in the file (`1m`), for problem details.
    pub window_label: String,
}

#[derive(Debug)]
pub struct Tier {
    pub name: String,
    pub limits: Vec<LimitId>,
    pub concurrency: Vec<crate::concurrency::ConcurrencyId>,
}

#[derive(Debug)]
pub struct Upstream {
    pub name: String,
    pub servers: Vec<SocketAddr>,
    next: AtomicUsize,
}

impl Upstream {
    pub fn new(name: String, servers: Vec<SocketAddr>) -> Self {
        Upstream {
            name,
            servers,
            next: AtomicUsize::new(0),
        }
    }

    /// Round robin over the servers.
    pub fn pick(&self) -> SocketAddr {
        let i = self.next.fetch_add(1, Ordering::Relaxed);
        self.servers[i % self.servers.len()]
    }
}

#[derive(Debug)]
pub struct Route {
    pub name: Arc<str>,
    pub methods: Option<Vec<Method>>,
    pub path_prefix: String,
    /// Lower-cased host without port.
    pub host: Option<String>,
    pub upstream: UpstreamId,
    pub cost: u64,
    /// The route's own limits and every top-level limit that applies to it.
    pub limits: Vec<LimitId>,
    /// The same for concurrency limits.
    pub concurrency: Vec<crate::concurrency::ConcurrencyId>,
    /// The priority class set on the route (otherwise it follows the method).
    pub priority: Option<crate::shed::Priority>,
}

#[derive(Debug, Clone, Copy)]
pub struct HeaderSettings {
    pub ietf: bool,
    pub legacy: bool,
}

impl Config {
    pub fn limit(&self, id: LimitId) -> &Limit {
        &self.limits[id]
    }

    pub fn upstream(&self, id: UpstreamId) -> &Upstream {
        &self.upstreams[id]
    }
}
