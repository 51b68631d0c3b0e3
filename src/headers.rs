//! A decision as rate-limit response headers, on proxied answers and on 429s alike.
//!
//! Phase: `response_filter` (proxied answers) and the edge's refusals ([`crate::refusal`]).
//!
//! Headers follow draft-ietf-httpapi-ratelimit-headers (structured fields):
//! `RateLimit-Policy: "free-minute";q=100;w=60` and `RateLimit: "free-minute";r=47;t=42`, plus
//! `X-RateLimit-Limit`, `X-RateLimit-Remaining` and `X-RateLimit-Reset` (Unix seconds) for
//! the most restrictive limit. `t` is the seconds until the quota is restored, or on a denial
//! until a retry can succeed; `Retry-After` is never earlier than `t` and at least 1.

use std::ops::Range;

use bytes::Bytes;
use http::HeaderValue;
use pingora_http::{ResponseHeader, StaticHeaderName};

use crate::config::{Config, LimitId, OnError, RateSpec};
use crate::limit::Decision;

/// Set on responses decided under a store failure policy: `store-unavailable; policy=local`.
pub const DEGRADED: &str = "tollgate-degraded";

// Names parsed once, when the program is built: a name given as a string is parsed and copied
// on every insert.
const RATELIMIT_POLICY: StaticHeaderName = StaticHeaderName::from_static("ratelimit-policy");
const RATELIMIT: StaticHeaderName = StaticHeaderName::from_static("ratelimit");
const X_LIMIT: StaticHeaderName = StaticHeaderName::from_static("x-ratelimit-limit");
const X_REMAINING: StaticHeaderName = StaticHeaderName::from_static("x-ratelimit-remaining");
const X_RESET: StaticHeaderName = StaticHeaderName::from_static("x-ratelimit-reset");
const RETRY_AFTER: StaticHeaderName = StaticHeaderName::from_static("retry-after");
const DEGRADED_NAME: StaticHeaderName = StaticHeaderName::from_static(DEGRADED);

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

/// How many headers [`apply`] adds (and [`degraded`], when `degraded`), to reserve them at
/// once: an upstream's head is sized to the headers it came with, so each header added past
/// them would otherwise grow its maps.
pub fn count(cfg: &Config, d: &Decision, degraded: bool) -> usize {
    2 * usize::from(cfg.headers.ietf)
        + 3 * usize::from(cfg.headers.legacy)
        + usize::from(!d.allowed)
        + usize::from(degraded)
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
    let rate = spec.unwrap_or_else(|| limit.rate());
    let t = seconds(d);
    // The values that change with each decision are written into one buffer and handed out
    // as slices of it: one allocation, not one per header. `X-RateLimit-Remaining` and
    // `Retry-After` are the digits of `r` and `t` in the `RateLimit` item.
    let mut values = Values::new(limit.name.len() + 48);
    values.extend(b"\"");
    values.extend(limit.name.as_bytes());
    values.extend(b"\";r=");
    let x_remaining = values.number(d.remaining);
    values.extend(b";t=");
    let retry_after = values.number(t);
    let ratelimit = 0..values.0.len();
    let ms = if d.allowed {
        d.reset_after_ms
    } else {
        d.retry_after_ms
    };
    let x_reset = values.number((now_ms + ms).div_ceil(1000));
    let values = values.done();

    if cfg.headers.ietf {
        let _ = resp.insert_header(&RATELIMIT_POLICY, rate.policy_header.clone());
        insert(resp, &RATELIMIT, &values, ratelimit);
    }
    if cfg.headers.legacy {
        // The limit's own, built with the config, unless the decision was made on another
        // quota (the local fallback's).
        let x_limit = if d.limit == rate.quota.limit {
            rate.limit_header.clone()
        } else {
            HeaderValue::from(d.limit)
        };
        let _ = resp.insert_header(&X_LIMIT, x_limit);
        insert(resp, &X_REMAINING, &values, x_remaining);
        insert(resp, &X_RESET, &values, x_reset);
    }
    if !d.allowed {
        insert(resp, &RETRY_AFTER, &values, retry_after);
    }
}

/// Header values written one after another into one buffer.
struct Values(Vec<u8>);

fn push_u64(b: &mut Vec<u8>, n: u64) {
    b.extend_from_slice(itoa::Buffer::new().format(n).as_bytes());
}

impl Values {
    fn new(capacity: usize) -> Self {
        Values(Vec::with_capacity(capacity))
    }

