//! The gateway's [`ProxyHttp`]: `request_filter` runs the head checks (Host, sizes, the
//! path's normal form) → identity → route → shedding → admission (concurrency, then rate
//! limits) and answers from there when one refuses;
//! otherwise the request is proxied to the route's upstream with the decisive limit's headers
//! added to the response. A request's in-flight count and concurrency slots are guards in its
//! context: they are given back exactly once when it ends, however it ends.
//!
//! Phase: every request. One config snapshot is taken at the start and used to the end, so a
//! reload never changes a request half-way.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;
use futures_util::future::BoxFuture;
use pingora_core::modules::http::HttpModules;
use pingora_core::upstreams::peer::HttpPeer;
use pingora_error::{Error, ErrorSource, ErrorType, Result};
use pingora_http::ResponseHeader;
use pingora_proxy::{FailToProxy, ProxyHttp, Session};

use crate::admission::Refused;
use crate::config::reload::ConfigHandle;
use crate::config::{Config, LimitId, OnError, RouteId, UpstreamTimeouts};
use crate::conn::ConnState;
use crate::headers;
use crate::lifecycle::Lifecycle;
use crate::limit::{Clock, Decision};
use crate::observe::{self, Observer};
use crate::pingora_patches;
use crate::quota::table::Resolved;
use crate::quota::Quotas;
use crate::refusal::Refusal;
use crate::shed::{InFlight, Shedder};
use crate::store::{HeldSlots, Store};

mod decide;
mod filter;
mod finished;
use finished::{finished, Immediate};

pub struct Gateway {
    pub config: Arc<ConfigHandle>,
    pub store: Arc<Store>,
    pub clock: Arc<dyn Clock>,
    /// Requests in flight in this process, for load shedding.
    pub shedder: &'static Shedder,
    /// Whether the gateway is draining for shutdown.
    pub lifecycle: Arc<Lifecycle>,
    /// Metrics, top callers and the access log.
    pub observer: Arc<Observer>,
    /// Per-key overrides, when the config has a `quotas` section.
    pub quotas: Option<Arc<Quotas>>,
}

/// Per-request state shared across the filters.
#[derive(Default)]
pub struct RequestCtx {
    config: Option<Arc<Config>>,
    route: Option<RouteId>,
    peer: Option<IpAddr>,
    /// The connection's peer, whose text was made once per connection ([`ConnState::peer`]).
    conn_peer: Option<IpAddr>,
    /// The most restrictive enforcing rate limit, for the response headers.
    decisive: Option<(LimitId, Decision)>,
    degraded: Option<OnError>,
    /// When the limits were decided (the store's clock), for the reset headers.
    decided_at: u64,
    /// The caller's quota override, for the headers of its own limit parameters.
    overrides: Option<Arc<Resolved>>,
    /// Counted in the gateway's requests in flight (for shedding) until dropped.
    in_flight: Option<InFlight>,
    /// The concurrency slots this request holds until dropped.
    slots: Option<HeldSlots>,
    /// The most body bytes this request may send (`max_body_bytes`), and how many it sent.
    max_body: Option<u64>,
    body_bytes: u64,
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
    /// `early_request_filter`'s work; see there.
    fn on_head(&self, session: &mut Session, ctx: &mut RequestCtx) -> Result<()> {
        // The one config snapshot this request runs on.
        let cfg = self.config.snapshot();
        ctx.obs = self.observer.begin(session, &cfg);
        let conn = ConnState::of(session);
        let tracked = conn.map(|conn| conn.busy()).is_some();
        ctx.conn_peer = conn.and_then(|conn| conn.peer()).map(|(ip, _)| *ip);
        session.set_pipelining_enabled(true);
        // Only where Pingora keeps the connection (HTTP/1.1, or 1.0 asking for keep-alive);
        // `Some(0)` would mean "forever".
        let keepalive = session.get_keepalive();
        if keepalive.is_some() {
            let secs = cfg.http.keepalive_timeout.as_secs();
            if self.lifecycle.draining() || secs == 0 {
                session.set_keepalive(None);
            } else if tracked {
                // `conn` closes the connection once it has been idle `keepalive_timeout`, so
                // Pingora keeps it without a timer of its own: `Some(secs)` would wrap every
                // read of every head in a timeout (about 3% of a proxied request's
                // instructions). Pingora has already said `Some(0)` for a keep-alive request
                // (setting it again would read the request's `Connection` header again).
                if keepalive != Some(0) {
                    session.set_keepalive(Some(0));
                }
            } else {
                session.set_keepalive(Some(secs));
            }
        }
        ctx.config = Some(cfg);
        Ok(())
    }

