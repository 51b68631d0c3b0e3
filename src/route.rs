//! Which route a request matches.
//!
//! Phase: `request_filter`, after identity. Routes are already sorted by validation (longest
//! `path_prefix` first, host-specific first), so the first match wins. A prefix matches at a
//! path-segment boundary: `/api/v1/orders` matches `/api/v1/orders` and `/api/v1/orders/7`,
//! not `/api/v1/ordersX`.

use std::cell::LazyCell;

use http::Method;

use crate::config::{Config, Route};

/// The index in `cfg.routes` of the route for this request, if any. `host` gives the request's
/// host; it is asked for only when a route names one.
pub fn match_route<'a>(
    cfg: &Config,
    method: &Method,
    host: impl FnOnce() -> Option<&'a str>,
    path: &str,
) -> Option<usize> {
    // `Api.Example.com.:8080` is `api.example.com` (compared without case).
    let host = LazyCell::new(|| host().map(|h| crate::path::trim_host_dot(strip_port(h))));
    cfg.routes
        .iter()
        .position(|r| matches(r, method, || *host, path))
}

fn matches<'a>(
    r: &Route,
    method: &Method,
    host: impl FnOnce() -> Option<&'a str>,
    path: &str,
) -> bool {
    if let Some(want) = &r.host {
        match host() {
            Some(h) if h.eq_ignore_ascii_case(want) => {}
            _ => return false,
        }
    }
    if let Some(methods) = &r.methods {
        if !methods.contains(method) {
            return false;
        }
    }
    prefix_matches(&r.path_prefix, path)
}

fn prefix_matches(prefix: &str, path: &str) -> bool {
    match path.strip_prefix(prefix) {
        None => false,
        Some(rest) => prefix.ends_with('/') || rest.is_empty() || rest.starts_with('/'),
    }
}

fn strip_port(host: &str) -> &str {
    if host.starts_with('[') {
        // [v6]:port
        return host
            .split_once(']')
            .map_or(host, |(h, _)| &host[..h.len() + 1]);
    }
    host.rsplit_once(':').map_or(host, |(h, _)| h)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{from_yaml, Overrides};

    fn cfg() -> Config {
        let yaml = r#"
upstreams: { b: ["127.0.0.1:9000"] }
routes:
  - { name: orders-write, match: { methods: [POST], path_prefix: /api/v1/orders }, upstream: b }
  - { name: api, match: { path_prefix: /api }, upstream: b }
  - { name: admin-host, match: { path_prefix: /api, host: admin.example.com }, upstream: b }
  - { name: default, match: { path_prefix: / }, upstream: b }
"#;
        from_yaml("t.yaml", yaml, &Overrides::default()).unwrap()
    }

    fn name(c: &Config, m: Method, host: Option<&str>, path: &str) -> String {
        c.routes[match_route(c, &m, || host, path).unwrap()]
            .name
            .to_string()
    }

    #[test]
    fn longest_prefix_then_host_then_method() {
        let c = cfg();
        assert_eq!(
            name(&c, Method::POST, None, "/api/v1/orders/7"),
            "orders-write"
        );
        assert_eq!(name(&c, Method::GET, None, "/api/v1/orders/7"), "api");
        assert_eq!(name(&c, Method::POST, None, "/api/v1/ordersX"), "api");
        assert_eq!(
            name(&c, Method::GET, Some("Admin.Example.com:8080"), "/api/x"),
            "admin-host"
        );
        assert_eq!(
            name(&c, Method::GET, Some("admin.example.com.:80"), "/api/x"),
            "admin-host"
        );
        assert_eq!(name(&c, Method::GET, None, "/apix"), "default");
        assert_eq!(name(&c, Method::GET, None, "/"), "default");
    }

    #[test]
    fn the_host_is_read_only_when_a_route_names_one() {
        let no_hosts = from_yaml(
            "t.yaml",
            "upstreams: { b: [\"127.0.0.1:9000\"] }\nroutes:\n  - { name: api, match: { path_prefix: /api }, upstream: b }\n  - { name: default, match: { path_prefix: / }, upstream: b }\n",
            &Overrides::default(),
        )
        .unwrap();
        let mut reads = 0;
        let host = || {
            reads += 1;
            Some("admin.example.com")
        };
        assert_eq!(
            match_route(&no_hosts, &Method::GET, host, "/api/x"),
            Some(0)
        );
        assert_eq!(reads, 0);
        // With a host route on the way: read once, whatever the routes after it.
        let c = cfg();
        let host = || {
            reads += 1;
            Some("other.example.com")
        };
        assert_eq!(
            c.routes[match_route(&c, &Method::GET, host, "/apix").unwrap()]
                .name
                .as_ref(),
            "default"
        );
        assert_eq!(reads, 1);
    }
}