    fn extend(&mut self, bytes: &[u8]) {
        self.0.extend_from_slice(bytes);
    }

    /// Append `n` in decimal; its range in the buffer.
    fn number(&mut self, n: u64) -> Range<usize> {
        let start = self.0.len();
        push_u64(&mut self.0, n);
        start..self.0.len()
    }

    fn done(self) -> Bytes {
        Bytes::from(self.0)
    }
}

fn insert(resp: &mut ResponseHeader, name: &StaticHeaderName, values: &Bytes, r: Range<usize>) {
    // Valid by construction (digits, and a limit name the config checked); a value that were
    // not would be left out, never sent malformed.
    if let Ok(v) = HeaderValue::from_maybe_shared(values.slice(r)) {
        let _ = resp.insert_header(name, v);
    }
}

/// Say that the answer was decided under failure policy `policy` while the store could not
/// answer.
pub fn degraded(resp: &mut ResponseHeader, policy: OnError) {
    let _ = resp.insert_header(&DEGRADED_NAME, policy.degraded_header());
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::config::{from_yaml, Overrides};

    /// One limit, `per-ip`: 100 a minute.
    fn per_ip_config() -> Config {
        let yaml = "upstreams: { backend: [\"127.0.0.1:9\"] }\n\
                    routes: [ { name: r, match: { path_prefix: / }, upstream: backend } ]\n\
                    limits: [ { name: per-ip, key: [client_ip], limit: 100, window: 1m } ]\n";
        from_yaml("t.yaml", yaml, &Overrides::default()).expect("valid")
    }

    fn wire(resp: &ResponseHeader) -> String {
        let mut out = vec![];
        resp.header_to_h1_wire(&mut out);
        String::from_utf8(out).expect("ascii")
    }

    #[test]
    fn every_header_of_an_answer_and_of_a_refusal_exactly() {
        let cfg = per_ip_config();
        let allow = Decision::allow(100, 47, 41_001);
        let deny = Decision::deny(100, 0, 60_000, 2_500);
        for (d, tail) in [
            (allow, "x-ratelimit-reset: 1042\r\n"),
            (deny, "x-ratelimit-reset: 1003\r\nretry-after: 3\r\n"),
        ] {
            // An upstream's head, sized to the two headers it came with.
            let mut resp = ResponseHeader::build(200, Some(2)).expect("status");
            resp.insert_header("Server", "up").expect("valid");
            resp.insert_header("Date", "now").expect("valid");
            resp.reserve(count(&cfg, &d, true));
            apply(&cfg, 0, None, &d, 1_000_500, &mut resp);
            degraded(&mut resp, OnError::Local);
            let r = if d.allowed { "r=47;t=42" } else { "r=0;t=3" };
            let remaining = d.remaining;
            assert_eq!(
                wire(&resp),
                format!(
                    "Server: up\r\nDate: now\r\n\
                     ratelimit-policy: \"per-ip\";q=100;w=60\r\n\
                     ratelimit: \"per-ip\";{r}\r\n\
                     x-ratelimit-limit: 100\r\nx-ratelimit-remaining: {remaining}\r\n{tail}\
                     tollgate-degraded: {}\r\n",
                    OnError::Local.degraded_header()
                )
            );
        }
    }

    #[test]
    fn the_limit_header_is_the_decisions_when_another_quota_decided() {
        let cfg = per_ip_config();
        // The limit's own quota (the header built with the config), and the local fallback's
        // share of it (written for this decision).
        for (limit, remaining) in [(100, 47), (25, 7)] {
            let mut resp = ResponseHeader::build(200, None).expect("status");
            let d = Decision::allow(limit, remaining, 1_000);
            apply(&cfg, 0, None, &d, 0, &mut resp);
            let header = |name: &str| resp.headers.get(name).expect(name).to_str().expect("ascii");
            assert_eq!(header("x-ratelimit-limit"), limit.to_string());
            assert_eq!(header("x-ratelimit-remaining"), remaining.to_string());
            assert_eq!(header("ratelimit"), format!("\"per-ip\";r={remaining};t=1"));
        }
    }

    #[test]
    fn seconds_round_up_and_retry_is_at_least_one() {
        assert_eq!(seconds(&Decision::allow(10, 3, 41_001)), 42);
        assert_eq!(seconds(&Decision::allow(10, 3, 0)), 0);
        assert_eq!(seconds(&Decision::deny(10, 0, 5_000, 1)), 1);
        assert_eq!(seconds(&Decision::deny(10, 0, 5_000, 2_500)), 3);
    }
}
