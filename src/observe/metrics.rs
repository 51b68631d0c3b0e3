//! The Prometheus metrics: one [`Registry`] owned by the gateway, the metric families, and the
//! label handles of one config ([`Labels`]), resolved once per config so that a request only
//! increments counters it already holds.
//!
//! Two kinds of source feed them:
//! - the request path increments handles directly (decisions, check and request durations,
//!   responses, failure policies, quota use): one atomic add each, no allocation;
//! - counters that other modules keep anyway as atomics (shedding, store errors, breaker,
//!   reloads, the access log) are copied in when `/metrics` is scraped ([`Metrics::sync`]),
//!   so nothing is counted twice on the request path.
//!
//! Every label value comes from the config (limit, route and tier names) or a fixed set.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};

use prometheus::{
    Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts,
    Registry,
};

use crate::admission::{Outcome, Source};
use crate::config::reload::ConfigHandle;
use crate::config::{Config, LimitId, Priority};
use crate::shed::Shedder;
use crate::store::breaker::State as BreakerState;
use crate::store::{ErrorKind, Store};

/// The `route` label of a request that matched no route (route names cannot contain `(`).
pub const NO_ROUTE: &str = "(none)";
/// `code_class` values; `none` is a request that ended without a response (client gone).
pub const CODE_CLASSES: [&str; 6] = ["1xx", "2xx", "3xx", "4xx", "5xx", "none"];
/// `kind` values of `tollgate_store_errors_total`.
pub const STORE_ERROR_KINDS: [ErrorKind; 4] = [
    ErrorKind::Timeout,
    ErrorKind::Connection,
    ErrorKind::Script,
    ErrorKind::Other,
];
/// `source` values, indexed by [`source_index`].
const SOURCES: [Source; 5] = [
    Source::Memory,
    Source::Redis,
    Source::Local,
    Source::OverLimitCache,
    Source::Lease,
];

const CHECK_BUCKETS: &[f64] = &[
    0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
];
const REQUEST_BUCKETS: &[f64] = &[
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];
const QUOTA_BUCKETS: &[f64] = &[0.1, 0.25, 0.5, 0.75, 0.9, 0.95, 0.99, 1.0];

fn source_index(s: Source) -> usize {
    match s {
        Source::Memory => 0,
        Source::Redis => 1,
        Source::Local => 2,
        Source::OverLimitCache => 3,
        Source::Lease => 4,
    }
}

/// The index in [`CODE_CLASSES`] of a status (`none` for anything outside 100-599).
pub fn code_class(status: u16) -> usize {
    match status {
        100..=199 => 0,
        200..=299 => 1,
        300..=399 => 2,
        400..=499 => 3,
        500..=599 => 4,
        _ => 5,
    }
}

/// Every metric family of the gateway, registered in its own registry.
pub struct Metrics {
    pub registry: Registry,
    decisions: IntCounterVec,
    pub(super) check_duration: Histogram,
    request_duration: HistogramVec,
    requests: IntCounterVec,
    in_flight: IntGauge,
    shed: IntCounterVec,
    admitted: IntCounterVec,
    slots_held: IntGauge,
    store_errors: IntCounterVec,
    breaker_rejected: IntCounter,
    calls_saved: IntCounterVec,
    over_limit_entries: IntGauge,
    leases: IntCounterVec,
    lease_units: IntCounterVec,
    failure_policy: IntCounterVec,
    breaker_open: IntGauge,
    breaker_transitions: IntCounterVec,
    config_reloads: IntCounterVec,
    config_generation: IntGauge,
    config_last_ok: IntGauge,
    quota: HistogramVec,
    pub(super) access_log_lines: IntCounter,
    pub(super) access_log_dropped: IntCounter,
    /// Held while scraped values are copied in, so two scrapes never add a delta twice.
    sync: parking_lot::Mutex<()>,
    /// Registered at the first scrape of a gateway with a quota store.
    quotas: std::sync::OnceLock<QuotaGauges>,
}

