//! `GET /admin/v1/usage/{key}` and its reset: which of a key's counters can be named from the
//! key alone, and what they hold. A rate limit whose key is the API key, optionally with the
//! route or the tier (or nothing else), has counters the admin API can find; one keyed by the
//! client IP, the user, the method or a header is listed as not enumerable.
//!
//! Phase: the admin listener.

use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;

use http::{HeaderMap, Method};
use serde_json::{json, Value};

use crate::admission::Request;
use crate::config::{Config, KeyPart, LimitId, Route, Spec, TierId};
use crate::fingerprint::KeyHash;
use crate::identity::Caller;
use crate::quota::table::Resolved;
use crate::store::{Check, Store, StoreError};

/// One counter of the key: its limit, and the route when the limit counts per route.
struct Counter {
    id: LimitId,
    route: Option<usize>,
    check: Check,
}

/// The counters of `api_key` (in `tier`, with its override), and the limits whose counters the
/// key alone does not name.
fn counters(
    cfg: &Config,
    key: KeyHash,
    tier: Option<TierId>,
    overrides: Option<&Resolved>,
) -> (Vec<Counter>, Vec<Value>) {
    let caller = Caller {
        api_key: None,
        key_hash: Some(key),
        user: None,
        tier,
        client_ip: IpAddr::V4(Ipv4Addr::UNSPECIFIED),
        overrides: None,
    };
    let headers = HeaderMap::new();
    let mut found: Vec<Counter> = Vec::new();
    let mut not_enumerable = Vec::new();
    let tier_limits = tier.map_or(&[][..], |t| cfg.tiers[t].limits.rate.as_slice());
    let mut candidates: Vec<(LimitId, Option<usize>)> =
        tier_limits.iter().map(|&id| (id, None)).collect();
    for (r, route) in cfg.routes.iter().enumerate() {
        candidates.extend(route.limits.rate.iter().map(|&id| (id, Some(r))));
    }
    for (id, route) in candidates {
        let l = cfg.limit(id);
        let Spec::Rate(spec) = &l.spec else { continue };
        if l.anonymous_only {
            continue; // never applies to a caller with a key
        }
        let per_route = l.key.contains(&KeyPart::Route);
        // Keyed by the IP, user, method or a header too: the key alone does not name it.
        if let Some(part) = l
            .key
            .iter()
            .find(|p| !matches!(p, KeyPart::ApiKey | KeyPart::Route | KeyPart::Tier))
        {
            let name = l.name.to_string();
            if !not_enumerable.iter().any(|v: &Value| v["name"] == name) {
                not_enumerable.push(json!({ "name": name, "key": part.to_string() }));
            }
            continue;
        }
        if !l.key.contains(&KeyPart::ApiKey) {
            continue; // shared by every caller (global, per route or per tier), not the key's
        }
        // A limit on several routes without a route part is one counter.
        let route = if per_route { route } else { None };
        if found.iter().any(|c| c.id == id && c.route == route) {
            continue;
        }
        let route_ref: &Route = &cfg.routes[route.unwrap_or(0)];
        let req = Request {
            cfg,
            caller: &caller,
            route: route_ref,
            method: &Method::GET,
            headers: &headers,
            keys: None,
        };
        let Some(key) = req.counter_key(&l.name, &l.key) else {
            continue;
        };
        let quota = overrides
            .and_then(|o| o.rate(id))
            .map_or(spec.quota, |s| s.quota);
        found.push(Counter {
            id,
            route,
            check: Check {
                id,
                name: l.name.clone(),
                key,
                quota,
                cost: 1,
                shadow: l.shadow,
            },
        });
    }
    (found, not_enumerable)
}

/// What the key has used of each of its limits, read without consuming anything.
pub async fn usage(
    cfg: &Arc<Config>,
    store: &Store,
    key: KeyHash,
    tier: Option<TierId>,
    overrides: Option<&Resolved>,
    now_ms: u64,
) -> Result<(Vec<Value>, Vec<Value>), StoreError> {
    let (found, not_enumerable) = counters(cfg, key, tier, overrides);
    let checks: Vec<Check> = found.iter().map(|c| c.check.clone()).collect();
    let (read, _) = store.peek(&checks, now_ms).await?;
    let limits = found
        .iter()
        .zip(read)
        .map(|(c, (remaining, reset_ms))| {
            let q = c.check.quota;
            let capacity = match q.algorithm {
                crate::limit::Algorithm::TokenBucket | crate::limit::Algorithm::Gcra => q.burst,
                _ => q.limit,
            };
            let mut v = json!({
                "name": &*cfg.limit(c.id).name,
                "used": capacity.saturating_sub(remaining),
                "limit": q.limit,
                "remaining": remaining,
                "reset": reset_ms.div_ceil(1000),
            });
            if let Some(r) = c.route {
                v["route"] = json!(&*cfg.routes[r].name);
            }
            v
        })
        .collect();
    Ok((limits, not_enumerable))
}

/// Clear every counter of the key that [`usage`] shows; how many the store held.
pub async fn reset(
    cfg: &Config,
    store: &Store,
    key: KeyHash,
    tier: Option<TierId>,
    overrides: Option<&Resolved>,
) -> Result<u64, StoreError> {
    let (found, _) = counters(cfg, key, tier, overrides);
    let checks: Vec<Check> = found.into_iter().map(|c| c.check).collect();
    store.reset(&checks).await
}
