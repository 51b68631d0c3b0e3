//! One pass from YAML text to a validated [`Config`], collecting every error with the file
//! name and the field path in front.
//!
//! Each top-level section, and each element of `routes`, `limits` and every tier, is
//! deserialized on its own, so that one structural mistake does not hide the others.

use std::collections::HashMap;

use serde_yaml::{Mapping, Value};

use super::errors::{clean_serde_message, Errors};
use super::limits::LimitBuilder;
use super::routes::{self, Route, RouteId};
use super::{
    access_log, admin, defaults, identity, quotas, raw, server, shedding, store, tiers, Config,
    ConfigErrors, HeaderSettings, Startup,
};

/// Command-line settings that take precedence over the file.
#[derive(Debug, Clone, Default)]
pub struct Overrides {
    pub listen: Option<String>,
    pub admin_listen: Option<String>,
    /// `--upstream`: the servers of the upstream named `default`.
    pub upstream: Vec<String>,
    pub redis_url: Option<String>,
    /// `--log-format json`: the access log defaults to JSON too.
    pub json_logs: bool,
}

/// The sections of one file, each deserialized on its own.
#[derive(Default)]
struct Sections {
    server: raw::Server,
    store: raw::Store,
    identity: raw::Identity,
    tiers: Vec<(String, Value)>,
    api_keys: Vec<(String, Value)>,
    default_tier: Option<String>,
    upstreams: Vec<(String, Value)>,
    routes: Vec<Value>,
    limits: Vec<Value>,
    headers: raw::Headers,
    shedding: Option<raw::Shedding>,
    quotas: Option<raw::Quotas>,
    access_log: raw::AccessLog,
    admin: raw::Admin,
}

/// The top-level mapping of the file, or `None` (reported) when the file is not one.
fn root(errs: &mut Errors, text: &str) -> Option<Mapping> {
    match serde_yaml::from_str(text) {
        Ok(Value::Null) => Some(Mapping::new()),
        Ok(Value::Mapping(m)) => Some(m),
        Ok(_) => {
            errs.at("", "the top level must be a mapping of sections");
            None
        }
        Err(e) => {
            let loc = e
                .location()
                .map(|l| format!("line {} column {}: ", l.line(), l.column()))
                .unwrap_or_default();
            errs.at(
                "",
                format!("{loc}invalid YAML: {}", clean_serde_message(&e.to_string())),
            );
            None
        }
    }
}

fn sections(errs: &mut Errors, map: Mapping, o: &Overrides) -> Sections {
    let mut found: HashMap<String, Value> = HashMap::new();
    for (k, v) in map {
        let Some(name) = k.as_str() else {
            errs.at("", format!("section names must be strings, found {k:?}"));
            continue;
        };
        if !raw::SECTIONS.contains(&name) {
            let expected = raw::SECTIONS.join(", ");
            errs.at(name, format!("unknown section, expected one of {expected}"));
            continue;
        }
        found.insert(name.to_string(), v);
    }
    let mut take = |name: &str| found.remove(name).filter(|v| !v.is_null());
    let mut s = Sections::default();
    if let Some(v) = take("server").and_then(|v| errs.parse("server", v)) {
        s.server = v;
    }
    if let Some(v) = take("store").and_then(|v| errs.parse("store", v)) {
        s.store = v;
    }
    if let Some(v) = take("identity").and_then(|v| errs.parse("identity", v)) {
        s.identity = v;
    }
    s.tiers = take("tiers").map_or_else(Vec::new, |v| errs.entries("tiers", v));
    s.api_keys = take("api_keys").map_or_else(Vec::new, |v| errs.entries("api_keys", v));
    s.default_tier = take("default_tier").and_then(|v| errs.parse("default_tier", v));
    let upstreams = take("upstreams");
    let routes = take("routes");
    s.limits = take("limits")
        .and_then(|v| errs.parse("limits", v))
        .unwrap_or_default();
    if let Some(v) = take("headers").and_then(|v| errs.parse("headers", v)) {
        s.headers = v;
    }
    s.shedding = take("shedding").and_then(|v| errs.parse("shedding", v));
    s.quotas = take("quotas").and_then(|v| errs.parse("quotas", v));
    if let Some(v) = take("access_log").and_then(|v| errs.parse("access_log", v)) {
        s.access_log = v;
    }
    if let Some(v) = take("admin").and_then(|v| errs.parse("admin", v)) {
        s.admin = v;
    }
    s.upstreams = upstreams_section(errs, upstreams, o);
    s.routes = routes_section(errs, routes, o);
    s
}

