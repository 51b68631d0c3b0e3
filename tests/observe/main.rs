//! Observability against the real gateway: Prometheus metrics parsed by a real parser and
//! scraped by a real Prometheus, the alert rules under `promtool test rules`, the dashboard's
//! metric names, the access log, the top limited callers, admin authentication, and the live
//! page in headless Chromium.
//!
//! Needs `prometheus` (with `promtool`) and `chromium` from Debian (scripts/setup.sh); a
//! missing one fails the test naming it.

#[path = "../common/mod.rs"]
mod common;

mod access_log;
mod admin;
mod metrics;
mod page;
mod prometheus;

use common::gateway::Gateway;
use common::upstream::Upstream;

/// A per-IP limit of 7 per hour for anonymous callers (token bucket: nothing refills during a
/// test), a tier of 5 per hour for API keys, one route to the demo upstream.
pub fn config(upstream: &Upstream, extra: &str) -> String {
    format!(
        "{}tiers:\n  free: [ {{ name: free-hour, algorithm: token_bucket, limit: 5, window: 1h }} ]\n\
         default_tier: free\n\
         routes:\n  - {{ name: default, match: {{ path_prefix: / }}, upstream: backend }}\n\
         limits:\n  - {{ name: per-ip, key: [client_ip], algorithm: token_bucket, limit: 7, window: 1h, anonymous_only: true }}\n{extra}",
        upstream.upstreams_yaml()
    )
}

/// The demo upstream and a gateway in front of it with [`config`].
pub async fn start(extra: &str) -> (Upstream, Gateway) {
    let up = Upstream::start().await;
    let gw = Gateway::start(&config(&up, extra)).await;
    (up, gw)
}

/// An API key that must never show up anywhere but in the requests that carry it.
pub const SECRET_KEY: &str = "sk_live_Zq8TtollgateSecretKey42";
