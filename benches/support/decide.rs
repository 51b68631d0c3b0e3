//! The decision path as `request_filter` runs it, without the network, and a global allocator
//! that counts: shared by `benches/decision.rs` and `tests/allocations.rs` (through `#[path]`).

use std::alloc::{GlobalAlloc, Layout, System};
use std::future::Future;
use std::net::IpAddr;
use std::pin::pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use http::{HeaderMap, Method};

use tollgate::admission::{admit, Admitted, Report, Request};
use tollgate::config::Config;
use tollgate::identity::identify;
use tollgate::observe::Observer;
use tollgate::route::match_route;
use tollgate::store::Store;

/// The config of the decision benchmarks: three rate limits for an API-key caller (the tier's
/// minute and hour, the global), two for an anonymous one (per IP, global), none that denies.
pub const CONFIG: &str = r#"
identity: { trusted_proxies: ["127.0.0.1/32"] }
tiers:
  free:
    - { name: free-minute, limit: 100000000, window: 1m }
    - { name: free-hour, limit: 100000000, window: 1h }
api_keys: { demo-free: free }
default_tier: free
access_log: { enabled: false }
upstreams: { backend: ["127.0.0.1:9000"] }
routes:
  - { name: orders, match: { methods: [POST], path_prefix: /api/v1/orders }, upstream: backend }
  - { name: default, match: { path_prefix: / }, upstream: backend }
limits:
  - { name: per-ip, key: [client_ip], limit: 100000000, window: 1m, anonymous_only: true }
  - { name: global, key: [], algorithm: fixed_window, limit: 100000000, window: 1s }
"#;

/// Counts every allocation and reallocation of the process.
pub struct Counting;

static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);

// The one `unsafe` of the crate: a global allocator must implement an unsafe trait.
// SAFETY: delegates every call to the system allocator unchanged; only counts.
#[allow(unsafe_code)]
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        System.alloc(layout)
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        System.dealloc(ptr, layout)
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        System.realloc(ptr, layout, new_size)
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// Allocations of the whole process so far.
pub fn allocations() -> u64 {
    ALLOCATIONS.load(Ordering::Relaxed)
}

/// Poll a future that never waits (the memory store answers at once) to its end.
pub fn now_or_never<F: Future>(f: F) -> F::Output {
    let mut f = pin!(f);
    match f.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(out) => out,
        Poll::Pending => panic!("the memory store never waits"),
    }
}

/// What `request_filter` does to decide a GET of `path`: identify, route, admit. With the
/// admission's report, for the metrics.
pub fn decide(
    cfg: &Config,
    store: &Arc<Store>,
    headers: &HeaderMap,
    peer: IpAddr,
    path: &str,
    now: u64,
) -> (Admitted, Report) {
    let method = Method::GET;
    let caller = identify(cfg, headers, peer).expect("identified");
    let r = match_route(cfg, &method, || Some("example.com"), path).expect("a route");
    let req = Request {
        cfg,
        caller: &caller,
        route: &cfg.routes[r],
        method: &method,
        headers,
        // No connection: every key is hashed, as for a request's first on a connection.
        keys: None,
    };
    let mut report = Report::default();
    let admitted = now_or_never(admit(store, &req, now, &mut report)).expect("admitted");
    (admitted, report)
}

/// [`decide`] a GET of `/x`, then count its decisions in the metrics as `request_filter` does.
pub fn decide_and_count(
    observer: &Observer,
    cfg: &Arc<Config>,
    store: &Arc<Store>,
    headers: &HeaderMap,
    peer: IpAddr,
    now: u64,
) -> Admitted {
    let (admitted, report) = decide(cfg, store, headers, peer, "/x", now);
    observer.decided(cfg, &report, std::time::SystemTime::now());
    admitted
}

/// Heap allocations per request of [`decide`] in steady state: every caller seen before.
pub fn allocations_per_request(
    cfg: &Config,
    store: &Arc<Store>,
    headers: &HeaderMap,
    peer: IpAddr,
) -> f64 {
    allocations_per(|now| decide(cfg, store, headers, peer, "/x", now).0)
}

/// Heap allocations per call of `f(now)`, after 1,000 calls to warm up.
pub fn allocations_per(mut f: impl FnMut(u64) -> Admitted) -> f64 {
    let mut now = 1_700_000_000_000u64;
    for _ in 0..1_000 {
        now += 1;
        std::hint::black_box(f(now));
    }
    let n = 10_000u64;
    let before = allocations();
    for _ in 0..n {
        now += 1;
        std::hint::black_box(f(now));
    }
    (allocations() - before) as f64 / n as f64
}
