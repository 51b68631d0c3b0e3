//! Concurrent-request limits (`kind: concurrency`): how many requests of one caller may be in
//! progress at once.
//!
//! A request takes one slot from every concurrency limit that applies to it, all or nothing,
//! and holds them in a [`Slots`] guard in its context. Dropping the guard gives them back,
//! exactly once, however the request ends: response sent, upstream error, client gone. A slot
//! also expires `timeout` after it was taken, so slots of a request that runs longer, or of a
//! gateway that died, cannot leak; the late release of an expired slot frees nothing.
//!
//! Where slots live follows the store: in this process ([`MemorySlots`]) for the memory
//! store; in Redis for the Redis store (a sorted set per limit and caller, member = request
//! id, score = when the slot was taken; `lua/concurrency_take.lua` and
//! `lua/concurrency_release.lua`), so the cap holds across every gateway sharing it. When
//! Redis cannot answer, each limit's `on_error` decides: `allow` skips it, `deny` answers 503,
//! `local` takes a slot in this process with `limit × store.local_share`.
//!
//! Phase: `request_filter`, after shedding and before the rate limits, so that a request
//! refused here consumes no rate-limit quota. The memory table is locked for a few
//! instructions and never across an await; a Redis release runs as a spawned task.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{HeaderMap, Method};
use pingora_http::ResponseHeader;
use serde_json::json;

use crate::config::{Config, KeyPart, OnError, Route};
use crate::evaluate::{counter_key, Degraded};
use crate::headers::{problem, QUOTA_EXCEEDED};
use crate::identity::Caller;
use crate::store::sharded::Sharded;
use crate::store::{CounterKey, Store, StoreError};

/// `Retry-After` (seconds) of a request refused by a concurrency limit: a slot frees as soon
/// as any of the caller's requests ends.
pub const CONCURRENCY_RETRY_AFTER_S: u64 = 1;
/// `Retry-After` (seconds) when a concurrency limit that fails closed cannot be checked.
pub const UNAVAILABLE_RETRY_AFTER_S: u64 = 1;
/// Attempts to give slots back to Redis. A release is idempotent (a member is removed at most
/// once), so a failed one is retried, after 50 ms, then twice as long each time (1.55 s in
/// all); after that the slots expire with their `timeout`.
pub const RELEASE_ATTEMPTS: u32 = 6;

pub type ConcurrencyId = usize;

/// A validated concurrency limit.
#[derive(Debug)]
pub struct ConcurrencyLimit {
    pub name: Arc<str>,
    /// The counter key; empty means one set of slots for everybody.
    pub key: Vec<KeyPart>,
    /// Requests in progress at once.
    pub limit: u64,
    /// How long a slot is held at most.
    pub timeout: Duration,
    pub anonymous_only: bool,
    /// Slots are taken when free and a full limit is logged, but never denies.
    pub shadow: bool,
    pub on_error: OnError,
    /// The cap in this process when Redis cannot answer and `on_error` is `local`.
    pub local_limit: u64,
}

/// One concurrency limit that applies to one request, with its key.
#[derive(Debug, Clone)]
pub struct Claim {
    pub id: ConcurrencyId,
    pub key: CounterKey,
    pub limit: u64,
    pub timeout_ms: u64,
    pub shadow: bool,
}

/// The concurrency limits of `route` and of the caller's tier that apply to this request
/// (the same rules as rate limits: `anonymous_only`, and a key part the request lacks means
/// the limit does not apply).
pub fn applicable(
    cfg: &Config,
    caller: &Caller,
    route: &Route,
    method: &Method,
    headers: &HeaderMap,
    out: &mut Vec<Claim>,
) {
    let tier = caller
        .tier
        .map_or(&[][..], |t| cfg.tiers[t].concurrency.as_slice());
    for &id in route.concurrency.iter().chain(tier) {
        let limit = &cfg.concurrency[id];
        if limit.anonymous_only && !caller.is_anonymous() {
            continue;
        }
        let Some(key) = counter_key(cfg, &limit.name, &limit.key, caller, route, method, headers)
        else {
            continue;
        };
        out.push(Claim {
            id,
            key,
            limit: limit.limit,
            timeout_ms: limit.timeout.as_millis() as u64,
            shadow: limit.shadow,
        });
    }
}

