//! Every answer the gateway makes itself, as one type, and the one place it becomes HTTP: a
//! status, headers and an RFC 9457 problem-details body (`application/problem+json`).
//!
//! Phase: the edge. `request_filter` either admits a request or answers one [`Refusal`];
//! `fail_to_proxy` answers the upstream's failures the same way. (Malformed heads, more than
//! 256 headers, over 1 MiB of head and CONNECT are answered by Pingora before any hook runs.)

use bytes::Bytes;
use http::Method;
use pingora_http::ResponseHeader;
use serde::Serialize;

use std::sync::Arc;

use crate::config::{Config, LimitId, OnError, Priority, RateSpec, Spec};
use crate::headers;
use crate::identity::IdentityError;
use crate::limit::Decision;

pub use crate::config::QUOTA_EXCEEDED;
/// Problem type of a request refused because capacity is temporarily reduced.
pub const REDUCED_CAPACITY: &str =
    "https://iana.org/assignments/http-problem-types#temporary-reduced-capacity";
/// `Retry-After` (seconds) of a shed request, of a full concurrency limit (a slot frees as
/// soon as any of the caller's requests ends), and of a limit that fails closed.
pub const RETRY_AFTER_S: u64 = 1;

/// An answer the gateway makes itself instead of proxying.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// 400: the head breaks HTTP/1.1 or the path rules (a Host missing, a bad path).
    BadHead(&'static str),
    /// 414: the request target is longer than `server.max_uri_bytes`.
    UriTooLong,
    /// 431: the request line and headers are larger than `server.max_request_header_bytes`.
    HeaderTooLarge,
    /// 413: the body is larger than `max_body_bytes`.
    BodyTooLarge,
    /// 400 (malformed API key) or 401 (invalid JWT).
    Credentials(IdentityError),
    /// 404: no route matches.
    NoRoute { method: Method, path: String },
    /// 503: shed by priority while the gateway is near capacity.
    Shed(Priority),
    /// 429: a concurrency limit has no free slot; `in_use` slots were taken.
    SlotsFull { limit: LimitId, in_use: u64 },
    /// 429: a rate limit is exhausted (decided at `at_ms`, the store's clock).
    RateLimited {
        limit: LimitId,
        decision: Decision,
        at_ms: u64,
        /// The caller's own parameters of this limit (a quota override); `None`: the config's.
        spec: Option<Arc<RateSpec>>,
    },
    /// 503: the store cannot answer and this limit fails closed.
    StoreUnavailable { limit: LimitId },
    /// 400: the request could not be read.
    BadRequest,
    /// 502: the upstream could not be reached or failed.
    UpstreamFailed,
    /// 504: the upstream did not answer within its read (or write) timeout.
    UpstreamTimeout,
    /// 500: the gateway failed.
    Internal,
    /// Another error status Pingora reported while proxying.
    Failed(u16),
}

impl From<IdentityError> for Refusal {
    fn from(e: IdentityError) -> Self {
        Refusal::Credentials(e)
    }
}

/// A problem-details body; the fields after `detail` depend on the problem.
#[derive(Serialize)]
struct Problem<'a, X: Serialize> {
    #[serde(rename = "type")]
    kind: &'a str,
    title: &'a str,
    status: u16,
    detail: String,
    #[serde(flatten)]
    extra: X,
}

#[derive(Serialize)]
struct SlotFields<'a> {
    policy: &'a str,
    limit: u64,
    in_progress: u64,
    retry_after: u64,
}

#[derive(Serialize)]
struct PolicyFields<'a> {
    policy: &'a str,
    retry_after: u64,
}

#[derive(Serialize)]
struct ShedFields {
    priority: &'static str,
    retry_after: u64,
}

#[derive(Serialize)]
struct NoFields {}

impl Refusal {
    /// The refusal for an error status Pingora reported.
    pub fn from_status(code: u16) -> Refusal {
        match code {
            400 => Refusal::BadRequest,
            413 => Refusal::BodyTooLarge,
            502 => Refusal::UpstreamFailed,
            504 => Refusal::UpstreamTimeout,
            500 => Refusal::Internal,
            other => Refusal::Failed(other),
        }
    }

    pub fn status(&self) -> u16 {
        match self {
            Refusal::BadHead(_) => 400,
            Refusal::UriTooLong => 414,
            Refusal::HeaderTooLarge => 431,
            Refusal::BodyTooLarge => 413,
            Refusal::Credentials(IdentityError::InvalidApiKey { .. }) => 400,
            Refusal::Credentials(
                IdentityError::InvalidToken(_) | IdentityError::Revoked | IdentityError::UnknownKey,
            ) => 401,
            Refusal::NoRoute { .. } => 404,
            Refusal::Shed(_) | Refusal::StoreUnavailable { .. } => 503,
            Refusal::SlotsFull { .. } | Refusal::RateLimited { .. } => 429,
            Refusal::BadRequest => 400,
            Refusal::UpstreamFailed => 502,
            Refusal::UpstreamTimeout => 504,
            Refusal::Internal => 500,
            Refusal::Failed(code) => *code,
        }
    }

