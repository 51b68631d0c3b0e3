//! The constant parts of a rate limit's `429` problem-details body, pre-built when the config
//! (or a quota override's parameters) is loaded, so that a refusal writes two numbers between
//! them instead of formatting and serializing the whole document.
//!
//! A refusal's body is
//! `head` + retry seconds + `middle` + remaining + `,"retry_after":` + retry seconds + `}`,
//! byte for byte what `serde_json` makes of the refusal's problem document (the refusal
//! module's tests compare the two).

/// Problem type of a rate-limited request (draft-ietf-httpapi-ratelimit-headers §problem types).
pub const QUOTA_EXCEEDED: &str = "https://iana.org/assignments/http-problem-types#quota-exceeded";

/// The parts of a rate limit's 429 body that depend only on the limit and its parameters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RateLimitedBody {
    /// `{"type":…,"title":"Too Many Requests","status":429,"detail":"Rate limit \"name\" of
    /// 100 per 1m exceeded; retry in ` (the retry seconds follow).
    pub head: Box<str>,
    /// ` s.","policy":"name","limit":100,"window":"1m","window_seconds":60,"remaining":` (the
    /// remaining units follow).
    pub middle: Box<str>,
}

impl RateLimitedBody {
    /// The parts for limit `name` of `limit` per `window_label` (`window_ms` long).
    pub fn new(name: &str, limit: u64, window_label: &str, window_ms: u64) -> RateLimitedBody {
        let detail =
            format!("Rate limit \"{name}\" of {limit} per {window_label} exceeded; retry in ");
        let head = format!(
            "{{\"type\":{},\"title\":\"Too Many Requests\",\"status\":429,\"detail\":{}",
            json(QUOTA_EXCEEDED),
            open_json(&detail),
        );
        let middle = format!(
            " s.\",\"policy\":{},\"limit\":{limit},\"window\":{},\"window_seconds\":{},\"remaining\":",
            json(name),
            json(window_label),
            window_ms.div_ceil(1000),
        );
        RateLimitedBody {
            head: head.into(),
            middle: middle.into(),
        }
    }

    /// The whole body of a refusal with `remaining` units left, retry in `retry_s` seconds.
    pub fn write(&self, remaining: u64, retry_s: u64) -> Vec<u8> {
        use std::io::Write;
        let mut body = Vec::with_capacity(self.head.len() + self.middle.len() + 64);
        body.extend_from_slice(self.head.as_bytes());
        let _ = write!(body, "{retry_s}");
        body.extend_from_slice(self.middle.as_bytes());
        let _ = write!(body, "{remaining},\"retry_after\":{retry_s}}}");
        body
    }
}

/// `s` as a JSON string.
fn json(s: &str) -> String {
    serde_json::to_string(s).expect("a string serializes")
}

/// `s` as the start of a JSON string: opening quote, escaped text, no closing quote (escaping
/// is per character, so the rest of the string can follow).
fn open_json(s: &str) -> String {
    let mut j = json(s);
    j.pop();
    j
}
