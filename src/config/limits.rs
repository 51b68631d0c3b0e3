//! Limits, of both kinds: rate limits (`limit` units per `window`, by one of the
//! [`Algorithm`]s) and concurrency limits (`limit` requests in progress at once). Both share
//! one name space, one id space ([`LimitId`]), the key parts and the failure policy.

use std::collections::HashSet;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use http::header::HeaderName;
use http::HeaderValue;

use super::errors::{check_name, words, Errors, WordError};
use super::problem::RateLimitedBody;
use super::raw;
use super::store::FailureDefaults;
use crate::limit::{Algorithm, Quota, MAX_SCALED};
use crate::pingora_patches::EncodedHeaders;

/// The most parts a counter key may have.
pub const MAX_KEY_PARTS: usize = 8;

/// A limit's index in [`super::Config::limits`].
pub type LimitId = usize;

words! {
    /// What a limit does when its store cannot answer.
    pub enum OnError ("a failure policy") {
        /// Fail open: the request proceeds without this limit.
        Allow = "allow",
        /// Fail closed: 503.
        Deny = "deny",
        /// Decide on an in-process limiter of the same algorithm.
        Local = "local",
    }
}

impl OnError {
    /// The `Tollgate-Degraded` value of an answer decided under this policy while the store
    /// could not answer.
    pub fn degraded_header(self) -> &'static str {
        match self {
            OnError::Allow => "store-unavailable; policy=allow",
            OnError::Local => "store-unavailable; policy=local",
            OnError::Deny => "store-unavailable; policy=deny",
        }
    }
}

words! {
    /// A limit's `kind`.
    pub enum Kind ("a limit kind") {
        Rate = "rate",
        Concurrency = "concurrency",
    }
}

/// One part of a limit's counter key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyPart {
    ApiKey,
    User,
    ClientIp,
    Route,
    Method,
    Tier,
    Header(HeaderName),
}

impl std::fmt::Display for KeyPart {
    /// As the config file writes it (`api_key`, `header:x-tenant`, ...).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            KeyPart::ApiKey => f.write_str("api_key"),
            KeyPart::User => f.write_str("user"),
            KeyPart::ClientIp => f.write_str("client_ip"),
            KeyPart::Route => f.write_str("route"),
            KeyPart::Method => f.write_str("method"),
            KeyPart::Tier => f.write_str("tier"),
            KeyPart::Header(h) => write!(f, "header:{h}"),
        }
    }
}

impl FromStr for KeyPart {
    type Err = WordError;
    fn from_str(s: &str) -> Result<Self, WordError> {
        Ok(match s {
            "api_key" => KeyPart::ApiKey,
            "user" => KeyPart::User,
            "client_ip" => KeyPart::ClientIp,
            "route" => KeyPart::Route,
            "method" => KeyPart::Method,
            "tier" => KeyPart::Tier,
            _ => s
                .strip_prefix("header:")
                .and_then(|h| HeaderName::from_bytes(h.as_bytes()).ok())
                .map(KeyPart::Header)
                .ok_or_else(|| WordError {
                    got: s.to_string(),
                    what: "a key part",
                    expected: &[
                        "api_key",
                        "user",
                        "client_ip",
                        "route",
                        "method",
                        "tier",
                        "header:<name>",
                    ],
                })?,
        })
    }
}

/// A validated limit of either kind.
#[derive(Debug)]
pub struct Limit {
    pub name: Arc<str>,
    /// The counter key; empty means one counter for everybody.
    pub key: Vec<KeyPart>,
    /// Applies only to callers with neither an API key nor a verified user.
    pub anonymous_only: bool,
    /// Counted and logged, never denies.
    pub shadow: bool,
    pub on_error: OnError,
    /// Rate limits on Redis: a denial may be answered again from this gateway's over-limit
    /// cache until it ends (`over_limit_cache`, default true).
    pub over_limit_cache: bool,
    /// Redis only: the most units one store call may take for a caller, the request's own
    /// included, leasing the rest to this gateway (`lease.max`, or `store.lease.max`); 0 or 1:
    /// no leasing.
    pub lease_max: u64,
    pub spec: Spec,
}

/// What a limit counts.
// A spec is built once with its config and read in place on every check; boxing the rate
// spec to even the variants out would add a pointer to follow on each of them.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
pub enum Spec {
    Rate(RateSpec),
    Concurrency(ConcurrencySpec),
}

