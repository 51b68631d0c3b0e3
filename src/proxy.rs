//! The gateway's [`ProxyHttp`]: `request_filter` runs identity → route → shedding →
//! admission (concurrency, then rate limits) and answers from there when one refuses;
//! otherwise the request is proxied to the route's upstream with the decisive limit's headers
//! added to the response. A request's in-flight count and concurrency slots are guards in its
//! context: they are given back exactly once when it ends, however it ends.
//!
//! Phase: every request. One config snapshot is taken at the start and used to the end, so a
//! reload never changes a request half-way.

use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use pingora_core::upstreams::peer::HttpPeer;
use pingora_error::{Error, ErrorSource, ErrorType, Result};
use pingora_http::{RequestHeader, ResponseHeader};
use pingora_proxy::{FailToProxy, ProxyHttp, Session};

use crate::admission::{self, Admitted, Refused, Report, Request};
use crate::config::reload::ConfigHandle;
use crate::config::{Config, LimitId, OnError, RouteId};
use crate::headers;
use crate::identity::{identify, Caller};
use crate::limit::{Clock, Decision};
use crate::observe::{self, Observer};
use crate::refusal::Refusal;
use crate::route::match_route;
use crate::shed::{self, InFlight, Shedder};
use crate::store::{HeldSlots, Store};

/// How long to wait for an upstream TCP connection.
pub const UPSTREAM_CONNECT_TIMEOUT: Duration = Duration::from_secs(3);

pub struct Gateway {
    pub config: Arc<ConfigHandle>,
    pub store: Arc<Store>,
    pub clock: Arc<dyn Clock>,
    /// Requests in flight in this process, for load shedding.
    pub shedder: Arc<Shedder>,
    /// Metrics, top callers and the access log.
    pub observer: Arc<Observer>,
}

/// Per-request state shared across the filters.
#[derive(Default)]
pub struct RequestCtx {
    config: Option<Arc<Config>>,
    route: Option<RouteId>,
    peer: Option<IpAddr>,
    /// The most restrictive enforcing rate limit, for the response headers.
    decisive: Option<(LimitId, Decision)>,
    degraded: Option<OnError>,
    /// When the limits were decided (the store's clock), for the reset headers.
    decided_at: u64,
    /// Counted in the gateway's requests in flight (for shedding) until dropped.
    in_flight: Option<InFlight>,
    /// The concurrency slots this request holds until dropped.
    slots: Option<HeldSlots>,
    /// What the metrics and the access log need to know of this request.
    obs: observe::Record,
}

/// Write an answer the gateway makes itself.
async fn respond(session: &mut Session, cfg: &Config, refused: Refused) -> Result<bool> {
    let (header, body) = refused.refusal.response(cfg, refused.degraded);
    let head_only = session.req_header().method == http::Method::HEAD;
    session
        .write_response_header(Box::new(header), head_only)
        .await?;
    if !head_only {
        session.write_response_body(Some(body), true).await?;
    }
    Ok(true)
}

fn refused(refusal: Refusal) -> Refused {
    Refused {
        refusal,
        degraded: None,
    }
}

impl Gateway {
    /// Steps 1 to 4 of `request_filter`: `Ok` with what the limits admitted, or the refusal.
    async fn decide(
        &self,
        cfg: &Arc<Config>,
        session: &Session,
        ctx: &mut RequestCtx,
    ) -> std::result::Result<Admitted, Refused> {
        let peer = ctx.peer.unwrap_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED));
        let req = session.req_header();

        // 1. Who is calling.
        let caller = identify(cfg, &req.headers, peer).map_err(|e| refused(e.into()))?;
        ctx.obs.identified(&caller);

        // 2. Which route.
        let host = req.uri.host().or_else(|| {
            req.headers
                .get(http::header::HOST)
                .and_then(|h| h.to_str().ok())
        });
        let Some(route_id) = match_route(cfg, &req.method, host, req.uri.path()) else {
            return Err(refused(Refusal::NoRoute {
                method: req.method.clone(),
                path: req.uri.path().to_string(),
            }));
        };
        ctx.route = Some(route_id);
        let route = &cfg.routes[route_id];

        // 3. Load shedding by priority, before any store call: a shed request costs no
        // round trip.
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

        // 4. Every limit that applies: a slot of each concurrency limit, then every rate
        // limit in one store call; the most restrictive decides.
        let request = Request {
            cfg,
            caller: &caller,
            route,
            method: &req.method,
            headers: &req.headers,
        };
        let mut report = Report::default();
        let started = std::time::Instant::now();
        let outcome =
            admission::admit(&self.store, &request, self.clock.now_ms(), &mut report).await;
        self.observer.decided(cfg, &report, started.elapsed());
        log_report(cfg, &caller, &report);
        outcome
    }
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

#[async_trait]
impl ProxyHttp for Gateway {
    type CTX = RequestCtx;

    fn new_ctx(&self) -> RequestCtx {
        RequestCtx::default()
    }

