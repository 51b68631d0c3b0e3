use std::sync::Arc;

use http::{HeaderMap, HeaderValue, Method};

use super::*;
use crate::config::{from_yaml, Overrides};
use crate::store::{Checks, Claims};

const YAML: &str = r#"
tiers:
  free:
    - { name: free-inflight, kind: concurrency, limit: 5, timeout: 30s }
    - { name: free-minute, limit: 3, window: 1m }
api_keys: { k1: free }
upstreams: { b: ["127.0.0.1:9000"] }
routes:
  - { name: r, match: { path_prefix: / }, upstream: b }
limits:
  - { name: per-key, kind: concurrency, key: [api_key], limit: 20, timeout: 60s }
  - { name: per-ip, kind: concurrency, key: [client_ip], limit: 2, timeout: 1s, anonymous_only: true }
  - { name: per-tenant, kind: concurrency, key: ["header:x-tenant"], limit: 3, timeout: 1s, shadow: true }
  - { name: ip-minute, key: [client_ip], limit: 2, window: 1m }
"#;

fn config() -> Config {
    from_yaml("t.yaml", YAML, &Overrides::default()).unwrap()
}

fn caller<'a>(cfg: &Config, key: Option<&'a str>) -> Caller<'a> {
    Caller {
        api_key: key,
        key_hash: key.map(crate::fingerprint::KeyHash::of),
        user: None,
        tier: key.and_then(|k| cfg.api_keys.get(k).copied()),
        client_ip: "10.0.0.1".parse().unwrap(),
        overrides: None,
    }
}

/// A GET on the config's first route.
fn request<'a>(cfg: &'a Config, c: &'a Caller<'a>, h: &'a HeaderMap) -> Request<'a> {
    Request {
        cfg,
        caller: c,
        route: &cfg.routes[0],
        method: &Method::GET,
        headers: h,
        keys: None,
    }
}

fn claims(cfg: &Config, c: &Caller<'_>, h: &HeaderMap) -> Claims {
    let req = request(cfg, c, h);
    let mut out = Claims::new();
    req.concurrency_claims(&mut out);
    out
}

#[test]
fn concurrency_claims_follow_the_rate_limit_rules() {
    let cfg = config();
    let names = |c: &Caller<'_>, h: &HeaderMap| {
        claims(&cfg, c, h)
            .iter()
            .map(|c| (cfg.limit(c.id).name.to_string(), c.cap, c.shadow))
            .collect::<Vec<_>>()
    };
    let none = HeaderMap::new();
    // Anonymous: no API key, so no per-key slot; the per-IP limit applies.
    assert_eq!(
        names(&caller(&cfg, None), &none),
        [("per-ip".into(), 2, false)]
    );
    // A key of the free tier: per-key and the tier's limit, not the anonymous one.
    let mut tenant = HeaderMap::new();
    tenant.insert("x-tenant", HeaderValue::from_static("acme"));
    assert_eq!(
        names(&caller(&cfg, Some("k1")), &tenant),
        [
            ("per-key".into(), 20, false),
            ("per-tenant".into(), 3, true),
            ("free-inflight".into(), 5, false)
        ]
    );
    // Keys differ per caller and per limit.
    let a = claims(&cfg, &caller(&cfg, Some("k1")), &none);
    let b = claims(&cfg, &caller(&cfg, Some("k2")), &none);
    assert_ne!(a[0].key, b[0].key);
    assert_eq!(a[0].timeout_ms, 60_000);
}

#[test]
fn rate_checks_carry_their_limit_ids() {
    let cfg = config();
    let none = HeaderMap::new();
    let c = caller(&cfg, Some("k1"));
    let req = request(&cfg, &c, &none);
    let mut checks = Checks::new();
    req.rate_checks(&mut checks);
    let names: Vec<&str> = checks.iter().map(|c| &*cfg.limit(c.id).name).collect();
    assert_eq!(names, ["ip-minute", "free-minute"]);
    assert!(!checks.spilled());
}

