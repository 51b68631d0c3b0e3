//! Memory per active key in Redis (`MEMORY USAGE`), for docs/stores.md's table: one limit and one
//! caller per algorithm, written through `Store::check` exactly as the gateway writes it, on
//! keys named like the bundled config's (`{tollgate:free-minute:<32 hex>}:<algorithm>`).
//! Decides at fixed times (explicit time) so every run writes the same state.
//!
//! loadtest/redis_memory.sh, or: cargo run --release --example redis_memory -- redis://127.0.0.1:6379

use std::time::Duration;

use redis::AsyncCommands;
use tollgate::config::Topology;
use tollgate::limit::{Algorithm, Quota};
use tollgate::store::{Check, CounterKey, Decisions, RedisStore, Store};

const NOW: u64 = 1_795_000_000_000;

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let url = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "redis://127.0.0.1:6379".into());
    let client = redis::Client::open(url.as_str()).expect("redis url");
    let mut conn = client
        .get_multiplexed_async_connection()
        .await
        .expect("connect to redis");
    let redis = RedisStore::new(Topology::Single { url }, "tollgate", Duration::from_secs(2))
        .expect("store")
        .with_explicit_time();
    let store = Store::redis(redis);

    // (row, algorithm, quota, the times of the requests, relative to NOW in ms)
    let minute = 60_000;
    let rows: Vec<(String, Algorithm, Quota, Vec<u64>)> = vec![
        (
            "sliding_window, one window".into(),
            Algorithm::SlidingWindow,
            Quota::new(Algorithm::SlidingWindow, 100, minute),
            vec![0],
        ),
        (
            "sliding_window, both windows".into(),
            Algorithm::SlidingWindow,
            Quota::new(Algorithm::SlidingWindow, 100, minute),
            vec![0, minute],
        ),
        (
            "fixed_window".into(),
            Algorithm::FixedWindow,
            Quota::new(Algorithm::FixedWindow, 100, minute),
            vec![0],
        ),
        (
            "token_bucket".into(),
            Algorithm::TokenBucket,
            Quota::new(Algorithm::TokenBucket, 100, minute),
            vec![0],
        ),
        (
            "gcra".into(),
            Algorithm::Gcra,
            Quota::new(Algorithm::Gcra, 100, minute),
            vec![0],
        ),
    ]
    .into_iter()
    .chain([10u64, 100, 200].map(|n| {
        (
            format!("sliding_log, {n} entries"),
            Algorithm::SlidingLog,
            Quota::new(Algorithm::SlidingLog, 1_000, minute),
            (0..n).collect(),
        )
    }))
    .collect();

    println!("| row | key | bytes |");
    println!("|---|---|---|");
    for (i, (row, algorithm, quota, times)) in rows.into_iter().enumerate() {
        // A caller of its own per row, so rows never share a key.
        let caller = format!("caller-{i}");
        let check = Check {
            id: 0,
            name: "free-minute".into(),
            key: CounterKey::new("free-minute", [caller.as_bytes()]),
            quota,
            cost: 1,
            shadow: false,
        };
        let mut out = Decisions::new();
        for t in &times {
            store
                .check(std::slice::from_ref(&check), NOW + t, &mut out)
                .await
                .expect("check");
            assert!(out[0].allowed, "{row}: request at +{t} ms denied");
        }
        let r = store.redis_store().expect("a Redis store");
        let pattern = format!("{}*", r.base_key(&check));
        let keys: Vec<String> = conn.keys(&pattern).await.expect("KEYS");
        // fixed_window keeps one key per window; here there is one window.
        assert_eq!(keys.len(), 1, "{row}: keys {keys:?}, algorithm {algorithm}");
        let bytes: u64 = redis::cmd("MEMORY")
            .arg("USAGE")
            .arg(&keys[0])
            .query_async(&mut conn)
            .await
            .expect("MEMORY USAGE");
        println!("| {row} | `{}` | {bytes} |", keys[0]);
    }
}
