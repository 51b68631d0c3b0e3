//! Instructions per decision, for `valgrind --tool=callgrind` (which counts instructions, the
//! same on a busy machine as on a quiet one): runs the decision path of `benches/decision.rs`
//! (identify, route, admit on the memory store; 3 rate limits, an API-key caller) N times.
//! Run it twice, with N and with 0, and divide the difference by N:
//!   cargo build --release --example decision_cost
//!   valgrind --tool=callgrind --callgrind-out-file=/dev/null target/release/examples/decision_cost 100000
//!   valgrind --tool=callgrind --callgrind-out-file=/dev/null target/release/examples/decision_cost 0

use std::net::IpAddr;
use std::sync::Arc;

use http::HeaderMap;
use tollgate::config::{from_yaml, Overrides};
use tollgate::store::Store;

#[path = "../benches/support/decide.rs"]
#[allow(dead_code)]
mod support;

fn main() {
    let n: u64 = std::env::args()
        .nth(1)
        .map_or(100_000, |s| s.parse().expect("a count"));
    let cfg = from_yaml("cost.yaml", support::CONFIG, &Overrides::default()).expect("config");
    let store = Arc::new(Store::memory(1_000_000));
    let mut headers = HeaderMap::new();
    headers.insert("x-api-key", "demo-free".parse().expect("header"));
    let peer: IpAddr = "203.0.113.7".parse().expect("ip");
    let mut now = 1_700_000_000_000u64;
    // The caller's counters exist before counting starts, as in steady state.
    support::decide(&cfg, &store, &headers, peer, "/api/v1/items/7", now);
    for _ in 0..n {
        now += 1;
        std::hint::black_box(support::decide(
            &cfg,
            &store,
            &headers,
            peer,
            "/api/v1/items/7",
            now,
        ));
    }
}
