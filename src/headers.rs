//! A decision as rate-limit response headers, on proxied answers and on 429s alike.
//!
//! Phase: `response_filter` (proxied answers) and the edge's refusals ([`crate::refusal`]).
//!
//! Headers follow draft-ietf-httpapi-ratelimit-headers (structured fields):
//! `RateLimit-Policy: "free-minute";q=100;w=60` and `RateLimit: "free-minute";r=47;t=42`, plus
//! `X-RateLimit-Limit`, `X-RateLimit-Remaining` and `X-RateLimit-Reset` (Unix seconds) for
//! the most restrictive limit. `t` is the seconds until the quota is restored, or on a denial
//! until a retry can succeed; `Retry-After` is never earlier than `t` and at least 1.

use http::{HeaderName, HeaderValue};
use pingora_http::ResponseHeader;

use crate::config::{
    Config, LimitId, OnError, RateSpec, RATELIMIT_POLICY, X_RATELIMIT_LIMIT as X_LIMIT,
};
use crate::limit::Decision;
use crate::pingora_patches::with_lines;

/// Set on responses decided under a store failure policy: `store-unavailable; policy=local`.
pub const DEGRADED: &str = "tollgate-degraded";

const RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");
const X_REMAINING: HeaderName = HeaderName::from_static("x-ratelimit-remaining");
const X_RESET: HeaderName = HeaderName::from_static("x-ratelimit-reset");
const RETRY_AFTER: HeaderName = HeaderName::from_static("retry-after");
const DEGRADED_NAME: HeaderName = HeaderName::from_static(DEGRADED);
/// The `t` parameter of the `RateLimit` item, after its `r`.
const T_PARAM: HeaderValue = HeaderValue::from_static(";t=");

/// Seconds for `t` and `Retry-After`.
pub fn seconds(d: &Decision) -> u64 {
    let s = until_ms(d).div_ceil(1000);
    if d.allowed {
        s
    } else {
        s.max(1)
    }
}

/// The ms until `t`: until the quota is restored, or on a denial until a retry can succeed.
fn until_ms(d: &Decision) -> u64 {
    if d.allowed {
        d.reset_after_ms
    } else {
        d.retry_after_ms
    }
}

/// Add the rate-limit headers of rate limit `id`'s decision `d`, made at `now_ms`, to a
/// response. `spec`: the caller's own parameters of the limit (a quota override), if any.
///
/// They are written as encoded lines ([`crate::pingora_patches::EncodedHeaders`]): the
/// response goes out with them, after the upstream's headers, and nothing here looks them up
/// again, so they skip the header map and its hashing (on stock Pingora they go into the map).
/// Headers of the same names that the upstream sent are removed: the gateway's replace them.
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
    let (ietf, legacy) = (cfg.headers.ietf, cfg.headers.legacy);
    let ours = [
        (ietf, &RATELIMIT_POLICY),
        (ietf, &RATELIMIT),
        (legacy, &X_LIMIT),
        (legacy, &X_REMAINING),
        (legacy, &X_RESET),
        (!d.allowed, &RETRY_AFTER),
    ];
    replace(resp, &ours);
    with_lines(resp, |lines| {
        // The lines' names and fixed parts, and room for their numbers.
        lines.reserve(160 + 2 * rate.policy_line.as_bytes().len());
        if ietf {
            lines.extend(&rate.policy_line);
            lines
                .line(&RATELIMIT)
                .value(&rate.ratelimit_prefix)
                .number(d.remaining)
                .value(&T_PARAM)
                .number(t);
        }
        if legacy {
            // The limit's own, built with the config, unless the decision was made on another
            // quota (the local fallback's).
            if d.limit == rate.quota.limit {
                lines.extend(&rate.limit_line);
            } else {
                lines.push_number(&X_LIMIT, d.limit);
            }
            lines.push_number(&X_REMAINING, d.remaining);
            lines.push_number(&X_RESET, (now_ms + until_ms(d)).div_ceil(1000));
        }
        if !d.allowed {
            lines.push_number(&RETRY_AFTER, t);
        }
    });
}

