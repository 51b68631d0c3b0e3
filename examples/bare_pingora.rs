//! The framework's floor: a Pingora `ProxyHttp` with no filters at all, built with the same
//! Pingora version, release profile and server settings as tollgate, forwarding every request
//! to one upstream. The load tests run it beside tollgate (it takes the same flags and reads
//! the same config, using only its threads and its first route's first upstream server), so
//! tollgate's own cost per request is the difference. Its upstream peers carry the same
//! options as tollgate's (the upstream's connect, read, write and idle timeouts, built by
//! `tollgate::proxy::peer`); with `--no-peer-timeouts` they carry none, Pingora's defaults,
//! which measures what the timeouts cost.
//!
//!   cargo build --release --example bare_pingora
//!   target/release/examples/bare_pingora -c gateway.yaml --listen 127.0.0.1:8081 --admin-listen 127.0.0.1:9902

use std::path::PathBuf;

use async_trait::async_trait;
use http::Response;
use pingora_core::apps::http_app::ServeHttp;
use pingora_core::modules::http::HttpModules;
use pingora_core::protocols::http::ServerSession;
use pingora_core::server::configuration::ServerConf;
use pingora_core::server::Server;
use pingora_core::services::listening::Service;
use pingora_core::upstreams::peer::HttpPeer;
use pingora_error::Result;
use pingora_proxy::{ProxyHttp, Session};
use std::net::SocketAddr;
use tollgate::config::{load, Overrides, UpstreamTimeouts};
use tollgate::pingora_patches;
use tollgate::proxy::peer;
use tollgate::server::{pingora_conf, pingora_process_settings, server_options};

struct Bare {
    upstream: SocketAddr,
    /// The upstream's timeouts, or `None` for Pingora's defaults (`--no-peer-timeouts`).
    timeouts: Option<UpstreamTimeouts>,
    /// `server.preserve_header_case`, for the response heads.
    preserve_header_case: bool,
}

#[async_trait]
impl ProxyHttp for Bare {
    type CTX = ();

    fn new_ctx(&self) {}

    /// As tollgate: no downstream modules (Pingora's default is a compression module,
    /// switched off).
    fn init_downstream_modules(&self, _modules: &mut HttpModules) {}

    async fn upstream_peer(&self, _session: &mut Session, _ctx: &mut ()) -> Result<Box<HttpPeer>> {
        Ok(Box::new(match &self.timeouts {
            Some(t) => peer(self.upstream, t, self.preserve_header_case),
            None => {
                let mut peer = HttpPeer::new(self.upstream, false, String::new());
                pingora_patches::peer_header_case(&mut peer.options, self.preserve_header_case);
                peer
            }
        }))
    }
}

/// `/healthz` (anything, in fact) answers 200, so the load tests can wait for it.
struct Health;

#[async_trait]
impl ServeHttp for Health {
    async fn response(&self, _session: &mut ServerSession) -> Response<Vec<u8>> {
        Response::builder()
            .status(200)
            .header("content-length", 2)
            .body(b"ok".to_vec())
            .expect("a response")
    }
}

fn flag(args: &[String], names: &[&str]) -> Option<String> {
    args.windows(2)
        .find(|w| names.contains(&w[0].as_str()))
        .map(|w| w[1].clone())
}

/// The allocator, as a measured choice (`loadtest/log/2026-11-24-mimalloc.md`): built with
/// `--features mimalloc`, every allocation goes to mimalloc instead of glibc's malloc.
#[cfg(feature = "mimalloc")]
#[allow(unsafe_code)] // a `GlobalAlloc` is an unsafe trait: tollgate's own, the same file
#[path = "../src/alloc.rs"]
mod alloc;

#[cfg(feature = "mimalloc")]
#[global_allocator]
static ALLOCATOR: alloc::MiMalloc = alloc::MiMalloc;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let usage =
        "usage: bare_pingora -c CONFIG --listen ADDR --admin-listen ADDR [--no-peer-timeouts]";
    let config = PathBuf::from(flag(&args, &["-c", "--config"]).expect(usage));
    let overrides = Overrides {
        listen: flag(&args, &["--listen"]),
        admin_listen: flag(&args, &["--admin-listen"]),
        ..Overrides::default()
    };
    let cfg = load(&config, &overrides).unwrap_or_else(|e| panic!("{e}"));
    let s = &cfg.startup.server;
    let upstream = cfg.upstream(cfg.routes[0].upstream);
    let timeouts = (!args.iter().any(|a| a == "--no-peer-timeouts")).then_some(upstream.timeouts);
    let upstream = upstream.servers[0];
    let conf = ServerConf {
        grace_period_seconds: Some(0),
        graceful_shutdown_timeout_seconds: Some(1),
        ..pingora_conf(s)
    };
    pingora_process_settings();
    let mut server = Server::new_with_opt_and_conf(None, conf);
    server.bootstrap();
    let mut proxy = pingora_proxy::http_proxy_service_with_name(
        &server.configuration,
        Bare {
            upstream,
            timeouts,
            preserve_header_case: s.preserve_header_case,
        },
        "bare pingora",
    );
    proxy.app_logic_mut().expect("the proxy").server_options = Some(server_options(s));
    proxy.add_tcp(&s.listen.to_string());
    let mut admin = Service::new("bare health".to_string(), Health);
    admin.add_tcp(&s.admin_listen.to_string());
    server.add_service(proxy);
    server.add_service(admin);
    server.run_forever()
}
