//! One pass from YAML text to a validated [`Config`], collecting every error with the file
//! name and the field path in front (`gateway.yaml: routes[0].limits[0].window: "1x" is not a
//! duration`).
//!
//! Each top-level section, and each element of `routes`, `limits` and every tier, is
//! deserialized on its own so that one structural mistake does not hide the others.

use std::collections::{HashMap, HashSet};
use std::net::{IpAddr, SocketAddr, ToSocketAddrs};
use std::time::Duration;

use http::header::HeaderName;
use http::{HeaderValue, Method};
use ipnet::IpNet;
use serde::de::DeserializeOwned;
use serde_yaml::Value;

use super::{
    defaults, raw, Backend, Config, ConfigErrors, HeaderSettings, IdentitySettings, JwtSettings,
    KeyPart, Limit, LimitId, OnError, Route, ServerSettings, StoreSettings, Tier, TierId, Upstream,
};
use crate::limit::{Algorithm, Quota, MAX_SCALED};
use crate::store::Topology;

use crate::concurrency::{ConcurrencyId, ConcurrencyLimit};
use crate::shed::{Priority, Shedding, TestTraffic};

/// The most parts a counter key may have.
pub const MAX_KEY_PARTS: usize = 8;

/// Command-line settings that take precedence over the file.
#[derive(Debug, Clone, Default)]
pub struct Overrides {
    pub listen: Option<String>,
    pub admin_listen: Option<String>,
    /// `--upstream`: the servers of the upstream named `default`.
    pub upstream: Vec<String>,
    pub redis_url: Option<String>,
}

struct Errors {
    file: String,
    /// Each error with its place in the file: (section, element index).
    list: Vec<((i32, usize), String)>,
}