/// Both kinds through one pipeline on the memory store: the concurrency slot is taken first,
/// a rate denial gives it back, and the refusal names the limit that decided.
#[tokio::test]
async fn one_pipeline_for_both_kinds() {
    let cfg = config();
    let store = Arc::new(Store::memory(1000));
    let none = HeaderMap::new();
    let c = caller(&cfg, Some("k1"));
    let req = request(&cfg, &c, &none);
    let mut held = Vec::new();
    for i in 0..2u64 {
        let mut report = Report::default();
        let a = admit(&store, &req, 1_000 + i, &mut report).await.unwrap();
        let (id, d) = a.decisive.unwrap();
        assert_eq!(&*cfg.limit(id).name, "ip-minute");
        assert_eq!(d.remaining, 1 - i);
        held.push(a.slots.expect("slots held"));
    }
    assert_eq!(store.local().slots.held(), 4);
    let mut report = Report::default();
    let refused = admit(&store, &req, 1_010, &mut report).await.unwrap_err();
    match refused.refusal {
        Refusal::RateLimited {
            limit, decision, ..
        } => {
            assert_eq!(&*cfg.limit(limit).name, "ip-minute");
            assert!(!decision.allowed);
        }
        other => panic!("expected a rate limit refusal, got {other:?}"),
    }
    assert_eq!(refused.degraded, None);
    // The refused request's slots were given back at once.
    assert_eq!(store.local().slots.held(), 4);
    drop(held);
    assert_eq!(store.local().slots.held(), 0);
    assert_eq!(store.slot_stats().requests_holding(), 0);
}

/// The request path's memory-store admission (`admit_local`, no future) decides exactly as
/// `admit` does: the same outcome, decisive limit, remaining count, slots and report for every
/// request of a sequence that fills the concurrency limit and runs out of the rate limit.
/// A Redis store gets `None`: its calls are awaited.
#[tokio::test]
async fn admit_local_decides_as_admit() {
    let cfg = config();
    let (a_store, b_store) = (Arc::new(Store::memory(1000)), Arc::new(Store::memory(1000)));
    let none = HeaderMap::new();
    let anon = caller(&cfg, None);
    let req = request(&cfg, &anon, &none);
    let mut held = Vec::new();
    let mut outcomes = Vec::new();
    for i in 0..5u64 {
        if i == 3 {
            // The slots given back: the rate limit, spent by now, refuses.
            held.clear();
        }
        let (mut ra, mut rb) = (Report::default(), Report::default());
        let a = admit(&a_store, &req, 1_000 + i, &mut ra).await;
        let b = admit_local(&b_store, &req, 1_000 + i, &mut rb).expect("memory decides at once");
        let view = |r: &Result<Admitted, Refused>| match r {
            Ok(a) => format!("ok {:?} {:?}", a.decisive, a.slots.is_some()),
            Err(r) => match r.refusal {
                Refusal::SlotsFull { .. } => "full".to_string(),
                Refusal::RateLimited { decision, .. } => format!("rate {decision:?}"),
                _ => format!("other {:?}", r.refusal),
            },
        };
        assert_eq!(view(&a), view(&b), "request {i}");
        assert_eq!(ra.decided, rb.decided, "request {i}");
        outcomes.push(view(&b).split(' ').next().unwrap().to_string());
        held.extend([a, b].into_iter().filter_map(|r| r.ok()?.slots));
        if i == 1 {
            assert_eq!(b_store.local().slots.held(), 2);
        }
    }
    // per-ip (2 in flight) is full at the third request; ip-minute (2 a minute) refuses after.
    assert_eq!(outcomes, ["ok", "ok", "full", "rate", "rate"]);
    assert_eq!(b_store.local().slots.held(), 0);

    let redis = crate::store::RedisStore::new(
        crate::config::Topology::Single {
            url: "redis://127.0.0.1:1".into(),
        },
        "p",
        std::time::Duration::from_millis(50),
    )
    .unwrap();
    let redis = Arc::new(Store::redis(redis));
    assert!(admit_local(&redis, &req, 1_000, &mut Report::default()).is_none());
}
