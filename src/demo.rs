//! A small upstream for the quick start and the integration tests: it echoes each request as
//! JSON and counts what it served.
//!
//! `GET /__demo/stats` returns `{"requests", "in_flight", "max_in_flight", "connections"}`
//! (not counted; `connections`: the distinct client connections that counted requests came on,
//! up to [`MAX_CONNECTIONS_COUNTED`]); `POST /__demo/reset` zeroes them. A connection is its
//! client address and the time it was accepted: on loopback Linux hands a closed connection's
//! port to a new one (`net.ipv4.tcp_tw_reuse = 2`), so the address alone would count two
//! connections as one.
//! Any other request is counted and echoed (method, path, the raw target as received, query,
//! headers, body). The header
//! `x-demo-delay-ms` holds the response that long; `x-demo-status` picks the status code.

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use http::Response;
use pingora_core::apps::http_app::ServeHttp;
use pingora_core::protocols::http::ServerSession;
use pingora_core::protocols::l4::socket::SocketAddr;
use serde_json::json;

use crate::admin::json_response;

/// The distinct connections `/__demo/stats` counts at most, so a long-running demo upstream's
/// memory stays bounded.
pub const MAX_CONNECTIONS_COUNTED: usize = 65_536;

/// The longest `x-demo-delay-ms` honoured.
pub const MAX_DELAY_MS: u64 = 60_000;

#[derive(Default)]
pub struct DemoUpstream {
    requests: AtomicU64,
    in_flight: AtomicU64,
    max_in_flight: AtomicU64,
    /// The connections counted requests came on: client address and time accepted.
    connections: parking_lot::Mutex<HashSet<(SocketAddr, SystemTime)>>,
}

struct InFlight<'a>(&'a AtomicU64);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// The connection `session` came on: its client address and when it was accepted.
fn connection_of(session: &ServerSession) -> Option<(SocketAddr, SystemTime)> {
    let accepted = session
        .digest()
        .and_then(|d| d.timing_digest.first()?.as_ref())
        .map_or(SystemTime::UNIX_EPOCH, |t| t.established_ts);
    Some((session.client_addr()?.clone(), accepted))
}

fn header_u64(session: &ServerSession, name: &str) -> Option<u64> {
    session
        .req_header()
        .headers
        .get(name)?
        .to_str()
        .ok()?
        .parse()
        .ok()
}

#[async_trait]
impl ServeHttp for DemoUpstream {
    async fn response(&self, session: &mut ServerSession) -> Response<Vec<u8>> {
        let req = session.req_header();
        let (method, path) = (req.method.to_string(), req.uri.path().to_string());
        match (method.as_str(), path.as_str()) {
            ("GET", "/__demo/stats") => {
                return json_response(
                    200,
                    json!({
                        "requests": self.requests.load(Ordering::SeqCst),
                        "in_flight": self.in_flight.load(Ordering::SeqCst),
                        "max_in_flight": self.max_in_flight.load(Ordering::SeqCst),
                        "connections": self.connections.lock().len(),
                    }),
                )
            }
            ("POST", "/__demo/reset") => {
                self.requests.store(0, Ordering::SeqCst);
                self.max_in_flight.store(0, Ordering::SeqCst);
                self.connections.lock().clear();
                return json_response(200, json!({ "reset": true }));
            }
            _ => {}
        }
        self.requests.fetch_add(1, Ordering::SeqCst);
        if let Some(connection) = connection_of(session) {
            let mut seen = self.connections.lock();
            if seen.len() < MAX_CONNECTIONS_COUNTED {
                seen.insert(connection);
            }
        }
        let now = self.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        self.max_in_flight.fetch_max(now, Ordering::SeqCst);
        let _guard = InFlight(&self.in_flight);

        let req = session.req_header();
        let mut headers = serde_json::Map::new();
        for (name, value) in req.headers.iter() {
            let entry = headers
                .entry(name.as_str().to_string())
                .or_insert_with(|| json!([]));
            if let Some(list) = entry.as_array_mut() {
                list.push(json!(String::from_utf8_lossy(value.as_bytes())));
            }
        }
        let query = req.uri.query().unwrap_or("").to_string();
        // The request target exactly as it arrived, to see what a proxy forwarded.
        let target = String::from_utf8_lossy(req.raw_path()).into_owned();
        let delay = header_u64(session, "x-demo-delay-ms")
            .unwrap_or(0)
            .min(MAX_DELAY_MS);
        let status = header_u64(session, "x-demo-status")
            .filter(|s| (200..600).contains(s))
            .unwrap_or(200) as u16;
        let mut body = Vec::new();
        loop {
            match session.read_request_body().await {
                Ok(Some(chunk)) => body.extend_from_slice(&chunk),
                Ok(None) => break,
                Err(e) => return json_response(400, json!({ "error": e.to_string() })),
            }
        }
        if delay > 0 {
            tokio::time::sleep(Duration::from_millis(delay)).await;
        }
        json_response(
            status,
            json!({
                "method": method,
                "path": path,
                "target": target,
                "query": query,
                "headers": headers,
                "body": String::from_utf8_lossy(&body),
                "body_len": body.len(),
            }),
        )
    }
}
