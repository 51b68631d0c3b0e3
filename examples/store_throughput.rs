//! Decisions per second from one process through the Redis store (the same code the gateway
//! runs per request, without HTTP): `concurrency` tasks share one multiplexed connection and
//! call `Store::check` with one limit on random keys for `seconds`.
//!
//! cargo run --release --example store_throughput -- redis://127.0.0.1:6379 sliding_window 10 64

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tollgate::config::Topology;
use tollgate::limit::{Algorithm, Quota};
use tollgate::store::{Check, CounterKey, Decisions, RedisStore, Store};

#[tokio::main(flavor = "multi_thread")]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let url = args
        .get(1)
        .cloned()
        .unwrap_or_else(|| "redis://127.0.0.1:6379".into());
    let algorithm: Algorithm = args
        .get(2)
        .map_or(Ok(Algorithm::SlidingWindow), |a| a.parse())
        .expect("algorithm");
    let seconds: u64 = args.get(3).map_or(10, |s| s.parse().expect("seconds"));
    let concurrency: usize = args.get(4).map_or(64, |s| s.parse().expect("concurrency"));

    let store = Arc::new(Store::redis(
        RedisStore::new(
            Topology::Single { url },
            "bench",
            Duration::from_millis(500),
        )
        .expect("store"),
    ));
    let quota = Quota::new(algorithm, 1_000_000, 60_000);
    let done = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let deadline = start + Duration::from_secs(seconds);
    let tasks: Vec<_> = (0..concurrency)
        .map(|t| {
            let (store, done, errors) = (store.clone(), done.clone(), errors.clone());
            tokio::spawn(async move {
                let mut out = Decisions::new();
                let mut i: u64 = t as u64;
                while Instant::now() < deadline {
                    i = i
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    let key = (i >> 33) % 10_000;
                    let check = Check {
                        id: 0,
                        name: "bench".into(),
                        key: CounterKey::new("bench", [&key.to_le_bytes()[..]]),
                        quota,
                        cost: 1,
                        shadow: false,
                    };
                    match store.check(std::slice::from_ref(&check), 0, &mut out).await {
                        Ok(_) => done.fetch_add(1, Ordering::Relaxed),
                        Err(_) => errors.fetch_add(1, Ordering::Relaxed),
                    };
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.expect("task");
    }
    let elapsed = start.elapsed().as_secs_f64();
    let n = done.load(Ordering::Relaxed);
    println!(
        "algorithm={algorithm} concurrency={concurrency} decisions={n} errors={} seconds={elapsed:.2} decisions_per_s={:.0}",
        errors.load(Ordering::Relaxed),
        n as f64 / elapsed
    );
}
