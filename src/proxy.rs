//! The gateway's [`ProxyHttp`]: `request_filter` runs identity → route → shedding →
//! concurrency limits → rate limits and answers from there when one refuses; otherwise the
//! request is proxied to the route's upstream with the decisive limit's headers added to the
//! response. A request's in-flight count and concurrency slots are guards in its context:
//! they are given back exactly once when it ends, however it ends.
//!
//! Phase: every request. One config snapshot is taken at the start and used to the end, so a
//! reload never changes a request half-way.

use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use pingora_core::upstreams::peer::HttpPeer;
use pingora_error::{Error, ErrorSource, ErrorType, Result};
use pingora_http::{RequestHeader, ResponseHeader};
use pingora_proxy::{FailToProxy, ProxyHttp, Session};

use crate::concurrency::MemorySlots;
use crate::concurrency::{self, Outcome, Slots};
use crate::config::reload::ConfigHandle;
use crate::config::{Config, LimitId};
use crate::evaluate::{applicable, decide, Degraded, Verdict};
use crate::headers;
use crate::identity::{identify, IdentityError};
use crate::limit::{Clock, Decision};
use crate::route::match_route;
use crate::shed::{self, InFlight, Shedder};
use crate::store::Store;

/// How long to wait for an upstream TCP connection.
pub const UPSTREAM_CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
/// `Retry-After` of a 503 from a limit that fails closed.
pub const STORE_DOWN_RETRY_AFTER_S: u64 = 1;

pub struct Gateway {
    pub config: Arc<ConfigHandle>,
    pub store: Arc<Store>,
    pub clock: Arc<dyn Clock>,
    /// Requests in flight in this process, for load shedding.
    pub shedder: Arc<Shedder>,
    /// Concurrency slots held in this process (memory store, and `local` fallback).
    pub slots: Arc<MemorySlots>,
}

/// Per-request state shared across the filters.
#[derive(Default)]
pub struct RequestCtx {
    config: Option<Arc<Config>>,
    route: Option<usize>,
    peer: Option<IpAddr>,
    decisive: Option<(LimitId, Decision)>,
    degraded: Option<Degraded>,
    now_ms: u64,
    /// Counted in the gateway's requests in flight (for shedding) until dropped.
    in_flight: Option<InFlight>,
    /// The concurrency slots this request holds until dropped.
    slots: Option<Slots>,
}

async fn respond(session: &mut Session, (header, body): (ResponseHeader, Bytes)) -> Result<bool> {
    let head_only = session.req_header().method == http::Method::HEAD;
    session
        .write_response_header(Box::new(header), head_only)
        .await?;
    if !head_only {
        session.write_response_body(Some(body), true).await?;
    }
    Ok(true)
}

#[async_trait]
impl ProxyHttp for Gateway {
    type CTX = RequestCtx;

    fn new_ctx(&self) -> RequestCtx {
        RequestCtx::default()
    }

