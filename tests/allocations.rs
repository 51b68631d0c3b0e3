//! The decision path allocates nothing of ours: for a caller identified by API key or by
//! client IP, identify → route → admit (concurrency and rate limits) on the memory store makes
//! no heap allocation once the caller's counters exist. Counted by a global allocator; one test
//! in this binary, so nothing else allocates while it counts.

#[path = "../benches/support/decide.rs"]
#[allow(dead_code)] // the benchmarks' config
mod support;

use std::net::IpAddr;
use std::sync::Arc;

use http::HeaderMap;
use tollgate::config::reload::ConfigHandle;
use tollgate::config::{from_yaml, Overrides};
use tollgate::observe::Observer;
use tollgate::shed::Shedder;
use tollgate::store::Store;

const CONFIG: &str = r#"
identity: { trusted_proxies: ["127.0.0.1/32"] }
tiers:
  free:
    - { name: free-minute, limit: 100000000, window: 1m }
    - { name: free-inflight, kind: concurrency, limit: 1000, timeout: 1m }
api_keys: { demo-free: free }
default_tier: free
access_log: { enabled: false }
upstreams: { backend: ["127.0.0.1:9000"] }
routes:
  - { name: default, match: { path_prefix: / }, upstream: backend }
limits:
  - { name: per-ip, key: [client_ip], limit: 100000000, window: 1m, anonymous_only: true }
  - { name: global, key: [], algorithm: fixed_window, limit: 100000000, window: 1s }
  - { name: ip-inflight, kind: concurrency, key: [client_ip], limit: 1000, timeout: 1m }
"#;

#[test]
fn the_memory_store_admit_path_allocates_nothing() {
    let cfg = from_yaml("allocations.yaml", CONFIG, &Overrides::default()).expect("config");
    let store = Arc::new(Store::memory(1_000_000));
    let peer: IpAddr = "203.0.113.7".parse().unwrap();
    let mut by_key = HeaderMap::new();
    by_key.insert("x-api-key", "demo-free".parse().unwrap());
    // Behind a trusted proxy, the client IP comes from X-Forwarded-For.
    let mut forwarded = HeaderMap::new();
    forwarded.insert("x-forwarded-for", "198.51.100.1, 10.0.0.1".parse().unwrap());
    let proxy: IpAddr = "127.0.0.1".parse().unwrap();

    let key = support::allocations_per_request(&cfg, &store, &by_key, peer);
    let ip = support::allocations_per_request(&cfg, &store, &HeaderMap::new(), peer);
    let xff = support::allocations_per_request(&cfg, &store, &forwarded, proxy);
    assert_eq!(
        (key, ip, xff),
        (0.0, 0.0, 0.0),
        "allocations per request: API key caller, client IP caller, client IP behind a proxy"
    );

    // The same with the metrics of every decision counted, as request_filter does.
    let handle = Arc::new(ConfigHandle::new(cfg, None, Overrides::default()));
    let cfg = handle.snapshot();
    let shedder = Shedder::leaked();
    let observer = Observer::new(handle, store.clone(), shedder).expect("observer");
    let counted = |headers: &HeaderMap, peer: IpAddr| {
        support::allocations_per(|now| {
            support::decide_and_count(&observer, &cfg, &store, headers, peer, now)
        })
    };
    let key = counted(&by_key, peer);
    let ip = counted(&HeaderMap::new(), peer);
    assert_eq!(
        (key, ip),
        (0.0, 0.0),
        "allocations per request with metrics: API key caller, client IP caller"
    );
    assert!(
        String::from_utf8(observer.render_metrics())
            .unwrap()
            .contains("tollgate_decisions_total{limit=\"free-minute\",outcome=\"allow\",source=\"memory\"} 11000"),
        "the API key caller's 11,000 decisions (1,000 to warm up, 10,000 counted) were counted"
    );
}
