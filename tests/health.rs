//! `tollgate health`, the container image's HEALTHCHECK: exit 0 when `/healthz` (or `--url`)
//! answers 200, 1 for any other status, a refused connection, or a listener that never
//! answers (within `--timeout`). Without `--url` it asks the admin listener of the config
//! (`--config`, `TOLLGATE_CONFIG`, or ./gateway.yaml), after `${VAR}` expansion, and a
//! wildcard admin address on loopback.

mod common;

use std::net::TcpListener;
use std::path::Path;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use common::gateway::Gateway;
use common::process::{free_port, BIN};
use common::upstream::Upstream;

/// `tollgate health <args>` in `dir`, with `env` and no other TOLLGATE_ variable.
fn health(dir: &Path, args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(BIN);
    for (k, _) in std::env::vars().filter(|(k, _)| k.starts_with("TOLLGATE_")) {
        cmd.env_remove(k);
    }
    cmd.arg("health")
        .args(args)
        .current_dir(dir)
        .envs(env.iter().copied())
        .output()
        .expect("run tollgate health")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Exit status and the one line health printed (stdout when healthy, stderr otherwise).
fn outcome(o: &Output) -> (Option<i32>, String) {
    let line = if o.status.success() {
        text(&o.stdout)
    } else {
        text(&o.stderr)
    };
    (o.status.code(), line.trim_end().to_string())
}

/// A gateway with one catch-all route (and its upstream, which must live as long).
async fn gateway() -> (Upstream, Gateway) {
    let up = Upstream::start().await;
    let gw = Gateway::start(&format!(
        "{}routes: [ {{ name: default, match: {{ path_prefix: / }}, upstream: backend }} ]\n",
        up.upstreams_yaml()
    ))
    .await;
    (up, gw)
}

#[tokio::test(flavor = "multi_thread")]
async fn exit_0_on_200_and_1_otherwise() {
    let (_up, gw) = gateway().await;
    let dir = tempfile::tempdir().expect("temp dir");
    let admin = gw.admin;
    let url = format!("http://{admin}/healthz");
    assert_eq!(
        outcome(&health(dir.path(), &["--url", &url], &[])),
        (Some(0), format!("healthy: GET {url}: 200"))
    );
    let missing = format!("http://{admin}/nope");
    assert_eq!(
        outcome(&health(dir.path(), &["--url", &missing], &[])),
        (Some(1), format!("unhealthy: GET {missing}: 404"))
    );
    let closed = format!("http://127.0.0.1:{}/healthz", free_port());
    let (code, line) = outcome(&health(dir.path(), &["--url", &closed], &[]));
    assert_eq!(code, Some(1));
    assert!(
        line.starts_with(&format!("unhealthy: GET {closed}: cannot connect to")),
        "{line}"
    );
}

#[test]
fn a_listener_that_never_answers_fails_within_the_timeout() {
    let silent = TcpListener::bind("127.0.0.1:0").expect("bind");
    let url = format!("http://{}/healthz", silent.local_addr().expect("addr"));
    let dir = tempfile::tempdir().expect("temp dir");
    let start = Instant::now();
    let out = health(dir.path(), &["--url", &url, "--timeout", "500ms"], &[]);
    let took = start.elapsed();
    assert_eq!(
        outcome(&out),
        (
            Some(1),
            format!("unhealthy: GET {url}: no answer within 500ms")
        )
    );
    assert!(took < Duration::from_secs(3), "took {took:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn without_url_it_asks_the_configs_admin_listener() {
    let (_up, gw) = gateway().await;
    let port = gw.admin.port().to_string();
    let dir = tempfile::tempdir().expect("temp dir");
    let healthy = format!("healthy: GET http://127.0.0.1:{port}/healthz: 200");
    // A wildcard admin address, from the environment, in a file named by --config.
    let file = dir.path().join("fleet.yaml");
    std::fs::write(
        &file,
        "server: { admin_listen: \"0.0.0.0:${TG_TEST_ADMIN_PORT}\" }\n",
    )
    .expect("write");
    let file = file.display().to_string();
    let env = [("TG_TEST_ADMIN_PORT", port.as_str())];
    assert_eq!(
        outcome(&health(dir.path(), &["--config", &file], &env)),
        (Some(0), healthy.clone())
    );
    // The same file through TOLLGATE_CONFIG, as in the image.
    let env = [("TOLLGATE_CONFIG", file.as_str()), env[0]];
    assert_eq!(
        outcome(&health(dir.path(), &[], &env)),
        (Some(0), healthy.clone())
    );
    // ./gateway.yaml when nothing names a file.
    let admin = format!("server: {{ admin_listen: \"127.0.0.1:{port}\" }}\n");
    std::fs::write(dir.path().join("gateway.yaml"), admin).expect("write");
    assert_eq!(outcome(&health(dir.path(), &[], &[])), (Some(0), healthy));
    // A variable the file needs and the environment lacks: unhealthy, and why.
    let (code, line) = outcome(&health(dir.path(), &["--config", &file], &[]));
    assert_eq!(code, Some(1));
    assert!(
        line.contains("environment variable TG_TEST_ADMIN_PORT is not set"),
        "{line}"
    );
}

#[test]
fn without_url_or_config_it_asks_the_default_admin_address() {
    let dir = tempfile::tempdir().expect("temp dir");
    let out = health(dir.path(), &["--timeout", "500ms"], &[]);
    // Whether something answers on 9901 of this machine is not ours to know; the URL is.
    let (_, line) = outcome(&out);
    assert!(line.contains("GET http://127.0.0.1:9901/healthz"), "{line}");
}
