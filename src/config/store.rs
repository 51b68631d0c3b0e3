//! `store`: where counters live (memory or Redis, and how Redis is reached), the deadline of
//! every store call, the circuit breaker, and the failure-policy defaults of limits.

use std::time::Duration;

use super::errors::{words, Errors};
use super::{defaults, raw, OnError, Overrides};

words! {
    /// `store.backend`.
    pub enum Backend ("a backend") {
        Memory = "memory",
        Redis = "redis",
        RedisCluster = "redis_cluster",
        RedisSentinel = "redis_sentinel",
    }
}

/// Where Redis is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Topology {
    Single {
        url: String,
    },
    Cluster {
        nodes: Vec<String>,
    },
    Sentinel {
        master_name: String,
        nodes: Vec<String>,
        /// Connection settings (password, database, TLS) of the master, if any.
        url: Option<String>,
    },
}

/// Circuit breaker settings (`store.breaker`); defaults in [`defaults::BREAKER`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BreakerSettings {
    pub failures: u32,
    pub failure_ratio: f64,
    pub min_calls: u32,
    pub window: Duration,
    pub cooldown: Duration,
}

impl Default for BreakerSettings {
    fn default() -> Self {
        defaults::BREAKER
    }
}

/// `store`, as read at start: a reload that changes it is logged and applied on restart.
#[derive(Debug, Clone, PartialEq)]
pub struct StoreSettings {
    pub backend: Backend,
    /// Where Redis is; `None` for the memory store.
    pub redis: Option<Topology>,
    pub timeout: Duration,
    pub key_prefix: String,
    pub max_keys: usize,
    pub breaker: BreakerSettings,
    /// Redis only: denials the over-limit cache keeps at most; 0 turns it off.
    pub over_limit_entries: usize,
}

/// The defaults in `store` that shape the limits (`on_error`, `local_share`, `lease`). They
/// are applied when the config is built, so a reload applies them.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FailureDefaults {
    pub on_error: OnError,
    pub local_share: f64,
    /// `store.lease.max`: leasing of every limit that can lease and sets none (0: off).
    pub lease_max: u64,
}

pub(super) fn validate(
    errs: &mut Errors,
    r: raw::Store,
    o: &Overrides,
) -> (StoreSettings, FailureDefaults) {
    let mut backend = r
        .backend
        .as_deref()
        .and_then(|b| errs.word("store.backend", b))
        .unwrap_or(Backend::Memory);
    let mut url = r.url;
    if let Some(u) = &o.redis_url {
        url = Some(u.clone());
        if backend == Backend::Memory {
            backend = Backend::Redis;
        }
    }
    let redis = topology(errs, backend, url, r.cluster_nodes, r.sentinel, o);
    let timeout = r
        .timeout
        .and_then(|t| errs.duration("store.timeout", &t))
        .unwrap_or(defaults::STORE_TIMEOUT);
    if timeout.is_zero() {
        errs.at("store.timeout", "must be greater than zero");
    }
    let key_prefix = r
        .key_prefix
        .unwrap_or_else(|| defaults::KEY_PREFIX.to_string());
    super::errors::check_name(errs, "store.key_prefix", &key_prefix);
    let on_error = r
        .on_error
        .and_then(|s| errs.word("store.on_error", &s))
        .unwrap_or(defaults::ON_ERROR);
    let max_keys = r.max_keys.map_or(defaults::MAX_KEYS, |n| {
        errs.at_least_one("store.max_keys", n, defaults::MAX_KEYS)
    });
    let breaker = r.breaker.map_or(defaults::BREAKER, |b| breaker(errs, b));
    let local_share = r.local_share.unwrap_or(defaults::LOCAL_SHARE);
    errs.fraction("store.local_share", local_share, " (1/N for N gateways)");
    let over_limit_entries = r
        .over_limit_cache
        .map_or(defaults::OVER_LIMIT_ENTRIES, |c| {
            c.max_entries.unwrap_or(defaults::OVER_LIMIT_ENTRIES)
        });
    let settings = StoreSettings {
        backend,
        redis,
        timeout,
        key_prefix,
        max_keys,
        breaker,
        over_limit_entries,
    };
    let lease_max = r.lease.map_or(0, |l| {
        if l.max == 0 {
            errs.at("store.lease.max", "must be at least 1 (1: no leasing)");
        }
        l.max
    });
    let failure = FailureDefaults {
        on_error,
        local_share,
        lease_max,
    };
    (settings, failure)
}

