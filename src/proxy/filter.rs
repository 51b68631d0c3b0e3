//! `request_filter`'s steps: the head's checks, the decision ([`Gateway::decide`]), and the
//! answer, or the headers an admitted request carries upstream.
//!
//! Phase: `request_filter`.

use std::sync::Arc;

use pingora_error::Result;
use pingora_http::StaticHeaderName;
use pingora_proxy::Session;

use super::{refused, respond, Gateway, RequestCtx};
use crate::admission::Refused;
use crate::config::Config;
use crate::conn::ConnState;
use crate::head;
use crate::observe::{self, digest_peer_ip, Observer};
use crate::refusal::Refusal;

impl Gateway {
    /// `request_filter`: `Ok(true)` when the gateway answered itself.
    pub(super) async fn filter(&self, session: &mut Session, ctx: &mut RequestCtx) -> Result<bool> {
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
        // The peer as the connection's entry noted it at accept: the same socket address as the
        // session's digest, which Pingora then need not make for this request.
        ctx.peer = ctx.conn_peer.or_else(|| digest_peer_ip(session));
        // 0. The head: Host, sizes, the path's normal form. 1-4: identity, route, shedding,
        // limits.
        let decided = match check_head(cfg, session) {
            Ok(()) => self.decide(cfg, session, ctx).await,
            Err(refused) => Err(refused),
        };
        self.observer.verdict(cfg, session, &mut ctx.obs, &decided);
        // 5. Answer, or proceed upstream with the headers of the decisive limit.
        match decided {
            Ok(admitted) => {
                forwarding_headers(&self.observer, session, ctx)?;
                ctx.decisive = admitted.decisive;
                ctx.degraded = admitted.degraded;
                ctx.decided_at = admitted.decided_at;
                ctx.slots = admitted.slots;
                Ok(false)
            }
            Err(refused) => respond(session, cfg, refused).await,
        }
    }
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
/// `X-Forwarded-For` with the peer appended. Written into the request's own head, which
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
    let id = ctx.obs.generated_id(observer);
    // Room for both at once, should the head have none left.
    req.reserve(1 + usize::from(id.is_some()));
    if let Some(id) = id {
        req.insert_header(&X_REQUEST_ID, id)?;
    }
    let Some(peer) = ctx.peer else { return Ok(()) };
    if let Some(text) = peer_text {
        return req.insert_header(&X_FORWARDED_FOR, text);
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
    req.insert_header(&X_FORWARDED_FOR, chain)?;
    Ok(())
}