    /// `response_filter`'s work; see there.
    fn on_response(
        &self,
        session: &mut Session,
        upstream_response: &mut ResponseHeader,
        ctx: &mut RequestCtx,
    ) -> Result<()> {
        ctx.obs.upstream_answered();
        if self.lifecycle.draining() {
            // Shutting down: this connection closes after the response.
            session.set_keepalive(None);
        }
        let decisive = ctx.config.as_ref().zip(ctx.decisive.as_ref());
        if let Some((cfg, (id, d))) = decisive.filter(|(cfg, _)| cfg.headers.on_admitted) {
            let spec = ctx.overrides.as_deref().and_then(|o| o.rate(*id));
            headers::apply(
                cfg,
                *id,
                spec.map(|s| &**s),
                d,
                ctx.decided_at,
                upstream_response,
            );
        }
        if let Some(policy) = ctx.degraded {
            headers::degraded(upstream_response, policy);
        }
        Ok(())
    }

    /// `request_body_filter`'s work; see there.
    fn on_body(body: Option<&Bytes>, ctx: &mut RequestCtx) -> Result<()> {
        if let (Some(max), Some(b)) = (ctx.max_body, body) {
            ctx.body_bytes += b.len() as u64;
            if ctx.body_bytes > max {
                return Error::e_explain(
                    ErrorType::HTTPStatus(413),
                    "the request body is larger than max_body_bytes",
                );
            }
        }
        Ok(())
    }

    /// `logging`'s work; see there.
    fn on_end(&self, session: &mut Session, ctx: &mut RequestCtx) {
        ctx.slots = None;
        ctx.in_flight = None;
        // One clock read for both: the connection's idle deadline and the request's time.
        let now = std::time::Instant::now();
        if let Some(conn) = ConnState::of(session) {
            let keepalive = ctx
                .config
                .as_ref()
                .map_or(crate::config::defaults::KEEPALIVE_TIMEOUT, |c| {
                    c.http.keepalive_timeout
                });
            conn.idle(keepalive, now);
        }
        self.observer
            .finish(session, ctx.config.as_ref(), ctx.route, &ctx.obs, now);
    }
}

/// The Pingora peer for one upstream server, with the upstream's timeouts: what tollgate
/// hands Pingora for every proxied request (`examples/bare_pingora` builds its peers here
/// too, so the framework's floor is measured with the same settings). The response's header
/// names keep their case exactly when the request's did (`server.preserve_header_case`;
/// HTTP/2 heads have none).
pub fn peer(addr: SocketAddr, t: &UpstreamTimeouts, preserve_header_case: bool) -> HttpPeer {
    let mut peer = HttpPeer::new(addr, false, String::new());
    pingora_patches::peer_header_case(&mut peer.options, preserve_header_case);
    peer.options.connection_timeout = Some(t.connect);
    peer.options.total_connection_timeout = Some(t.connect);
    peer.options.read_timeout = Some(t.read);
    peer.options.write_timeout = Some(t.write);
    peer.options.idle_timeout = Some(t.idle);
    peer
}

#[async_trait]
impl ProxyHttp for Gateway {
    /// Boxed: Pingora keeps the context inside each request's future, which it moves (and,
    /// through `async_trait`, boxes) whole, so a pointer is cheaper to carry than 400 bytes.
    type CTX = Box<RequestCtx>;

    fn new_ctx(&self) -> Box<RequestCtx> {
        Box::default()
    }

    /// No downstream modules. Pingora's default registers a response-compression module,
    /// switched off, which tollgate never switches on; it still made its context and ran its
    /// filters on every request (about 650 instructions).
    fn init_downstream_modules(&self, _modules: &mut HttpModules) {}

    // This filter, `request_body_filter`, `response_filter` and `logging` are written out as
    // `async_trait` would write them, because their work is done when they are called: they
    // return `finished`'s future, which has no size, so no allocation per request (an
    // `async fn`'s future holds its arguments and is boxed). So is `request_filter`, on the
    // memory store, for an admitted request; where it waits (for Redis, or to write an answer
    // of the gateway's own) its future is made in its box (`pinned_in_place`), not on the
    // stack and copied into the box, as `async_trait` would. `upstream_peer` returns a value
    // and stays `async`.

    /// The head has been read: the connection is busy (no head deadline while the request
    /// runs), keep-alive follows `server.keepalive_timeout` whatever the client asked, and
    /// pipelined requests are served in order.
    fn early_request_filter<'a, 'b, 'c, 'async_trait>(
        &'a self,
        session: &'b mut Session,
        ctx: &'c mut Box<RequestCtx>,
    ) -> BoxFuture<'async_trait, Result<()>>
    where
        'a: 'async_trait,
        'b: 'async_trait,
        'c: 'async_trait,
        Self: 'async_trait,
    {
        finished(self.on_head(session, ctx))
    }

