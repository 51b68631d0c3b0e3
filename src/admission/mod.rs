//! Admission: every limit that applies to a request, of both kinds, through one pipeline.
//!
//! A request first takes a slot of every concurrency limit that applies ([`concurrency`]),
//! then every rate limit that applies is checked in one store call ([`rate`]). Each kind asks
//! the one [`Store`] seam, whatever the backend, and when the store cannot answer each limit's
//! failure policy decides ([`policy`]), the same way for both kinds. The outcome is either
//! [`Admitted`] (with the slots to hold and the decisive limit for the response headers) or
//! [`Refused`], one [`Refusal`] that the edge turns into HTTP.
//!
//! Phase: `request_filter`, after identity, route and shedding. The common path (a caller
//! identified by API key or IP, the memory store) allocates nothing: checks, claims and
//! decisions are small vectors on the stack.

pub mod concurrency;
pub mod policy;
pub mod rate;

use std::net::IpAddr;
use std::sync::Arc;

use http::{HeaderMap, Method};
use smallvec::SmallVec;

use crate::config::{Config, KeyPart, LimitId, OnError, Route};
use crate::identity::Caller;
use crate::limit::Decision;
use crate::refusal::Refusal;
use crate::store::{CounterKey, HeldSlots, KeyMemo, Store, StoreError};

/// What the limiter needs to know about one request.
pub struct Request<'a> {
    /// The config snapshot the request runs on, start to end.
    pub cfg: &'a Config,
    pub caller: &'a Caller<'a>,
    pub route: &'a Route,
    pub method: &'a Method,
    pub headers: &'a HeaderMap,
    /// The counter keys of the connection the request came on, if it has a memo of them.
    pub keys: Option<&'a KeyMemo>,
}

/// Where a decision was made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// The embedded memory store.
    Memory,
    /// Redis.
    Redis,
    /// The in-process fallback of an `on_error: local` limit while Redis could not answer.
    Local,
    /// A denial Redis gave, answered again from this gateway until it ends (no store call).
    OverLimitCache,
    /// This gateway's quota lease of the limit (no store call).
    Lease,
}

/// A request the limits let through.
#[derive(Debug, Default)]
pub struct Admitted {
    /// The most restrictive enforcing rate limit, for the response headers.
    pub decisive: Option<(LimitId, Decision)>,
    /// The concurrency slots the request holds until it ends.
    pub slots: Option<HeldSlots>,
    /// Set when the store could not answer and failure policies decided.
    pub degraded: Option<OnError>,
    /// The store's clock when it decided (Redis's `TIME`), for the reset headers.
    pub decided_at: u64,
}

/// A request a limit refused.
#[derive(Debug)]
pub struct Refused {
    pub refusal: Refusal,
    pub degraded: Option<OnError>,
}

/// What one limit decided for one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Allow,
    Deny,
    /// A shadow limit that would have denied; it let the request through.
    ShadowDeny,
}

impl Outcome {
    pub const ALL: [Outcome; 3] = [Outcome::Allow, Outcome::Deny, Outcome::ShadowDeny];

    fn of(allowed: bool, shadow: bool) -> Outcome {
        match (allowed, shadow) {
            (true, _) => Outcome::Allow,
            (false, false) => Outcome::Deny,
            (false, true) => Outcome::ShadowDeny,
        }
    }

    /// The word metrics and logs use.
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Allow => "allow",
            Outcome::Deny => "deny",
            Outcome::ShadowDeny => "shadow_deny",
        }
    }
}

impl Source {
    /// The word metrics use.
    pub fn as_str(self) -> &'static str {
        match self {
            Source::Memory => "memory",
            Source::Redis => "redis",
            Source::Local => "local",
            Source::OverLimitCache => "over_limit_cache",
            Source::Lease => "lease",
        }
    }

    /// Where `store` decides when it answers.
    pub fn of_store(store: &Store) -> Source {
        match store.redis_store() {
            Some(_) => Source::Redis,
            None => Source::Memory,
        }
    }
}

/// One limit's own decision for one request.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Decided {
    pub limit: LimitId,
    pub outcome: Outcome,
    pub source: Source,
    /// Rate limits: the fraction of the limit used after this request (1 when denied).
    pub used: Option<f64>,
}

/// What one admission found beyond its outcome: for logs and metrics.
#[derive(Debug, Default)]
pub struct Report {
    /// Every limit's own decision, in the order they were checked (concurrency first). With
    /// several limits, each says what it decided, also when another one refused.
    pub decided: SmallVec<[Decided; 8]>,
    /// Limits the store could not answer for: each was answered by its `on_error`.
    pub failed: SmallVec<[LimitId; 4]>,
    /// Set when the store failed and the failure policies decided.
    pub store_error: Option<StoreError>,
}

impl Report {
    /// Shadow limits (of either kind) that would have refused.
    pub fn shadow_denied(&self) -> impl Iterator<Item = LimitId> + '_ {
        self.decided
            .iter()
            .filter(|d| d.outcome == Outcome::ShadowDeny)
            .map(|d| d.limit)
    }

    fn decide(
        &mut self,
        limit: LimitId,
        allowed: bool,
        shadow: bool,
        source: Source,
        used: Option<f64>,
    ) {
        self.decided.push(Decided {
            limit,
            outcome: Outcome::of(allowed, shadow),
            source,
            used,
        });
    }
}