/// The quota store's state.
struct QuotaGauges {
    overrides: IntGauge,
    age: IntGauge,
    stale: IntGauge,
}

fn counter_vec(r: &Registry, name: &str, help: &str, labels: &[&str]) -> IntCounterVec {
    let v = IntCounterVec::new(Opts::new(name, help), labels).expect("valid metric");
    r.register(Box::new(v.clone())).expect("registered once");
    v
}

fn counter(r: &Registry, name: &str, help: &str) -> IntCounter {
    let c = IntCounter::new(name, help).expect("valid metric");
    r.register(Box::new(c.clone())).expect("registered once");
    c
}

fn gauge(r: &Registry, name: &str, help: &str) -> IntGauge {
    let g = IntGauge::new(name, help).expect("valid metric");
    r.register(Box::new(g.clone())).expect("registered once");
    g
}

fn histogram_vec(r: &Registry, name: &str, help: &str, labels: &[&str], b: &[f64]) -> HistogramVec {
    let opts = HistogramOpts::new(name, help).buckets(b.to_vec());
    let h = HistogramVec::new(opts, labels).expect("valid metric");
    r.register(Box::new(h.clone())).expect("registered once");
    h
}

impl Metrics {
    pub fn new() -> Metrics {
        let r = Registry::new();
        let check = HistogramOpts::new(
            "tollgate_check_duration_seconds",
            "Time the limit checks of one request took, store round trips included.",
        )
        .buckets(CHECK_BUCKETS.to_vec());
        let check_duration = Histogram::with_opts(check).expect("valid metric");
        r.register(Box::new(check_duration.clone()))
            .expect("registered once");
        let build = IntGaugeVec::new(
            Opts::new(
                "tollgate_build_info",
                "Always 1; the version of this build.",
            ),
            &["version"],
        )
        .expect("valid metric");
        r.register(Box::new(build.clone()))
            .expect("registered once");
        build.with_label_values(&[env!("CARGO_PKG_VERSION")]).set(1);
        Metrics {
            decisions: counter_vec(&r, "tollgate_decisions_total", "Limit decisions, one per limit checked for a request.", &["limit", "outcome", "source"]),
            check_duration,
            request_duration: histogram_vec(&r, "tollgate_request_duration_seconds", "Whole requests, from the request head to the end of the response.", &["route"], REQUEST_BUCKETS),
            requests: counter_vec(&r, "tollgate_requests_total", "Responses, by route and status class.", &["route", "code_class"]),
            in_flight: gauge(&r, "tollgate_requests_in_flight", "Requests in progress in this gateway (past routing)."),
            shed: counter_vec(&r, "tollgate_shed_total", "Requests refused by load shedding (503), by priority class.", &["class"]),
            admitted: counter_vec(&r, "tollgate_admitted_total", "Requests load shedding let through, by priority class.", &["class"]),
            slots_held: gauge(&r, "tollgate_concurrency_slots_held", "Requests of this gateway holding concurrency slots."),
            store_errors: counter_vec(&r, "tollgate_store_errors_total", "Store calls that failed, by kind.", &["kind"]),
            breaker_rejected: counter(&r, "tollgate_breaker_rejected_total", "Store calls not made because the circuit breaker was open."),
            calls_saved: counter_vec(&r, "tollgate_store_calls_saved_total", "Store calls not made because this gateway answered from memory, by reason (over_limit_cache: a cached denial).", &["reason"]),
            leases: counter_vec(&r, "tollgate_leases_total", "Quota leases of this gateway: taken, and ended early (with units unspent) by an invalidation: a reload changing their limit, a quota change, a usage reset.", &["event"]),
            lease_units: counter_vec(&r, "tollgate_lease_units_total", "Units of quota leases: taken, given back (unspent, returned to Redis), lost (unspent and not returned: the window had ended, or the return failed).", &["event"]),
            over_limit_entries: gauge(&r, "tollgate_over_limit_cache_entries", "Denials held in this gateway's over-limit cache."),
            failure_policy: counter_vec(&r, "tollgate_failure_policy_total", "Limit checks the store could not answer, by the limit's on_error policy that answered instead (allow: fail open, deny: fail closed, local: in-process fallback).", &["limit", "policy"]),
            breaker_open: gauge(&r, "tollgate_breaker_open", "1 while the store's circuit breaker is open or half-open, else 0."),
            breaker_transitions: counter_vec(&r, "tollgate_breaker_transitions_total", "Circuit breaker state changes, by the state entered.", &["state"]),
            config_reloads: counter_vec(&r, "tollgate_config_reloads_total", "Config reloads, by result.", &["result"]),
            config_generation: gauge(&r, "tollgate_config_generation", "Successful config reloads since start."),
            config_last_ok: gauge(&r, "tollgate_config_last_reload_successful", "1 when the last config reload succeeded (or none was tried), 0 when it was rejected."),
            quota: histogram_vec(&r, "tollgate_quota_utilization_ratio", "Fraction of a tier limit used at decision time (1 when denied), by tier.", &["tier"], QUOTA_BUCKETS),
            access_log_lines: counter(&r, "tollgate_access_log_lines_total", "Access-log lines written."),
            access_log_dropped: counter(&r, "tollgate_access_log_dropped_total", "Access-log lines dropped because the writer's buffer was full."),
            registry: r,
            sync: parking_lot::Mutex::new(()),
            quotas: std::sync::OnceLock::new(),
        }
    }

