//! `shedding` and route priorities: the priority classes, and the in-flight thresholds at
//! which each class is shed.

use http::header::HeaderName;
use http::{HeaderMap, Method};

use super::errors::Errors;
use super::identity::header_name;
use super::{defaults, raw};

/// A request's priority class, lowest first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Priority {
    Test = 0,
    Get = 1,
    Post = 2,
    Critical = 3,
}

impl Priority {
    /// Every class, lowest priority first.
    pub const ALL: [Priority; 4] = [
        Priority::Test,
        Priority::Get,
        Priority::Post,
        Priority::Critical,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Priority::Test => "test",
            Priority::Get => "get",
            Priority::Post => "post",
            Priority::Critical => "critical",
        }
    }

    /// The class of a request by its method: the safe methods (GET, HEAD, OPTIONS, TRACE) are
    /// `get`; every other method may change state and is `post`.
    pub fn of_method(m: &Method) -> Priority {
        match *m {
            Method::GET | Method::HEAD | Method::OPTIONS | Method::TRACE => Priority::Get,
            _ => Priority::Post,
        }
    }
}

impl std::fmt::Display for Priority {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for Priority {
    type Err = super::WordError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Priority::ALL
            .into_iter()
            .find(|p| p.as_str() == s)
            .ok_or_else(|| super::WordError {
                got: s.to_string(),
                what: "a priority class",
                expected: &["critical", "post", "get", "test"],
            })
    }
}

/// Which requests are test traffic (`shedding.test_traffic`).
#[derive(Debug, Clone, Default)]
pub struct TestTraffic {
    /// A request carrying this header with a non-empty value is test traffic.
    pub header: Option<HeaderName>,
    /// A request whose API key starts with this is test traffic.
    pub api_key_prefix: Option<String>,
}

impl TestTraffic {
    pub fn matches(&self, headers: &HeaderMap, api_key: Option<&str>) -> bool {
        let by_header = self
            .header
            .as_ref()
            .and_then(|h| headers.get(h))
            .is_some_and(|v| !v.is_empty());
        let by_key = match (&self.api_key_prefix, api_key) {
            (Some(p), Some(k)) => k.starts_with(p.as_str()),
            _ => false,
        };
        by_header || by_key
    }
}

/// Validated `shedding` settings.
#[derive(Debug, Clone)]
pub struct Shedding {
    pub max_in_flight: u64,
    /// Thresholds of `test`, `get`, `post`, as fractions of `max_in_flight`.
    pub thresholds: [f64; 3],
    /// For `test`, `get`, `post`: a request of the class is admitted only while fewer than this
    /// many requests are in flight (`ceil(threshold × max_in_flight)`).
    caps: [u64; 3],
    pub test_traffic: TestTraffic,
}

impl Shedding {
    /// `thresholds` are those of `test`, `get` and `post`, each in (0, 1] (validated by the
    /// caller).
    pub fn new(max_in_flight: u64, thresholds: [f64; 3], test_traffic: TestTraffic) -> Shedding {
        // In parts per million, so that 0.7 × 40 is exactly 28 and not 28.000000000000004.
        let cap = |t: f64| {
            let ppm = (t * 1e6).round() as u128;
            (ppm * max_in_flight as u128).div_ceil(1_000_000) as u64
        };
        Shedding {
            max_in_flight,
            thresholds,
            caps: thresholds.map(cap),
            test_traffic,
        }
    }

    /// How many requests may be in flight for one more of `class` to be admitted; `None` for
    /// `critical`, which is never shed.
    pub fn cap(&self, class: Priority) -> Option<u64> {
        match class {
            Priority::Critical => None,
            c => Some(self.caps[c as usize]),
        }
    }
}

pub(super) fn validate(errs: &mut Errors, r: raw::Shedding) -> Shedding {
    if r.max_in_flight == 0 {
        errs.at("shedding.max_in_flight", "must be at least 1");
    }
    let t = r.thresholds.unwrap_or_default();
    let d = defaults::SHED_THRESHOLDS;
    let thresholds = [
        ("test", t.test.unwrap_or(d[0])),
        ("get", t.get.unwrap_or(d[1])),
        ("post", t.post.unwrap_or(d[2])),
    ];
    let mut in_range = true;
    for (class, v) in thresholds {
        in_range &= errs.fraction(&format!("shedding.thresholds.{class}"), v, "");
    }
    let [(_, test), (_, get), (_, post)] = thresholds;
    if in_range && !(test < get && get < post) {
        errs.at(
            "shedding.thresholds",
            format!("must increase with priority (test < get < post), got test {test}, get {get}, post {post}"),
        );
    }
    let test_traffic = r
        .test_traffic
        .map(|tt| test_traffic(errs, tt))
        .unwrap_or_default();
    Shedding::new(r.max_in_flight, [test, get, post], test_traffic)
}

fn test_traffic(errs: &mut Errors, tt: raw::TestTraffic) -> TestTraffic {
    if tt.header.is_none() && tt.api_key_prefix.is_none() {
        errs.at(
            "shedding.test_traffic",
            "set `header`, `api_key_prefix` or both",
        );
    }
    let header = tt
        .header
        .and_then(|h| header_name(errs, "shedding.test_traffic.header", &h));
    if tt.api_key_prefix.as_deref() == Some("") {
        errs.at(
            "shedding.test_traffic.api_key_prefix",
            "must not be empty (it would make every API key test traffic)",
        );
    }
    TestTraffic {
        header,
        api_key_prefix: tt.api_key_prefix,
    }
}
