//! Who may read the admin listener: with `admin.token_env` configured, the pages that show
//! callers and decisions (`/`, `/stats`, `/top`, and the quota API later) need the admin
//! token; `/healthz`, `/readyz` and `/metrics` stay open for load balancers and Prometheus.
//!
//! The token comes as `Authorization: Bearer <token>`, or, for `GET` only, in the session
//! cookie the live page's login form sets (so a browser is asked once per session, and a
//! cross-site form can never change anything with it). Tokens are compared as BLAKE3 hashes,
//! whose equality is constant-time.
//!
//! Phase: the admin listener.

use http::{HeaderMap, Method};

use crate::config::AdminSettings;

/// The cookie the live page's login form sets.
pub const COOKIE: &str = "tollgate_admin";

/// What a request presented.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// No token configured, or the right one presented.
    Granted,
    /// A token is configured and none was presented: 401.
    Missing,
    /// The wrong token: 403.
    Wrong,
}

/// Check `headers` of a `method` request against the configured token.
pub fn check(settings: &AdminSettings, method: &Method, headers: &HeaderMap) -> Access {
    let Some(want) = &settings.token_hash else {
        return Access::Granted;
    };
    let bearer = headers
        .get(http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(|t| t.trim().to_string());
    let cookie = (method == Method::GET || method == Method::HEAD)
        .then(|| cookie(headers))
        .flatten();
    match bearer.or(cookie) {
        None => Access::Missing,
        Some(t) if blake3::hash(t.as_bytes()) == *want => Access::Granted,
        Some(_) => Access::Wrong,
    }
}

/// The token in the [`COOKIE`] cookie, percent-decoded.
fn cookie(headers: &HeaderMap) -> Option<String> {
    headers
        .get_all(http::header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .find_map(|kv| {
            let (k, v) = kv.trim().split_once('=')?;
            (k == COOKIE).then(|| percent_decode(v))
        })
        .flatten()
}

/// `%XX` escapes decoded (as JavaScript's `encodeURIComponent` writes them).
fn percent_decode(s: &str) -> Option<String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = std::str::from_utf8(b.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
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
    fn bearer_and_cookie_for_get_only() {
        let s = settings("s3cret; x");
        let get = Method::GET;
        assert_eq!(
            check(&AdminSettings::default(), &get, &headers(&[])),
            Access::Granted
        );
        assert_eq!(check(&s, &get, &headers(&[])), Access::Missing);
        assert_eq!(
            check(&s, &get, &headers(&[("authorization", "Bearer nope")])),
            Access::Wrong
        );
        assert_eq!(
            check(&s, &get, &headers(&[("authorization", "Bearer s3cret; x")])),
            Access::Granted
        );
        let c = headers(&[("cookie", "a=b; tollgate_admin=s3cret%3B%20x")]);
        assert_eq!(check(&s, &get, &c), Access::Granted);
        assert_eq!(check(&s, &Method::POST, &c), Access::Missing);
    }
}
