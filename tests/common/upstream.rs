//! The demo upstream, `tollgate demo-upstream`: it echoes each request as JSON, counts the
//! requests it served and holds in flight, holds a request `x-demo-delay-ms` milliseconds and
//! answers the status `x-demo-status` asks for.

use std::net::SocketAddr;
use std::time::Duration;

use reqwest::StatusCode;
use serde::Deserialize;

use super::http::{client_builder, get_json};
use super::process::{free_port, loopback, on_free_ports, Proc};
use super::wait::eventually;

/// The demo upstream, `tollgate demo-upstream --listen 127.0.0.1:PORT`.
pub struct Upstream {
    pub addr: SocketAddr,
    pub proc: Proc,
    client: reqwest::Client,
}

/// `GET /__demo/stats` of the demo upstream.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
pub struct Stats {
    pub requests: u64,
    pub in_flight: u64,
    pub max_in_flight: u64,
    /// Distinct client connections the counted requests came on.
    pub connections: u64,
}

impl Upstream {
    pub async fn start() -> Upstream {
        on_free_ports("demo upstream", || {
            Upstream::start_at(loopback(free_port()))
        })
        .await
    }

    /// Stop this upstream (SIGKILL: the kernel closes its connections) and start another on
    /// the same address.
    pub async fn restarted(self) -> Upstream {
        let addr = self.addr;
        drop(self);
        Upstream::start_at(addr)
            .await
            .unwrap_or_else(|out| panic!("demo upstream restarted on {addr}: {out}"))
    }

    async fn start_at(addr: SocketAddr) -> Result<Upstream, String> {
        let client = client_builder()
            .timeout(Duration::from_secs(2))
            .build()
            .expect("client");
        let stats = format!("http://{addr}/__demo/stats");
        Proc::tollgate(
            "demo upstream",
            &["demo-upstream".into(), "--listen".into(), addr.to_string()],
            &[],
        )
        .answering(&client, &stats)
        .await
        .map(|proc| Upstream { addr, proc, client })
    }

    /// The config section that names this upstream `backend`:
    /// `upstreams: { backend: ["127.0.0.1:PORT"] }` and a newline.
    pub fn upstreams_yaml(&self) -> String {
        format!("upstreams: {{ backend: [\"{}\"] }}\n", self.addr)
    }

    pub async fn stats(&self) -> Stats {
        get_json(&self.client, &format!("http://{}/__demo/stats", self.addr)).await
    }

    pub async fn requests(&self) -> u64 {
        self.stats().await.requests
    }

    /// Poll the stats every 10 ms until `cond` holds; panics after `within`.
    pub async fn wait_stats(&self, what: &str, within: Duration, cond: impl Fn(&Stats) -> bool) {
        eventually(format!("upstream: {what}"), within)
            .every(Duration::from_millis(10))
            .holds_on(|| self.stats(), cond)
            .await;
    }

    /// Wait until exactly `n` requests are in flight at the upstream; panics after 10 s.
    pub async fn wait_in_flight(&self, n: u64) {
        self.wait_stats(
            &format!("{n} requests in flight"),
            Duration::from_secs(10),
            |s| s.in_flight == n,
        )
        .await
    }

    pub async fn reset(&self) {
        let r = self
            .client
            .post(format!("http://{}/__demo/reset", self.addr))
            .send()
            .await
            .expect("POST /__demo/reset");
        assert_eq!(r.status(), StatusCode::OK);
    }
}