/// `upstreams`, with `--upstream` as the upstream named `default`.
fn upstreams_section(errs: &mut Errors, v: Option<Value>, o: &Overrides) -> Vec<(String, Value)> {
    let mut entries = match v {
        Some(v) => {
            let e = errs.entries("upstreams", v);
            if e.is_empty() && o.upstream.is_empty() {
                errs.at("upstreams", "empty: define at least one upstream");
            }
            e
        }
        None if !o.upstream.is_empty() => Vec::new(),
        None => {
            errs.at("upstreams", "missing: define at least one upstream");
            Vec::new()
        }
    };
    if !o.upstream.is_empty() {
        let servers = Value::Sequence(o.upstream.iter().cloned().map(Value::String).collect());
        match entries
            .iter_mut()
            .find(|(n, _)| n == defaults::FLAG_UPSTREAM)
        {
            Some((_, v)) => *v = servers,
            None => entries.push((defaults::FLAG_UPSTREAM.to_string(), servers)),
        }
    }
    entries
}

/// `routes`; with `--upstream` and no routes, one catch-all route to it.
fn routes_section(errs: &mut Errors, v: Option<Value>, o: &Overrides) -> Vec<Value> {
    match v {
        Some(v) => {
            let routes: Vec<Value> = errs.parse("routes", v).unwrap_or_default();
            if routes.is_empty() {
                errs.at("routes", "empty: define at least one route");
            }
            routes
        }
        None if !o.upstream.is_empty() => {
            vec![serde_yaml::from_str(defaults::CATCH_ALL_ROUTE).expect("built-in route")]
        }
        None => {
            errs.at("routes", "missing: define at least one route");
            Vec::new()
        }
    }
}

/// Validate a whole configuration. `file` labels every error.
pub fn from_yaml(file: &str, text: &str, overrides: &Overrides) -> Result<Config, ConfigErrors> {
    let mut errs = Errors::new(file);
    let Some(map) = root(&mut errs, text) else {
        return Err(errs.finish().expect_err("reported"));
    };
    let s = sections(&mut errs, map, overrides);
    let (server, http) = server::validate(&mut errs, s.server, overrides);
    let (store, failure) = store::validate(&mut errs, s.store, overrides);
    let identity = identity::validate(&mut errs, s.identity);
    let shedding = s.shedding.map(|r| shedding::validate(&mut errs, r));
    let quotas = s.quotas.map(|r| quotas::validate(&mut errs, r));
    let access_log = access_log::validate(&mut errs, s.access_log, overrides.json_logs);
    let admin = admin::validate(&mut errs, s.admin);
    let mut b = LimitBuilder::new(failure);
    let (tiers, tier_ids) = tiers::tiers(&mut errs, s.tiers, &mut b);
    let api_keys = tiers::api_keys(&mut errs, s.api_keys, &tier_ids);
    let default_tier = tiers::default_tier(&mut errs, s.default_tier, &tier_ids);
    let (upstreams, upstream_ids) = routes::upstreams(&mut errs, s.upstreams);
    let (mut routes, route_ids) =
        routes_and_their_limits(&mut errs, s.routes, &upstream_ids, &mut b);
    top_level_limits(&mut errs, s.limits, &mut routes, &route_ids, &mut b);
    errs.finish()?;
    routes::sort_for_matching(&mut routes);
    let headers = HeaderSettings {
        ietf: s.headers.ietf.unwrap_or(defaults::HEADERS.ietf),
        legacy: s.headers.legacy.unwrap_or(defaults::HEADERS.legacy),
        on_admitted: s
            .headers
            .on_admitted
            .unwrap_or(defaults::HEADERS.on_admitted),
    };
    Ok(Config {
        source: file.to_string(),
        startup: Startup {
            server,
            store,
            quotas,
            admin_max_connections: admin.max_connections,
        },
        http,
        identity,
        limits: b.limits,
        tiers,
        api_keys,
        default_tier,
        upstreams,
        routes,
        headers,
        shedding,
        failure,
        access_log,
        admin,
    })
}

