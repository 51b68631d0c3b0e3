//! The per-request decision path, without the network: identify the caller, match the route,
//! and run the admission pipeline (concurrency and rate limits) on the memory store; the
//! response headers; and each algorithm on its own. Before criterion runs, it prints the heap
//! allocations per request of the decision path, counted by a global allocator.
//! Run: `cargo bench --bench decision`.

use std::hint::black_box;
use std::net::IpAddr;
use std::sync::Arc;

use criterion::{criterion_group, criterion_main, BatchSize, Criterion};
use http::HeaderMap;
use tollgate::config::reload::ConfigHandle;
use tollgate::config::{from_yaml, Overrides};
use tollgate::limit::{check, Algorithm, Quota};
use tollgate::observe::Observer;
use tollgate::shed::Shedder;
use tollgate::store::Store;

#[path = "support/decide.rs"]
mod support;
use support::{allocations_per_request, decide, decide_and_count};

fn request_path(c: &mut Criterion) {
    let cfg = from_yaml("bench.yaml", support::CONFIG, &Overrides::default()).expect("config");
    let store = Arc::new(Store::memory(1_000_000));
    let mut headers = HeaderMap::new();
    headers.insert("x-api-key", "demo-free".parse().unwrap());
    let peer: IpAddr = "203.0.113.7".parse().unwrap();
    let anonymous = HeaderMap::new();
    println!(
        "allocations per request (decision path, memory store): API key caller {:.2}, client IP caller {:.2}",
        allocations_per_request(&cfg, &store, &headers, peer),
        allocations_per_request(&cfg, &store, &anonymous, peer),
    );
    let mut now = 1_700_000_000_000u64;

    c.bench_function(
        "request: identify+route+admit, memory store (3 limits)",
        |b| {
            b.iter(|| {
                now += 1;
                let (a, _) = decide(&cfg, &store, &headers, peer, "/api/v1/items/7", now);
                black_box(a.decisive)
            })
        },
    );

    // The same with every decision counted in the Prometheus metrics, as the gateway does.
    let handle = Arc::new(ConfigHandle::new(
        from_yaml("bench.yaml", support::CONFIG, &Overrides::default()).expect("config"),
        None,
        Overrides::default(),
    ));
    let counted_cfg = handle.snapshot();
    let observer = Observer::new(handle, store.clone(), Shedder::leaked()).expect("observer");
    c.bench_function(
        "request + metrics: identify+route+admit+count, memory store (3 limits)",
        |b| {
            b.iter(|| {
                now += 1;
                let a = decide_and_count(&observer, &counted_cfg, &store, &headers, peer, now);
                black_box(a.decisive)
            })
        },
    );

    // The response side: the decisive limit's five headers added to an upstream response.
    let (admitted, _) = decide(&cfg, &store, &headers, peer, "/x", now);
    let (id, decision) = admitted.decisive.expect("a decisive limit");
    c.bench_function(
        "response headers: RateLimit, RateLimit-Policy, X-RateLimit-*",
        |b| {
            b.iter_batched(
                || pingora_http::ResponseHeader::build(200, Some(8)).unwrap(),
                |mut resp| {
                    tollgate::headers::apply(&cfg, id, None, &decision, now, &mut resp);
                    black_box(resp)
                },
                BatchSize::SmallInput,
            )
        },
    );

    // A rate limit's refusal: the 429's head, rate-limit headers and problem body (what every
    // request of a caller over its limit costs, the over-limit cache's answers included).
    let denied = tollgate::limit::Decision::deny(decision.limit, 0, 60_000, 12_345);
    c.bench_function(
        "refusal: a rate limit's 429 (head, headers, problem body)",
        |b| {
            b.iter(|| {
                let refusal = tollgate::refusal::Refusal::RateLimited {
                    limit: id,
                    decision: denied,
                    at_ms: now,
                    spec: None,
                };
                black_box(refusal.response(&cfg, None))
            })
        },
    );

    // 10k distinct callers (keys) round robin.
    let keys: Vec<HeaderMap> = (0..10_000)
        .map(|i| {
            let mut h = HeaderMap::new();
            h.insert("x-api-key", format!("key-{i}").parse().unwrap());
            h
        })
        .collect();
    let mut i = 0;
    c.bench_function("request: 10k distinct API keys", |b| {
        b.iter(|| {
            now += 1;
            i = (i + 1) % keys.len();
            let (a, _) = decide(&cfg, &store, &keys[i], peer, "/x", now);
            black_box(a.decisive)
        })
    });
}

fn algorithms(c: &mut Criterion) {
    for a in Algorithm::ALL {
        let q = Quota::new(a, 1_000, 60_000);
        let mut state = None;
        let mut now = 1_700_000_000_000u64;
        c.bench_function(&format!("algorithm: {a}"), |b| {
            b.iter_batched(
                || (),
                |()| {
                    now += 60; // exactly the refill rate: most checks admit
                    let o = check(&q, state.as_ref(), now, 1);
                    if let Some(n) = o.next {
                        state = Some(n);
                    }
                    black_box(o.decision.allowed)
                },
                BatchSize::SmallInput,
            )
        });
    }
}

/// A sliding log that is full: 1000 entries, each request denied. Denials read the log and
/// copy nothing.
fn full_sliding_log(c: &mut Criterion) {
    let q = Quota::new(Algorithm::SlidingLog, 1_000, 60_000);
    let start = 1_700_000_000_000u64;
    let mut state = None;
    for i in 0..1_000 {
        state = check(&q, state.as_ref(), start + i * 50, 1).next;
    }
    let now = start + 1_000 * 50;
    assert!(!check(&q, state.as_ref(), now, 1).decision.allowed);
    c.bench_function("algorithm: sliding_log, full (1000 entries), denied", |b| {
        b.iter(|| black_box(check(&q, state.as_ref(), now, 1).decision.retry_after_ms))
    });
}

criterion_group!(benches, request_path, algorithms, full_sliding_log);
criterion_main!(benches);