    fn title(&self) -> &'static str {
        http::StatusCode::from_u16(self.status())
            .ok()
            .and_then(|s| s.canonical_reason())
            .unwrap_or("Error")
    }

    /// The whole answer: head and body. `degraded` is the failure policy that decided, when
    /// the store could not answer.
    pub fn response(&self, cfg: &Config, degraded: Option<OnError>) -> (ResponseHeader, Bytes) {
        let (mut head, body) = self.problem(cfg);
        match self {
            Refusal::Credentials(IdentityError::InvalidToken(_)) => {
                let _ = head.insert_header("www-authenticate", "Bearer error=\"invalid_token\"");
            }
            Refusal::RateLimited {
                limit,
                decision,
                at_ms,
                spec,
            } => headers::apply(cfg, *limit, spec.as_deref(), decision, *at_ms, &mut head),
            Refusal::Shed(_) | Refusal::SlotsFull { .. } | Refusal::StoreUnavailable { .. } => {
                let _ = head.insert_header("retry-after", RETRY_AFTER_S);
            }
            _ => {}
        }
        if let Some(policy) = degraded {
            headers::degraded(&mut head, policy);
        }
        (head, body)
    }

    /// The status line and body, with the content headers.
    fn problem(&self, cfg: &Config) -> (ResponseHeader, Bytes) {
        let body = match self {
            Refusal::BadHead(detail) => self.plain(detail),
            Refusal::UriTooLong => self.plain("The request target is longer than this gateway accepts."),
            Refusal::HeaderTooLarge => self.plain(HEADER_TOO_LARGE),
            Refusal::BodyTooLarge => self.plain("The request body is larger than this route accepts."),
            Refusal::Credentials(e) => self.body("about:blank", e.to_string(), NoFields {}),
            Refusal::NoRoute { method, path } => self.body(
                "about:blank",
                format!("No route matches {method} {path}."),
                NoFields {},
            ),
            Refusal::Shed(class) => self.body(
                REDUCED_CAPACITY,
                format!(
                    "The gateway is near capacity and is shedding {class} requests; retry in {RETRY_AFTER_S} s."
                ),
                ShedFields {
                    priority: class.as_str(),
                    retry_after: RETRY_AFTER_S,
                },
            ),
            Refusal::SlotsFull { limit, in_use } => self.slots_full(cfg, *limit, *in_use),
            Refusal::RateLimited {
                limit,
                decision,
                spec,
                ..
            } => Refusal::rate_limited(cfg, *limit, spec.as_deref(), decision),
            Refusal::StoreUnavailable { limit } => self.store_unavailable(cfg, *limit),
            Refusal::BadRequest => self.plain("The request could not be read."),
            Refusal::UpstreamFailed => {
                self.plain("The upstream could not be reached or failed to answer.")
            }
            Refusal::UpstreamTimeout => self.plain("The upstream did not answer in time."),
            Refusal::Internal => self.plain("The gateway failed to handle the request."),
            Refusal::Failed(_) => self.plain("The gateway could not handle the request."),
        };
        (problem_head(self.status(), body.len()), Bytes::from(body))
    }

    /// A problem-details body of this refusal's status.
    fn body(&self, kind: &str, detail: String, extra: impl Serialize) -> Vec<u8> {
        let p = Problem {
            kind,
            title: self.title(),
            status: self.status(),
            detail,
            extra,
        };
        serde_json::to_vec(&p).expect("serializable")
    }

    fn plain(&self, detail: &str) -> Vec<u8> {
        self.body("about:blank", detail.to_string(), NoFields {})
    }

    fn slots_full(&self, cfg: &Config, id: LimitId, in_use: u64) -> Vec<u8> {
        let l = cfg.limit(id);
        let cap = l.concurrency().limit;
        self.body(
            QUOTA_EXCEEDED,
            format!(
                "Concurrency limit \"{}\" of {cap} requests in progress exceeded; retry in {RETRY_AFTER_S} s.",
                l.name
            ),
            SlotFields {
                policy: &l.name,
                limit: cap,
                in_progress: in_use,
                retry_after: RETRY_AFTER_S,
            },
        )
    }

    /// The 429 body of a rate limit: its constant parts were built with the config (or the
    /// quota override), so only `remaining` and the retry seconds are written here.
    fn rate_limited(cfg: &Config, id: LimitId, spec: Option<&RateSpec>, d: &Decision) -> Vec<u8> {
        let rate = spec.unwrap_or_else(|| cfg.limit(id).rate());
        rate.refusal_body.write(d.remaining, headers::seconds(d))
    }

    fn store_unavailable(&self, cfg: &Config, id: LimitId) -> Vec<u8> {
        let l = cfg.limit(id);
        let what = match l.spec {
            Spec::Rate(_) => "rate limit",
            Spec::Concurrency(_) => "concurrency limit",
        };
        self.body(
            REDUCED_CAPACITY,
            format!(
                "The {what} \"{}\" cannot be checked right now and does not fail open; retry in {RETRY_AFTER_S} s.",
                l.name
            ),
            PolicyFields {
                policy: &l.name,
                retry_after: RETRY_AFTER_S,
            },
        )
    }
}

