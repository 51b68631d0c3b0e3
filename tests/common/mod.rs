//! The shared harness of the integration tests: real processes on loopback, driven over HTTP
//! and raw sockets, with faults injected for real. One module per job:
//!
//! - [`process`]: `Proc`, a child process killed by PID when dropped (also when a test
//!   panics, and then its output is printed); free loopback ports, and `on_free_ports` to
//!   retry a start whose port was taken in the meantime.
//! - [`wait`]: `eventually`, the one bounded poll loop.
//! - [`http`]: reqwest clients, `Resp`, `send` / `get` / `get_json`.
//! - [`upstream`]: the demo `Upstream`; [`gateway`]: the `Gateway` under test.
//! - [`raw`]: HTTP/1.1 by hand (`RawConn`) and simultaneous bursts of it (`raw_burst`).
//! - [`load`]: the one load generator, `Load`: bursts, and `Driver`s in the background.
//! - [`faults`]: signals, a latency-injecting TCP proxy, libfaketime.
//! - [`redis`]: real `redis-server` processes: single, cluster, sentinel.
//! - [`postgres`]: a real PostgreSQL server (`initdb` + `postgres`) for the quota store.
//! - [`fleet`]: `docker/fleet.sh`: HAProxy, two gateways, Redis and the upstream on loopback;
//!   [`haproxy`]: `haproxy -c` and the balancer's view of its servers.
//! - [`scrape`]: `/metrics` parsed by a real exposition-format parser, and `promtool`.
//! - [`prometheus`]: a real Prometheus server scraping gateways, queried with PromQL.
//! - [`browser`]: headless Chromium: a page's DOM after its scripts ran, screenshots.
//! - [`clock`]: the wall clock and fixed-window boundaries.
//!
//! Every wait is bounded; nothing listens or connects outside 127.0.0.0/8. A missing program
//! fails the test and names what to install; nothing is skipped.
//!
//! Test files import from the module that does the job (`use common::redis::RedisServer;`),
//! so a reader sees where each helper lives.
#![allow(dead_code)] // Each test binary uses a different part of the harness.

pub mod browser;
pub mod clock;
pub mod faults;
pub mod fleet;
pub mod gateway;
pub mod haproxy;
pub mod http;
pub mod load;
pub mod postgres;
pub mod process;
pub mod prometheus;
pub mod raw;
pub mod redis;
pub mod scrape;
pub mod upstream;
pub mod wait;