/// Remove from the response's map the headers of `names` whose flag is set, when it has any:
/// an upstream's own give way to the gateway's, which go out as encoded lines. One pass over
/// the map's names finds none in the usual case, most at the first test: a name of a length
/// none of `names` has.
fn replace(resp: &mut ResponseHeader, names: &[(bool, &HeaderName)]) {
    let lengths = names
        .iter()
        .fold(0u64, |m, (_, n)| m | (1 << n.as_str().len().min(63)));
    let ours = |k: &HeaderName| {
        let k = k.as_str();
        lengths & (1 << k.len().min(63)) != 0 && names.iter().any(|(on, n)| *on && n.as_str() == k)
    };
    if resp.headers.keys().any(ours) {
        for (_, name) in names.iter().filter(|(on, _)| *on) {
            resp.remove_header(*name);
        }
    }
}

/// Say that the answer was decided under failure policy `policy` while the store could not
/// answer.
pub fn degraded(resp: &mut ResponseHeader, policy: OnError) {
    replace(resp, &[(true, &DEGRADED_NAME)]);
    with_lines(resp, |lines| {
        lines.push(
            &DEGRADED_NAME,
            &HeaderValue::from_static(policy.degraded_header()),
        )
    });
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
            // An upstream's head.
            let mut resp = ResponseHeader::build(200, Some(2)).expect("status");
            resp.insert_header("Server", "up").expect("valid");
            resp.insert_header("Date", "now").expect("valid");
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
            // As HTTP/2 would send them: the encoded lines joined to the map.
            let parts = resp.as_owned_parts();
            let header = |name: &str| parts.headers[name].to_str().expect("ascii");
            assert_eq!(header("x-ratelimit-limit"), limit.to_string());
            assert_eq!(header("x-ratelimit-remaining"), remaining.to_string());
            assert_eq!(header("ratelimit"), format!("\"per-ip\";r={remaining};t=1"));
        }
    }

    #[test]
    fn the_gateways_headers_replace_an_upstreams_of_the_same_names_and_no_others() {
        let cfg = per_ip_config();
        let d = Decision::allow(100, 47, 41_001);
        let mut resp = ResponseHeader::build(200, Some(4)).expect("status");
        resp.insert_header("X-RateLimit-Remaining", "5")
            .expect("valid");
        resp.append_header("RateLimit", "\"up\";r=5;t=9")
            .expect("valid");
        resp.append_header("RateLimit", "\"up2\";r=1;t=9")
            .expect("valid");
        // Not the gateway's on an admitted answer: kept.
        resp.insert_header("Retry-After", "7").expect("valid");
        resp.insert_header("Tollgate-Degraded", "upstream's")
            .expect("valid");
        apply(&cfg, 0, None, &d, 1_000_500, &mut resp);
        assert_eq!(
            wire(&resp),
            "Retry-After: 7\r\nTollgate-Degraded: upstream's\r\n\
             ratelimit-policy: \"per-ip\";q=100;w=60\r\n\
             ratelimit: \"per-ip\";r=47;t=42\r\n\
             x-ratelimit-limit: 100\r\nx-ratelimit-remaining: 47\r\n\
             x-ratelimit-reset: 1042\r\n"
        );
        degraded(&mut resp, OnError::Deny);
        let parts = resp.as_owned_parts();
        assert_eq!(parts.headers["retry-after"], "7");
        let values: Vec<_> = parts.headers.get_all(DEGRADED).iter().collect();
        assert_eq!(values, [OnError::Deny.degraded_header()]);
        // Each header once, the upstream's copies gone.
        assert_eq!(parts.headers.len(), 7);
    }

    #[test]
    fn seconds_round_up_and_retry_is_at_least_one() {
        assert_eq!(seconds(&Decision::allow(10, 3, 41_001)), 42);
        assert_eq!(seconds(&Decision::allow(10, 3, 0)), 0);
        assert_eq!(seconds(&Decision::deny(10, 0, 5_000, 1)), 1);
        assert_eq!(seconds(&Decision::deny(10, 0, 5_000, 2_500)), 3);
    }
}