/// The detail of a `431`.
const HEADER_TOO_LARGE: &str = "The request line and headers are larger than this gateway accepts.";

/// The whole `431` answer on the wire, for a head that passes `server.max_request_header_bytes`
/// while it arrives: the connection layer writes it itself, before Pingora has a head to
/// answer, and then closes the connection (so it says `Connection: close`).
pub fn header_too_large_wire() -> Vec<u8> {
    let body = Refusal::HeaderTooLarge.plain(HEADER_TOO_LARGE);
    let mut wire = format!(
        "HTTP/1.1 431 Request Header Fields Too Large\r\nContent-Type: application/problem+json\r\n\
         Content-Length: {}\r\nCache-Control: no-store\r\nConnection: close\r\n\r\n",
        body.len()
    )
    .into_bytes();
    wire.extend_from_slice(&body);
    wire
}

/// The head of a problem-details answer.
fn problem_head(status: u16, len: usize) -> ResponseHeader {
    let mut h = ResponseHeader::build(status, Some(8)).expect("valid status");
    let _ = h.insert_header("content-type", "application/problem+json");
    let _ = h.insert_header("content-length", len);
    let _ = h.insert_header("cache-control", "no-store");
    h
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{from_yaml, Overrides, RateLimitedBody};

    #[derive(Serialize)]
    struct RateFields<'a> {
        policy: &'a str,
        limit: u64,
        window: &'a str,
        window_seconds: u64,
        remaining: u64,
        retry_after: u64,
    }

    /// The body as serde_json makes it from the whole problem document: what the pre-built
    /// parts must reproduce byte for byte.
    fn serialized(spec: &RateSpec, name: &str, d: &Decision) -> Vec<u8> {
        let retry = headers::seconds(d);
        let p = Problem {
            kind: QUOTA_EXCEEDED,
            title: "Too Many Requests",
            status: 429,
            detail: format!(
                "Rate limit \"{name}\" of {} per {} exceeded; retry in {retry} s.",
                spec.quota.limit, spec.window_label
            ),
            extra: RateFields {
                policy: name,
                limit: spec.quota.limit,
                window: &spec.window_label,
                window_seconds: spec.quota.window_ms.div_ceil(1000),
                remaining: d.remaining,
                retry_after: retry,
            },
        };
        serde_json::to_vec(&p).expect("serializable")
    }

    #[test]
    fn the_prebuilt_429_body_is_the_serialized_problem_byte_for_byte() {
        let yaml = "upstreams: { backend: [\"127.0.0.1:9\"] }\n\
                    routes: [ { name: r, match: { path_prefix: / }, upstream: backend } ]\n\
                    limits:\n\
                    \x20 - { name: per-ip, key: [client_ip], limit: 100, window: 1m }\n\
                    \x20 - { name: tb_1.5s, key: [client_ip], algorithm: token_bucket, limit: 7, burst: 3, window: 1500ms }\n";
        let cfg = from_yaml("t.yaml", yaml, &Overrides::default()).expect("valid");
        let decisions = [
            Decision::deny(100, 0, 60_000, 1),
            Decision::deny(100, 0, 60_000, 59_001),
            Decision::deny(7, 2, 1_500, 12_345_678),
            Decision::deny(u64::MAX, u64::MAX, 0, u64::MAX - 1),
        ];
        for (id, limit) in cfg.limits.iter().enumerate() {
            // The config's parameters, and a quota override's.
            let overridden = limit
                .rate()
                .with_params(&limit.name, Some(5_000), Some("90s"), None, 0.5)
                .expect("valid override");
            for spec in [None, Some(&overridden)] {
                let rate = spec.unwrap_or_else(|| limit.rate());
                for d in &decisions {
                    let refusal = Refusal::RateLimited {
                        limit: id,
                        decision: *d,
                        at_ms: 0,
                        spec: spec.map(|s| Arc::new(s.clone())),
                    };
                    let (head, body) = refusal.response(&cfg, None);
                    let want = serialized(rate, &limit.name, d);
                    assert_eq!(
                        String::from_utf8_lossy(&body),
                        String::from_utf8_lossy(&want)
                    );
                    assert_eq!(
                        head.headers["content-length"],
                        want.len().to_string().as_str()
                    );
                }
            }
        }
    }

    #[test]
    fn json_special_characters_in_the_constant_parts_are_escaped() {
        let body = RateLimitedBody::new("a\"b\\c\u{e9}", 3, "1m\n", 60_000).write(1, 2);
        let v: serde_json::Value = serde_json::from_slice(&body).expect("valid JSON");
        assert_eq!(v["policy"], "a\"b\\c\u{e9}");
        assert_eq!(v["window"], "1m\n");
        assert_eq!(
            v["detail"],
            "Rate limit \"a\"b\\c\u{e9}\" of 3 per 1m\n exceeded; retry in 2 s."
        );
        assert_eq!(
            (v["remaining"].as_u64(), v["retry_after"].as_u64()),
            (Some(1), Some(2))
        );
    }
}
