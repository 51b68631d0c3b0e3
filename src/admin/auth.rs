//! Who may read the admin listener: with `admin.token_env` configured, the pages that show
//! callers and decisions (`/`, `/stats`, `/top`, and the admin API) need the admin token;
//! `/healthz`, `/readyz` and `/metrics` stay open for load balancers and Prometheus.
//!
//! The token comes as `Authorization: Bearer <token>` (the scheme in any case, RFC 9110
//! §11.1). A browser signs in once: the live page's login form posts the token to
//! `POST /login`, which answers with a random session id in an `HttpOnly; SameSite=Strict`
//! cookie ([`COOKIE`]) that expires after [`SESSION_LIFETIME`]. The cookie is honoured for `GET`
//! and `HEAD` only (so a cross-site form can never change anything with it), is never the
//! token itself, and the proxy never forwards it upstream ([`without_session`]): cookies are
//! not port-scoped, so a browser sends it to the proxy port of the same host too. Sessions live
//! in memory (a restart signs everyone out), at most [`MAX_SESSIONS`] at once.
//!
//! Tokens and session ids are compared as BLAKE3 hashes, whose equality is constant-time.
//!
//! Phase: the admin listener; [`without_session`] also on the proxy path, for requests that
//! carry a cookie naming [`COOKIE`].

use std::collections::HashMap;
use std::time::{Duration, Instant};

use http::{HeaderMap, Method};

use crate::config::AdminSettings;

/// The session cookie `POST /login` sets.
pub const COOKIE: &str = "tollgate_admin";
/// How long a session lasts after its login.
pub const SESSION_LIFETIME: Duration = Duration::from_secs(12 * 3600);
/// Sessions held at once; a login beyond them ends the oldest.
pub const MAX_SESSIONS: usize = 64;

/// What a request presented.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// No token configured, or the right one (or a live session) presented.
    Granted,
    /// A token is configured and neither it nor a live session was presented: 401.
    Missing,
    /// The wrong token: 403.
    Wrong,
}

/// The live sessions: the BLAKE3 hash of each id, and when it expires.
#[derive(Debug, Default)]
pub struct Sessions {
    live: parking_lot::Mutex<HashMap<blake3::Hash, Instant>>,
}

impl Sessions {
    /// A new session: its id (64 hex digits of 32 random bytes), valid for
    /// [`SESSION_LIFETIME`] from `now`. `None` if the system has no randomness to give.
    pub fn open(&self, now: Instant) -> Option<String> {
        let mut bytes = [0u8; 32];
        getrandom::getrandom(&mut bytes).ok()?;
        let id: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
        let mut live = self.live.lock();
        live.retain(|_, expires| *expires > now);
        while live.len() >= MAX_SESSIONS {
            let Some(oldest) = live.iter().min_by_key(|(_, e)| **e).map(|(h, _)| *h) else {
                break;
            };
            live.remove(&oldest);
        }
        live.insert(blake3::hash(id.as_bytes()), now + SESSION_LIFETIME);
        Some(id)
    }

    /// Whether `id` names a session that has not expired at `now`.
    pub fn valid(&self, id: &str, now: Instant) -> bool {
        let hash = blake3::hash(id.as_bytes());
        let mut live = self.live.lock();
        match live.get(&hash) {
            Some(expires) if *expires > now => true,
            Some(_) => {
                live.remove(&hash);
                false
            }
            None => false,
        }
    }

    /// How many sessions are held (expired ones included until the next login).
    pub fn len(&self) -> usize {
        self.live.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The `Set-Cookie` value of a new session.
pub fn session_cookie(id: &str) -> String {
    format!(
        "{COOKIE}={id}; HttpOnly; SameSite=Strict; Path=/; Max-Age={}",
        SESSION_LIFETIME.as_secs()
    )
}

/// Whether `token` is the configured admin token.
pub fn is_token(settings: &AdminSettings, token: &str) -> bool {
    settings
        .token_hash
        .is_some_and(|want| blake3::hash(token.as_bytes()) == want)
}

/// Check `headers` of a `method` request against the configured token and the sessions.
pub fn check(
    settings: &AdminSettings,
    sessions: &Sessions,
    method: &Method,
    headers: &HeaderMap,
) -> Access {
    if settings.token_hash.is_none() {
        return Access::Granted;
    }
    if let Some(token) = bearer(headers) {
        return if is_token(settings, token) {
            Access::Granted
        } else {
            Access::Wrong
        };
    }
    if method != Method::GET && method != Method::HEAD {
        return Access::Missing;
    }
    let now = Instant::now();
    if session_ids(headers).any(|id| sessions.valid(id, now)) {
        Access::Granted
    } else {
        Access::Missing
    }
}

/// The token of `Authorization: Bearer <token>`, the scheme in any case.
fn bearer(headers: &HeaderMap) -> Option<&str> {
    let v = headers.get(http::header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = v.trim().split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| token.trim())
        .filter(|t| !t.is_empty())
}

/// The values of every [`COOKIE`] cookie the request sent.
fn session_ids(headers: &HeaderMap) -> impl Iterator<Item = &str> {
    headers
        .get_all(http::header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|kv| {
            let (k, v) = kv.trim().split_once('=')?;
            (k.trim() == COOKIE).then(|| v.trim())
        })
}

/// Whether a `Cookie` header value may hold a [`COOKIE`] cookie (a quick test before
/// [`without_session`]).
pub fn names_session(cookie: &[u8]) -> bool {
    cookie.windows(COOKIE.len()).any(|w| w == COOKIE.as_bytes())
}

/// A `Cookie` header value without its [`COOKIE`] cookies, the others kept in order; `None`
/// when none is left.
pub fn without_session(cookie: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(cookie.len());
    for pair in cookie.split(|b| *b == b';') {
        let pair = pair.trim_ascii();
        let name = pair
            .split(|b| *b == b'=')
            .next()
            .unwrap_or(b"")
            .trim_ascii();
        if pair.is_empty() || name == COOKIE.as_bytes() {
            continue;
        }
        if !out.is_empty() {
            out.extend_from_slice(b"; ");
        }
        out.extend_from_slice(pair);
    }
    (!out.is_empty()).then_some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(token: &str) -> AdminSettings {
        AdminSettings {
            token_hash: Some(blake3::hash(token.as_bytes())),
            token_env: Some("T".into()),
            ..AdminSettings::default()
        }
    }

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(
                http::header::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                v.parse().unwrap(),
            );
        }
        h
    }