/// `limit` units per `window`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RateSpec {
    pub quota: Quota,
    /// The quota on the local fallback limiter (`limit × store.local_share`, at least 1).
    pub local_quota: Quota,
    /// The `RateLimit-Policy` line, encoded: `ratelimit-policy: "name";q=100;w=60`.
    pub policy_line: EncodedHeaders,
    /// The start of the `RateLimit` item, up to its `r`: `"name";r=`.
    pub ratelimit_prefix: HeaderValue,
    /// The `X-RateLimit-Limit` line, encoded: `x-ratelimit-limit: 100`.
    pub limit_line: EncodedHeaders,
    /// The window as written in the file (`1m`), for problem details.
    pub window_label: String,
    /// The constant parts of this limit's 429 body.
    pub refusal_body: RateLimitedBody,
}

impl RateSpec {
    /// This spec with new parameters (what is `None` stays), for a per-key override of the
    /// limit named `name`; the same rules as the file. `Err((field, message))`.
    pub fn with_params(
        &self,
        name: &str,
        limit: Option<u64>,
        window: Option<&str>,
        burst: Option<u64>,
        local_share: f64,
    ) -> Result<RateSpec, (&'static str, String)> {
        let q = self.quota;
        let limit = limit.unwrap_or(q.limit);
        if limit == 0 {
            return Err(("limit", "must be at least 1".into()));
        }
        let (window_ms, window_label) = match window {
            None => (q.window_ms, self.window_label.clone()),
            Some(w) => match humantime::parse_duration(w) {
                Ok(d) if d.as_millis() >= 1 => (d.as_millis() as u64, w.to_string()),
                Ok(_) => return Err(("window", "must be at least 1ms".into())),
                Err(_) => {
                    return Err((
                        "window",
                        format!("{w:?} is not a duration (examples: 500ms, 30s, 1m, 1h, 1d)"),
                    ))
                }
            },
        };
        let burst = match (burst, q.algorithm) {
            (None, Algorithm::TokenBucket | Algorithm::Gcra) if q.burst != q.limit => q.burst,
            (None, _) => limit,
            (Some(0), _) => return Err(("burst", "must be at least 1".into())),
            (Some(b), Algorithm::TokenBucket | Algorithm::Gcra) => b,
            (Some(_), a) => {
                return Err((
                    "burst",
                    format!("applies only to token_bucket and gcra, not {a}"),
                ))
            }
        };
        if limit.saturating_mul(window_ms) > MAX_SCALED
            || burst.saturating_mul(window_ms) > MAX_SCALED
        {
            return Err((
                "limit",
                format!("limit × window in ms must not exceed 2^53 ({MAX_SCALED})"),
            ));
        }
        Ok(rate_spec(
            name,
            q.algorithm,
            limit,
            window_ms,
            burst,
            window_label,
            local_share,
        ))
    }
}

/// `RateLimit-Policy`, of every rate-limited answer.
pub const RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
/// `X-RateLimit-Limit`, of every rate-limited answer.
pub const X_RATELIMIT_LIMIT: HeaderName = HeaderName::from_static("x-ratelimit-limit");

/// A rate spec with its pre-built header lines and local quota.
fn rate_spec(
    name: &str,
    algorithm: Algorithm,
    limit: u64,
    window_ms: u64,
    burst: u64,
    window_label: String,
    local_share: f64,
) -> RateSpec {
    let quota = Quota::new(algorithm, limit, window_ms).with_burst(burst);
    let share = |n: u64| ((n as f64 * local_share).floor() as u64).max(1);
    let local_quota = Quota::new(algorithm, share(limit), window_ms).with_burst(share(burst));
    let policy = format!("\"{name}\";q={limit};w={}", window_ms.div_ceil(1000));
    let mut policy_line = EncodedHeaders::new();
    // A name that is not a valid header value is reported by validation.
    policy_line.push(
        &RATELIMIT_POLICY,
        &HeaderValue::from_str(&policy).unwrap_or(HeaderValue::from_static("")),
    );
    let mut limit_line = EncodedHeaders::new();
    limit_line.push_number(&X_RATELIMIT_LIMIT, limit);
    RateSpec {
        quota,
        local_quota,
        policy_line,
        ratelimit_prefix: HeaderValue::from_str(&format!("\"{name}\";r="))
            .unwrap_or(HeaderValue::from_static("")),
        limit_line,
        refusal_body: RateLimitedBody::new(name, limit, &window_label, window_ms),
        window_label,
    }
}

/// `limit` requests in progress at once.
#[derive(Debug)]
pub struct ConcurrencySpec {
    pub limit: u64,
    /// How long a slot is held at most.
    pub timeout: Duration,
    /// The cap in this process when Redis cannot answer and `on_error` is `local`.
    pub local_limit: u64,
}

