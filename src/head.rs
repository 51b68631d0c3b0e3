//! What the gateway checks of a request head before anything else: a `Host` on HTTP/1.1, the
//! sizes of the target and the head, and the path's normal form. Routing, the limits and the
//! upstream all see the normal form, so a `//login` or `/%6Cogin` cannot walk around a limit
//! of `/login`: the target is rewritten to it (and an absolute-form target to origin-form)
//! before routing.
//!
//! Phase: `request_filter`, step 0. Reads the request head; the rewrite is applied by the
//! proxy. An already-normal origin-form target (the common case) allocates nothing.

use std::borrow::Cow;

use http::header::HOST;
use http::{HeaderValue, Uri, Version};
use pingora_http::authority::raw_target_authority;
use pingora_http::RequestHeader;

use crate::config::{EscapedSlashes, HttpSettings, PathNormalization};
use crate::path::{self, PathError};
use crate::pingora_patches;
use crate::refusal::Refusal;

/// What to change in the head before routing.
#[derive(Debug, Default)]
pub struct Rewrite {
    /// The normal form of the target, origin-form, when it differs from what was sent.
    pub uri: Option<Uri>,
    /// A `Host` for an HTTP/1.0 absolute-form target sent without one.
    pub host: Option<HeaderValue>,
}

/// Check the head of `req`, whose request line and headers took `head_bytes` bytes.
pub fn check(
    http: &HttpSettings,
    req: &RequestHeader,
    head_bytes: usize,
) -> Result<Rewrite, Refusal> {
    if req.version == Version::HTTP_11 && !req.headers.contains_key(HOST) {
        return Err(Refusal::BadHead("An HTTP/1.1 request needs a Host header."));
    }
    if req.raw_path().len() > http.max_uri_bytes {
        return Err(Refusal::UriTooLong);
    }
    if head_bytes > http.max_request_header_bytes {
        return Err(Refusal::HeaderTooLarge);
    }
    if !req.raw_path_is_utf8() {
        return Err(Refusal::BadHead("The request target is not UTF-8."));
    }
    let target = req.uri.path_and_query().map_or("/", |pq| pq.as_str());
    let normal = path::normalize(target).map_err(|e| {
        Refusal::BadHead(match e {
            PathError::NotAbsolute => "The request path must start with '/'.",
            PathError::BadEscape { .. } => "The request path has an invalid percent-escape.",
        })
    })?;
    if http.escaped_slashes == EscapedSlashes::Reject && normal.has_escaped_slash() {
        return Err(Refusal::BadHead(
            "The request path holds an escaped slash (%2F or %5C), which this gateway refuses.",
        ));
    }
    if http.path_normalization == PathNormalization::Reject && !normal.was_normal() {
        return Err(Refusal::BadHead(
            "The request path is not in normal form (repeated '/', dot-segments, or needless percent-escapes).",
        ));
    }
    rewrite(req, normal.into_cow())
}

/// The rewrite that puts `normal` on the wire, if the target sent differs from it.
fn rewrite(req: &RequestHeader, normal: Cow<'_, str>) -> Result<Rewrite, Refusal> {
    if normal.as_bytes() == req.raw_path() {
        return Ok(Rewrite::default());
    }
    let uri = Uri::try_from(normal.as_ref())
        .map_err(|_| Refusal::BadHead("The request target cannot be put in normal form."))?;
    let host = match raw_target_authority(req.raw_path()).authority() {
        Some(a) if !req.headers.contains_key(HOST) => HeaderValue::from_bytes(a).ok(),
        _ => None,
    };
    Ok(Rewrite {
        uri: Some(uri),
        host,
    })
}

/// The raw size of the request line and headers, as received.
pub fn head_bytes(session: &pingora_proxy::Session) -> usize {
    session
        .as_downstream()
        .as_http1()
        .map_or(0, pingora_patches::headers_raw_len)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings() -> HttpSettings {
        crate::config::from_yaml(
            "t.yaml",
            "upstreams: { b: [\"127.0.0.1:9\"] }\nroutes: [ { name: r, match: { path_prefix: / }, upstream: b } ]\n",
            &Default::default(),
        )
        .unwrap()
        .http
    }

    fn req(target: &str, host: Option<&str>) -> RequestHeader {
        let mut r = RequestHeader::build("GET", target.as_bytes(), None).unwrap();
        if let Some(h) = host {
            r.insert_header("host", h).unwrap();
        }
        r
    }

    #[test]
    fn a_normal_target_needs_no_rewrite() {
        let r = check(&settings(), &req("/login?a=1", Some("x")), 40).unwrap();
        assert!(r.uri.is_none() && r.host.is_none());
    }

    #[test]
    fn variants_are_rewritten_to_the_normal_form() {
        for t in ["//login", "/./login", "/x/../login", "/%6Cogin", "/%6cogin"] {
            let r = check(&settings(), &req(t, Some("x")), 40).unwrap();
            assert_eq!(r.uri.unwrap().path(), "/login", "{t}");
        }
    }

    #[test]
    fn refusals() {
        let s = settings();
        assert_eq!(
            check(&s, &req("/", None), 10).unwrap_err().status(),
            400,
            "HTTP/1.1 without Host"
        );
        assert_eq!(
            check(&s, &req(&format!("/{}", "a".repeat(9000)), Some("x")), 10)
                .unwrap_err()
                .status(),
            414
        );
        assert_eq!(
            check(&s, &req("/", Some("x")), 70_000)
                .unwrap_err()
                .status(),
            431
        );
        assert_eq!(
            check(&s, &req("/%zz", Some("x")), 10).unwrap_err().status(),
            400
        );
    }
}
