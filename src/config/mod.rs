//! Configuration: `gateway.yaml` parsed into [`raw`] structs, then validated into the typed
//! runtime [`Config`] that every request reads through one [`arc_swap`] snapshot.
//!
//! This is the ground floor: it imports nothing of the crate but the pure [`crate::limit`]
//! types and [`crate::redact`] (how a URL is shown in an error). One file per section (`server`, `store`, `identity`, `tiers`, `routes`, `limits`,
//! `shedding`) holds the section's validated types and its validation; [`defaults`] holds
//! every default; `document` puts a whole file together.
//!
//! What a reload can change is in the types: [`Startup`] is read once at start (a reload that
//! changes it is logged and applied on restart); every other field of [`Config`] is policy
//! that a reload swaps in whole.
//!
//! Phase: startup and reload only. Nothing here runs per request except reading the
//! already-built [`Config`].

mod access_log;
mod admin;
pub mod defaults;
mod document;
mod env;
mod errors;
mod identity;
mod limits;
mod problem;
mod quotas;
pub mod raw;
pub mod reload;
mod routes;
mod server;
mod shedding;
mod store;
mod tiers;

use std::collections::HashMap;
use std::path::Path;

pub use access_log::{AccessLogFormat, AccessLogSettings};
pub use admin::AdminSettings;
pub use document::{from_yaml, Overrides};
pub use env::expand_env;
pub use errors::{ConfigErrors, WordError};
pub use identity::{IdentitySettings, JwtSettings};
pub use limits::{
    ConcurrencySpec, KeyPart, Kind, Limit, LimitId, LimitIds, OnError, RateSpec, Spec,
    MAX_KEY_PARTS, RATELIMIT_POLICY, X_RATELIMIT_LIMIT,
};
pub use problem::{RateLimitedBody, QUOTA_EXCEEDED};
pub use quotas::QuotaSettings;
pub use routes::{Route, RouteId, Upstream, UpstreamId, UpstreamTimeouts};
pub use server::{EscapedSlashes, HttpSettings, PathNormalization, ServerSettings};
pub use shedding::{Priority, Shedding, TestTraffic};
pub use store::{Backend, BreakerSettings, FailureDefaults, StoreSettings, Topology};
pub use tiers::{Tier, TierId};

/// Read a config file, expand its `${VAR}` references from the environment ([`env`]), and
/// validate it.
pub fn load(path: &Path, overrides: &Overrides) -> Result<Config, ConfigErrors> {
    let label = path.display().to_string();
    let text = std::fs::read_to_string(path)
        .map_err(|e| ConfigErrors(vec![format!("{label}: cannot read: {e}")]))?;
    from_file_text(&label, &text, overrides)
}

/// The text of a config file labelled `label`: `${VAR}` references expanded, then validated.
pub fn from_file_text(
    label: &str,
    text: &str,
    overrides: &Overrides,
) -> Result<Config, ConfigErrors> {
    let text = expand_env(label, text, process_env)?;
    from_yaml(label, &text, overrides)
}

/// A variable of this process's environment, as `${VAR}` expansion reads it.
fn process_env(name: &str) -> Option<String> {
    std::env::var_os(name).map(|v| v.to_string_lossy().into_owned())
}

/// Where a gateway's admin listener is, as a client of it reads a config file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdminEndpoint {
    /// `server.admin_listen` (the default when it is not set).
    pub listen: std::net::SocketAddr,
    /// `admin.token_env`: the environment variable holding the admin bearer token.
    pub token_env: Option<String>,
}

/// The admin endpoint of a config file (after `${VAR}` expansion), without validating the rest
/// of the file: what `tollgate health` and `tollgate quotas` ask.
pub fn admin_endpoint_of(path: &Path) -> Result<AdminEndpoint, ConfigErrors> {
    let label = path.display().to_string();
    let fail = |msg: String| ConfigErrors(vec![format!("{label}: {msg}")]);
    let text = std::fs::read_to_string(path).map_err(|e| fail(format!("cannot read: {e}")))?;
    let text = expand_env(&label, &text, process_env)?;
    let doc: serde_yaml::Value =
        serde_yaml::from_str(&text).map_err(|e| fail(format!("invalid YAML: {e}")))?;
    let addr = doc["server"]["admin_listen"]
        .as_str()
        .unwrap_or(defaults::ADMIN_LISTEN);
    let listen = addr.parse().map_err(|_| {
        fail(format!(
            "server.admin_listen: {addr:?} is not an address (ip:port)"
        ))
    })?;
    let token_env = doc["admin"]["token_env"].as_str().map(str::to_string);
    Ok(AdminEndpoint { listen, token_env })
}