    async fn request_filter(&self, session: &mut Session, ctx: &mut RequestCtx) -> Result<bool> {
        let cfg = self.config.snapshot();
        ctx.config = Some(cfg.clone());
        let peer = session
            .client_addr()
            .and_then(|a| a.as_inet())
            .map_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED), |a| a.ip());
        ctx.peer = Some(peer);
        let req = session.req_header();

        // 1. Who is calling.
        let caller = match identify(&cfg, &req.headers, peer) {
            Ok(c) => c,
            Err(e @ IdentityError::InvalidApiKey { .. }) => {
                return respond(session, headers::simple(400, "Bad Request", &e.to_string())).await;
            }
            Err(e @ IdentityError::InvalidToken(_)) => {
                let (mut h, b) = headers::simple(401, "Unauthorized", &e.to_string());
                let _ = h.insert_header("www-authenticate", "Bearer error=\"invalid_token\"");
                return respond(session, (h, b)).await;
            }
        };

        // 2. Which route.
        let host = req.uri.host().or_else(|| {
            req.headers
                .get(http::header::HOST)
                .and_then(|h| h.to_str().ok())
        });
        let Some(route_id) = match_route(&cfg, &req.method, host, req.uri.path()) else {
            let detail = format!("No route matches {} {}.", req.method, req.uri.path());
            return respond(session, headers::simple(404, "Not Found", &detail)).await;
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
            caller.api_key.as_deref(),
        );
        match self.shedder.admit(class, cfg.shedding.as_ref()) {
            Ok(in_flight) => ctx.in_flight = Some(in_flight),
            Err(shed) => return respond(session, shed.response()).await,
        }

        // 4. A slot of every concurrency limit, held until the request ends.
        let mut claims = Vec::new();
        concurrency::applicable(&cfg, &caller, route, &req.method, &req.headers, &mut claims);
        if !claims.is_empty() {
            let (outcome, report) =
                concurrency::acquire(&cfg, &self.store, &self.slots, &claims).await;
            for &id in &report.shadow_full {
                tracing::info!(limit = %cfg.concurrency[id].name, client_ip = %caller.client_ip, "shadow limit would deny");
            }
            if let Some(e) = &report.store_error {
                tracing::debug!(error = %e, "store failed; concurrency failure policies applied");
            }
            ctx.degraded = report.degraded;
            let answer = match outcome {
                Outcome::Admitted(slots) => {
                    ctx.slots = slots;
                    None
                }
                Outcome::Denied { limit, in_use } => {
                    Some(concurrency::denied_response(&cfg, limit, in_use))
                }
                Outcome::Unavailable { limit } => {
                    Some(concurrency::unavailable_response(&cfg, limit))
                }
            };
            if let Some((mut head, body)) = answer {
                if let Some(d) = report.degraded {
                    let _ = head.insert_header(headers::DEGRADED, d.header_value());
                }
                return respond(session, (head, body)).await;
            }
        }

        // 5. Every matching rate limit, in one store call.
        let mut ids = Vec::new();
        let mut checks = Vec::new();
        applicable(
            &cfg,
            &caller,
            route,
            &req.method,
            &req.headers,
            &mut ids,
            &mut checks,
        );
        let now = self.clock.now_ms();
        ctx.now_ms = now;
        let mut decisions = Vec::with_capacity(checks.len());
        let (verdict, report) = decide(&cfg, &self.store, &ids, &checks, now, &mut decisions).await;
        for &id in &report.shadow_denied {
            tracing::info!(limit = %cfg.limit(id).name, client_ip = %caller.client_ip, "shadow limit would deny");
        }
        if let Some(e) = &report.store_error {
            // Breaker transitions are logged at warn by the store; this is per request.
            tracing::debug!(error = %e, "store failed; failure policies applied");
        }
        ctx.degraded = report.degraded.or(ctx.degraded);
        // Resets are reported on the store's clock, so every gateway agrees.
        let now = report.decided_at.unwrap_or(now);
        ctx.now_ms = now;

        // 6. Answer or proceed.
        let mut answer = match verdict {
            Verdict::Allow { decisive } => {
                ctx.decisive = decisive;
                return Ok(false);
            }
            Verdict::Deny { limit, decision } => headers::rate_limited(&cfg, limit, &decision, now),
            Verdict::Unavailable { limit } => headers::store_unavailable(
                "rate limit",
                &cfg.limit(limit).name,
                STORE_DOWN_RETRY_AFTER_S,
            ),
        };
        if let Some(d) = ctx.degraded {
            let _ = answer.0.insert_header(headers::DEGRADED, d.header_value());
        }
        // Refused: give the concurrency slots back now rather than after the answer is sent.
        ctx.slots = None;
        respond(session, answer).await
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
        if let (Some(cfg), Some((id, d))) = (&ctx.config, &ctx.decisive) {
            headers::apply(cfg, *id, d, ctx.now_ms, upstream_response);
        }
        if let Some(d) = ctx.degraded {
            upstream_response.insert_header(headers::DEGRADED, d.header_value())?;
        }
        Ok(())
    }

    /// The end of every request, answered or failed, including a client gone mid-request:
    /// give back its concurrency slots and leave the in-flight count. The guards would do the
    /// same when the context drops; either way it happens exactly once.
    async fn logging(&self, _session: &mut Session, _e: Option<&Error>, ctx: &mut RequestCtx) {
        ctx.slots = None;
        ctx.in_flight = None;
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
        _ctx: &mut RequestCtx,
    ) -> FailToProxy {
        let code = match e.etype() {
            ErrorType::HTTPStatus(code) => *code,
            _ => match e.esource() {
                ErrorSource::Upstream => 502,
                ErrorSource::Downstream => match e.etype() {
                    ErrorType::WriteError | ErrorType::ReadError | ErrorType::ConnectionClosed => 0,
                    _ => 400,
                },
                ErrorSource::Internal | ErrorSource::Unset => 500,
            },
        };
        if code > 0 && session.response_written().is_none() {
            // The connection is not reused after this (see below): say so.
            session.set_keepalive(None);
            let (title, detail) = match code {
                502 => (
                    "Bad Gateway",
                    "The upstream could not be reached or failed to answer.",
                ),
                400 => ("Bad Request", "The request could not be read."),
                _ => (
                    "Internal Server Error",
                    "The gateway failed to handle the request.",
                ),
            };
            let resp = headers::simple(code, title, detail);
            if let Err(err) = respond(session, resp).await {
                tracing::debug!("could not send the error response: {err}");
            }
        }
        FailToProxy {
            error_code: code,
            can_reuse_downstream: false,
        }
    }
}
