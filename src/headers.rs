//! A decision as rate-limit response headers, on proxied answers and on 429s alike.
//!
//! Phase: `response_filter` (proxied answers) and the edge's refusals ([`crate::refusal`]).
//!
//! Headers follow draft-ietf-httpapi-ratelimit-headers (structured fields):
//! `RateLimit-Policy: "free-minute";q=100;w=60` and `RateLimit: "free-minute";r=47;t=42`, plus
//! `X-RateLimit-Limit`, `X-RateLimit-Remaining` and `X-RateLimit-Reset` (Unix seconds) for
//! the most restrictive limit. `t` is the seconds until the quota is restored, or on a denial
//! until a retry can succeed; `Retry-After` is never earlier than `t` and at least 1.

use pingora_http::ResponseHeader;

use crate::config::{Config, LimitId, OnError, RateSpec};
use crate::limit::Decision;

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

/// Add the rate-limit headers of rate limit `id`'s decision `d`, made at `now_ms`, to a
/// response. `spec`: the caller's own parameters of the limit (a quota override), if any.
pub fn apply(
    cfg: &Config,
    id: LimitId,
    spec: Option<&RateSpec>,
    d: &Decision,
    now_ms: u64,
    resp: &mut ResponseHeader,
) {
    let limit = cfg.limit(id);
    let t = seconds(d);
    if cfg.headers.ietf {
        let policy = spec.unwrap_or_else(|| limit.rate()).policy_header.clone();
        let _ = resp.insert_header("ratelimit-policy", policy);
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

/// Say that the answer was decided under failure policy `policy` while the store could not
/// answer.
pub fn degraded(resp: &mut ResponseHeader, policy: OnError) {
    let _ = resp.insert_header(DEGRADED, policy.degraded_header());
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
