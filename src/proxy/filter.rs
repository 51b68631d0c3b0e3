//! `request_filter`'s steps: the head's checks, the decision ([`Gateway::decide`]), and the
//! answer, or the headers an admitted request carries upstream.
//!
//! Phase: `request_filter`.

use std::sync::Arc;

use futures_util::future::BoxFuture;
use pingora_error::Result;
use pingora_proxy::Session;

use super::finished::{pinned_in_place, Immediate};
use super::{refused, respond, Gateway, RequestCtx};
use crate::admin::auth;
use crate::admission::{Admitted, Refused};
use crate::config::Config;
use crate::conn::ConnState;
use crate::head;
use crate::observe::{self, digest_peer_ip, Observer};
use crate::pingora_patches::{self, StaticHeaderName};
use crate::refusal::Refusal;

impl Gateway {
    /// `request_filter`'s future: `Ok(true)` when the gateway answered itself. On the memory
    /// store every step is done here, but for writing an answer the gateway makes itself, so an
    /// admitted request's future has no size (and its box allocates nothing); on Redis, whose
    /// calls are awaited, the steps' future is made in its box.
    pub(super) fn filter_future<'f>(
        &'f self,
        session: &'f mut Session,
        ctx: &'f mut RequestCtx,
    ) -> BoxFuture<'f, Result<bool>> {
        if self.store.redis_store().is_some() {
            return pinned_in_place(|| self.filter(session, ctx));
        }
        let cfg = ctx.config.take().unwrap_or_else(|| self.config.snapshot());
        let decided = match self.head(&cfg, session, ctx) {
            Ok(()) => self.decide_now(&cfg, session, ctx),
            Err(refused) => Err(refused),
        };
        let settled = self.settle(&cfg, session, ctx, decided);
        ctx.config = Some(cfg);
        match settled {
            Ok(None) => Box::pin(Immediate(|| Ok(false))),
            Ok(Some(refused)) => pinned_in_place(move || async move {
                let cfg = ctx.config.clone().unwrap_or_else(|| self.config.snapshot());
                respond(session, &cfg, refused).await
            }),
            Err(e) => Box::pin(std::future::ready(Err(e))),
        }
    }

    /// The steps on any store, waiting for it.
    async fn filter(&self, session: &mut Session, ctx: &mut RequestCtx) -> Result<bool> {
        // The request's snapshot, moved out of the context while the steps borrow the context
        // and put back after (a clone would cost two atomic operations). Should the steps not
        // finish, the later phases fall back to the current snapshot.
        let cfg = ctx.config.take().unwrap_or_else(|| self.config.snapshot());
        let answered = self.filter_on(&cfg, session, ctx).await;
        ctx.config = Some(cfg);
        answered
    }

    async fn filter_on(
        &self,
        cfg: &Arc<Config>,
        session: &mut Session,
        ctx: &mut RequestCtx,
    ) -> Result<bool> {
        let decided = match self.head(cfg, session, ctx) {
            Ok(()) => self.decide(cfg, session, ctx).await,
            Err(refused) => Err(refused),
        };
        match self.settle(cfg, session, ctx, decided)? {
            None => Ok(false),
            Some(refused) => respond(session, cfg, refused).await,
        }
    }

    /// Step 0: the peer, and the head's checks.
    fn head(
        &self,
        cfg: &Config,
        session: &mut Session,
        ctx: &mut RequestCtx,
    ) -> std::result::Result<(), Refused> {
        // The peer as the connection's entry noted it at accept: the same socket address as the
        // session's digest, which Pingora then need not make for this request.
        ctx.peer = ctx.conn_peer.or_else(|| digest_peer_ip(session));
        // 0. The head: Host, sizes, the path's normal form. 1-4: identity, route, shedding,
        // limits.
        check_head(cfg, session)
    }

    /// Step 5: the outcome counted, then an admitted request's forwarding headers and what its
    /// later phases need (`None`), or the refusal to answer.
    fn settle(
        &self,
        cfg: &Config,
        session: &mut Session,
        ctx: &mut RequestCtx,
        decided: std::result::Result<Admitted, Refused>,
    ) -> Result<Option<Refused>> {
        self.observer.verdict(cfg, session, &mut ctx.obs, &decided);
        match decided {
            Ok(admitted) => {
                forwarding_headers(&self.observer, session, ctx)?;
                ctx.decisive = admitted.decisive;
                ctx.degraded = admitted.degraded;
                ctx.decided_at = admitted.decided_at;
                ctx.slots = admitted.slots;
                Ok(None)
            }
            Err(refused) => Ok(Some(refused)),
        }
    }
}