impl Limit {
    /// The rate spec of a rate limit. Panics on a concurrency limit: ids of rate limits are
    /// kept apart from those of concurrency limits (routes' `rate` and `concurrency`).
    pub fn rate(&self) -> &RateSpec {
        match &self.spec {
            Spec::Rate(r) => r,
            Spec::Concurrency(_) => panic!("limit {} is a concurrency limit", self.name),
        }
    }

    /// The spec of a concurrency limit; panics on a rate limit.
    pub fn concurrency(&self) -> &ConcurrencySpec {
        match &self.spec {
            Spec::Concurrency(c) => c,
            Spec::Rate(_) => panic!("limit {} is a rate limit", self.name),
        }
    }
}

/// The limits of a tier, a route, or everywhere: their ids by kind.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct LimitIds {
    pub rate: Vec<LimitId>,
    pub concurrency: Vec<LimitId>,
}

impl LimitIds {
    pub(super) fn push(&mut self, id: LimitId, limits: &[Limit]) {
        match limits[id].spec {
            Spec::Rate(_) => self.rate.push(id),
            Spec::Concurrency(_) => self.concurrency.push(id),
        }
    }
}

/// Builds every limit of a file, checking names are unique across tiers, routes and the
/// top-level `limits`.
pub(super) struct LimitBuilder {
    pub(super) limits: Vec<Limit>,
    names: HashSet<String>,
    failure: FailureDefaults,
}

/// The fields every kind of limit has, validated.
struct Common {
    key: Vec<KeyPart>,
    on_error: OnError,
}

impl LimitBuilder {
    pub(super) fn new(failure: FailureDefaults) -> LimitBuilder {
        LimitBuilder {
            limits: Vec::new(),
            names: HashSet::new(),
            failure,
        }
    }

    /// Validate one limit at `path` and add it; `None` when it has errors (reported).
    pub(super) fn add(
        &mut self,
        errs: &mut Errors,
        path: &str,
        l: raw::Limit,
        default_key: &[KeyPart],
    ) -> Option<LimitId> {
        let before = errs.count();
        check_name(errs, &format!("{path}.name"), &l.name);
        if super::errors::is_name(&l.name) && !self.names.insert(l.name.clone()) {
            errs.at(
                &format!("{path}.name"),
                format!("duplicate limit name {:?} (limit names are unique across tiers, routes and limits)", l.name),
            );
        }
        let kind = match &l.kind {
            None => Some(Kind::Rate),
            Some(k) => errs.word(&format!("{path}.kind"), k),
        };
        let spec = match kind {
            Some(Kind::Rate) => self.rate(errs, path, &l).map(Spec::Rate),
            Some(Kind::Concurrency) => {
                concurrency(errs, path, &l, self.failure).map(Spec::Concurrency)
            }
            // Which fields belong depends on the kind: check only what every kind has.
            None => None,
        };
        let common = self.common(errs, path, &l, default_key);
        let lease_max = self.lease_max(errs, path, &l, spec.as_ref());
        if errs.count() > before {
            return None;
        }
        self.limits.push(Limit {
            name: l.name.into(),
            key: common.key,
            anonymous_only: l.anonymous_only.unwrap_or(false),
            shadow: l.shadow.unwrap_or(false),
            on_error: common.on_error,
            over_limit_cache: l.over_limit_cache.unwrap_or(true),
            lease_max,
            spec: spec.expect("no errors"),
        });
        Some(self.limits.len() - 1)
    }

    /// `lease.max` of a rate limit (its own, else `store.lease`); sliding_log cannot lease.
    fn lease_max(&self, errs: &mut Errors, path: &str, l: &raw::Limit, spec: Option<&Spec>) -> u64 {
        let Some(Spec::Rate(r)) = spec else { return 0 };
        let sliding_log = r.quota.algorithm == crate::limit::Algorithm::SlidingLog;
        match &l.lease {
            Some(_) if sliding_log => {
                errs.at(
                    &format!("{path}.lease"),
                    "sliding_log cannot lease (it logs every request); use another algorithm or drop lease",
                );
                0
            }
            Some(lease) if lease.max == 0 => {
                errs.at(
                    &format!("{path}.lease.max"),
                    "must be at least 1 (1: no leasing)",
                );
                0
            }
            Some(lease) => lease.max,
            None if sliding_log => 0,
            None => self.failure.lease_max,
        }
    }