    /// Copy in the quota store's state: how many overrides are held, how old they are, and
    /// whether the database could not be read at the last try.
    pub fn sync_quotas(&self, q: &crate::quota::Quotas) {
        let r = &self.registry;
        let g = self.quotas.get_or_init(|| QuotaGauges {
            overrides: gauge(r, "tollgate_quota_overrides", "Quota overrides this gateway holds in memory."),
            age: gauge(r, "tollgate_quota_overrides_age_seconds", "Seconds since this gateway last loaded the quota overrides (since it started, if it never has)."),
            stale: gauge(r, "tollgate_quota_overrides_stale", "1 while the quota database cannot be read and the overrides held may be stale, else 0."),
        });
        let now = crate::quota::now_s();
        g.overrides.set(q.held() as i64);
        g.age.set(q.age_s(now));
        g.stale.set(i64::from(q.is_stale()));
    }

    /// Copy in the values that other modules count: shedding, slots, store, breaker, reloads.
    /// Called on every scrape.
    pub fn sync(&self, store: &Store, shedder: &Shedder, config: &ConfigHandle) {
        let _one = self.sync.lock();
        let st = shedder.stats();
        self.in_flight.set(st.in_flight as i64);
        for p in Priority::ALL {
            set(
                &self.shed.with_label_values(&[p.as_str()]),
                st.shed[p as usize],
            );
            set(
                &self.admitted.with_label_values(&[p.as_str()]),
                st.admitted[p as usize],
            );
        }
        self.slots_held
            .set(store.slot_stats().requests_holding() as i64);
        let redis = store.redis_store();
        for (i, kind) in STORE_ERROR_KINDS.iter().enumerate() {
            let n = redis.map_or(0, |r| r.stats.errors[i].load(Ordering::Relaxed));
            set(&self.store_errors.with_label_values(&[kind.as_str()]), n);
        }
        let load =
            |a: Option<&std::sync::atomic::AtomicU64>| a.map_or(0, |a| a.load(Ordering::Relaxed));
        set(
            &self.breaker_rejected,
            load(redis.map(|r| &r.stats.rejected)),
        );
        let cache = store.over_limit();
        set(
            &self.calls_saved.with_label_values(&["over_limit_cache"]),
            cache.hits.load(Ordering::Relaxed),
        );
        self.over_limit_entries.set(cache.len() as i64);
        let ls = &store.leases().stats;
        set(
            &self.calls_saved.with_label_values(&["lease"]),
            ls.answered.load(Ordering::Relaxed),
        );
        for (event, a) in [("taken", &ls.taken), ("ended_early", &ls.ended_early)] {
            set(
                &self.leases.with_label_values(&[event]),
                a.load(Ordering::Relaxed),
            );
        }
        for (event, a) in [
            ("taken", &ls.units_taken),
            ("given_back", &ls.units_given_back),
            ("lost", &ls.units_lost),
        ] {
            set(
                &self.lease_units.with_label_values(&[event]),
                a.load(Ordering::Relaxed),
            );
        }
        let open = redis.is_some_and(|r| r.breaker_state() != BreakerState::Closed);
        self.breaker_open.set(i64::from(open));
        for (state, n) in [
            ("open", load(redis.map(|r| &r.stats.opened))),
            ("half_open", load(redis.map(|r| &r.stats.half_opened))),
            ("closed", load(redis.map(|r| &r.stats.closed))),
        ] {
            set(&self.breaker_transitions.with_label_values(&[state]), n);
        }
        let generation = config.generation.load(Ordering::Relaxed);
        self.config_generation.set(generation as i64);
        set(
            &self.config_reloads.with_label_values(&["success"]),
            generation,
        );
        let failed = config.rejected.load(Ordering::Relaxed);
        set(&self.config_reloads.with_label_values(&["failure"]), failed);
        let last_ok = config.last_reload_ok.load(Ordering::Relaxed);
        self.config_last_ok.set(i64::from(last_ok));
    }