/// What the concurrency limits say about one request.
#[derive(Debug)]
pub enum Outcome {
    /// Proceed, holding these slots until the request ends (`None`: nothing to hold).
    Admitted(Option<Slots>),
    /// 429: this limit has no free slot; `in_use` slots were taken.
    Denied { limit: ConcurrencyId, in_use: u64 },
    /// 503: the store could not answer and this limit fails closed.
    Unavailable { limit: ConcurrencyId },
}

/// What one acquisition found beyond the outcome: for logs.
#[derive(Debug, Default)]
pub struct Report {
    /// Shadow limits that were full.
    pub shadow_full: Vec<ConcurrencyId>,
    /// Set when the store failed and the failure policies decided.
    pub store_error: Option<StoreError>,
    /// Which failure policy decided, when one did.
    pub degraded: Option<Degraded>,
}

/// Take a slot of every claim, all or nothing.
/// `slots` is this process's table: the memory store's slots, and where `on_error: local`
/// limits take theirs while Redis is down.
pub async fn acquire(
    cfg: &Config,
    store: &Arc<Store>,
    slots: &Arc<MemorySlots>,
    claims: &[Claim],
) -> (Outcome, Report) {
    let mut report = Report::default();
    if claims.is_empty() {
        return (Outcome::Admitted(None), report);
    }
    let Store::Redis(redis) = &**store else {
        let outcome = take_memory(slots, claims, &mut report);
        return (outcome, report);
    };
    let keys: Vec<String> = claims
        .iter()
        .map(|c| redis.slot_key(&cfg.concurrency[c.id].name, &c.key))
        .collect();
    let member = request_member();
    match redis.take_slots(&keys, claims, &member).await {
        Ok(in_use) => {
            let mut denied = None;
            for (c, &n) in claims.iter().zip(&in_use) {
                if n >= c.limit {
                    if c.shadow {
                        report.shadow_full.push(c.id);
                    } else if denied.is_none() {
                        denied = Some((c.id, n));
                    }
                }
            }
            let outcome = match denied {
                Some((limit, in_use)) => Outcome::Denied { limit, in_use },
                None => Outcome::Admitted(Some(Slots::new(Held::Redis {
                    store: store.clone(),
                    keys,
                    member,
                }))),
            };
            (outcome, report)
        }
        Err(e) => {
            // A call that timed out or lost its connection may still have run: give back
            // whatever it took (a release of a slot never taken frees nothing).
            if matches!(e, StoreError::Timeout(_) | StoreError::Unavailable(_)) {
                drop(Slots::new(Held::Redis {
                    store: store.clone(),
                    keys,
                    member,
                }));
            }
            report.store_error = Some(e);
            let outcome = on_store_error(cfg, slots, claims, &mut report);
            (outcome, report)
        }
    }
}

fn on_store_error(
    cfg: &Config,
    slots: &Arc<MemorySlots>,
    claims: &[Claim],
    report: &mut Report,
) -> Outcome {
    for c in claims {
        let l = &cfg.concurrency[c.id];
        if !l.shadow && l.on_error == OnError::Deny {
            report.degraded = Some(Degraded::Deny);
            return Outcome::Unavailable { limit: c.id };
        }
    }
    let local: Vec<Claim> = claims
        .iter()
        .filter(|c| cfg.concurrency[c.id].on_error == OnError::Local)
        .map(|c| Claim {
            limit: cfg.concurrency[c.id].local_limit,
            ..c.clone()
        })
        .collect();
    report.degraded = Some(if local.is_empty() {
        Degraded::Allow
    } else {
        Degraded::Local
    });
    take_memory(slots, &local, report)
}

