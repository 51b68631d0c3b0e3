//! Steps 1 to 4 of `request_filter`: who is calling, which route, load shedding, and the
//! limits, the most restrictive of which decides. [`Gateway::decide`] runs them on any store;
//! [`Gateway::decide_now`] on the memory store, which decides in this process without waiting,
//! so a request's filter needs no future of its own (see `filter`).
//!
//! Phase: `request_filter`.

use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use std::time::SystemTime;

use pingora_http::RequestHeader;
use pingora_proxy::Session;

use super::{refused, Gateway, RequestCtx};
use crate::admission::{self, Admitted, Refused, Report, Request};
use crate::config::{Config, Route, RouteId};
use crate::conn::ConnState;
use crate::identity::{apply_quotas, identify, Caller};
use crate::quota;
use crate::refusal::Refusal;
use crate::route::match_route;
use crate::shed;

/// Step 4 under way: the request's limits and what their check has to report.
struct Check<'a> {
    request: Request<'a>,
    report: Report,
    /// When the check started (the store's clock read for the limits' time too).
    started: SystemTime,
    /// The limits' time, in ms.
    now: u64,
}

impl Gateway {
    /// Steps 1 to 4: `Ok` with what the limits admitted, or the refusal.
    pub(super) async fn decide(
        &self,
        cfg: &Arc<Config>,
        session: &Session,
        ctx: &mut RequestCtx,
    ) -> Result<Admitted, Refused> {
        let mut caller = None;
        let Some(mut c) = self.start(cfg, session, ctx, &mut caller)? else {
            return Ok(Admitted::default());
        };
        let store = &self.store;
        let outcome = match admission::admit_local(store, &c.request, c.now, &mut c.report) {
            Some(outcome) => outcome,
            None => admission::admit(store, &c.request, c.now, &mut c.report).await,
        };
        self.checked(cfg, c, outcome)
    }

    /// [`Self::decide`] on the memory store (the caller has seen that it is), which decides
    /// without waiting.
    pub(super) fn decide_now(
        &self,
        cfg: &Arc<Config>,
        session: &Session,
        ctx: &mut RequestCtx,
    ) -> Result<Admitted, Refused> {
        let mut caller = None;
        match self.start(cfg, session, ctx, &mut caller)? {
            None => Ok(Admitted::default()),
            Some(mut c) => {
                let outcome =
                    admission::admit_memory(&self.store, &c.request, c.now, &mut c.report);
                self.checked(cfg, c, outcome)
            }
        }
    }

    /// Steps 1 to 3, then step 4's start ([`Self::check`]); the caller is kept in `caller`,
    /// where the check can borrow it.
    fn start<'a>(
        &self,
        cfg: &'a Arc<Config>,
        session: &'a Session,
        ctx: &mut RequestCtx,
        caller: &'a mut Option<Caller<'a>>,
    ) -> Result<Option<Check<'a>>, Refused> {
        let (who, route_id) = self.identify_route_shed(cfg, session, ctx)?;
        let caller = caller.insert(who);
        Ok(self.check(cfg, session, &cfg.routes[route_id], caller))
    }

    /// Steps 1 to 3; the caller and the index of its route, for the limits.
    fn identify_route_shed<'s>(
        &self,
        cfg: &Arc<Config>,
        session: &'s Session,
        ctx: &mut RequestCtx,
    ) -> Result<(Caller<'s>, RouteId), Refused> {
        let peer = ctx.peer.unwrap_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED));
        let req = session.req_header();

        // 1. Who is calling.
        let mut caller = identify(cfg, &req.headers, peer).map_err(|e| refused(e.into()))?;
        let quotas = self.quotas.as_deref();
        apply_quotas(cfg, quotas, &mut caller, quota::now_s).map_err(|e| refused(e.into()))?;
        ctx.overrides = caller.overrides.clone();
        ctx.obs.identified(&caller);

        // 2. Which route, on the normal form of the path (step 0 put it in the head).
        let host = || {
            req.headers
                .get(http::header::HOST)
                .and_then(|h| h.to_str().ok())
        };
        let Some(route_id) = match_route(cfg, &req.method, host, req.uri.path()) else {
            return Err(refused(Refusal::NoRoute {
                method: req.method.clone(),
                path: req.uri.path().to_string(),
            }));
        };
        ctx.route = Some(route_id);
        let route = &cfg.routes[route_id];
        ctx.max_body = route.max_body_bytes.or(cfg.http.max_body_bytes);
        // The declared length is looked up only when there is a bound to hold it to.
        if let Some(max) = ctx.max_body {
            if content_length(req).is_some_and(|len| len > max) {
                return Err(refused(Refusal::BodyTooLarge));
            }
        }

        // 3. Load shedding by priority, before any store call (a shed costs no round trip).
        let class = shed::classify(
            cfg.shedding.as_ref(),
            route.priority,
            &req.method,
            &req.headers,
            caller.api_key,
        );
        ctx.obs.class = Some(class);
        let in_flight = self
            .shedder
            .admit(class, cfg.shedding.as_ref())
            .map_err(|shed| refused(Refusal::Shed(shed.class)))?;
        ctx.in_flight = Some(in_flight);
        Ok((caller, route_id))
    }

    /// Step 4's start: every limit that applies (a slot of each concurrency limit, then every
    /// rate limit in one store call; the most restrictive decides). `None` when the route and
    /// the caller's tier list none.
    fn check<'a>(
        &self,
        cfg: &'a Config,
        session: &'a Session,
        route: &'a Route,
        caller: &'a Caller<'a>,
    ) -> Option<Check<'a>> {
        let req = session.req_header();
        let mut request = Request {
            cfg,
            caller,
            route,
            method: &req.method,
            headers: &req.headers,
            keys: None,
        };
        if !request.has_limits() {
            return None;
        }
        // The connection's remembered keys, looked up only for a request that needs keys.
        request.keys = ConnState::of(session).map(|c| c.keys());
        // One clock read for both: the limits' time and the start of the check's timing.
        let started = SystemTime::now();
        Some(Check {
            request,
            report: Report::default(),
            started,
            now: self.clock.ms_at(started),
        })
    }

    /// Step 4's end: the check's metrics and log lines, and its `outcome`.
    fn checked(
        &self,
        cfg: &Arc<Config>,
        c: Check<'_>,
        outcome: Result<Admitted, Refused>,
    ) -> Result<Admitted, Refused> {
        self.observer.decided(cfg, &c.report, c.started);
        log_report(cfg, c.request.caller, &c.report);
        outcome
    }
}

/// The declared body length (Pingora has already refused conflicting or repeated ones).
fn content_length(req: &RequestHeader) -> Option<u64> {
    req.headers
        .get(http::header::CONTENT_LENGTH)?
        .to_str()
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// Shadow limits that would have refused, and store failures the policies answered.
fn log_report(cfg: &Config, caller: &Caller<'_>, report: &Report) {
    for id in report.shadow_denied() {
        tracing::info!(limit = %cfg.limit(id).name, client_ip = %caller.client_ip, "shadow limit would deny");
    }
    if let Some(e) = &report.store_error {
        // Breaker transitions are logged at warn by the store; this is per request.
        tracing::debug!(error = %e, kind = e.kind().as_str(), "store failed; failure policies applied");
    }
}