    fn request_filter<'a, 'b, 'c, 'async_trait>(
        &'a self,
        session: &'b mut Session,
        ctx: &'c mut Box<RequestCtx>,
    ) -> BoxFuture<'async_trait, Result<bool>>
    where
        'a: 'async_trait,
        'b: 'async_trait,
        'c: 'async_trait,
        Self: 'async_trait,
    {
        self.filter_future(session, ctx)
    }

    async fn upstream_peer(
        &self,
        session: &mut Session,
        ctx: &mut Box<RequestCtx>,
    ) -> Result<Box<HttpPeer>> {
        let ctx: &mut RequestCtx = ctx;
        let (Some(cfg), Some(route)) = (&ctx.config, ctx.route) else {
            return Error::e_explain(ErrorType::InternalError, "no route selected");
        };
        let upstream = cfg.upstream(cfg.routes[route].upstream);
        let addr = upstream.pick();
        ctx.obs.upstream(addr);
        let keep_case = session.req_header().has_case();
        Ok(Box::new(peer(addr, &upstream.timeouts, keep_case)))
    }

    fn response_filter<'a, 'b, 'c, 'd, 'async_trait>(
        &'a self,
        session: &'b mut Session,
        upstream_response: &'c mut ResponseHeader,
        ctx: &'d mut Box<RequestCtx>,
    ) -> BoxFuture<'async_trait, Result<()>>
    where
        'a: 'async_trait,
        'b: 'async_trait,
        'c: 'async_trait,
        'd: 'async_trait,
        Self: 'async_trait,
    {
        finished(self.on_response(session, upstream_response, ctx))
    }

    /// A body sent without a length (chunked) is cut once it passes `max_body_bytes`: `413`
    /// if the upstream has not answered yet. The upstream may have seen part of it.
    fn request_body_filter<'a, 'b, 'c, 'd, 'async_trait>(
        &'a self,
        _session: &'b mut Session,
        body: &'c mut Option<Bytes>,
        _end_of_stream: bool,
        ctx: &'d mut Box<RequestCtx>,
    ) -> BoxFuture<'async_trait, Result<()>>
    where
        'a: 'async_trait,
        'b: 'async_trait,
        'c: 'async_trait,
        'd: 'async_trait,
        Self: 'async_trait,
    {
        finished(Self::on_body(body.as_ref(), ctx))
    }

    /// The end of every request, answered or failed, including a client gone mid-request:
    /// give back its concurrency slots and leave the in-flight count. The guards would do the
    /// same when the context drops; either way it happens exactly once. The connection now
    /// waits for its next head at most `server.keepalive_timeout`. Then its metrics and
    /// access-log line.
    fn logging<'a, 'b, 'c, 'd, 'async_trait>(
        &'a self,
        session: &'b mut Session,
        _e: Option<&'c Error>,
        ctx: &'d mut Box<RequestCtx>,
    ) -> BoxFuture<'async_trait, ()>
    where
        'a: 'async_trait,
        'b: 'async_trait,
        'c: 'async_trait,
        'd: 'async_trait,
        Self: 'async_trait,
    {
        self.on_end(session, ctx);
        Box::pin(Immediate(|| ()))
    }

    /// A client that goes away mid-request (closed, reset, a failed read or write on its side)
    /// is routine, not the gateway's error: not logged at ERROR, where it would bury real
    /// upstream and gateway failures. It is logged at debug.
    fn suppress_error_log(&self, _session: &Session, _ctx: &Box<RequestCtx>, e: &Error) -> bool {
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

    /// What Pingora's own log lines say of a request (the ERROR line of a failed proxy, the
    /// WARN line of a retry), in place of its raw request line and `Host`, which can hold the
    /// caller's credentials: the method, the path as the access log writes it (no query, the
    /// API key and bearer token replaced) and the route.
    fn request_summary(&self, session: &Session, ctx: &Box<RequestCtx>) -> String {
        let cfg = ctx.config.clone().unwrap_or_else(|| self.config.snapshot());
        observe::summary(&cfg, session, ctx.route)
    }

    async fn fail_to_proxy(
        &self,
        session: &mut Session,
        e: &Error,
        ctx: &mut Box<RequestCtx>,
    ) -> FailToProxy {
        let refusal = match e.etype() {
            ErrorType::HTTPStatus(code) => Ok(Refusal::from_status(*code)),
            _ => match e.esource() {
                ErrorSource::Upstream => Ok(match e.etype() {
                    ErrorType::ReadTimedout | ErrorType::WriteTimedout => Refusal::UpstreamTimeout,
                    _ => Refusal::UpstreamFailed,
                }),
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