fn take_memory(table: &Arc<MemorySlots>, claims: &[Claim], report: &mut Report) -> Outcome {
    if claims.is_empty() {
        return Outcome::Admitted(None);
    }
    let id = NEXT_REQUEST.fetch_add(1, Ordering::Relaxed);
    match table.take(claims, id, monotonic_ms()) {
        Err((i, in_use)) => Outcome::Denied {
            limit: claims[i].id,
            in_use,
        },
        Ok(shadow_full) => {
            report
                .shadow_full
                .extend(shadow_full.into_iter().map(|i| claims[i].id));
            Outcome::Admitted(Some(Slots::new(Held::Memory {
                table: table.clone(),
                keys: claims.iter().map(|c| c.key).collect(),
                id,
            })))
        }
    }
}

static NEXT_REQUEST: AtomicU64 = AtomicU64::new(1);

/// This process among all gateways sharing a Redis: a hash of the pid, the start time and an
/// address, so that request ids of two gateways never collide.
static INSTANCE: LazyLock<u64> = LazyLock::new(|| {
    let mut h = blake3::Hasher::new();
    h.update(&std::process::id().to_le_bytes());
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    h.update(&now.as_nanos().to_le_bytes());
    h.update(&(&NEXT_REQUEST as *const AtomicU64 as usize).to_le_bytes());
    u64::from_le_bytes(h.finalize().as_bytes()[..8].try_into().expect("8 bytes"))
});

/// A request id unique across the fleet: the sorted-set member of its slots.
fn request_member() -> String {
    format!(
        "{:016x}:{:x}",
        *INSTANCE,
        NEXT_REQUEST.fetch_add(1, Ordering::Relaxed)
    )
}

/// Milliseconds on a monotonic clock (since the first call).
fn monotonic_ms() -> u64 {
    static ORIGIN: LazyLock<Instant> = LazyLock::new(Instant::now);
    ORIGIN.elapsed().as_millis() as u64
}

/// Slots held by requests of this process right now, and Redis releases under way.
static HELD: AtomicU64 = AtomicU64::new(0);
static RELEASING: AtomicU64 = AtomicU64::new(0);

/// Counters for the admin listener.
pub fn stats_json(slots: &MemorySlots) -> serde_json::Value {
    json!({
        "requests_holding_slots": HELD.load(Ordering::Relaxed),
        "redis_releases_pending": RELEASING.load(Ordering::Relaxed),
        "memory_slots": slots.held(),
    })
}

enum Held {
    Memory {
        table: Arc<MemorySlots>,
        keys: Vec<CounterKey>,
        id: u64,
    },
    Redis {
        store: Arc<Store>,
        keys: Vec<String>,
        member: String,
    },
}

/// The slots one request holds; dropping it gives them back.
pub struct Slots {
    held: Option<Held>,
}

impl std::fmt::Debug for Slots {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let what = match &self.held {
            Some(Held::Memory { keys, .. }) => format!("{} in memory", keys.len()),
            Some(Held::Redis { keys, .. }) => format!("{} in redis", keys.len()),
            None => "none".into(),
        };
        write!(f, "Slots({what})")
    }
}

impl Slots {
    fn new(held: Held) -> Slots {
        HELD.fetch_add(1, Ordering::Relaxed);
        Slots { held: Some(held) }
    }
}

impl Drop for Slots {
    fn drop(&mut self) {
        let Some(held) = self.held.take() else { return };
        HELD.fetch_sub(1, Ordering::Relaxed);
        match held {
            Held::Memory { table, keys, id } => table.release(&keys, id),
            Held::Redis {
                store,
                keys,
                member,
            } => {
                // Drop cannot wait: release on the runtime. Without one (the process is
                // ending) the slots expire after their timeout.
                let Ok(rt) = tokio::runtime::Handle::try_current() else {
                    return;
                };
                RELEASING.fetch_add(1, Ordering::Relaxed);
                rt.spawn(async move {
                    if let Store::Redis(r) = &*store {
                        let mut pause = Duration::from_millis(50);
                        for attempt in 1..=RELEASE_ATTEMPTS {
                            match r.release_slots(&keys, &member).await {
                                Ok(_) => break,
                                Err(e) if attempt == RELEASE_ATTEMPTS => {
                                    tracing::warn!(error = %e, "concurrency slots not given back to Redis; they expire after their timeout");
                                }
                                Err(_) => {
                                    tokio::time::sleep(pause).await;
                                    pause *= 2;
                                }
                            }
                        }
                    }
                    RELEASING.fetch_sub(1, Ordering::Relaxed);
                });
            }
        }
    }
}