/// A Redis URL is shown in an error only with its password hidden, and not at all when it
/// does not parse ([`crate::redact::url`]).
fn check_url(errs: &mut Errors, path: &str, u: &str) {
    match crate::redact::url(u) {
        Err(e) => errs.at(path, format!("not a Redis URL: {e}")),
        Ok(shown) => {
            if let Err(e) = redis::Client::open(u) {
                errs.at(path, format!("{shown:?} is not a Redis URL: {e}"));
            }
        }
    }
}

fn topology(
    errs: &mut Errors,
    backend: Backend,
    url: Option<String>,
    cluster_nodes: Option<Vec<String>>,
    sentinel: Option<raw::Sentinel>,
    o: &Overrides,
) -> Option<Topology> {
    match backend {
        Backend::Memory => None,
        Backend::Redis => {
            let u = url.unwrap_or_else(|| defaults::REDIS_URL.to_string());
            let path = if o.redis_url.is_some() {
                "--redis-url"
            } else {
                "store.url"
            };
            check_url(errs, path, &u);
            Some(Topology::Single { url: u })
        }
        Backend::RedisCluster => {
            let nodes = cluster_nodes.unwrap_or_default();
            if nodes.is_empty() {
                errs.at(
                    "store.cluster_nodes",
                    "redis_cluster needs at least one seed node (redis://host:port)",
                );
            }
            for (i, n) in nodes.iter().enumerate() {
                check_url(errs, &format!("store.cluster_nodes[{i}]"), n);
            }
            Some(Topology::Cluster { nodes })
        }
        Backend::RedisSentinel => {
            let Some(s) = sentinel else {
                errs.at(
                    "store.sentinel",
                    "redis_sentinel needs { master_name, nodes }",
                );
                return None;
            };
            if s.nodes.is_empty() {
                errs.at(
                    "store.sentinel.nodes",
                    "needs at least one sentinel (redis://host:port)",
                );
            }
            for (i, n) in s.nodes.iter().enumerate() {
                check_url(errs, &format!("store.sentinel.nodes[{i}]"), n);
            }
            Some(Topology::Sentinel {
                master_name: s.master_name,
                nodes: s.nodes,
                url,
            })
        }
    }
}

fn breaker(errs: &mut Errors, b: raw::Breaker) -> BreakerSettings {
    let d = defaults::BREAKER;
    let failures = errs.at_least_one(
        "store.breaker.failures",
        b.failures.unwrap_or(d.failures),
        d.failures,
    );
    let failure_ratio = b.failure_ratio.unwrap_or(d.failure_ratio);
    errs.fraction("store.breaker.failure_ratio", failure_ratio, "");
    let min_calls = errs.at_least_one(
        "store.breaker.min_calls",
        b.min_calls.unwrap_or(d.min_calls),
        d.min_calls,
    );
    let window = b
        .window
        .and_then(|w| errs.duration("store.breaker.window", &w))
        .unwrap_or(d.window);
    let cooldown = b
        .cooldown
        .and_then(|w| errs.duration("store.breaker.cooldown", &w))
        .unwrap_or(d.cooldown);
    if window.is_zero() {
        errs.at("store.breaker.window", "must be greater than zero");
    }
    BreakerSettings {
        failures,
        failure_ratio,
        min_calls,
        window,
        cooldown,
    }
}