/// Run every limit that applies to `req` at `now` (the gateway's clock, ms since the Unix
/// epoch). A request refused by a rate limit gives its concurrency slots back at once.
pub async fn admit(
    store: &Arc<Store>,
    req: &Request<'_>,
    now: u64,
    report: &mut Report,
) -> Result<Admitted, Refused> {
    let taken = concurrency::take(store, req, report).await?;
    both(taken, rate::check(store, req, now, report).await)
}

/// [`admit`] without a future, where the store answers in this process and never fails (the
/// memory store): `None` for Redis, whose calls are awaited. The request path asks this first,
/// so a memory-store request builds and polls no admission future.
pub fn admit_local(
    store: &Arc<Store>,
    req: &Request<'_>,
    now: u64,
    report: &mut Report,
) -> Option<Result<Admitted, Refused>> {
    store
        .redis_store()
        .is_none()
        .then(|| admit_memory(store, req, now, report))
}

/// [`admit_local`]'s decision, for a caller that has seen the store is the memory store (on
/// Redis this would decide on the local fallback's counters, as if Redis were down).
pub fn admit_memory(
    store: &Arc<Store>,
    req: &Request<'_>,
    now: u64,
    report: &mut Report,
) -> Result<Admitted, Refused> {
    debug_assert!(store.redis_store().is_none(), "the memory store");
    let taken = concurrency::take_local(store, req, report)?;
    both(taken, rate::check_local(store, req, now, report))
}

/// The outcome of the rate limits, with the concurrency slots `taken` before them.
fn both(taken: concurrency::Taken, rate: Result<Admitted, Refused>) -> Result<Admitted, Refused> {
    let mut admitted = rate.map_err(|mut r| {
        r.degraded = r.degraded.or(taken.degraded);
        r
    })?;
    admitted.slots = taken.slots;
    admitted.degraded = admitted.degraded.or(taken.degraded);
    Ok(admitted)
}

impl Request<'_> {
    /// Whether any limit, of either kind, is listed for this request's route or its caller's
    /// tier (whether it then applies depends on the caller: see `applicable`). A request
    /// with none skips admission, and its clock reads, altogether.
    pub fn has_limits(&self) -> bool {
        let route = &self.route.limits;
        let tier = self.caller.tier.map(|t| &self.cfg.tiers[t].limits);
        !route.rate.is_empty()
            || !route.concurrency.is_empty()
            || tier.is_some_and(|t| !t.rate.is_empty() || !t.concurrency.is_empty())
    }

    /// The counter key of the limit named `name` with key `parts` for this request: BLAKE3 of
    /// the name and the caller's key parts. `None` when the request lacks a part (no API key,
    /// no such header): then the limit does not apply to it.
    pub fn counter_key(&self, name: &str, parts: &[KeyPart]) -> Option<CounterKey> {
        let (ip_buf, ip_len) = match self.caller.client_ip {
            IpAddr::V4(v4) => {
                let mut b = [0u8; 16];
                b[..4].copy_from_slice(&v4.octets());
                (b, 4)
            }
            // One counter per network (`identity.ipv6_prefix`, validated to 1-128).
            IpAddr::V6(v6) => (
                ipnet::Ipv6Net::new(v6, self.cfg.identity.ipv6_prefix)
                    .map_or(v6, |n| n.network())
                    .octets(),
                16,
            ),
        };
        // At most 8 parts (validated), without allocating.
        let mut bytes: [&[u8]; 8] = [&[]; 8];
        for (slot, part) in bytes.iter_mut().zip(parts) {
            *slot = match part {
                KeyPart::ApiKey => &self.caller.key_hash.as_ref()?.0,
                KeyPart::User => self.caller.user.as_deref()?.as_bytes(),
                KeyPart::ClientIp => &ip_buf[..ip_len],
                KeyPart::Route => self.route.name.as_bytes(),
                KeyPart::Method => self.method.as_str().as_bytes(),
                KeyPart::Tier => self.cfg.tiers[self.caller.tier?].name.as_bytes(),
                KeyPart::Header(h) => self.headers.get(h)?.as_bytes(),
            };
        }
        Some(CounterKey::remembered(
            self.keys,
            name,
            bytes[..parts.len()].iter().copied(),
        ))
    }

    /// The limits of one kind that apply to this request, with their keys: the route's (its
    /// own and the top-level ones) and the caller's tier's, minus `anonymous_only` limits for
    /// identified callers and limits whose key needs a part the request lacks.
    fn applicable<'s>(
        &'s self,
        route: &'s [LimitId],
        tier: impl Fn(&'s crate::config::Tier) -> &'s [LimitId],
    ) -> impl Iterator<Item = (LimitId, CounterKey)> + 's {
        let tier_limits = self
            .caller
            .tier
            .map_or(&[][..], |t| tier(&self.cfg.tiers[t]));
        route.iter().chain(tier_limits).filter_map(move |&id| {
            let limit = self.cfg.limit(id);
            if limit.anonymous_only && !self.caller.is_anonymous() {
                return None;
            }
            Some((id, self.counter_key(&limit.name, &limit.key)?))
        })
    }
}

#[cfg(test)]
mod tests;