/// Number of shards of [`MemorySlots`]; a power of two.
/// One key's slots: (request id, taken at ms), oldest first.
type Holders = VecDeque<(u64, u64)>;

/// Slots in this process: per key, the requests holding one. A key exists only while some
/// request holds a slot of it, so memory follows the requests in flight.
pub struct MemorySlots {
    shards: Sharded<Holders>,
}

impl Default for MemorySlots {
    fn default() -> Self {
        MemorySlots::new()
    }
}

impl MemorySlots {
    pub fn new() -> MemorySlots {
        MemorySlots {
            shards: Sharded::default(),
        }
    }

    /// Take a slot of every claim for request `id` at `now` (monotonic ms), all or nothing:
    /// `Err((index, in use))` of the first full enforcing claim, else the indexes of full
    /// shadow claims (which got no slot).
    pub fn take(&self, claims: &[Claim], id: u64, now: u64) -> Result<Vec<usize>, (usize, u64)> {
        let mut locked = self.shards.lock(claims.iter().map(|c| &c.key));
        let mut shadow_full = Vec::new();
        for (i, c) in claims.iter().enumerate() {
            let shard = locked.map_mut(&c.key);
            let mut in_use = 0;
            if let Some(holders) = shard.get_mut(&c.key) {
                while holders
                    .front()
                    .is_some_and(|&(_, at)| at + c.timeout_ms <= now)
                {
                    holders.pop_front();
                }
                in_use = holders.len() as u64;
            }
            if in_use == 0 {
                shard.remove(&c.key);
            }
            if in_use >= c.limit {
                if !c.shadow {
                    return Err((i, in_use));
                }
                shadow_full.push(i);
            }
        }
        for (i, c) in claims.iter().enumerate() {
            if shadow_full.contains(&i) {
                continue;
            }
            locked
                .map_mut(&c.key)
                .entry(c.key)
                .or_default()
                .push_back((id, now));
        }
        Ok(shadow_full)
    }

    /// Give back request `id`'s slots of `keys`. A slot that expired is already gone and is
    /// not freed twice.
    pub fn release(&self, keys: &[CounterKey], id: u64) {
        for key in keys {
            let mut shard = self.shards.lock_one(key);
            if let Some(holders) = shard.get_mut(key) {
                if let Some(pos) = holders.iter().position(|&(h, _)| h == id) {
                    holders.remove(pos);
                }
                if holders.is_empty() {
                    shard.remove(key);
                }
            }
        }
    }

    /// Slots held right now (including expired ones not yet dropped).
    pub fn held(&self) -> usize {
        self.shards
            .each()
            .map(|s| s.values().map(VecDeque::len).sum::<usize>())
            .sum()
    }
}

/// The `429` of a concurrency limit with no free slot.
pub fn denied_response(cfg: &Config, id: ConcurrencyId, in_use: u64) -> (ResponseHeader, Bytes) {
    let l = &cfg.concurrency[id];
    let (mut h, body) = problem(
        429,
        json!({
            "type": QUOTA_EXCEEDED,
            "title": "Too Many Requests",
            "status": 429,
            "detail": format!(
                "Concurrency limit \"{}\" of {} requests in progress exceeded; retry in {} s.",
                l.name, l.limit, CONCURRENCY_RETRY_AFTER_S
            ),
            "policy": &*l.name,
            "limit": l.limit,
            "in_progress": in_use,
            "retry_after": CONCURRENCY_RETRY_AFTER_S,
        }),
    );
    let _ = h.insert_header("retry-after", CONCURRENCY_RETRY_AFTER_S);
    (h, body)
}

