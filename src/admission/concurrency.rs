//! Concurrency limits (`kind: concurrency`): how many requests of one caller may be in
//! progress at once.
//!
//! A request takes one slot from every concurrency limit that applies to it, all or nothing,
//! and holds them in a [`HeldSlots`] guard in its context; dropping the guard gives them back
//! exactly once, however the request ends. A slot also expires `timeout` after it was taken,
//! so slots of a request that runs longer, or of a gateway that died, cannot leak; the late
//! release of an expired slot frees nothing. Where slots live is the store's business.
//!
//! Phase: `request_filter`, after shedding and before the rate limits, so that a request
//! refused here consumes no rate-limit quota.

use std::sync::Arc;

use super::policy::{self, Failure};
use super::{Refused, Report, Request, Source};
use crate::config::{LimitId, OnError};
use crate::refusal::Refusal;
use crate::store::{Claim, Claims, HeldSlots, InUse, Store};

/// The slots one request took.
#[derive(Debug, Default)]
pub(super) struct Taken {
    pub slots: Option<HeldSlots>,
    pub degraded: Option<OnError>,
}

impl Request<'_> {
    /// The concurrency limits that apply to this request, with their keys.
    pub fn concurrency_claims(&self, out: &mut Claims) {
        let claims = self
            .applicable(&self.route.limits.concurrency, |t| &t.limits.concurrency)
            .map(|(id, key)| {
                let l = self.cfg.limit(id);
                let c = l.concurrency();
                Claim {
                    id,
                    name: l.name.clone(),
                    key,
                    cap: c.limit,
                    timeout_ms: c.timeout.as_millis() as u64,
                    shadow: l.shadow,
                }
            });
        out.extend(claims);
    }
}

/// Take a slot of every concurrency limit of `req`, all or nothing.
pub(super) async fn take(
    store: &Arc<Store>,
    req: &Request<'_>,
    report: &mut Report,
) -> Result<Taken, Refused> {
    let mut claims = Claims::new();
    req.concurrency_claims(&mut claims);
    if claims.is_empty() {
        return Ok(Taken::default());
    }
    let mut in_use = InUse::new();
    match store.take_slots(&claims, &mut in_use).await {
        Ok(slots) => judge(
            &claims,
            &in_use,
            slots,
            (None, Source::of_store(store)),
            report,
        ),
        Err(e) => {
            report.store_error = Some(e);
            report.failed.extend(claims.iter().map(|c| c.id));
            let failure = policy::on_store_error(req.cfg, claims.iter().map(|c| c.id));
            let degraded = Some(failure.degraded());
            match failure {
                Failure::Closed(limit) => Err(Refused {
                    refusal: Refusal::StoreUnavailable { limit },
                    degraded,
                }),
                Failure::Open => Ok(Taken {
                    slots: None,
                    degraded,
                }),
                Failure::Local => {
                    claims.retain(|c| policy::is_local(req.cfg, c.id));
                    for c in claims.iter_mut() {
                        c.cap = req.cfg.limit(c.id).concurrency().local_limit;
                    }
                    let slots = store.take_local_slots(&claims, &mut in_use);
                    judge(&claims, &in_use, slots, (degraded, Source::Local), report)
                }
            }
        }
    }
}

/// [`take`] where the store answers in this process and never fails (the memory store).
pub(super) fn take_local(
    store: &Arc<Store>,
    req: &Request<'_>,
    report: &mut Report,
) -> Result<Taken, Refused> {
    let mut claims = Claims::new();
    req.concurrency_claims(&mut claims);
    if claims.is_empty() {
        return Ok(Taken::default());
    }
    let mut in_use = InUse::new();
    let slots = store.take_local_slots(&claims, &mut in_use);
    judge(&claims, &in_use, slots, (None, Source::Memory), report)
}

/// Every limit's decision is reported; the first full enforcing limit refuses.
fn judge(
    claims: &[Claim],
    in_use: &InUse,
    slots: Option<HeldSlots>,
    (degraded, source): (Option<OnError>, Source),
    report: &mut Report,
) -> Result<Taken, Refused> {
    let mut full: Option<(LimitId, u64)> = None;
    for (c, &n) in claims.iter().zip(in_use) {
        let has_room = n < c.cap;
        report.decide(c.id, has_room, c.shadow, source, None);
        if !has_room && !c.shadow && full.is_none() {
            full = Some((c.id, n));
        }
    }
    match full {
        Some((limit, in_use)) => Err(Refused {
            refusal: Refusal::SlotsFull { limit, in_use },
            degraded,
        }),
        None => Ok(Taken { slots, degraded }),
    }
}
