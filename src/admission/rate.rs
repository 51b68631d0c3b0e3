//! Rate limits: every one that applies to a request, checked in one store call; the most
//! restrictive enforcing one decides.
//!
//! Phase: `request_filter`, after the concurrency slots are taken.

use std::sync::Arc;
use std::time::Instant;

use super::policy::{self, Failure};
use super::{Admitted, Refused, Report, Request, Source};
use crate::config::LimitId;
use crate::limit::Decision;
use crate::refusal::Refusal;
use crate::store::lease::lease_ttl;
use crate::store::{bit_set, Check, Checks, Decisions, FromLease, Store};
use smallvec::SmallVec;

impl Request<'_> {
    /// The rate limits that apply to this request, with their keys and the route's cost.
    pub fn rate_checks(&self, out: &mut Checks) {
        let checks = self
            .applicable(&self.route.limits.rate, |t| &t.limits.rate)
            .map(|(id, key)| {
                let l = self.cfg.limit(id);
                Check {
                    id,
                    name: l.name.clone(),
                    key,
                    quota: self.caller.rate_spec(self.cfg, id).quota,
                    cost: self.route.cost,
                    shadow: l.shadow,
                }
            });
        out.extend(checks);
    }
}

/// Check every rate limit of `req` and decide.
pub(super) async fn check(
    store: &Arc<Store>,
    req: &Request<'_>,
    now: u64,
    report: &mut Report,
) -> Result<Admitted, Refused> {
    let mut checks = Checks::new();
    req.rate_checks(&mut checks);
    if checks.is_empty() {
        return Ok(Admitted {
            decided_at: now,
            ..Admitted::default()
        });
    }
    // A denial still in the over-limit cache decides without a store call: denials beat
    // admissions, so the other limits need not be asked.
    let cache = store.over_limit();
    let cacheable = |c: &Check| !c.shadow && req.cfg.limit(c.id).over_limit_cache;
    // The clock is read only where the cache is on (never for the memory store), and turned
    // into the cache's own only where an entry may be looked up or a denial kept.
    let sent = cache.enabled().then(Instant::now);
    let cached = sent
        .filter(|_| !cache.is_empty())
        .and_then(|t| cache.lookup(&checks, cache.ms(t), cacheable));
    if let Some((i, decision, at)) = cached {
        let id = checks[i].id;
        report.decide(id, false, false, Source::OverLimitCache, Some(1.0));
        return verdict(req, Some((id, decision)), at, None);
    }
    let mut decisions = Decisions::new();
    let mut from_lease: FromLease = 0;
    let leases = |c: &Check| req.cfg.limit(c.id).lease_max > 1;
    let result = if store.leases().enabled() && checks.iter().any(leases) {
        // Limits that lease: the most units one store call may take for each check.
        let lease: SmallVec<[u64; 8]> = checks
            .iter()
            .map(|c| req.cfg.limit(c.id).lease_max)
            .collect();
        // Boxed: only a store that leases comes here, and this call's future (1.9 KB) would
        // otherwise be part of every request's own (`request_filter`'s, allocated and moved
        // for each request, limits or not: 4.2 KB with it, 2.3 KB without).
        Box::pin(store.check_leasing(&checks, &lease, now, &mut decisions, &mut from_lease)).await
    } else {
        store.check(&checks, now, &mut decisions).await
    };
    match result {
        Ok(at) => {
            // A limit that leases: units other gateways hold may come back (when their leases
            // end) before the denial's retry time; keep it no longer than a lease lasts.
            let keep = |c: &Check| {
                cacheable(c).then(|| match req.cfg.limit(c.id).lease_max {
                    0 | 1 => u64::MAX,
                    _ => lease_ttl(c.quota.window_ms),
                })
            };
            if let Some(sent) = sent.filter(|_| decisions.iter().any(|d| !d.allowed)) {
                cache.remember(&checks, &decisions, at, cache.ms(sent), keep);
            }
            let source = Source::of_store(store);
            let decided = most_restrictive(&checks, &decisions, source, from_lease, report);
            verdict(req, decided, at, None)
        }
        Err(e) => {
            report.store_error = Some(e);
            report.failed.extend(checks.iter().map(|c| c.id));
            on_store_error(req, store, &mut checks, now, &mut decisions, report)
        }
    }
}

/// [`check`] where the store answers in this process and never fails (the memory store: no
/// over-limit cache, no leases).
pub(super) fn check_local(
    store: &Store,
    req: &Request<'_>,
    now: u64,
    report: &mut Report,
) -> Result<Admitted, Refused> {
    let mut checks = Checks::new();
    req.rate_checks(&mut checks);
    if checks.is_empty() {
        return verdict(req, None, now, None);
    }
    let mut decisions = Decisions::new();
    store.local().counters.check(&checks, now, &mut decisions);
    let decided = most_restrictive(&checks, &decisions, Source::Memory, 0, report);
    verdict(req, decided, now, None)
}

/// The most restrictive enforcing decision; every limit's own decision is reported.
fn most_restrictive(
    checks: &[Check],
    decisions: &[Decision],
    source: Source,
    from_lease: FromLease,
    report: &mut Report,
) -> Option<(LimitId, Decision)> {
    let mut decisive: Option<(LimitId, Decision)> = None;
    for (i, (c, d)) in checks.iter().zip(decisions).enumerate() {
        let source = if bit_set(from_lease, i) {
            Source::Lease
        } else {
            source
        };
        report.decide(c.id, d.allowed, c.shadow, source, Some(used(d)));
        if c.shadow {
            continue;
        }
        if decisive.is_none_or(|(_, best)| d.more_restrictive_than(&best)) {
            decisive = Some((c.id, *d));
        }
    }
    decisive
}

/// The fraction of a rate limit used after a decision: 1 when denied.
fn used(d: &Decision) -> f64 {
    if !d.allowed || d.limit == 0 {
        return 1.0;
    }
    1.0 - d.remaining.min(d.limit) as f64 / d.limit as f64
}

fn verdict(
    req: &Request<'_>,
    decisive: Option<(LimitId, Decision)>,
    at: u64,
    degraded: Option<crate::config::OnError>,
) -> Result<Admitted, Refused> {
    match decisive {
        Some((limit, decision)) if !decision.allowed => Err(Refused {
            refusal: Refusal::RateLimited {
                limit,
                decision,
                at_ms: at,
                spec: req.caller.override_spec(limit).cloned(),
            },
            degraded,
        }),
        _ => Ok(Admitted {
            decisive,
            slots: None,
            degraded,
            decided_at: at,
        }),
    }
}

/// The store could not answer: the failure policies decide; `local` limits are checked on the
/// in-process fallback with their local quota.
fn on_store_error(
    req: &Request<'_>,
    store: &Store,
    checks: &mut Checks,
    now: u64,
    decisions: &mut Decisions,
    report: &mut Report,
) -> Result<Admitted, Refused> {
    let cfg = req.cfg;
    let failure = policy::on_store_error(cfg, checks.iter().map(|c| c.id));
    let degraded = Some(failure.degraded());
    match failure {
        Failure::Closed(limit) => Err(Refused {
            refusal: Refusal::StoreUnavailable { limit },
            degraded,
        }),
        Failure::Open => verdict(req, None, now, degraded),
        Failure::Local => {
            checks.retain(|c| policy::is_local(cfg, c.id));
            for c in checks.iter_mut() {
                c.quota = req.caller.rate_spec(cfg, c.id).local_quota;
            }
            store.local().counters.check(checks, now, decisions);
            let decided = most_restrictive(checks, decisions, Source::Local, 0, report);
            verdict(req, decided, now, degraded)
        }
    }
}