/// The `503` of a concurrency limit that fails closed while its store is down.
pub fn unavailable_response(cfg: &Config, id: ConcurrencyId) -> (ResponseHeader, Bytes) {
    crate::headers::store_unavailable(
        "concurrency limit",
        &cfg.concurrency[id].name,
        UNAVAILABLE_RETRY_AFTER_S,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claim(key: &str, limit: u64, timeout_ms: u64, shadow: bool) -> Claim {
        Claim {
            id: 0,
            key: CounterKey::new("t", [key.as_bytes()]),
            limit,
            timeout_ms,
            shadow,
        }
    }

    #[test]
    fn takes_up_to_the_limit_and_release_frees_exactly_once() {
        let t = MemorySlots::new();
        let c = [claim("k", 3, 60_000, false)];
        for id in 1..=3 {
            assert!(t.take(&c, id, 0).is_ok());
        }
        assert_eq!(t.take(&c, 4, 0), Err((0, 3)));
        t.release(&[c[0].key], 2);
        // Releasing the same request again frees nothing more.
        t.release(&[c[0].key], 2);
        assert!(t.take(&c, 5, 0).is_ok());
        assert_eq!(t.take(&c, 6, 0), Err((0, 3)));
        for id in [1, 3, 5] {
            t.release(&[c[0].key], id);
        }
        assert_eq!(t.held(), 0);
        assert!(t.shards.each().all(|s| s.is_empty()));
    }

    #[test]
    fn all_or_nothing_across_limits() {
        let t = MemorySlots::new();
        let a = claim("a", 5, 60_000, false);
        let b = claim("b", 1, 60_000, false);
        assert!(t.take(&[a.clone(), b.clone()], 1, 0).is_ok());
        // b is full: the request takes nothing from a either.
        assert_eq!(t.take(&[a.clone(), b.clone()], 2, 0), Err((1, 1)));
        assert_eq!(t.held(), 2);
        for id in 3..=6 {
            assert!(t.take(std::slice::from_ref(&a), id, 0).is_ok());
        }
        assert!(t.take(std::slice::from_ref(&a), 7, 0).is_err());
    }

    #[test]
    fn slots_expire_after_the_timeout_and_a_late_release_frees_nothing() {
        let t = MemorySlots::new();
        let c = [claim("k", 2, 1_000, false)];
        assert!(t.take(&c, 1, 0).is_ok());
        assert!(t.take(&c, 2, 500).is_ok());
        assert_eq!(t.take(&c, 3, 999), Err((0, 2)));
        // Request 1's slot is 1000 ms old: expired.
        assert!(t.take(&c, 3, 1_000).is_ok());
        assert_eq!(t.take(&c, 4, 1_000), Err((0, 2)));
        // Request 1 ends late: nothing of it is left to free; 2 and 3 still hold theirs.
        t.release(&[c[0].key], 1);
        assert_eq!(t.take(&c, 4, 1_001), Err((0, 2)));
    }

    #[test]
    fn a_full_shadow_limit_never_denies() {
        let t = MemorySlots::new();
        let real = claim("real", 10, 60_000, false);
        let shadow = claim("shadow", 1, 60_000, true);
        let both = [real, shadow];
        assert_eq!(t.take(&both, 1, 0), Ok(vec![]));
        assert_eq!(t.take(&both, 2, 0), Ok(vec![1]));
        assert_eq!(t.held(), 3);
    }

    #[test]
    fn exact_under_concurrency() {
        let t = Arc::new(MemorySlots::new());
        let c = claim("k", 20, 60_000, false);
        let barrier = Arc::new(std::sync::Barrier::new(8));
        let threads: Vec<_> = (0..8u64)
            .map(|n| {
                let (t, c, barrier) = (t.clone(), c.clone(), barrier.clone());
                std::thread::spawn(move || {
                    barrier.wait();
                    (0..50u64)
                        .filter(|i| t.take(std::slice::from_ref(&c), n * 100 + i, 0).is_ok())
                        .count()
                })
            })
            .collect();
        let taken: usize = threads.into_iter().map(|h| h.join().unwrap()).sum();
        assert_eq!(taken, 20);
        assert_eq!(t.held(), 20);
    }

    #[test]
    fn dropping_the_guard_releases() {
        let t = &Arc::new(MemorySlots::new());
        let c = [claim("k", 1, 60_000, false)];
        let mut report = Report::default();
        let Outcome::Admitted(Some(slots)) = take_memory(t, &c, &mut report) else {
            panic!("admitted")
        };
        assert!(matches!(
            take_memory(t, &c, &mut report),
            Outcome::Denied { in_use: 1, .. }
        ));
        drop(slots);
        assert_eq!(t.held(), 0);
        assert!(matches!(
            take_memory(t, &c, &mut report),
            Outcome::Admitted(Some(_))
        ));
    }

    #[test]
    fn applicable_follows_the_rate_limit_rules() {
        let yaml = r#"
tiers:
  free: [ { name: free-inflight, kind: concurrency, limit: 5, timeout: 30s } ]
api_keys: { k1: free }
upstreams: { b: ["127.0.0.1:9000"] }
routes:
  - { name: r, match: { path_prefix: / }, upstream: b }
limits:
  - { name: per-key, kind: concurrency, key: [api_key], limit: 20, timeout: 60s }
  - { name: per-ip, kind: concurrency, key: [client_ip], limit: 2, timeout: 1s, anonymous_only: true }
  - { name: per-tenant, kind: concurrency, key: ["header:x-tenant"], limit: 3, timeout: 1s, shadow: true }
"#;
        let cfg = crate::config::from_yaml("t.yaml", yaml, &Default::default()).unwrap();
        let caller = |key: Option<&str>| Caller {
            api_key: key.map(str::to_string),
            user: None,
            tier: key.and_then(|k| cfg.api_keys.get(k).copied()),
            client_ip: "10.0.0.1".parse().unwrap(),
        };
        let names = |c: &Caller, h: &HeaderMap| {
            let mut out = Vec::new();
            applicable(&cfg, c, &cfg.routes[0], &Method::GET, h, &mut out);
            out.iter()
                .map(|c| (cfg.concurrency[c.id].name.to_string(), c.limit, c.shadow))
                .collect::<Vec<_>>()
        };
        let none = HeaderMap::new();
        // Anonymous: no API key, so no per-key slot; the per-IP limit applies.
        assert_eq!(names(&caller(None), &none), [("per-ip".into(), 2, false)]);
        // A key of the free tier: per-key and the tier's limit, not the anonymous one.
        let mut tenant = HeaderMap::new();
        tenant.insert("x-tenant", http::HeaderValue::from_static("acme"));
        assert_eq!(
            names(&caller(Some("k1")), &tenant),
            [
                ("per-key".into(), 20, false),
                ("per-tenant".into(), 3, true),
                ("free-inflight".into(), 5, false)
            ]
        );
        // Keys differ per caller and per limit.
        let mut a = Vec::new();
        let mut b = Vec::new();
        applicable(
            &cfg,
            &caller(Some("k1")),
            &cfg.routes[0],
            &Method::GET,
            &none,
            &mut a,
        );
        applicable(
            &cfg,
            &caller(Some("k2")),
            &cfg.routes[0],
            &Method::GET,
            &none,
            &mut b,
        );
        assert_ne!(a[0].key, b[0].key);
        assert_eq!(a[0].timeout_ms, 60_000);
    }

    #[test]
    fn request_members_are_unique() {
        let a = request_member();
        let b = request_member();
        assert_ne!(a, b);
        assert_eq!(a.split(':').next().unwrap().len(), 16);
    }
}
