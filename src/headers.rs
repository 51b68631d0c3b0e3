//! Decision → response headers and the edge's error responses.
//!
//! Phase: the end of `request_filter` (gateway answers) and `response_filter` (proxied
//! answers). This is the only place where typed outcomes become HTTP.
//!
//! Headers follow draft-ietf-httpapi-ratelimit-headers (structured fields):
//! `RateLimit-Policy: "free-minute";q=100;w=60` and `RateLimit: "free-minute";r=47;t=42`, plus
//! `X-RateLimit-Limit`, `X-RateLimit-Remaining` and `X-RateLimit-Reset` (Unix seconds) for
//! the most restrictive limit. `t` is the seconds until the quota is restored, or on a denial
//! until a retry can succeed; `Retry-After` is never earlier than `t` and at least 1.

use bytes::Bytes;
use pingora_http::ResponseHeader;
use serde_json::json;

use crate::config::{Config, Limit, LimitId};
use crate::limit::Decision;

/// Problem type of a rate-limited request (draft-ietf-httpapi-ratelimit-headers §problem types).
pub const QUOTA_EXCEEDED: &str = "https://iana.org/assignments/http-problem-types#quota-exceeded";
/// Problem type of a request refused because capacity is temporarily reduced.
pub const REDUCED_CAPACITY: &str =
    "https://iana.org/assignments/http-problem-types#temporary-reduced-capacity";

/// Set on responses decided under a store failure policy: `store-unavailable; policy=local`.
pub const DEGRADED: &str = "tollgate-degraded";

/// Seconds for `t` and `Retry-After`.
pub fn seconds(d: &Decision) -> u64 {
    let ms = if d.allowed {
        d.reset_after_ms
    } else {
        d.retry_after_ms
    };
    let s = ms.div_ceil(1000);
    if d.allowed {
        s
    } else {
        s.max(1)
    }
}

/// Add the rate-limit headers of `limit`'s decision to a response.
pub fn apply(cfg: &Config, id: LimitId, d: &Decision, now_ms: u64, resp: &mut ResponseHeader) {
    let limit = cfg.limit(id);
    let t = seconds(d);
    if cfg.headers.ietf {
        let _ = resp.insert_header("ratelimit-policy", limit.policy_header.clone());
        let _ = resp.insert_header(
            "ratelimit",
            format!("\"{}\";r={};t={}", limit.name, d.remaining, t),
        );
    }
    if cfg.headers.legacy {
        let _ = resp.insert_header("x-ratelimit-limit", d.limit);
        let _ = resp.insert_header("x-ratelimit-remaining", d.remaining);
        let ms = if d.allowed {
            d.reset_after_ms
        } else {
            d.retry_after_ms
        };
        let _ = resp.insert_header("x-ratelimit-reset", (now_ms + ms).div_ceil(1000));
    }
    if !d.allowed {
        let _ = resp.insert_header("retry-after", t);
    }
}

/// A problem-details response (RFC 9457): header and body.
pub fn problem(status: u16, body: serde_json::Value) -> (ResponseHeader, Bytes) {
    let body = Bytes::from(serde_json::to_vec(&body).expect("json"));
    let mut h = ResponseHeader::build(status, Some(6)).expect("valid status");
    let _ = h.insert_header("content-type", "application/problem+json");
    let _ = h.insert_header("content-length", body.len());
    let _ = h.insert_header("cache-control", "no-store");
    (h, body)
}

/// The 429 for a denial by `limit`.
pub fn rate_limited(
    cfg: &Config,
    id: LimitId,
    d: &Decision,
    now_ms: u64,
) -> (ResponseHeader, Bytes) {
    let limit: &Limit = cfg.limit(id);
    let retry = seconds(d);
    let (mut h, body) = problem(
        429,
        json!({
            "type": QUOTA_EXCEEDED,
            "title": "Too Many Requests",
            "status": 429,
            "detail": format!(
                "Rate limit \"{}\" of {} per {} exceeded; retry in {} s.",
                limit.name, limit.quota.limit, limit.window_label, retry
            ),
            "policy": &*limit.name,
            "limit": limit.quota.limit,
            "window": limit.window_label,
            "window_seconds": limit.quota.window_ms.div_ceil(1000),
            "remaining": d.remaining,
            "retry_after": retry,
        }),
    );
    apply(cfg, id, d, now_ms, &mut h);
    (h, body)
}

/// A plain problem with a status, title and detail.
pub fn simple(status: u16, title: &str, detail: &str) -> (ResponseHeader, Bytes) {
    problem(
        status,
        json!({ "type": "about:blank", "title": title, "status": status, "detail": detail }),
    )
}

/// The 503 of a limit that fails closed while its store is down. `what` says which kind of
/// limit: "rate limit", "concurrency limit".
pub fn store_unavailable(what: &str, name: &str, retry_after_s: u64) -> (ResponseHeader, Bytes) {
    let (mut h, body) = problem(
        503,
        json!({
            "type": REDUCED_CAPACITY,
            "title": "Service Unavailable",
            "status": 503,
            "detail": format!(
                "The {what} \"{name}\" cannot be checked right now and does not fail open; retry in {retry_after_s} s."
            ),
            "policy": name,
            "retry_after": retry_after_s,
        }),
    );
    let _ = h.insert_header("retry-after", retry_after_s);
    (h, body)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seconds_round_up_and_retry_is_at_least_one() {
        assert_eq!(seconds(&Decision::allow(10, 3, 41_001)), 42);
        assert_eq!(seconds(&Decision::allow(10, 3, 0)), 0);
        assert_eq!(seconds(&Decision::deny(10, 0, 5_000, 1)), 1);
        assert_eq!(seconds(&Decision::deny(10, 0, 5_000, 2_500)), 3);
    }
}
