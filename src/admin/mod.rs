//! The admin listener (loopback by default), never on the proxy port:
//!
//! - open: `GET /healthz`, `GET /readyz`, `GET /metrics` (Prometheus text exposition);
//! - with the admin token once `admin.token_env` is configured ([`auth`]): `GET /stats`
//!   (requests in flight, shedding per class, slots, store, decision totals), `GET /top`
//!   (the top limited callers) and `GET /` (the live page, [`page`]). Without a token they
//!   are served only on a loopback admin listener; elsewhere they answer 403;
//! - `/admin/v1/…` ([`api`]): quota overrides, usage, the audit log, reload, the effective
//!   config; only with the admin token (403 saying how to enable it when none is configured);
//! - `POST /login`: the live page's login form; the token in, a session cookie out ([`auth`]).
//!
//! Against DNS rebinding, a request whose `Host` is not an IP literal, `localhost` or a name
//! in `admin.allowed_hosts` gets 421, except on `/healthz`, `/readyz` and `/metrics` (and a
//! request without `Host`, as HTTP/1.0 health checks send). Every answer carries
//! `Content-Security-Policy` (`frame-ancestors 'none'`), `X-Frame-Options: DENY` and
//! `X-Content-Type-Options: nosniff`.
//!
//! Phase: its own listener, never on the proxy path. `/readyz` answers 200 while the gateway
//! can serve: a config is loaded (always, once this listener runs), its listeners are up
//! (Pingora binds the proxy's with this one; `tollgate` refuses to start when either address
//! is taken) and it is not draining; also while the store is unreachable, unless
//! `server.ready_requires_store`. Its body reports the store and the quota source either way.

mod api;
pub mod auth;
pub mod page;
mod usage;
mod view;

use std::sync::Arc;

use async_trait::async_trait;
use http::Response;
use pingora_core::apps::http_app::ServeHttp;
use pingora_core::protocols::http::ServerSession;
use serde_json::json;

use crate::config::reload::ConfigHandle;
use crate::observe::{top, Observer};
use crate::store::Store;
use auth::Access;

pub struct Admin {
    pub config: Arc<ConfigHandle>,
    pub store: Arc<Store>,
    pub shedder: &'static crate::shed::Shedder,
    pub conns: Arc<crate::conn::Connections>,
    pub lifecycle: Arc<crate::lifecycle::Lifecycle>,
    pub observer: Arc<Observer>,
    /// The quota store, when the config has a `quotas` section.
    pub quotas: Option<Arc<crate::quota::Quotas>>,
    /// The live page's login sessions.
    pub sessions: auth::Sessions,
}

/// Rows `/top` shows unless `?n=` asks for another number (at most [`TOP_MAX`]).
pub const TOP_DEFAULT: usize = 20;
pub const TOP_MAX: usize = 200;

/// The endpoints, for the 404 answer.
const ENDPOINTS: [&str; 7] = [
    "GET /healthz",
    "GET /readyz",
    "GET /metrics",
    "GET /stats",
    "GET /top",
    "GET /",
    "POST /login",
];

/// The largest login form read.
const MAX_LOGIN_BODY: usize = 4096;

/// What every admin answer may load and who may frame it: the live page's own inline script
/// and style, and requests to this listener; no frame, no plugin, no other origin.
const CSP: &str = "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; img-src 'self' data:; connect-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'";

pub(crate) fn json_response(status: u16, body: serde_json::Value) -> Response<Vec<u8>> {
    let body = serde_json::to_vec(&body).expect("json");
    response(status, "application/json", body)
}

pub(crate) fn response(status: u16, content_type: &str, body: Vec<u8>) -> Response<Vec<u8>> {
    Response::builder()
        .status(status)
        .header("content-type", content_type)
        .header("content-length", body.len())
        .header("cache-control", "no-store")
        .header("content-security-policy", CSP)
        .header("x-frame-options", "DENY")
        .header("x-content-type-options", "nosniff")
        .body(body)
        .expect("valid response")
}

