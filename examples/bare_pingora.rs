//! The framework's floor: a Pingora `ProxyHttp` with no filters at all, built with the same
//! Pingora version, release profile and server settings as tollgate, forwarding every request
//! to one upstream. `loadtest/proxy.sh` measures it beside tollgate, so tollgate's own cost
//! per request is the difference.
//!
//!   cargo build --release --example bare_pingora
//!   target/release/examples/bare_pingora 127.0.0.1:8081 127.0.0.1:9000 [threads]

use std::net::SocketAddr;

use async_trait::async_trait;
use pingora_core::server::configuration::ServerConf;
use pingora_core::server::Server;
use pingora_core::upstreams::peer::HttpPeer;
use pingora_error::Result;
use pingora_proxy::{ProxyHttp, Session};

struct Bare {
    upstream: SocketAddr,
}

#[async_trait]
impl ProxyHttp for Bare {
    type CTX = ();

    fn new_ctx(&self) {}

    async fn upstream_peer(&self, _session: &mut Session, _ctx: &mut ()) -> Result<Box<HttpPeer>> {
        Ok(Box::new(HttpPeer::new(self.upstream, false, String::new())))
    }
}

fn main() {
    let mut args = std::env::args().skip(1);
    let usage = "usage: bare_pingora LISTEN UPSTREAM [THREADS]";
    let listen: SocketAddr = args.next().expect(usage).parse().expect(usage);
    let upstream: SocketAddr = args.next().expect(usage).parse().expect(usage);
    let threads: usize = args.next().map_or(1, |t| t.parse().expect(usage));
    let conf = ServerConf {
        threads,
        grace_period_seconds: Some(0),
        graceful_shutdown_timeout_seconds: Some(1),
        ..ServerConf::default()
    };
    let mut server = Server::new_with_opt_and_conf(None, conf);
    server.bootstrap();
    let mut proxy = pingora_proxy::http_proxy_service_with_name(
        &server.configuration,
        Bare { upstream },
        "bare pingora",
    );
    proxy.add_tcp(&listen.to_string());
    server.add_service(proxy);
    server.run_forever()
}