/// Route names and their ids: `None` for a route with errors, which still counts as defined
/// so that a top-level limit naming it gets no second, misleading error.
type RouteIds = HashMap<String, Option<RouteId>>;

/// Every route, first without limits so that top-level limits can name them, then with their
/// own limits. A route with errors still registers its name and has its limits checked, so
/// that one mistake is reported once and does not hide or cause others.
fn routes_and_their_limits(
    errs: &mut Errors,
    items: Vec<Value>,
    upstream_ids: &HashMap<String, usize>,
    b: &mut LimitBuilder,
) -> (Vec<Route>, RouteIds) {
    let mut routes = Vec::new();
    let mut ids: RouteIds = HashMap::new();
    let mut own_limits = Vec::new();
    for (i, item) in items.into_iter().enumerate() {
        let path = format!("routes[{i}]");
        let name = item.get("name").and_then(Value::as_str).map(str::to_string);
        let Some(r) = errs.parse::<raw::Route>(&path, item) else {
            if let Some(n) = name {
                ids.entry(n).or_insert(None);
            }
            continue;
        };
        let route = routes::route(errs, &path, &r, upstream_ids);
        if ids.insert(r.name.clone(), Some(routes.len())).is_some() {
            errs.at(
                &format!("{path}.name"),
                format!("duplicate route name {:?}", r.name),
            );
        }
        routes.push(route);
        own_limits.push((path, r.limits.unwrap_or_default()));
    }
    for (ri, (path, items)) in own_limits.into_iter().enumerate() {
        for (i, item) in items.into_iter().enumerate() {
            let path = format!("{path}.limits[{i}]");
            let Some(l) = errs.parse::<raw::Limit>(&path, item) else {
                continue;
            };
            if l.routes.is_some() {
                errs.at(
                    &format!("{path}.routes"),
                    "a route's own limit cannot name routes; move it to the top-level limits",
                );
            }
            if let Some(id) = b.add(errs, &path, l, &[]) {
                routes[ri].limits.push(id, &b.limits);
            }
        }
    }
    (routes, ids)
}

/// The top-level `limits`, attached to the routes they name (all when they name none).
fn top_level_limits(
    errs: &mut Errors,
    items: Vec<Value>,
    routes: &mut [Route],
    route_ids: &RouteIds,
    b: &mut LimitBuilder,
) {
    for (i, item) in items.into_iter().enumerate() {
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
        let only: Option<Vec<RouteId>> = l.routes.as_ref().map(|names| {
            let mut only = Vec::new();
            for (j, n) in names.iter().enumerate() {
                match route_ids.get(n) {
                    Some(r) => only.extend(*r),
                    None => errs.at(
                        &format!("{path}.routes[{j}]"),
                        format!("route {n:?} is not defined under routes"),
                    ),
                }
            }
            only
        });
        if let Some(id) = b.add(errs, &path, l, &[]) {
            for (r, route) in routes.iter_mut().enumerate() {
                if only.as_ref().is_none_or(|o| o.contains(&r)) {
                    route.limits.push(id, &b.limits);
                }
            }
        }
    }
}