impl Admin {
    /// `GET /stats`: requests in flight, shedding decisions per priority class, concurrency
    /// slots held by this process, the store, and decision and response totals.
    fn stats(&self) -> serde_json::Value {
        let cfg = self.config.snapshot();
        let mut body = self.shedder.stats().to_json();
        body["shedding"] = match &cfg.shedding {
            None => serde_json::Value::Null,
            Some(s) => {
                let mut classes = serde_json::Map::new();
                for p in crate::config::Priority::ALL {
                    if let Some(cap) = s.cap(p) {
                        classes.insert(
                            p.as_str().into(),
                            json!({ "threshold": s.thresholds[p as usize], "shed_at_in_flight": cap }),
                        );
                    }
                }
                json!({ "max_in_flight": s.max_in_flight, "thresholds": classes })
            }
        };
        let slots = self.store.slot_stats();
        body["concurrency"] = json!({
            "requests_holding_slots": slots.requests_holding(),
            "redis_releases_pending": slots.releases_pending(),
            "memory_slots": self.store.local().slots.held(),
        });
        body["connections"] = self.conns.stats_json();
        body["store"] = self.store.status();
        body["totals"] = self.observer.totals();
        body["config_generation"] = self.generation().into();
        body
    }

    fn generation(&self) -> u64 {
        self.config
            .generation
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// `GET /readyz`: 200 while this gateway can serve (its config is loaded, its listeners
    /// are up, it is not draining), 503 otherwise. The store's state does not decide unless
    /// `server.ready_requires_store`: every limit has an `on_error` policy that answers while
    /// the store is down, and a store outage must not take every gateway out of the
    /// balancer's rotation at once. The body says how the store and the quota source are.
    async fn readyz(&self) -> Response<Vec<u8>> {
        let cfg = self.config.snapshot();
        let draining = self.lifecycle.stopping();
        let requires_store = cfg.startup.server.ready_requires_store;
        // While draining, the store is not asked: the answer is 503 whatever it says.
        let store_ok = if draining {
            None
        } else {
            Some(self.store.ready().await)
        };
        let reason = match (draining, store_ok) {
            (true, _) => Some("draining"),
            (false, Some(false)) if requires_store => {
                Some("the store is unreachable (server.ready_requires_store)")
            }
            _ => None,
        };
        let store = match store_ok {
            None => "not checked: draining",
            Some(true) => "ok",
            Some(false) => "unreachable",
        };
        json_response(
            if reason.is_none() { 200 } else { 503 },
            json!({
                "status": if reason.is_none() { "ready" } else { "not ready" },
                "reason": reason,
                "draining": draining,
                "ready_requires_store": requires_store,
                "config": cfg.source,
                "config_generation": self.generation(),
                "store": store,
                "store_status": self.store.status(),
                // Never a reason to be unready: gateways serve with the overrides they have.
                "quotas": self.quotas.as_ref().map(|q| q.status_json()),
            }),
        )
    }

    /// `GET /top?n=N`: the callers limits denied most in the last minutes.
    fn top(&self, query: Option<&str>) -> serde_json::Value {
        let n = query
            .into_iter()
            .flat_map(|q| q.split('&'))
            .find_map(|kv| kv.strip_prefix("n="))
            .and_then(|n| n.parse().ok())
            .unwrap_or(TOP_DEFAULT)
            .min(TOP_MAX);
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        json!({
            "window_seconds": top::MINUTES * 60,
            "callers": self.observer.top.top(n, now),
        })
    }
}

/// The answer to a request that needs the admin token and lacks it.
fn refused(access: Access, html: bool) -> Response<Vec<u8>> {
    let status = if access == Access::Missing { 401 } else { 403 };
    if html {
        return page::login(status);
    }
    let mut r = json_response(
        status,
        json!({ "error": if status == 401 {
            "this endpoint needs the admin token: Authorization: Bearer <token> (admin.token_env)"
        } else {
            "wrong admin token"
        }}),
    );
    r.headers_mut().insert(
        "www-authenticate",
        http::HeaderValue::from_static("Bearer realm=\"tollgate admin\""),
    );
    r
}

#[async_trait]
impl ServeHttp for Admin {
    async fn response(&self, session: &mut ServerSession) -> Response<Vec<u8>> {
        let req = session.req_header();
        let method = req.method.clone();
        let path = req.uri.path().to_string();
        let query = req.uri.query().map(str::to_string);
        let get = method == http::Method::GET;
        match (get, path.as_str()) {
            (true, "/healthz") => return json_response(200, json!({ "status": "ok" })),
            (true, "/readyz") => return self.readyz().await,
            (true, "/metrics") => {
                let body = self.observer.render_metrics();
                return response(200, "text/plain; version=0.0.4; charset=utf-8", body);
            }
            _ => {}
        }
        let cfg = self.config.snapshot();
        if let Some(host) = req.headers.get(http::header::HOST) {
            if !host_allowed(&cfg.admin.allowed_hosts, host) {
                return misdirected(host);
            }
        }
        match (get, path.as_str()) {
            (true, "/stats" | "/top" | "/") => {}
            _ if path.starts_with("/admin/v1/") => {}
            _ if method == http::Method::POST && path == "/login" => {
                return self.login(session, &cfg).await
            }
            _ => {
                return json_response(
                    404,
                    json!({ "error": format!("no admin endpoint {method} {path}"), "endpoints": ENDPOINTS }),
                )
            }
        }
        let api = path.starts_with("/admin/v1/");
        if cfg.admin.token_hash.is_none() && (api || !self.on_loopback(&cfg)) {
            return no_token(api);
        }
        let access = auth::check(&cfg.admin, &self.sessions, &method, &req.headers);
        if access != Access::Granted {
            return refused(access, path == "/");
        }
        if api {
            return self.api(session, &method, &path, query.as_deref()).await;
        }
        match path.as_str() {
            "/stats" => json_response(200, self.stats()),
            "/top" => json_response(200, self.top(query.as_deref())),
            _ => page::live(),
        }
    }
}

/// Whether the admin listener answers to `host` (a `Host` header, perhaps with a port): an IP
/// literal, `localhost`, or a name in `admin.allowed_hosts`. Anything else is what a browser
/// sends after a DNS rebinding (an attacker's name, resolved to this listener).
fn host_allowed(allowed: &[String], host: &http::HeaderValue) -> bool {
    let Ok(authority) = host.to_str().unwrap_or("").parse::<http::uri::Authority>() else {
        return false;
    };
    let h = authority.host();
    let bare = h
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(h);
    if bare.parse::<std::net::IpAddr>().is_ok() {
        return true;
    }
    let name = h.strip_suffix('.').unwrap_or(h).to_ascii_lowercase();
    name == "localhost" || allowed.contains(&name)
}

/// 421: the `Host` is not one the admin listener answers to.
fn misdirected(host: &http::HeaderValue) -> Response<Vec<u8>> {
    let shown: String = String::from_utf8_lossy(host.as_bytes())
        .chars()
        .take(100)
        .collect();
    api::problem(
        421,
        format!("the admin listener does not answer to the host {shown:?}: use an IP address or localhost, or add the name to admin.allowed_hosts"),
        None,
    )
}

impl Admin {
    /// `POST /login`: the login form's `token`; a session cookie and back to `/` when it is
    /// the admin token, the form again (403) when it is not.
    async fn login(
        &self,
        session: &mut ServerSession,
        cfg: &crate::config::Config,
    ) -> Response<Vec<u8>> {
        if cfg.admin.token_hash.is_none() {
            return no_token(false);
        }
        let body = match api::read_body(session, MAX_LOGIN_BODY).await {
            Ok(b) => b,
            Err(r) => return r,
        };
        let token = form_urlencoded::parse(&body)
            .find(|(k, _)| k == "token")
            .map(|(_, v)| v.into_owned())
            .unwrap_or_default();
        if !auth::is_token(&cfg.admin, &token) {
            return page::login(403);
        }
        match self.sessions.open(std::time::Instant::now()) {
            Some(id) => page::signed_in(&auth::session_cookie(&id)),
            None => api::problem(503, "no randomness for a session id right now", None),
        }
    }
}

impl Admin {
    /// Whether the admin listener is on a loopback address.
    fn on_loopback(&self, cfg: &crate::config::Config) -> bool {
        cfg.startup.server.admin_listen.ip().is_loopback()
    }
}

/// The answer when no admin token is configured: the admin API always needs one, and the
/// other protected pages need one off loopback.
fn no_token(api: bool) -> Response<Vec<u8>> {
    let detail = if api {
        "the admin API needs an admin token: set admin.token_env to the name of an environment variable holding it, and send Authorization: Bearer <token>"
    } else {
        "the admin listener is not on loopback and no admin token is configured: set admin.token_env (or bind server.admin_listen to 127.0.0.1)"
    };
    api::problem(403, detail, None)
}
