//! Every limit that applies to a request, checked in one store call; the most restrictive
//! one decides.
//!
//! Phase: `request_filter`, after identity, route and shedding. Builds the counter keys (hashes
//! of the caller's identity parts), calls the store once, and applies each limit's failure
//! policy if the store cannot answer.

use http::{HeaderMap, Method};

use crate::config::{Config, KeyPart, LimitId, OnError, Route};
use crate::identity::Caller;
use crate::limit::Decision;
use crate::store::{Check, CounterKey, Store};

/// The outcome for one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Proceed. `decisive` is the most restrictive enforcing limit, for the response headers.
    Allow {
        decisive: Option<(LimitId, Decision)>,
    },
    /// 429: this limit is exhausted.
    Deny { limit: LimitId, decision: Decision },
    /// 503: the store could not answer and this limit fails closed.
    Unavailable { limit: LimitId },
}

/// What one evaluation found, beyond the verdict: for metrics and logs.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Report {
    /// Shadow limits that would have denied.
    pub shadow_denied: Vec<LimitId>,
    /// Set when the store failed and the failure policies decided.
    pub store_error: Option<String>,
    /// Which failure policy decided, when one did.
    pub degraded: Option<Degraded>,
    /// The store's clock when it decided (Redis's `TIME`), for the reset headers.
    pub decided_at: Option<u64>,
}

/// The failure policy that decided a request while the store could not answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Degraded {
    /// Limits failed open.
    Allow,
    /// The local fallback limiter decided (`on_error: local`).
    Local,
    /// A limit failed closed.
    Deny,
}

impl Degraded {
    /// The `Tollgate-Degraded` header value.
    pub fn header_value(self) -> &'static str {
        match self {
            Degraded::Allow => "store-unavailable; policy=allow",
            Degraded::Local => "store-unavailable; policy=local",
            Degraded::Deny => "store-unavailable; policy=deny",
        }
    }
}

/// The limits of `route` and of the caller's tier that apply to this caller, with their keys.
pub fn applicable(
    cfg: &Config,
    caller: &Caller,
    route: &Route,
    method: &Method,
    headers: &HeaderMap,
    ids: &mut Vec<LimitId>,
    checks: &mut Vec<Check>,
) {
    let tier_limits = caller
        .tier
        .map_or(&[][..], |t| cfg.tiers[t].limits.as_slice());
    for &id in route.limits.iter().chain(tier_limits) {
        let limit = cfg.limit(id);
        if limit.anonymous_only && !caller.is_anonymous() {
            continue;
        }
        // A limit whose key needs a part this request lacks (no API key, no such header) does
        // not apply to it.
        let Some(key) = counter_key(cfg, &limit.name, &limit.key, caller, route, method, headers)
        else {
            continue;
        };
        ids.push(id);
        checks.push(Check {
            name: limit.name.clone(),
            key,
            quota: limit.quota,
            cost: route.cost,
            shadow: limit.shadow,
        });
    }
}

/// The counter key of a limit named `name` with key `parts` for this request: BLAKE3 of the
/// name and the caller's key parts. `None` when the request lacks a part (no API key, no such
/// header): then the limit does not apply to it. Rate and concurrency limits share this.
pub(crate) fn counter_key(
    cfg: &Config,
    name: &str,
    key: &[KeyPart],
    caller: &Caller,
    route: &Route,
    method: &Method,
    headers: &HeaderMap,
) -> Option<CounterKey> {
    let (ip_buf, ip_len) = match caller.client_ip {
        std::net::IpAddr::V4(v4) => {
            let mut b = [0u8; 16];
            b[..4].copy_from_slice(&v4.octets());
            (b, 4)
        }
        // One counter per network (`identity.ipv6_prefix`, validated to 1-128).
        std::net::IpAddr::V6(v6) => (
            ipnet::Ipv6Net::new(v6, cfg.identity.ipv6_prefix)
                .map_or(v6, |n| n.network())
                .octets(),
            16,
        ),
    };
    // At most 8 parts (validated), without allocating.
    let mut parts: [&[u8]; 8] = [&[]; 8];
    for (slot, part) in parts.iter_mut().zip(key) {
        *slot = match part {
            KeyPart::ApiKey => caller.api_key.as_deref()?.as_bytes(),
            KeyPart::User => caller.user.as_deref()?.as_bytes(),
            KeyPart::ClientIp => &ip_buf[..ip_len],
            KeyPart::Route => route.name.as_bytes(),
            KeyPart::Method => method.as_str().as_bytes(),
            KeyPart::Tier => cfg.tiers[caller.tier?].name.as_bytes(),
            KeyPart::Header(h) => headers.get(h)?.as_bytes(),
        };
    }
    Some(CounterKey::new(name, parts[..key.len()].iter().copied()))
}