    fn common(
        &self,
        errs: &mut Errors,
        path: &str,
        l: &raw::Limit,
        default_key: &[KeyPart],
    ) -> Common {
        let key: Vec<KeyPart> = match &l.key {
            None => default_key.to_vec(),
            Some(parts) => parts
                .iter()
                .enumerate()
                .filter_map(|(i, p)| errs.word(&format!("{path}.key[{i}]"), p))
                .collect(),
        };
        if key.len() > MAX_KEY_PARTS {
            errs.at(
                &format!("{path}.key"),
                format!("at most {MAX_KEY_PARTS} key parts"),
            );
        }
        let on_error = match &l.on_error {
            None => self.failure.on_error,
            Some(s) => errs
                .word(&format!("{path}.on_error"), s)
                .unwrap_or(OnError::Allow),
        };
        Common { key, on_error }
    }

    /// The rest of a rate limit.
    fn rate(&self, errs: &mut Errors, path: &str, l: &raw::Limit) -> Option<RateSpec> {
        if l.timeout.is_some() {
            errs.at(
                &format!("{path}.timeout"),
                "applies only to kind: concurrency",
            );
        }
        let algorithm = match &l.algorithm {
            None => super::defaults::ALGORITHM,
            Some(s) => errs
                .word(&format!("{path}.algorithm"), s)
                .unwrap_or(super::defaults::ALGORITHM),
        };
        if l.limit == 0 {
            errs.at(&format!("{path}.limit"), "must be at least 1");
        }
        let window_ms = window_ms(errs, path, l.window.as_deref());
        let burst = burst(errs, path, l, algorithm);
        if window_ms > 0
            && (l.limit.saturating_mul(window_ms) > MAX_SCALED
                || burst.saturating_mul(window_ms) > MAX_SCALED)
        {
            errs.at(
                &format!("{path}.limit"),
                format!("limit × window in ms must not exceed 2^53 ({MAX_SCALED})"),
            );
        }
        Some(rate_spec(
            &l.name,
            algorithm,
            l.limit,
            window_ms,
            burst,
            l.window.clone().unwrap_or_default(),
            self.failure.local_share,
        ))
    }
}

/// A rate limit's window in ms (1 when missing or invalid: the error is reported).
fn window_ms(errs: &mut Errors, path: &str, window: Option<&str>) -> u64 {
    let window = match window {
        Some(w) => errs.duration(&format!("{path}.window"), w),
        None => {
            errs.at(
                &format!("{path}.window"),
                "missing: a rate limit needs a window (examples: 1s, 1m, 1h)",
            );
            None
        }
    };
    let window_ms = window.map_or(1, |w| w.as_millis() as u64);
    if window.is_some() && window_ms == 0 {
        errs.at(&format!("{path}.window"), "must be at least 1ms");
    }
    window_ms
}

fn burst(errs: &mut Errors, path: &str, l: &raw::Limit, algorithm: Algorithm) -> u64 {
    match (l.burst, algorithm) {
        (None, _) => l.limit,
        (Some(0), _) => {
            errs.at(&format!("{path}.burst"), "must be at least 1");
            1
        }
        (Some(b), Algorithm::TokenBucket | Algorithm::Gcra) => b,
        (Some(_), a) => {
            errs.at(
                &format!("{path}.burst"),
                format!("applies only to token_bucket and gcra, not {a}"),
            );
            l.limit
        }
    }
}

/// The rest of a `kind: concurrency` limit.
fn concurrency(
    errs: &mut Errors,
    path: &str,
    l: &raw::Limit,
    failure: FailureDefaults,
) -> Option<ConcurrencySpec> {
    for (field, set) in [
        ("algorithm", l.algorithm.is_some()),
        ("window", l.window.is_some()),
        ("burst", l.burst.is_some()),
        ("over_limit_cache", l.over_limit_cache.is_some()),
        ("lease", l.lease.is_some()),
    ] {
        if set {
            errs.at(
                &format!("{path}.{field}"),
                "does not apply to kind: concurrency",
            );
        }
    }
    if l.limit == 0 {
        errs.at(&format!("{path}.limit"), "must be at least 1");
    }
    let timeout = match &l.timeout {
        Some(t) => errs.duration(&format!("{path}.timeout"), t),
        None => {
            errs.at(
                &format!("{path}.timeout"),
                "missing: a concurrency limit needs a timeout, after which the slot of a request that has not ended is freed (examples: 30s, 1m)",
            );
            None
        }
    };
    if timeout.is_some_and(|t| t.as_millis() == 0) {
        errs.at(&format!("{path}.timeout"), "must be at least 1ms");
    }
    Some(ConcurrencySpec {
        limit: l.limit,
        timeout: timeout?,
        local_limit: ((l.limit as f64 * failure.local_share).floor() as u64).max(1),
    })
}
