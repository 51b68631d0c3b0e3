//! Configuration: `gateway.yaml` parsed into [`raw`] structs, then validated into the typed
//! runtime [`Config`] that every request reads through one [`arc_swap`] snapshot.
//!
//! This is the ground floor: it imports nothing of the crate but the pure [`crate::limit`]
//! types. One file per section (`server`, `store`, `identity`, `tiers`, `routes`, `limits`,
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
mod errors;
mod identity;
mod limits;
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
pub use errors::{ConfigErrors, WordError};
pub use identity::{IdentitySettings, JwtSettings};
pub use limits::{
    ConcurrencySpec, KeyPart, Kind, Limit, LimitId, LimitIds, OnError, RateSpec, Spec,
    MAX_KEY_PARTS,
};
pub use routes::{Route, RouteId, Upstream, UpstreamId};
pub use server::ServerSettings;
pub use shedding::{Priority, Shedding, TestTraffic};
pub use store::{Backend, BreakerSettings, FailureDefaults, StoreSettings, Topology};
pub use tiers::{Tier, TierId};

/// Read and validate a config file.
pub fn load(path: &Path, overrides: &Overrides) -> Result<Config, ConfigErrors> {
    let label = path.display().to_string();
    let text = std::fs::read_to_string(path)
        .map_err(|e| ConfigErrors(vec![format!("{label}: cannot read: {e}")]))?;
    from_yaml(&label, &text, overrides)
}

/// What is read once, at start: listeners, threads, the store. A reload that changes any of it
/// keeps the running value and logs that it takes effect on restart.
#[derive(Debug, Clone, PartialEq)]
pub struct Startup {
    pub server: ServerSettings,
    pub store: StoreSettings,
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
            ("server.grace_period", a.grace_period != b.grace_period),
            ("store.backend", s.backend != t.backend),
            ("store.url/cluster_nodes/sentinel", s.redis != t.redis),
            ("store.timeout", s.timeout != t.timeout),
            ("store.key_prefix", s.key_prefix != t.key_prefix),
            ("store.max_keys", s.max_keys != t.max_keys),
            ("store.breaker", s.breaker != t.breaker),
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

/// `headers`: which families of rate-limit headers responses carry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
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

#[cfg(test)]
mod tests;