/// Check `checks` (built by [`applicable`]) and decide.
pub async fn decide(
    cfg: &Config,
    store: &Store,
    ids: &[LimitId],
    checks: &[Check],
    now: u64,
    decisions: &mut Vec<Decision>,
) -> (Verdict, Report) {
    let mut report = Report::default();
    if checks.is_empty() {
        return (Verdict::Allow { decisive: None }, report);
    }
    match store.check(checks, now, decisions).await {
        Ok(at) => report.decided_at = Some(at),
        Err(e) => {
            report.store_error = Some(e.to_string());
            let verdict = on_store_error(cfg, store, ids, checks, now, decisions, &mut report);
            return (verdict, report);
        }
    }
    let verdict = most_restrictive(ids, checks, decisions, &mut report);
    (verdict, report)
}

fn most_restrictive(
    ids: &[LimitId],
    checks: &[Check],
    decisions: &[Decision],
    report: &mut Report,
) -> Verdict {
    let mut decisive: Option<(LimitId, Decision)> = None;
    for ((&id, c), d) in ids.iter().zip(checks).zip(decisions) {
        if c.shadow {
            if !d.allowed {
                report.shadow_denied.push(id);
            }
            continue;
        }
        if decisive.is_none_or(|(_, best)| d.more_restrictive_than(&best)) {
            decisive = Some((id, *d));
        }
    }
    match decisive {
        Some((limit, decision)) if !decision.allowed => Verdict::Deny { limit, decision },
        _ => Verdict::Allow { decisive },
    }
}

/// The store could not answer: each limit's `on_error` decides. A `deny` limit makes the
/// request 503; `local` limits are checked on the in-process fallback limiter with their
/// `local_quota`; `allow` limits are skipped.
fn on_store_error(
    cfg: &Config,
    store: &Store,
    ids: &[LimitId],
    checks: &[Check],
    now: u64,
    decisions: &mut Vec<Decision>,
    report: &mut Report,
) -> Verdict {
    for &id in ids {
        let l = cfg.limit(id);
        if !l.shadow && l.on_error == OnError::Deny {
            report.degraded = Some(Degraded::Deny);
            return Verdict::Unavailable { limit: id };
        }
    }
    let (local_ids, local_checks): (Vec<LimitId>, Vec<Check>) = ids
        .iter()
        .zip(checks)
        .filter(|(&id, _)| cfg.limit(id).on_error == OnError::Local)
        .map(|(&id, c)| {
            let mut c = c.clone();
            c.quota = cfg.limit(id).local_quota;
            (id, c)
        })
        .unzip();
    match store.fallback() {
        Some(fallback) if !local_checks.is_empty() => {
            report.degraded = Some(Degraded::Local);
            fallback.check(&local_checks, now, decisions);
            most_restrictive(&local_ids, &local_checks, decisions, report)
        }
        _ => {
            report.degraded = Some(Degraded::Allow);
            Verdict::Allow { decisive: None }
        }
    }
}