/// Where an error sorts: root errors and unknown sections first, then the sections in their
/// documented order, then the element index (`routes[3]` after `routes[1]`).
fn place(path: &str) -> (i32, usize) {
    let section_end = path.find(['.', '[']).unwrap_or(path.len());
    let section = match &path[..section_end] {
        "--listen" | "--admin-listen" => "server",
        "--redis-url" => "store",
        other => other,
    };
    let Some(i) = raw::SECTIONS.iter().position(|s| *s == section) else {
        return (-1, 0);
    };
    let index = path[section_end..]
        .strip_prefix('[')
        .and_then(|r| r.split(']').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    (i as i32, index)
}

impl Errors {
    fn at(&mut self, path: &str, msg: impl std::fmt::Display) {
        let line = if path.is_empty() {
            format!("{}: {msg}", self.file)
        } else {
            format!("{}: {path}: {msg}", self.file)
        };
        self.list.push((place(path), line));
    }

    /// A mapping section as `(name, value)` pairs in file order.
    fn entries(&mut self, path: &str, value: Value) -> Vec<(String, Value)> {
        match value {
            Value::Mapping(m) => m
                .into_iter()
                .filter_map(|(k, v)| match k {
                    Value::String(name) => Some((name, v)),
                    other => {
                        self.at(path, format!("names must be strings, found {other:?}"));
                        None
                    }
                })
                .collect(),
            _ => {
                self.at(path, "must be a mapping of names to values");
                Vec::new()
            }
        }
    }

    fn count(&self) -> usize {
        self.list.len()
    }

    /// Every error, in file order.
    fn finish(mut self) -> ConfigErrors {
        self.list.sort_by_key(|(p, _)| *p);
        ConfigErrors(self.list.into_iter().map(|(_, l)| l).collect())
    }

    /// Deserialize `value` as `T`, reporting a structural error at `path` (plus the path
    /// inside `value` where serde stopped).
    fn parse<T: DeserializeOwned>(&mut self, path: &str, value: Value) -> Option<T> {
        match serde_path_to_error::deserialize::<_, T>(value) {
            Ok(v) => Some(v),
            Err(e) => {
                let inner = e.path().to_string();
                let full = join_path(path, if inner == "." { "" } else { &inner });
                let msg = e.into_inner().to_string();
                self.at(&full, clean_serde_message(&msg));
                None
            }
        }
    }
}

fn join_path(outer: &str, inner: &str) -> String {
    match (outer.is_empty(), inner.is_empty()) {
        (_, true) => outer.to_string(),
        (true, false) => inner.to_string(),
        (false, false) if inner.starts_with('[') => format!("{outer}{inner}"),
        (false, false) => format!("{outer}.{inner}"),
    }
}

/// serde_yaml puts the error's own position (" at line L column C") into its message; the
/// field path (or the prefix we add) already says where, so drop that one position and keep
/// any other ("while parsing a flow mapping at line 3 column 5").
fn clean_serde_message(msg: &str) -> String {
    let Some(i) = msg.find(" at line ") else {
        return msg.to_string();
    };
    let rest = &msg[i + " at line ".len()..];
    let digits = |s: &str| s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let line_len = digits(rest);
    let Some(after_line) = rest[line_len..].strip_prefix(" column ") else {
        return msg.to_string();
    };
    let col_len = digits(after_line);
    let end = i + " at line ".len() + line_len + " column ".len() + col_len;
    format!("{}{}", &msg[..i], &msg[end..])
}

/// Validate a whole configuration. `file` labels every error.
pub fn from_yaml(file: &str, text: &str, overrides: &Overrides) -> Result<Config, ConfigErrors> {
    let mut errs = Errors {
        file: file.to_string(),
        list: Vec::new(),
    };
    let root: Value = match serde_yaml::from_str(text) {
        Ok(Value::Null) => Value::Mapping(Default::default()),
        Ok(v) => v,
        Err(e) => {
            let loc = e
                .location()
                .map(|l| format!("line {} column {}: ", l.line(), l.column()))
                .unwrap_or_default();
            errs.at(
                "",
                format!("{loc}invalid YAML: {}", clean_serde_message(&e.to_string())),
            );
            return Err(errs.finish());
        }
    };
    let Value::Mapping(map) = root else {
        errs.at("", "the top level must be a mapping of sections");
        return Err(errs.finish());
    };
    let mut sections: HashMap<String, Value> = HashMap::new();
    for (k, v) in map {
        let Some(name) = k.as_str() else {
            errs.at("", format!("section names must be strings, found {k:?}"));
            continue;
        };
        if !raw::SECTIONS.contains(&name) {
            errs.at(
                name,
                format!(
                    "unknown section, expected one of {}",
                    raw::SECTIONS.join(", ")
                ),
            );
            continue;
        }
        sections.insert(name.to_string(), v);
    }
    let mut take = |name: &str| sections.remove(name).filter(|v| !v.is_null());
    let server_raw: raw::Server = take("server")
        .and_then(|v| errs.parse("server", v))
        .unwrap_or_default();
    let store_raw: raw::Store = take("store")
        .and_then(|v| errs.parse("store", v))
        .unwrap_or_default();
    let identity_raw: raw::Identity = take("identity")
        .and_then(|v| errs.parse("identity", v))
        .unwrap_or_default();
    let tiers_raw = take("tiers")
        .map(|v| errs.entries("tiers", v))
        .unwrap_or_default();
    let api_keys_raw = take("api_keys")
        .map(|v| errs.entries("api_keys", v))
        .unwrap_or_default();
    let default_tier_raw: Option<String> =
        take("default_tier").and_then(|v| errs.parse("default_tier", v));
    let upstreams_value = take("upstreams");
    let routes_value = take("routes");
    let limits_raw: Vec<Value> = take("limits")
        .and_then(|v| errs.parse("limits", v))
        .unwrap_or_default();
    let headers_raw: raw::Headers = take("headers")
        .and_then(|v| errs.parse("headers", v))
        .unwrap_or_default();
    let shedding_raw: Option<raw::Shedding> =
        take("shedding").and_then(|v| errs.parse("shedding", v));

    let mut upstreams_raw: Vec<(String, Value)> = match upstreams_value {
        Some(v) => {
            let e = errs.entries("upstreams", v);
            if e.is_empty() && overrides.upstream.is_empty() {
                errs.at("upstreams", "empty: define at least one upstream");
            }
            e
        }
        None if !overrides.upstream.is_empty() => Vec::new(),
        None => {
            errs.at("upstreams", "missing: define at least one upstream");
            Vec::new()
        }
    };
    if !overrides.upstream.is_empty() {
        let servers = Value::Sequence(
            overrides
                .upstream
                .iter()
                .map(|s| Value::String(s.clone()))
                .collect(),
        );
        match upstreams_raw.iter_mut().find(|(n, _)| n == "default") {
            Some((_, v)) => *v = servers,
            None => upstreams_raw.push(("default".to_string(), servers)),
        }
    }
    let routes_declared = routes_value.is_some();
    let routes_raw: Vec<Value> = match routes_value {
        Some(v) => errs.parse("routes", v).unwrap_or_default(),
        None if !overrides.upstream.is_empty() => {
            // A catch-all route to the `--upstream` servers.
            vec![serde_yaml::from_str(
                "{ name: default, match: { path_prefix: / }, upstream: default }",
            )
            .expect("built-in route")]
        }
        None => {
            errs.at("routes", "missing: define at least one route");
            Vec::new()
        }
    };

    let server = server_settings(&mut errs, server_raw, overrides);
    let store = store_settings(&mut errs, store_raw, overrides);
    let identity = identity_settings(&mut errs, identity_raw);
    let shedding = shedding_raw.map(|r| shedding_settings(&mut errs, r));

    let mut b = LimitBuilder {
        limits: Vec::new(),
        concurrency: Vec::new(),
        names: HashSet::new(),
        store_on_error: store.on_error,
        local_share: store.local_share,
    };

    // Tiers.
    let mut tiers = Vec::new();
    let mut tier_ids: HashMap<String, TierId> = HashMap::new();
    for (name, items) in tiers_raw {
        let items: Vec<Value> = errs
            .parse(&format!("tiers.{name}"), items)
            .unwrap_or_default();
        let mut ids = Vec::new();
        let mut concurrency = Vec::new();
        for (i, item) in items.into_iter().enumerate() {
            let path = format!("tiers.{name}[{i}]");
            if let Some(l) = errs.parse::<raw::Limit>(&path, item) {
                if l.routes.is_some() {
                    errs.at(
                        &format!("{path}.routes"),
                        "only top-level limits can name routes",
                    );
                }
                if let Some(id) = b.add(&mut errs, &path, l, &[KeyPart::ApiKey]) {
                    id.attach(&mut ids, &mut concurrency);
                }
            }
        }
        tier_ids.insert(name.clone(), tiers.len());
        tiers.push(Tier {
            name,
            limits: ids,
            concurrency,
        });
    }
    let mut api_keys = HashMap::new();
    for (key, tier) in api_keys_raw {
        let path = format!("api_keys.{}", redact_key(&key));
        let Some(tier) = errs.parse::<String>(&path, tier) else {
            continue;
        };
        match tier_ids.get(&tier) {
            Some(&t) => {
                api_keys.insert(key, t);
            }
            None => errs.at(&path, format!("tier {tier:?} is not defined under tiers")),
        }
    }
    let default_tier = default_tier_raw.and_then(|t| match tier_ids.get(&t) {
        Some(&id) => Some(id),
        None => {
            errs.at(
                "default_tier",
                format!("tier {t:?} is not defined under tiers"),
            );
            None
        }
    });

    // Upstreams.
    let mut upstreams = Vec::new();
    let mut upstream_ids = HashMap::new();
    for (name, servers) in upstreams_raw {
        let path = format!("upstreams.{name}");
        let servers: Vec<String> = errs.parse(&path, servers).unwrap_or_default();
        if servers.is_empty() {
            errs.at(&path, "needs at least one server (host:port)");
        }
        let mut addrs = Vec::new();
        for (i, s) in servers.iter().enumerate() {
            match resolve(s) {
                Ok(a) => addrs.push(a),
                Err(e) => errs.at(&format!("{path}[{i}]"), e),
            }
        }
        upstream_ids.insert(name.clone(), upstreams.len());
        upstreams.push(Upstream::new(name, addrs));
    }

    // Routes, first without limits so that top-level limits can name them. A route with
    // errors still registers its name and has its limits checked, so that one mistake is
    // reported once and does not hide or cause others.
    let mut routes = Vec::new();
    let mut route_ids: HashMap<String, Option<usize>> = HashMap::new();
    let mut route_limit_values = Vec::new();
    if routes_raw.is_empty() && routes_declared {
        errs.at("routes", "empty: define at least one route");
    }
    for (i, item) in routes_raw.into_iter().enumerate() {
        let path = format!("routes[{i}]");
        let name = item.get("name").and_then(Value::as_str).map(str::to_string);
        let Some(r) = errs.parse::<raw::Route>(&path, item) else {
            if let Some(n) = name {
                route_ids.entry(n).or_insert(None);
            }
            continue;
        };
        let route = route(&mut errs, &path, &r, &upstream_ids);
        if route_ids
            .insert(r.name.clone(), Some(routes.len()))
            .is_some()
        {
            errs.at(
                &format!("{path}.name"),
                format!("duplicate route name {:?}", r.name),
            );
        }
        routes.push(route);
        route_limit_values.push((path, r.limits.unwrap_or_default()));
    }
    for (ri, (path, items)) in route_limit_values.into_iter().enumerate() {
        for (i, item) in items.into_iter().enumerate() {
            let path = format!("{path}.limits[{i}]");
            if let Some(l) = errs.parse::<raw::Limit>(&path, item) {
                if l.routes.is_some() {
                    errs.at(
                        &format!("{path}.routes"),
                        "a route's own limit cannot name routes; move it to the top-level limits",
                    );
                }
                if let Some(id) = b.add(&mut errs, &path, l, &[]) {
                    let r = &mut routes[ri];
                    id.attach(&mut r.limits, &mut r.concurrency);
                }
            }
        }
    }
    for (i, item) in limits_raw.into_iter().enumerate() {
        let path = format!("limits[{i}]");
        let Some(l) = errs.parse::<raw::Limit>(&path, item) else {
            continue;
        };
        if l.routes.as_ref().is_some_and(|r| r.is_empty()) {
            errs.at(
                &format!("{path}.routes"),
                "empty: name at least one route, or leave `routes` out to apply the limit to all",
            );
        }
        let only: Option<Vec<usize>> = l.routes.as_ref().map(|names| {
            names
                .iter()
                .enumerate()
                .filter_map(|(j, n)| match route_ids.get(n) {
                    Some(&r) => r,
                    None => {
                        errs.at(
                            &format!("{path}.routes[{j}]"),
                            format!("route {n:?} is not defined under routes"),
                        );
                        None
                    }
                })
                .collect()
        });
        if let Some(id) = b.add(&mut errs, &path, l, &[]) {
            for (r, route) in routes.iter_mut().enumerate() {
                if only.as_ref().is_none_or(|o| o.contains(&r)) {
                    id.attach(&mut route.limits, &mut route.concurrency);
                }
            }
        }
    }

    if !errs.list.is_empty() {
        return Err(errs.finish());
    }
    // Match order: longest prefix first, host-specific first, then file order (stable sort).
    routes.sort_by(|a, b| {
        b.path_prefix
            .len()
            .cmp(&a.path_prefix.len())
            .then(b.host.is_some().cmp(&a.host.is_some()))
    });
    Ok(Config {
        source: file.to_string(),
        server,
        store,
        identity,
        limits: b.limits,
        tiers,
        api_keys,
        default_tier,
        upstreams,
        routes,
        headers: HeaderSettings {
            ietf: headers_raw.ietf.unwrap_or(true),
            legacy: headers_raw.legacy.unwrap_or(true),
        },
        concurrency: b.concurrency,
        shedding,
    })
}

/// API keys are secrets: an error message shows only their first characters.
fn redact_key(key: &str) -> String {
    let shown: String = key.chars().take(4).collect();
    if shown.len() < key.len() {
        format!("{shown}…")
    } else {
        shown
    }
}

fn resolve(s: &str) -> Result<SocketAddr, String> {
    if let Ok(a) = s.parse::<SocketAddr>() {
        return Ok(a);
    }
    match s.to_socket_addrs() {
        Ok(mut it) => it
            .next()
            .ok_or_else(|| format!("{s:?} resolves to no address")),
        Err(e) => Err(format!("{s:?} is not a host:port address ({e})")),
    }
}

/// `500ms`, `30s`, `1m`, `1h`, `1d` (and compounds such as `1m30s`).
pub fn parse_duration(s: &str) -> Option<Duration> {
    let d = humantime::parse_duration(s).ok()?;
    Some(d)
}

fn duration(errs: &mut Errors, path: &str, s: &str) -> Option<Duration> {
    match parse_duration(s) {
        Some(d) => Some(d),
        None => {
            errs.at(
                path,
                format!("{s:?} is not a duration (examples: 500ms, 30s, 1m, 1h, 1d)"),
            );
            None
        }
    }
}

fn on_error(errs: &mut Errors, path: &str, s: &str) -> Option<OnError> {
    match s {
        "allow" => Some(OnError::Allow),
        "deny" => Some(OnError::Deny),
        "local" => Some(OnError::Local),
        _ => {
            errs.at(
                path,
                format!("{s:?} is not a failure policy (allow, deny, local)"),
            );
            None
        }
    }
}

fn socket_addr(errs: &mut Errors, path: &str, s: &str) -> SocketAddr {
    s.parse().unwrap_or_else(|_| {
        errs.at(path, format!("{s:?} is not an address (ip:port)"));
        SocketAddr::from(([0, 0, 0, 0], 0))
    })
}

fn server_settings(errs: &mut Errors, r: raw::Server, o: &Overrides) -> ServerSettings {
    let (listen, listen_path) = match &o.listen {
        Some(l) => (l.clone(), "--listen"),
        None => (
            r.listen.unwrap_or_else(|| defaults::LISTEN.to_string()),
            "server.listen",
        ),
    };
    let (admin, admin_path) = match &o.admin_listen {
        Some(l) => (l.clone(), "--admin-listen"),
        None => (
            r.admin_listen
                .unwrap_or_else(|| defaults::ADMIN_LISTEN.to_string()),
            "server.admin_listen",
        ),
    };
    let threads = match r.threads {
        Some(0) => {
            errs.at("server.threads", "must be at least 1");
            1
        }
        Some(n) => n,
        None => std::thread::available_parallelism().map_or(1, |n| n.get()),
    };
    let grace_period = r
        .grace_period
        .and_then(|g| duration(errs, "server.grace_period", &g))
        .unwrap_or(Duration::from_secs(defaults::GRACE_PERIOD_S));
    ServerSettings {
        listen: socket_addr(errs, listen_path, &listen),
        admin_listen: socket_addr(errs, admin_path, &admin),
        threads,
        grace_period,
    }
}

fn store_settings(errs: &mut Errors, r: raw::Store, o: &Overrides) -> StoreSettings {
    let mut backend = match r.backend.as_deref().unwrap_or("memory") {
        "memory" => Backend::Memory,
        "redis" => Backend::Redis,
        "redis_cluster" => Backend::RedisCluster,
        "redis_sentinel" => Backend::RedisSentinel,
        other => {
            errs.at(
                "store.backend",
                format!(
                    "{other:?} is not a backend (memory, redis, redis_cluster, redis_sentinel)"
                ),
            );
            Backend::Memory
        }
    };
    let mut url = r.url;
    if let Some(u) = &o.redis_url {
        url = Some(u.clone());
        if backend == Backend::Memory {
            backend = Backend::Redis;
        }
    }
    let check_url = |errs: &mut Errors, path: &str, u: &str| {
        if let Err(e) = redis::Client::open(u) {
            errs.at(path, format!("{u:?} is not a Redis URL: {e}"));
        }
    };
    let redis = match backend {
        Backend::Memory => None,
        Backend::Redis => {
            let u = url.unwrap_or_else(|| defaults::REDIS_URL.to_string());
            check_url(
                errs,
                if o.redis_url.is_some() {
                    "--redis-url"
                } else {
                    "store.url"
                },
                &u,
            );
            Some(Topology::Single { url: u })
        }
        Backend::RedisCluster => {
            let nodes = r.cluster_nodes.unwrap_or_default();
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
        Backend::RedisSentinel => match r.sentinel {
            None => {
                errs.at(
                    "store.sentinel",
                    "redis_sentinel needs { master_name, nodes }",
                );
                None
            }
            Some(s) => {
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
        },
    };
    let timeout = r
        .timeout
        .and_then(|t| duration(errs, "store.timeout", &t))
        .unwrap_or(Duration::from_millis(defaults::STORE_TIMEOUT_MS));
    if timeout.is_zero() {
        errs.at("store.timeout", "must be greater than zero");
    }
    let key_prefix = r
        .key_prefix
        .unwrap_or_else(|| defaults::KEY_PREFIX.to_string());
    if key_prefix.is_empty() || !key_prefix.chars().all(is_name_char) {
        errs.at(
            "store.key_prefix",
            format!("{key_prefix:?} must be non-empty and use only letters, digits, '_', '-', '.'"),
        );
    }
    let on_error = r
        .on_error
        .and_then(|s| on_error(errs, "store.on_error", &s))
        .unwrap_or(OnError::Allow);
    let max_keys = match r.max_keys {
        Some(0) => {
            errs.at("store.max_keys", "must be at least 1");
            defaults::MAX_KEYS
        }
        Some(n) => n,
        None => defaults::MAX_KEYS,
    };
    let d = crate::store::breaker::BreakerSettings::default();
    let breaker = match r.breaker {
        None => d,
        Some(b) => {
            let failures = b.failures.unwrap_or(d.failures);
            if failures == 0 {
                errs.at("store.breaker.failures", "must be at least 1");
            }
            let failure_ratio = b.failure_ratio.unwrap_or(d.failure_ratio);
            if !(failure_ratio > 0.0 && failure_ratio <= 1.0) {
                errs.at(
                    "store.breaker.failure_ratio",
                    format!("{failure_ratio} must be greater than 0 and at most 1"),
                );
            }
            let min_calls = b.min_calls.unwrap_or(d.min_calls);
            if min_calls == 0 {
                errs.at("store.breaker.min_calls", "must be at least 1");
            }
            let window = b
                .window
                .and_then(|w| duration(errs, "store.breaker.window", &w))
                .unwrap_or(d.window);
            let cooldown = b
                .cooldown
                .and_then(|w| duration(errs, "store.breaker.cooldown", &w))
                .unwrap_or(d.cooldown);
            if window.is_zero() {
                errs.at("store.breaker.window", "must be greater than zero");
            }
            crate::store::breaker::BreakerSettings {
                failures,
                failure_ratio,
                min_calls,
                window,
                cooldown,
            }
        }
    };
    let local_share = r.local_share.unwrap_or(1.0);
    if !(local_share > 0.0 && local_share <= 1.0) {
        errs.at(
            "store.local_share",
            format!("{local_share} must be greater than 0 and at most 1 (1/N for N gateways)"),
        );
    }
    StoreSettings {
        backend,
        redis,
        breaker,
        local_share,
        timeout,
        key_prefix,
        on_error,
        max_keys,
    }
}

fn header_name(errs: &mut Errors, path: &str, s: &str) -> Option<HeaderName> {
    match HeaderName::from_bytes(s.as_bytes()) {
        Ok(h) => Some(h),
        Err(_) => {
            errs.at(path, format!("{s:?} is not a valid header name"));
            None
        }
    }
}

fn identity_settings(errs: &mut Errors, r: raw::Identity) -> IdentitySettings {
    let api_key_header = r
        .api_key_header
        .and_then(|h| header_name(errs, "identity.api_key_header", &h))
        .unwrap_or(HeaderName::from_static(defaults::API_KEY_HEADER));
    let mut trusted_proxies = Vec::new();
    for (i, p) in r.trusted_proxies.unwrap_or_default().iter().enumerate() {
        let net = p
            .parse::<IpNet>()
            .or_else(|_| p.parse::<IpAddr>().map(IpNet::from));
        match net {
            Ok(n) => trusted_proxies.push(n),
            Err(_) => errs.at(
                &format!("identity.trusted_proxies[{i}]"),
                format!("{p:?} is not an IP address or CIDR network"),
            ),
        }
    }
    let ipv6_prefix = match r.ipv6_prefix {
        None => defaults::IPV6_PREFIX,
        Some(p @ 1..=128) => p as u8,
        Some(p) => {
            errs.at(
                "identity.ipv6_prefix",
                format!("{p} is not a prefix length from 1 to 128"),
            );
            defaults::IPV6_PREFIX
        }
    };
    let jwt = r.jwt.and_then(|j| {
        let leeway_s = j
            .leeway
            .as_deref()
            .and_then(|l| duration(errs, "identity.jwt.leeway", l))
            .map_or(0, |d| d.as_secs());
        let header = j
            .header
            .and_then(|h| header_name(errs, "identity.jwt.header", &h))
            .unwrap_or(HeaderName::from_static(defaults::JWT_HEADER));
        match std::env::var(&j.hs256_secret_env) {
            Ok(secret) if !secret.is_empty() => Some(JwtSettings {
                header,
                key: jsonwebtoken::DecodingKey::from_secret(secret.as_bytes()),
                user_claim: j
                    .user_claim
                    .unwrap_or_else(|| defaults::JWT_USER_CLAIM.to_string()),
                tier_claim: j
                    .tier_claim
                    .unwrap_or_else(|| defaults::JWT_TIER_CLAIM.to_string()),
                leeway_s,
            }),
            other => {
                let state = if other.is_ok() {
                    "is empty"
                } else {
                    "is not set"
                };
                errs.at(
                    "identity.jwt.hs256_secret_env",
                    format!(
                        "environment variable {} {state} (it must hold the HS256 secret)",
                        j.hs256_secret_env
                    ),
                );
                None
            }
        }
    });
    IdentitySettings {
        api_key_header,
        trusted_proxies,
        ipv6_prefix,
        jwt,
    }
}

fn is_name_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.')
}

/// The methods a route may match.
const STANDARD_METHODS: [Method; 9] = [
    Method::GET,
    Method::HEAD,
    Method::POST,
    Method::PUT,
    Method::DELETE,
    Method::PATCH,
    Method::OPTIONS,
    Method::CONNECT,
    Method::TRACE,
];

fn route(
    errs: &mut Errors,
    path: &str,
    r: &raw::Route,
    upstream_ids: &HashMap<String, usize>,
) -> Route {
    if r.name.is_empty() || !r.name.chars().all(is_name_char) {
        errs.at(
            &format!("{path}.name"),
            format!(
                "{:?} must be non-empty and use only letters, digits, '_', '-', '.'",
                r.name
            ),
        );
    }
    let upstream = upstream_ids.get(&r.upstream).copied();
    if upstream.is_none() {
        errs.at(
            &format!("{path}.upstream"),
            format!("upstream {:?} is not defined under upstreams", r.upstream),
        );
    }
    let methods = r.matcher.methods.as_ref().map(|ms| {
        ms.iter()
            .enumerate()
            .filter_map(|(i, m)| {
                let upper = m.to_ascii_uppercase();
                match STANDARD_METHODS.iter().find(|s| s.as_str() == upper) {
                    Some(m) => Some(m.clone()),
                    None => {
                        errs.at(
                            &format!("{path}.match.methods[{i}]"),
                            format!(
                                "{m:?} is not an HTTP method ({})",
                                STANDARD_METHODS
                                    .iter()
                                    .map(|m| m.as_str())
                                    .collect::<Vec<_>>()
                                    .join(", ")
                            ),
                        );
                        None
                    }
                }
            })
            .collect::<Vec<_>>()
    });
    let path_prefix = r.matcher.path_prefix.clone().unwrap_or_else(|| "/".into());
    if !path_prefix.starts_with('/') {
        errs.at(
            &format!("{path}.match.path_prefix"),
            format!("{path_prefix:?} must start with '/'"),
        );
    }
    let host = r.matcher.host.as_ref().map(|h| h.to_ascii_lowercase());
    if let Some(h) = &host {
        let bracketed_v6 = h.starts_with('[') && h.ends_with(']');
        if h.is_empty() || h.contains('/') || (h.contains(':') && !bracketed_v6) {
            errs.at(
                &format!("{path}.match.host"),
                format!("{h:?} must be a host name without scheme, port or path"),
            );
        }
    }
    let cost = r.cost.unwrap_or(1);
    if cost == 0 {
        errs.at(&format!("{path}.cost"), "must be at least 1");
    }
    Route {
        name: r.name.as_str().into(),
        methods,
        path_prefix,
        host,
        // A placeholder when undefined: the error above fails the whole config.
        upstream: upstream.unwrap_or(0),
        cost,
        limits: Vec::new(),
        concurrency: Vec::new(),
        priority: route_priority(errs, path, r.priority.as_deref()),
    }
}

struct LimitBuilder {
    limits: Vec<Limit>,
    concurrency: Vec<ConcurrencyLimit>,
    names: HashSet<String>,
    store_on_error: OnError,
    local_share: f64,
}

impl LimitBuilder {
    fn add(
        &mut self,
        errs: &mut Errors,
        path: &str,
        l: raw::Limit,
        default_key: &[KeyPart],
    ) -> Option<Added> {
        let before = errs.count();
        if l.name.is_empty() || !l.name.chars().all(is_name_char) {
            errs.at(
                &format!("{path}.name"),
                format!(
                    "{:?} must be non-empty and use only letters, digits, '_', '-', '.'",
                    l.name
                ),
            );
        } else if !self.names.insert(l.name.clone()) {
            errs.at(
                &format!("{path}.name"),
                format!("duplicate limit name {:?} (limit names are unique across tiers, routes and limits)", l.name),
            );
        }
        match limit_kind(errs, path, l.kind.as_deref()) {
            Kind::Rate => {}
            Kind::Concurrency => {
                return self
                    .add_concurrency(errs, path, l, default_key, before)
                    .map(Added::Concurrency);
            }
            Kind::Unknown => {
                // Which fields belong depends on the kind: check only what every kind has.
                key_parts(errs, path, l.key, default_key);
                if let Some(s) = &l.on_error {
                    on_error(errs, &format!("{path}.on_error"), s);
                }
                return None;
            }
        }
        if l.timeout.is_some() {
            errs.at(
                &format!("{path}.timeout"),
                "applies only to kind: concurrency",
            );
        }
        let algorithm = match l.algorithm.as_deref() {
            None => Algorithm::default(),
            Some(s) => s.parse().unwrap_or_else(|_| {
                errs.at(
                    &format!("{path}.algorithm"),
                    format!(
                        "{s:?} is not an algorithm ({})",
                        Algorithm::ALL.map(|a| a.as_str()).join(", ")
                    ),
                );
                Algorithm::default()
            }),
        };
        if l.limit == 0 {
            errs.at(&format!("{path}.limit"), "must be at least 1");
        }
        let window = match &l.window {
            Some(w) => duration(errs, &format!("{path}.window"), w),
            None => {
                errs.at(
                    &format!("{path}.window"),
                    "missing: a rate limit needs a window (examples: 1s, 1m, 1h)",
                );
                None
            }
        };
        let window_ms = window.map_or(1, |w| w.as_millis() as u64);
        if window.is_some() && window_ms == 0 {
            errs.at(&format!("{path}.window"), "must be at least 1ms");
        }
        let burst = match (l.burst, algorithm) {
            (None, _) => l.limit,
            (Some(0), _) => {
                errs.at(&format!("{path}.burst"), "must be at least 1");
                1
            }
            (Some(b), Algorithm::TokenBucket | Algorithm::Gcra) => b,
            (Some(_), a) => {
                errs.at(
                    &format!("{path}.burst"),
                    format!("applies only to token_bucket and gcra, not {a}"),
                );
                l.limit
            }
        };
        if window_ms > 0
            && (l.limit.saturating_mul(window_ms) > MAX_SCALED
                || burst.saturating_mul(window_ms) > MAX_SCALED)
        {
            errs.at(
                &format!("{path}.limit"),
                format!("limit × window in ms must not exceed 2^53 ({MAX_SCALED})"),
            );
        }
        let key = key_parts(errs, path, l.key, default_key);
        let on_error = match l.on_error {
            None => self.store_on_error,
            Some(s) => on_error(errs, &format!("{path}.on_error"), &s).unwrap_or(OnError::Allow),
        };
        if errs.count() > before {
            return None;
        }
        let quota = Quota::new(algorithm, l.limit, window_ms).with_burst(burst);
        let share = |n: u64| ((n as f64 * self.local_share).floor() as u64).max(1);
        let local_quota = Quota::new(algorithm, share(l.limit), window_ms).with_burst(share(burst));
        let window_s = window_ms.div_ceil(1000);
        let policy = format!("\"{}\";q={};w={}", l.name, l.limit, window_s);
        self.limits.push(Limit {
            name: l.name.into(),
            key,
            quota,
            anonymous_only: l.anonymous_only.unwrap_or(false),
            shadow: l.shadow.unwrap_or(false),
            on_error,
            local_quota,
            policy_header: HeaderValue::from_str(&policy).expect("validated name"),
            window_label: l.window.unwrap_or_default(),
        });
        Some(Added::Rate(self.limits.len() - 1))
    }
}

fn key_parts(
    errs: &mut Errors,
    path: &str,
    parts: Option<Vec<String>>,
    default_key: &[KeyPart],
) -> Vec<KeyPart> {
    let key: Vec<KeyPart> = match parts {
        None => default_key.to_vec(),
        Some(parts) => parts
            .iter()
            .enumerate()
            .filter_map(|(i, p)| match key_part(p) {
                Some(k) => Some(k),
                None => {
                    errs.at(
                        &format!("{path}.key[{i}]"),
                        format!(
                            "{p:?} is not a key part (api_key, user, client_ip, route, method, tier, header:<name>)"
                        ),
                    );
                    None
                }
            })
            .collect(),
    };
    if key.len() > MAX_KEY_PARTS {
        errs.at(
            &format!("{path}.key"),
            format!("at most {MAX_KEY_PARTS} key parts"),
        );
    }
    key
}

// ---------------------------------------------------------------------------------------
// Concurrency limits, route priorities and load shedding.
// ---------------------------------------------------------------------------------------

/// A limit's `kind`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Rate,
    Concurrency,
    /// Reported; the limit is not built.
    Unknown,
}

fn limit_kind(errs: &mut Errors, path: &str, kind: Option<&str>) -> Kind {
    match kind {
        None | Some("rate") => Kind::Rate,
        Some("concurrency") => Kind::Concurrency,
        Some(other) => {
            errs.at(
                &format!("{path}.kind"),
                format!("{other:?} is not a limit kind (rate, concurrency)"),
            );
            Kind::Unknown
        }
    }
}

/// Where a validated limit went: rate limits and concurrency limits are kept apart.
#[derive(Debug, Clone, Copy)]
enum Added {
    Rate(LimitId),
    Concurrency(ConcurrencyId),
}

impl Added {
    fn attach(self, rate: &mut Vec<LimitId>, concurrency: &mut Vec<ConcurrencyId>) {
        match self {
            Added::Rate(id) => rate.push(id),
            Added::Concurrency(id) => concurrency.push(id),
        }
    }
}

impl LimitBuilder {
    /// The rest of a `kind: concurrency` limit, once its name is checked.
    fn add_concurrency(
        &mut self,
        errs: &mut Errors,
        path: &str,
        l: raw::Limit,
        default_key: &[KeyPart],
        before: usize,
    ) -> Option<ConcurrencyId> {
        for (field, set) in [
            ("algorithm", l.algorithm.is_some()),
            ("window", l.window.is_some()),
            ("burst", l.burst.is_some()),
        ] {
            if set {
                errs.at(
                    &format!("{path}.{field}"),
                    "does not apply to kind: concurrency",
                );
            }
        }
        if l.limit == 0 {
            errs.at(&format!("{path}.limit"), "must be at least 1");
        }
        let timeout = match &l.timeout {
            Some(t) => duration(errs, &format!("{path}.timeout"), t),
            None => {
                errs.at(
                    &format!("{path}.timeout"),
                    "missing: a concurrency limit needs a timeout, after which the slot of a request that has not ended is freed (examples: 30s, 1m)",
                );
                None
            }
        };
        if timeout.is_some_and(|t| t.as_millis() == 0) {
            errs.at(&format!("{path}.timeout"), "must be at least 1ms");
        }
        let key = key_parts(errs, path, l.key, default_key);
        let on_error = match l.on_error {
            None => self.store_on_error,
            Some(s) => on_error(errs, &format!("{path}.on_error"), &s).unwrap_or(OnError::Allow),
        };
        if errs.count() > before {
            return None;
        }
        self.concurrency.push(ConcurrencyLimit {
            name: l.name.into(),
            key,
            limit: l.limit,
            timeout: timeout.expect("validated"),
            anonymous_only: l.anonymous_only.unwrap_or(false),
            shadow: l.shadow.unwrap_or(false),
            on_error,
            local_limit: ((l.limit as f64 * self.local_share).floor() as u64).max(1),
        });
        Some(self.concurrency.len() - 1)
    }
}

fn route_priority(errs: &mut Errors, path: &str, p: Option<&str>) -> Option<Priority> {
    let p = p?;
    let parsed = Priority::parse(p);
    if parsed.is_none() {
        errs.at(
            &format!("{path}.priority"),
            format!("{p:?} is not a priority class (critical, post, get, test)"),
        );
    }
    parsed
}

fn shedding_settings(errs: &mut Errors, r: raw::Shedding) -> Shedding {
    if r.max_in_flight == 0 {
        errs.at("shedding.max_in_flight", "must be at least 1");
    }
    let t = r.thresholds.unwrap_or_default();
    let d = defaults::SHED_THRESHOLDS;
    let thresholds = [
        ("test", t.test.unwrap_or(d[0])),
        ("get", t.get.unwrap_or(d[1])),
        ("post", t.post.unwrap_or(d[2])),
    ];
    let mut in_range = true;
    for (class, v) in thresholds {
        if !(v > 0.0 && v <= 1.0) {
            in_range = false;
            errs.at(
                &format!("shedding.thresholds.{class}"),
                format!("{v} must be greater than 0 and at most 1"),
            );
        }
    }
    let [(_, test), (_, get), (_, post)] = thresholds;
    if in_range && !(test < get && get < post) {
        errs.at(
            "shedding.thresholds",
            format!("must increase with priority (test < get < post), got test {test}, get {get}, post {post}"),
        );
    }
    let mut test_traffic = TestTraffic::default();
    if let Some(tt) = r.test_traffic {
        if tt.header.is_none() && tt.api_key_prefix.is_none() {
            errs.at(
                "shedding.test_traffic",
                "set `header`, `api_key_prefix` or both",
            );
        }
        test_traffic.header = tt
            .header
            .and_then(|h| header_name(errs, "shedding.test_traffic.header", &h));
        if tt.api_key_prefix.as_deref() == Some("") {
            errs.at(
                "shedding.test_traffic.api_key_prefix",
                "must not be empty (it would make every API key test traffic)",
            );
        }
        test_traffic.api_key_prefix = tt.api_key_prefix;
    }
    Shedding::new(r.max_in_flight, [test, get, post], test_traffic)
}

fn key_part(s: &str) -> Option<KeyPart> {
    Some(match s {
        "api_key" => KeyPart::ApiKey,
        "user" => KeyPart::User,
        "client_ip" => KeyPart::ClientIp,
        "route" => KeyPart::Route,
        "method" => KeyPart::Method,
        "tier" => KeyPart::Tier,
        _ => {
            let name = s.strip_prefix("header:")?;
            KeyPart::Header(HeaderName::from_bytes(name.as_bytes()).ok()?)
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(yaml: &str) -> Result<Config, Vec<String>> {
        from_yaml("gateway.yaml", yaml, &Overrides::default()).map_err(|e| e.0)
    }

    const MIN: &str = "upstreams: { backend: [\"127.0.0.1:9000\"] }\nroutes: [ { name: default, match: { path_prefix: / }, upstream: backend } ]\n";

    #[test]
    fn minimal_config_gets_defaults() {
        let c = check(MIN).unwrap();
        assert_eq!(c.server.listen.to_string(), "0.0.0.0:8080");
        assert_eq!(c.server.admin_listen.to_string(), "127.0.0.1:9901");
        assert_eq!(c.store.timeout, Duration::from_millis(25));
        assert_eq!(c.store.on_error, OnError::Allow);
        assert!(c.headers.ietf && c.headers.legacy);
        assert!(c.limits.is_empty());
    }

    #[test]
    fn collects_errors_from_every_section() {
        let yaml = format!(
            "{MIN}store: {{ timeout: 1x }}\nlimits:\n  - {{ name: a, limit: 0, window: 1m }}\n  - {{ name: b, limt: 5, window: 1m }}\n"
        );
        let errs = check(&yaml).unwrap_err();
        assert_eq!(
            errs,
            vec![
                "gateway.yaml: store.timeout: \"1x\" is not a duration (examples: 500ms, 30s, 1m, 1h, 1d)",
                "gateway.yaml: limits[0].limit: must be at least 1",
                "gateway.yaml: limits[1].limt: unknown field `limt`, expected one of `name`, `kind`, `key`, `algorithm`, `limit`, `window`, `timeout`, `burst`, `anonymous_only`, `shadow`, `on_error`, `routes`",
            ]
        );
    }

    #[test]
    fn top_level_limits_attach_to_named_routes_only() {
        let yaml = "upstreams: { b: [\"127.0.0.1:9000\"] }\nroutes:\n  - { name: login, match: { path_prefix: /login }, upstream: b }\n  - { name: rest, match: { path_prefix: / }, upstream: b }\nlimits:\n  - { name: l, key: [client_ip], limit: 5, window: 1m, routes: [login] }\n  - { name: g, key: [], limit: 5, window: 1s }\n";
        let c = check(yaml).unwrap();
        let login = c.routes.iter().find(|r| &*r.name == "login").unwrap();
        let rest = c.routes.iter().find(|r| &*r.name == "rest").unwrap();
        assert_eq!(login.limits, vec![0, 1]);
        assert_eq!(rest.limits, vec![1]);
        assert_eq!(c.limits[0].policy_header, "\"l\";q=5;w=60");
    }

    #[test]
    fn concurrency_limits_are_kept_apart_from_rate_limits() {
        let yaml = r#"
store: { local_share: 0.5 }
tiers:
  free:
    - { name: free-minute, limit: 100, window: 1m }
    - { name: free-inflight, kind: concurrency, limit: 5, timeout: 30s }
upstreams: { b: ["127.0.0.1:9000"] }
routes:
  - name: pay
    match: { path_prefix: /pay }
    upstream: b
    priority: critical
    limits: [ { name: pay-inflight, kind: concurrency, key: [route], limit: 3, timeout: 1m, on_error: deny } ]
  - { name: rest, match: { path_prefix: / }, upstream: b }
limits:
  - { name: inflight, kind: concurrency, key: [api_key], limit: 20, timeout: 60s, routes: [rest] }
  - { name: g, kind: rate, key: [], limit: 5, window: 1s }
"#;
        let c = check(yaml).unwrap();
        let names = |ids: &[usize]| -> Vec<String> {
            ids.iter()
                .map(|&i| c.concurrency[i].name.to_string())
                .collect()
        };
        assert_eq!(
            c.limits.iter().map(|l| &*l.name).collect::<Vec<_>>(),
            ["free-minute", "g"]
        );
        let free = &c.tiers[0];
        assert_eq!(names(&free.concurrency), ["free-inflight"]);
        assert_eq!(c.concurrency[free.concurrency[0]].key, [KeyPart::ApiKey]);
        let pay = c.routes.iter().find(|r| &*r.name == "pay").unwrap();
        let rest = c.routes.iter().find(|r| &*r.name == "rest").unwrap();
        assert_eq!(names(&pay.concurrency), ["pay-inflight"]);
        assert_eq!(names(&rest.concurrency), ["inflight"]);
        assert_eq!(pay.priority, Some(Priority::Critical));
        assert_eq!(rest.priority, None);
        let inflight = &c.concurrency[rest.concurrency[0]];
        assert_eq!(
            (inflight.limit, inflight.timeout, inflight.local_limit),
            (20, Duration::from_secs(60), 10)
        );
        assert_eq!(c.concurrency[pay.concurrency[0]].on_error, OnError::Deny);
        assert!(c.shedding.is_none());
    }

    #[test]
    fn shedding_defaults_and_names_shared_with_rate_limits() {
        let yaml = format!("{MIN}shedding: {{ max_in_flight: 40 }}\n");
        let s = check(&yaml).unwrap().shedding.unwrap();
        assert_eq!(s.thresholds, defaults::SHED_THRESHOLDS);
        assert_eq!(s.cap(Priority::Test), Some(28));
        assert_eq!(s.cap(Priority::Critical), None);
        assert!(s.test_traffic.header.is_none());

        // One name space for both kinds.
        let yaml = format!("{MIN}limits:\n  - {{ name: a, limit: 1, window: 1s }}\n  - {{ name: a, kind: concurrency, limit: 1, timeout: 1s }}\n");
        assert_eq!(
            check(&yaml).unwrap_err(),
            ["gateway.yaml: limits[1].name: duplicate limit name \"a\" (limit names are unique across tiers, routes and limits)"]
        );
    }
}