    #[test]
    fn bearer_in_any_case_and_sessions_for_get_only() {
        let s = settings("s3cret; x");
        let sessions = Sessions::default();
        let get = Method::GET;
        let none = Sessions::default();
        assert_eq!(
            check(&AdminSettings::default(), &none, &get, &headers(&[])),
            Access::Granted
        );
        assert_eq!(check(&s, &sessions, &get, &headers(&[])), Access::Missing);
        assert_eq!(
            check(
                &s,
                &sessions,
                &get,
                &headers(&[("authorization", "Bearer nope")])
            ),
            Access::Wrong
        );
        for scheme in ["Bearer", "bearer", "BEARER", "bEaReR"] {
            let h = headers(&[("authorization", &format!("{scheme} s3cret; x"))]);
            assert_eq!(check(&s, &sessions, &get, &h), Access::Granted, "{scheme}");
            assert_eq!(check(&s, &sessions, &Method::PUT, &h), Access::Granted);
        }
        // The token itself in the cookie opens nothing: only a session id does.
        let raw = headers(&[("cookie", "a=b; tollgate_admin=s3cret%3B%20x")]);
        assert_eq!(check(&s, &sessions, &get, &raw), Access::Missing);
        let id = sessions.open(Instant::now()).unwrap();
        assert_eq!(id.len(), 64);
        let c = headers(&[("cookie", &format!("a=b; tollgate_admin={id}"))]);
        assert_eq!(check(&s, &sessions, &get, &c), Access::Granted);
        assert_eq!(check(&s, &sessions, &Method::HEAD, &c), Access::Granted);
        assert_eq!(check(&s, &sessions, &Method::POST, &c), Access::Missing);
        assert_ne!(sessions.open(Instant::now()).unwrap(), id);
    }

    #[test]
    fn sessions_expire_and_are_bounded() {
        let sessions = Sessions::default();
        let t0 = Instant::now();
        let first = sessions.open(t0).unwrap();
        assert!(sessions.valid(&first, t0 + SESSION_LIFETIME - Duration::from_secs(1)));
        assert!(!sessions.valid(&first, t0 + SESSION_LIFETIME));
        assert!(!sessions.valid("0123", t0));
        let ids: Vec<String> = (0..MAX_SESSIONS + 5)
            .map(|i| sessions.open(t0 + Duration::from_secs(i as u64)).unwrap())
            .collect();
        assert_eq!(sessions.len(), MAX_SESSIONS);
        let now = t0 + Duration::from_secs(100);
        // The oldest five made room for the newest.
        assert!(ids[..5].iter().all(|id| !sessions.valid(id, now)));
        assert!(ids[5..].iter().all(|id| sessions.valid(id, now)));
        assert_eq!(
            session_cookie("ab"),
            "tollgate_admin=ab; HttpOnly; SameSite=Strict; Path=/; Max-Age=43200"
        );
    }

    #[test]
    fn the_session_cookie_is_cut_from_a_cookie_header_and_the_others_kept() {
        let cut = |v: &str| without_session(v.as_bytes()).map(|v| String::from_utf8(v).unwrap());
        assert!(names_session(b"a=1; tollgate_admin=x"));
        assert!(!names_session(b"a=1; b=2"));
        assert_eq!(cut("a=1; tollgate_admin=x; b=2"), Some("a=1; b=2".into()));
        assert_eq!(cut("tollgate_admin=x"), None);
        assert_eq!(cut(" tollgate_admin = x ;a=1"), Some("a=1".into()));
        // Only the exact name: a cookie whose name merely contains it stays.
        assert_eq!(
            cut("my_tollgate_admin=1; tollgate_admin_x=2"),
            Some("my_tollgate_admin=1; tollgate_admin_x=2".into())
        );
    }
}
