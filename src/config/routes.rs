//! `upstreams` and `routes`: where requests go, and which route a request belongs to.

use std::collections::HashMap;
use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use http::Method;
use serde_yaml::Value;

use super::errors::{check_name, Errors};
use super::limits::LimitIds;
use super::shedding::Priority;
use super::{defaults, raw};

pub type UpstreamId = usize;
pub type RouteId = usize;

#[derive(Debug)]
pub struct Upstream {
    pub name: String,
    pub servers: Vec<SocketAddr>,
    pub timeouts: UpstreamTimeouts,
    next: AtomicUsize,
}

/// How long the gateway waits on an upstream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UpstreamTimeouts {
    /// To connect (TCP); a connect that fails or times out is answered `502`.
    pub connect: Duration,
    /// For each read of the response; a read that times out is answered `504`.
    pub read: Duration,
    /// For each write of the request; a write that times out is answered `504`.
    pub write: Duration,
    /// How long an idle upstream connection stays in the pool.
    pub idle: Duration,
}

impl Upstream {
    pub fn new(name: String, servers: Vec<SocketAddr>, timeouts: UpstreamTimeouts) -> Self {
        Upstream {
            name,
            servers,
            timeouts,
            next: AtomicUsize::new(0),
        }
    }

    /// Round robin over the servers. A single server is picked without the shared counter's
    /// atomic add and the division.
    pub fn pick(&self) -> SocketAddr {
        if let [only] = self.servers[..] {
            return only;
        }
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
    pub limits: LimitIds,
    /// The priority class set on the route (otherwise it follows the method).
    pub priority: Option<Priority>,
    /// Overrides `server.max_body_bytes`.
    pub max_body_bytes: Option<u64>,
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

/// `upstreams`, with their ids by name. An upstream is a list of servers, or a mapping with
/// `servers` and `timeouts`.
pub(super) fn upstreams(
    errs: &mut Errors,
    entries: Vec<(String, Value)>,
) -> (Vec<Upstream>, HashMap<String, UpstreamId>) {
    let mut upstreams = Vec::new();
    let mut ids = HashMap::new();
    for (name, value) in entries {
        let path = format!("upstreams.{name}");
        let mapping = matches!(value, Value::Mapping(_));
        let (servers, timeouts) = if mapping {
            match errs.parse::<raw::Upstream>(&path, value) {
                Some(u) => (
                    u.servers,
                    timeouts(errs, &path, u.timeouts.unwrap_or_default()),
                ),
                None => (Vec::new(), defaults::UPSTREAM_TIMEOUTS),
            }
        } else {
            let servers = errs.parse(&path, value).unwrap_or_default();
            (servers, defaults::UPSTREAM_TIMEOUTS)
        };
        let list = if mapping {
            format!("{path}.servers")
        } else {
            path.clone()
        };
        if servers.is_empty() {
            errs.at(&list, "needs at least one server (host:port)");
        }
        let mut addrs = Vec::new();
        for (i, s) in servers.iter().enumerate() {
            match resolve(s) {
                Ok(a) => addrs.push(a),
                Err(e) => errs.at(&format!("{list}[{i}]"), e),
            }
        }
        ids.insert(name.clone(), upstreams.len());
        upstreams.push(Upstream::new(name, addrs, timeouts));
    }
    (upstreams, ids)
}

fn timeouts(errs: &mut Errors, path: &str, t: raw::Timeouts) -> UpstreamTimeouts {
    let d = defaults::UPSTREAM_TIMEOUTS;
    let mut one = |field: &str, v: Option<String>, default: Duration| {
        let p = format!("{path}.timeouts.{field}");
        let got = v.and_then(|s| errs.duration(&p, &s)).unwrap_or(default);
        if got.is_zero() {
            errs.at(&p, "must be greater than zero");
        }
        got
    };
    UpstreamTimeouts {
        connect: one("connect", t.connect, d.connect),
        read: one("read", t.read, d.read),
        write: one("write", t.write, d.write),
        idle: one("idle", t.idle, d.idle),
    }
}

fn methods(errs: &mut Errors, path: &str, ms: &[String]) -> Vec<Method> {
    ms.iter()
        .enumerate()
        .filter_map(|(i, m)| {
            let upper = m.to_ascii_uppercase();
            let found = STANDARD_METHODS.iter().find(|s| s.as_str() == upper);
            if found.is_none() {
                let all: Vec<&str> = STANDARD_METHODS.iter().map(Method::as_str).collect();
                errs.at(
                    &format!("{path}.match.methods[{i}]"),
                    format!("{m:?} is not an HTTP method ({})", all.join(", ")),
                );
            }
            found.cloned()
        })
        .collect()
}

/// One route, without its limits (they are attached once every route is known).
pub(super) fn route(
    errs: &mut Errors,
    path: &str,
    r: &raw::Route,
    upstream_ids: &HashMap<String, UpstreamId>,
) -> Route {
    check_name(errs, &format!("{path}.name"), &r.name);
    let upstream = upstream_ids.get(&r.upstream).copied();
    if upstream.is_none() {
        errs.at(
            &format!("{path}.upstream"),
            format!("upstream {:?} is not defined under upstreams", r.upstream),
        );
    }
    let methods = r.matcher.methods.as_ref().map(|ms| methods(errs, path, ms));
    let path_prefix = r
        .matcher
        .path_prefix
        .clone()
        .unwrap_or_else(|| defaults::PATH_PREFIX.into());
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
    let cost = r.cost.unwrap_or(defaults::COST);
    if cost == 0 {
        errs.at(&format!("{path}.cost"), "must be at least 1");
    }
    let priority = r
        .priority
        .as_deref()
        .and_then(|p| errs.word(&format!("{path}.priority"), p));
    Route {
        name: r.name.as_str().into(),
        methods,
        path_prefix,
        host,
        // A placeholder when undefined: the error above fails the whole config.
        upstream: upstream.unwrap_or(0),
        cost,
        limits: LimitIds::default(),
        priority,
        max_body_bytes: r.max_body_bytes,
    }
}

/// Match order: longest prefix first, host-specific first, then file order (stable sort).
pub(super) fn sort_for_matching(routes: &mut [Route]) {
    routes.sort_by(|a, b| {
        b.path_prefix
            .len()
            .cmp(&a.path_prefix.len())
            .then(b.host.is_some().cmp(&a.host.is_some()))
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn upstream(servers: &[&str]) -> Upstream {
        let t = Duration::from_secs(1);
        let timeouts = UpstreamTimeouts {
            connect: t,
            read: t,
            write: t,
            idle: t,
        };
        let servers = servers.iter().map(|s| s.parse().unwrap()).collect();
        Upstream::new("u".into(), servers, timeouts)
    }

    #[test]
    fn pick_goes_round_the_servers_and_always_to_a_single_one() {
        let three = upstream(&["127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3"]);
        let ports: Vec<u16> = (0..7).map(|_| three.pick().port()).collect();
        assert_eq!(ports, [1, 2, 3, 1, 2, 3, 1]);
        let one = upstream(&["127.0.0.1:9"]);
        assert!((0..3).all(|_| one.pick().port() == 9));
        // The single server's pick leaves the counter alone.
        assert_eq!(one.next.load(Ordering::Relaxed), 0);
    }
}
