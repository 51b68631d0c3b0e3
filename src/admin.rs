//! The admin listener (loopback by default): `GET /healthz`, `GET /readyz` and `GET /stats`
//! (requests in flight, shedding per priority class, concurrency slots held).
//!
//! Phase: its own listener, never on the proxy path. `/readyz` answers 200 only while a
//! config is loaded and the store answers.

use std::sync::Arc;

use async_trait::async_trait;
use http::Response;
use pingora_core::apps::http_app::ServeHttp;
use pingora_core::protocols::http::ServerSession;
use serde_json::json;

use crate::config::reload::ConfigHandle;
use crate::store::Store;

pub struct Admin {
    pub config: Arc<ConfigHandle>,
    pub store: Arc<Store>,
    pub shedder: Arc<crate::shed::Shedder>,
    pub conns: Arc<crate::conn::Connections>,
    pub lifecycle: Arc<crate::lifecycle::Lifecycle>,
}

pub(crate) fn json_response(status: u16, body: serde_json::Value) -> Response<Vec<u8>> {
    let body = serde_json::to_vec(&body).expect("json");
    Response::builder()
        .status(status)
        .header("content-type", "application/json")
        .header("content-length", body.len())
        .header("cache-control", "no-store")
        .body(body)
        .expect("valid response")
}

impl Admin {
    /// `GET /stats`: requests in flight, shedding decisions per priority class, concurrency
    /// slots held by this process.
    fn stats(&self) -> serde_json::Value {
        let cfg = self.config.snapshot();
        let mut body = self.shedder.stats().to_json();
        body["shedding"] = match &cfg.shedding {
            None => serde_json::Value::Null,
            Some(s) => {
                let mut classes = serde_json::Map::new();
                for p in crate::config::Priority::ALL {
                    if let Some(cap) = s.cap(p) {
                        classes.insert(
                            p.as_str().into(),
                            json!({ "threshold": s.thresholds[p as usize], "shed_at_in_flight": cap }),
                        );
                    }
                }
                json!({ "max_in_flight": s.max_in_flight, "thresholds": classes })
            }
        };
        let slots = self.store.slot_stats();
        body["concurrency"] = json!({
            "requests_holding_slots": slots.requests_holding(),
            "redis_releases_pending": slots.releases_pending(),
            "memory_slots": self.store.local().slots.held(),
        });
        body["connections"] = self.conns.stats_json();
        body
    }
}

#[async_trait]
impl ServeHttp for Admin {
    async fn response(&self, session: &mut ServerSession) -> Response<Vec<u8>> {
        let req = session.req_header();
        let method = req.method.clone();
        let path = req.uri.path().to_string();
        match (method.as_str(), path.as_str()) {
            ("GET", "/healthz") => json_response(200, json!({ "status": "ok" })),
            ("GET", "/readyz") => {
                let cfg = self.config.snapshot();
                let draining = self.lifecycle.stopping();
                // While draining, the store is not asked: the answer is 503 whatever it says.
                let store_ok = !draining && self.store.ready().await;
                let status = if store_ok { 200 } else { 503 };
                let store = match (draining, store_ok) {
                    (true, _) => "not checked: draining",
                    (false, true) => "ok",
                    (false, false) => "unreachable",
                };
                json_response(
                    status,
                    json!({
                        "status": if store_ok { "ready" } else { "not ready" },
                        "draining": draining,
                        "config": cfg.source,
                        "config_generation": self.config.generation.load(std::sync::atomic::Ordering::Relaxed),
                        "store": store,
                        "store_status": self.store.status(),
                    }),
                )
            }
            ("GET", "/stats") => json_response(200, self.stats()),
            _ => json_response(
                404,
                json!({ "error": format!("no admin endpoint {method} {path}"), "endpoints": ["GET /healthz", "GET /readyz", "GET /stats"] }),
            ),
        }
    }
}