    async fn request_filter(&self, session: &mut Session, ctx: &mut RequestCtx) -> Result<bool> {
        ctx.obs = self.observer.begin(session);
        let cfg = self.config.snapshot();
        ctx.peer = session
            .client_addr()
            .and_then(|a| a.as_inet())
            .map(|a| a.ip());
        // 1-4: identity, route, shedding, limits.
        let decided = self.decide(&cfg, session, ctx).await;
        self.observer.verdict(&cfg, session, &mut ctx.obs, &decided);
        ctx.config = Some(cfg.clone());
        // 5. Answer, or proceed upstream with the headers of the decisive limit.
        match decided {
            Ok(admitted) => {
                ctx.decisive = admitted.decisive;
                ctx.degraded = admitted.degraded;
                ctx.decided_at = admitted.decided_at;
                ctx.slots = admitted.slots;
                Ok(false)
            }
            Err(refused) => respond(session, &cfg, refused).await,
        }
    }

    async fn upstream_peer(
        &self,
        _session: &mut Session,
        ctx: &mut RequestCtx,
    ) -> Result<Box<HttpPeer>> {
        let (Some(cfg), Some(route)) = (&ctx.config, ctx.route) else {
            return Error::e_explain(ErrorType::InternalError, "no route selected");
        };
        let addr = cfg.upstream(cfg.routes[route].upstream).pick();
        ctx.obs.upstream(addr);
        let mut peer = HttpPeer::new(addr, false, String::new());
        peer.options.connection_timeout = Some(UPSTREAM_CONNECT_TIMEOUT);
        Ok(Box::new(peer))
    }

    async fn upstream_request_filter(
        &self,
        _session: &mut Session,
        upstream_request: &mut RequestHeader,
        ctx: &mut RequestCtx,
    ) -> Result<()> {
        if let Some(id) = ctx.obs.generated_id(&self.observer) {
            upstream_request.insert_header(observe::REQUEST_ID, id)?;
        }
        let Some(peer) = ctx.peer else { return Ok(()) };
        let mut chain = String::new();
        for v in upstream_request.headers.get_all("x-forwarded-for") {
            if let Ok(v) = v.to_str() {
                chain.push_str(v);
                chain.push_str(", ");
            }
        }
        chain.push_str(&peer.to_string());
        upstream_request.insert_header("x-forwarded-for", chain)?;
        Ok(())
    }

    async fn response_filter(
        &self,
        _session: &mut Session,
        upstream_response: &mut ResponseHeader,
        ctx: &mut RequestCtx,
    ) -> Result<()> {
        ctx.obs.upstream_answered();
        if let (Some(cfg), Some((id, d))) = (&ctx.config, &ctx.decisive) {
            headers::apply(cfg, *id, d, ctx.decided_at, upstream_response);
        }
        if let Some(policy) = ctx.degraded {
            headers::degraded(upstream_response, policy);
        }
        Ok(())
    }

    /// The end of every request, answered or failed, including a client gone mid-request:
    /// give back its concurrency slots and leave the in-flight count. The guards would do the
    /// same when the context drops; either way it happens exactly once. Then its metrics
    /// and access-log line.
    async fn logging(&self, session: &mut Session, _e: Option<&Error>, ctx: &mut RequestCtx) {
        ctx.slots = None;
        ctx.in_flight = None;
        self.observer
            .finish(session, ctx.config.as_ref(), ctx.route, &ctx.obs);
    }

    /// A client that goes away mid-request (closed, reset, a failed read or write on its side)
    /// is routine, not the gateway's error: not logged at ERROR, where it would bury real
    /// upstream and gateway failures. It is logged at debug.
    fn suppress_error_log(&self, _session: &Session, _ctx: &RequestCtx, e: &Error) -> bool {
        let client_gone = matches!(e.esource(), ErrorSource::Downstream)
            && matches!(
                e.etype(),
                ErrorType::ConnectionClosed | ErrorType::ReadError | ErrorType::WriteError
            );
        if client_gone {
            tracing::debug!("client went away: {e}");
        }
        client_gone
    }

    async fn fail_to_proxy(
        &self,
        session: &mut Session,
        e: &Error,
        ctx: &mut RequestCtx,
    ) -> FailToProxy {
        let refusal = match e.etype() {
            ErrorType::HTTPStatus(code) => Ok(Refusal::from_status(*code)),
            _ => match e.esource() {
                ErrorSource::Upstream => Ok(Refusal::UpstreamFailed),
                ErrorSource::Downstream => match e.etype() {
                    ErrorType::WriteError | ErrorType::ReadError | ErrorType::ConnectionClosed => {
                        Err(0)
                    }
                    _ => Ok(Refusal::BadRequest),
                },
                ErrorSource::Internal | ErrorSource::Unset => Ok(Refusal::Internal),
            },
        };
        let code = match &refusal {
            Ok(r) => r.status(),
            Err(code) => *code,
        };
        if let Ok(r) = refusal {
            if session.response_written().is_none() {
                // The connection is not reused after this (see below): say so.
                session.set_keepalive(None);
                let cfg = ctx.config.clone().unwrap_or_else(|| self.config.snapshot());
                if let Err(err) = respond(session, &cfg, refused(r)).await {
                    tracing::debug!("could not send the error response: {err}");
                }
            }
        }
        FailToProxy {
            error_code: code,
            can_reuse_downstream: false,
        }
    }
}