/// The admin listener's session cookie never goes upstream: cookies are not port-scoped, so a
/// browser signed in to the admin page sends it to the proxy port of the same host too. Other
/// cookies are kept. Costs a look-up of `Cookie` and, when there is one, a scan of its bytes.
fn strip_admin_session(req: &mut pingora_http::RequestHeader) -> Result<()> {
    let name = http::header::COOKIE;
    let values = req.headers.get_all(&name);
    if !values.iter().any(|v| auth::names_session(v.as_bytes())) {
        return Ok(());
    }
    let kept: Vec<Vec<u8>> = values
        .iter()
        .filter_map(|v| auth::without_session(v.as_bytes()))
        .collect();
    req.remove_header(&name);
    for v in kept {
        req.append_header(name.clone(), v)?;
    }
    Ok(())
}

/// Step 0: the head's checks, and the rewrite to the path's normal form.
fn check_head(cfg: &Config, session: &mut Session) -> std::result::Result<(), Refused> {
    let head_bytes = head::head_bytes(session);
    let rewrite = head::check(&cfg.http, session.req_header(), head_bytes).map_err(refused)?;
    let req = session.req_header_mut();
    if let Some(uri) = rewrite.uri {
        req.set_uri(uri);
    }
    if let Some(host) = rewrite.host {
        req.insert_header(http::header::HOST, host).map_err(|_| {
            refused(Refusal::BadHead(
                "The request's authority is not a valid host.",
            ))
        })?;
    }
    Ok(())
}

/// The headers an admitted request carries upstream: its id, when the gateway made it, and
/// `X-Forwarded-For` with the peer appended; its `Cookie` without the admin listener's session
/// cookie ([`strip_admin_session`]). Written into the request's own head, which
/// Pingora copies for the upstream (and again for each retry): the parsed head has room for
/// them, where the copy, sized to exactly the headers it holds, would grow both its maps.
fn forwarding_headers(observer: &Observer, session: &mut Session, ctx: &RequestCtx) -> Result<()> {
    static X_FORWARDED_FOR: StaticHeaderName = StaticHeaderName::from_static("x-forwarded-for");
    static X_REQUEST_ID: StaticHeaderName = StaticHeaderName::from_static(observe::REQUEST_ID);
    let xff = X_FORWARDED_FOR.as_header_name();
    // The usual case, no proxy before this one: the connection's own text of the peer.
    let peer_text = match ctx.peer {
        Some(peer) if !session.req_header().headers.contains_key(xff) => ConnState::of(session)
            .and_then(|c| c.peer())
            .filter(|(ip, _)| *ip == peer)
            .map(|(_, text)| text.clone()),
        _ => None,
    };
    let req = session.req_header_mut();
    strip_admin_session(req)?;
    let id = ctx.obs.generated_id(observer);
    // Room for both at once, should the head have none left.
    pingora_patches::reserve_headers(req, 1 + usize::from(id.is_some()));
    if let Some(id) = id {
        pingora_patches::insert_header(req, &X_REQUEST_ID, id)?;
    }
    let Some(peer) = ctx.peer else { return Ok(()) };
    if let Some(text) = peer_text {
        return pingora_patches::insert_header(req, &X_FORWARDED_FOR, text);
    }
    let mut chain = Vec::with_capacity(48);
    for v in req.headers.get_all(xff) {
        if let Ok(v) = v.to_str() {
            chain.extend_from_slice(v.as_bytes());
            chain.extend_from_slice(b", ");
        }
    }
    // Written in place, without `fmt`.
    observe::format::push_ip(&mut chain, peer);
    pingora_patches::insert_header(req, &X_FORWARDED_FOR, chain)?;
    Ok(())
}