/// What is read once, at start: listeners, threads, the store. A reload that changes any of it
/// keeps the running value and logs that it takes effect on restart.
#[derive(Debug, Clone, PartialEq)]
pub struct Startup {
    pub server: ServerSettings,
    pub store: StoreSettings,
    /// `quotas`; `None`: no quota store.
    pub quotas: Option<QuotaSettings>,
    /// `admin.max_connections` (also in [`AdminSettings`]), so that a reload that changes it
    /// is reported like every other setting read at start.
    pub admin_max_connections: usize,
}

impl Startup {
    /// The settings that differ in `next`, by their path in the file.
    pub fn changes(&self, next: &Startup) -> Vec<&'static str> {
        let (a, b) = (&self.server, &next.server);
        let (s, t) = (&self.store, &next.store);
        [
            ("server.listen", a.listen != b.listen),
            ("server.admin_listen", a.admin_listen != b.admin_listen),
            ("server.threads", a.threads != b.threads),
            ("server.work_stealing", a.work_stealing != b.work_stealing),
            ("server.grace_period", a.grace_period != b.grace_period),
            ("server.drain_period", a.drain_period != b.drain_period),
            (
                "server.header_timeout",
                a.header_timeout != b.header_timeout,
            ),
            (
                "server.max_connections",
                a.max_connections != b.max_connections,
            ),
            (
                "server.upstream_keepalive_pool",
                a.upstream_keepalive_pool != b.upstream_keepalive_pool,
            ),
            ("server.upgrade_sock", a.upgrade_sock != b.upgrade_sock),
            (
                "server.preserve_header_case",
                a.preserve_header_case != b.preserve_header_case,
            ),
            (
                "server.ready_requires_store",
                a.ready_requires_store != b.ready_requires_store,
            ),
            ("store.backend", s.backend != t.backend),
            ("store.url/cluster_nodes/sentinel", s.redis != t.redis),
            ("store.timeout", s.timeout != t.timeout),
            ("store.key_prefix", s.key_prefix != t.key_prefix),
            ("store.max_keys", s.max_keys != t.max_keys),
            ("store.breaker", s.breaker != t.breaker),
            (
                "store.over_limit_cache",
                s.over_limit_entries != t.over_limit_entries,
            ),
            ("quotas", self.quotas != next.quotas),
            (
                "admin.max_connections",
                self.admin_max_connections != next.admin_max_connections,
            ),
        ]
        .into_iter()
        .filter_map(|(path, changed)| changed.then_some(path))
        .collect()
    }
}

/// The validated, immutable configuration. A reload builds a new one and swaps it in whole.
#[derive(Debug)]
pub struct Config {
    /// Where it came from (a file path, or `<flags>`).
    pub source: String,
    /// Read once at start.
    pub startup: Startup,
    /// The per-request part of `server`.
    pub http: HttpSettings,
    pub identity: IdentitySettings,
    /// Every limit of both kinds: top-level, tier and route limits. Names are unique.
    pub limits: Vec<Limit>,
    pub tiers: Vec<Tier>,
    pub api_keys: HashMap<String, TierId>,
    pub default_tier: Option<TierId>,
    pub upstreams: Vec<Upstream>,
    /// Routes in match order: longest `path_prefix` first, host-specific before host-less,
    /// then file order.
    pub routes: Vec<Route>,
    pub headers: HeaderSettings,
    /// Priority load shedding; `None` sheds nothing.
    pub shedding: Option<Shedding>,
    /// `store.on_error` and `store.local_share`, already applied to every limit.
    pub failure: FailureDefaults,
    pub access_log: AccessLogSettings,
    pub admin: AdminSettings,
}

/// `headers`: which families of rate-limit headers responses carry, and whether admitted
/// (proxied) responses carry them or only refusals do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeaderSettings {
    pub ietf: bool,
    pub legacy: bool,
    /// `false`: only `429`s carry the rate-limit headers; a proxied answer goes back with
    /// none (nothing told about the quota left, and no cost for them per request).
    pub on_admitted: bool,
}

impl Config {
    pub fn limit(&self, id: LimitId) -> &Limit {
        &self.limits[id]
    }

    pub fn upstream(&self, id: UpstreamId) -> &Upstream {
        &self.upstreams[id]
    }
}

#[cfg(test)]
mod tests;
