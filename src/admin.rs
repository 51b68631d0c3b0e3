//! The admin listener (loopback by default): `GET /healthz` and `GET /readyz`.
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
                let store_ok = self.store.ready().await;
                let status = if store_ok { 200 } else { 503 };
                json_response(
                    status,
                    json!({
                        "status": if store_ok { "ready" } else { "not ready" },
                        "config": cfg.source,
                        "config_generation": self.config.generation.load(std::sync::atomic::Ordering::Relaxed),
                        "store": if store_ok { "ok" } else { "unreachable" },
                        "store_status": self.store.status(),
                    }),
                )
            }
            _ => json_response(
                404,
                json!({ "error": format!("no admin endpoint {method} {path}"), "endpoints": ["GET /healthz", "GET /readyz"] }),
            ),
        }
    }
}
