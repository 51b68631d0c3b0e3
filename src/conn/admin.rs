//! [`Phased`]: the admin listener's app, telling its connection's state (see the parent
//! module) when a request is in progress and when the connection waits for its next head, as
//! the proxy's hooks do for proxy connections.
//!
//! Phase: the admin listener, around each admin request.

use std::sync::Arc;

use async_trait::async_trait;
use http::Response;
use pingora_core::apps::http_app::ServeHttp;
use pingora_core::protocols::http::ServerSession;

use super::ConnState;
use crate::config::reload::ConfigHandle;

/// An admin app whose connections are tracked: busy while it answers, then idle for at most
/// `server.keepalive_timeout`.
pub struct Phased<S> {
    inner: S,
    config: Arc<ConfigHandle>,
}

impl<S> Phased<S> {
    pub fn new(inner: S, config: Arc<ConfigHandle>) -> Phased<S> {
        Phased { inner, config }
    }
}

#[async_trait]
impl<S: ServeHttp + Send + Sync> ServeHttp for Phased<S> {
    async fn response(&self, session: &mut ServerSession) -> Response<Vec<u8>> {
        let conn = ConnState::of_stream(session.stream()).cloned();
        if let Some(conn) = &conn {
            conn.busy();
        }
        let answer = self.inner.response(session).await;
        if let Some(conn) = conn {
            let keepalive = self.config.snapshot().http.keepalive_timeout;
            conn.idle(keepalive, std::time::Instant::now());
        }
        answer
    }
}