    /// The text exposition of every metric.
    pub fn render(&self) -> Vec<u8> {
        use prometheus::Encoder;
        let mut out = Vec::with_capacity(16 * 1024);
        prometheus::TextEncoder::new()
            .encode(&self.registry.gather(), &mut out)
            .expect("text encoding never fails");
        out
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

/// Raise a counter to `v`, a total kept elsewhere.
fn set(c: &IntCounter, v: u64) {
    let cur = c.get();
    if v > cur {
        c.inc_by(v - cur);
    }
}

/// The label handles of one config: every series a request of it can touch.
pub struct Labels {
    pub(super) config: Weak<Config>,
    limit_names: Vec<Arc<str>>,
    route_names: Vec<Arc<str>>,
    tier_names: Vec<String>,
    /// `[limit][outcome][source]`; `None` for sources this store never uses.
    decisions: Vec<[[Option<IntCounter>; 5]; 3]>,
    failure_policy: Vec<IntCounter>,
    /// By limit: the quota histogram of the tier the limit belongs to.
    quota: Vec<Option<Histogram>>,
    /// `[route][code class]`; the last route is [`NO_ROUTE`].
    requests: Vec<[IntCounter; 6]>,
    request_duration: Vec<Histogram>,
}

impl Labels {
    /// Resolve every series of `cfg` (`redis`: the store is Redis, with its local fallback).
    pub fn resolve(m: &Metrics, cfg: &Arc<Config>, redis: bool) -> Labels {
        let sources: &[Source] = if redis {
            &[
                Source::Redis,
                Source::Local,
                Source::OverLimitCache,
                Source::Lease,
            ]
        } else {
            &[Source::Memory]
        };
        let decisions = cfg
            .limits
            .iter()
            .map(|l| {
                Outcome::ALL.map(|o| {
                    SOURCES.map(|s| {
                        sources.contains(&s).then(|| {
                            m.decisions
                                .with_label_values(&[&l.name, o.as_str(), s.as_str()])
                        })
                    })
                })
            })
            .collect();
        let mut quota: Vec<Option<Histogram>> = vec![None; cfg.limits.len()];
        for t in &cfg.tiers {
            let h = m.quota.with_label_values(&[&t.name]);
            for &id in t.limits.rate.iter() {
                quota[id] = Some(h.clone());
            }
        }
        let mut route_names: Vec<Arc<str>> = cfg.routes.iter().map(|r| r.name.clone()).collect();
        route_names.push(NO_ROUTE.into());
        Labels {
            config: Arc::downgrade(cfg),
            limit_names: cfg.limits.iter().map(|l| l.name.clone()).collect(),
            tier_names: cfg.tiers.iter().map(|t| t.name.clone()).collect(),
            decisions,
            failure_policy: cfg
                .limits
                .iter()
                .map(|l| {
                    m.failure_policy
                        .with_label_values(&[&l.name, l.on_error.as_str()])
                })
                .collect(),
            quota,
            requests: route_names
                .iter()
                .map(|r| CODE_CLASSES.map(|c| m.requests.with_label_values(&[r, c])))
                .collect(),
            request_duration: route_names
                .iter()
                .map(|r| m.request_duration.with_label_values(&[r]))
                .collect(),
            route_names,
        }
    }

    /// Whether these are the labels of `cfg`.
    pub fn of(&self, cfg: &Arc<Config>) -> bool {
        std::ptr::eq(self.config.as_ptr(), Arc::as_ptr(cfg))
    }

    pub fn decision(&self, limit: LimitId, outcome: Outcome, source: Source) {
        if let Some(c) = &self.decisions[limit][outcome as usize][source_index(source)] {
            c.inc();
        }
    }

    pub fn failure_policy(&self, limit: LimitId) {
        self.failure_policy[limit].inc();
    }

    pub fn quota_used(&self, limit: LimitId, used: f64) {
        if let Some(h) = &self.quota[limit] {
            h.observe(used);
        }
    }

    /// One response of `route` (`None`: no route matched) with `status` (0: none).
    pub fn request(&self, route: Option<usize>, status: u16, seconds: Option<f64>) {
        let r = route.unwrap_or(self.route_names.len() - 1);
        self.requests[r][code_class(status)].inc();
        if let Some(s) = seconds {
            self.request_duration[r].observe(s);
        }
    }

    /// Decisions of every limit, summed over sources: `(name, [allow, deny, shadow_deny])`.
    pub fn decision_totals(&self) -> impl Iterator<Item = (&str, [u64; 3])> + '_ {
        self.limit_names
            .iter()
            .zip(&self.decisions)
            .map(|(name, by)| {
                let sum =
                    |o: &[Option<IntCounter>; 5]| o.iter().flatten().map(IntCounter::get).sum();
                (&**name, [sum(&by[0]), sum(&by[1]), sum(&by[2])])
            })
    }

    /// Responses by code class, summed over routes.
    pub fn response_totals(&self) -> [u64; 6] {
        let mut out = [0; 6];
        for r in &self.requests {
            for (o, c) in out.iter_mut().zip(r) {
                *o += c.get();
            }
        }
        out
    }

    /// Drop the series of limits, routes and tiers that `self` has and `next` has not, so a
    /// removed limit stops being exported.
    pub fn prune(&self, m: &Metrics, next: &Labels) {
        for name in self
            .limit_names
            .iter()
            .filter(|n| !next.limit_names.contains(n))
        {
            for o in Outcome::ALL {
                for s in SOURCES {
                    let _ = m
                        .decisions
                        .remove_label_values(&[name, o.as_str(), s.as_str()]);
                }
            }
            for p in ["allow", "deny", "local"] {
                let _ = m.failure_policy.remove_label_values(&[name, p]);
            }
        }
        for name in self
            .route_names
            .iter()
            .filter(|n| !next.route_names.contains(n))
        {
            for c in CODE_CLASSES {
                let _ = m.requests.remove_label_values(&[name, c]);
            }
            let _ = m.request_duration.remove_label_values(&[name]);
        }
        for name in self
            .tier_names
            .iter()
            .filter(|n| !next.tier_names.contains(n))
        {
            let _ = m.quota.remove_label_values(&[name]);
        }
    }
}
