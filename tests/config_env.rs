//! `${VAR}` and `${VAR:-default}` in `gateway.yaml` on the real gateway: expanded at start
//! and again on every reload; a variable that is unset and has no default stops the start
//! with an error naming the file, the variable and its line, and a reload that meets one is
//! rejected while the last good config keeps serving. (`tests/check.rs` has one fixture per
//! mistake through `tollgate check`.)
//!
//! Every limit here is a 1 h fixed window, and each test first makes sure it does not run
//! across an hour boundary.

mod common;

use std::time::Duration;

use common::clock::clear_of_window_boundary;
use common::gateway::Gateway;
use common::http::{client, get, Resp};
use common::process::{count, Proc};
use common::upstream::Upstream;
use common::wait::eventually;

const HOUR: u64 = 3600;
const APPLY_WITHIN: Duration = Duration::from_secs(5);

/// A config whose one limit, `envlimit`, has `limit` and `window` as written (with `${...}`).
fn config(up: &Upstream, limit: &str, window: &str) -> String {
    format!(
        "{}routes:\n  - {{ name: default, match: {{ path_prefix: / }}, upstream: backend }}\n\
         limits:\n  - {{ name: envlimit, key: [], algorithm: fixed_window, limit: {limit}, window: {window} }}\n",
        up.upstreams_yaml()
    )
}

/// The quota and window the response's `RateLimit-Policy` reports for `envlimit`.
fn policy(r: &Resp) -> String {
    assert_eq!(r.status, 200, "{r:#?}");
    r.header("ratelimit-policy").to_string()
}

#[tokio::test(flavor = "multi_thread")]
async fn set_and_defaulted_variables_shape_the_running_gateway() {
    clear_of_window_boundary(HOUR, 20).await;
    let up = Upstream::start().await;
    let yaml = config(&up, "${TG_TEST_LIMIT}", "${TG_TEST_UNSET_WINDOW:-1h}");
    let gw = Gateway::start_with_env(&yaml, &[("TG_TEST_LIMIT", "3")]).await;
    let r = get(&client(), &gw.url("/x"), &[]).await;
    assert_eq!(policy(&r), format!("\"envlimit\";q=3;w={HOUR}"));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_variable_unset_without_default_stops_the_start_naming_it() {
    let up = Upstream::start().await;
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("gateway.yaml");
    std::fs::write(&path, config(&up, "${TG_TEST_NOT_SET}", "1h")).expect("write");
    let mut proc = Proc::tollgate(
        "gateway",
        &["--config".into(), path.display().to_string()],
        &[],
    );
    let status = eventually("the gateway exits", Duration::from_secs(20))
        .holds(|| proc.exited())
        .await;
    assert_eq!(status.code(), Some(1), "{}", proc.output());
    assert_eq!(
        proc.output().trim_end(),
        format!(
            "{}: line 5 column 64: environment variable TG_TEST_NOT_SET is not set, and \
             ${{TG_TEST_NOT_SET}} has no default (write ${{TG_TEST_NOT_SET:-default}} to give one)",
            path.display()
        )
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn every_reload_expands_again_and_rejects_a_missing_variable() {
    clear_of_window_boundary(HOUR, 40).await;
    let up = Upstream::start().await;
    let env = [("TG_TEST_FIRST", "5"), ("TG_TEST_SECOND", "4")];
    let gw = Gateway::start_with_env(&config(&up, "${TG_TEST_FIRST}", "1h"), &env).await;
    let c = client();
    let quota = || async { policy(&get(&c, &gw.url("/x"), &[]).await) };
    let of = |q: u64| format!("\"envlimit\";q={q};w={HOUR}");
    assert_eq!(quota().await, of(5));

    // A default, then another variable of the gateway's environment read for the first time:
    // each applied by a reload. (The file watcher may apply a change before the SIGHUP does,
    // so a step ends with the SIGHUP's own log line, after which nothing else reloads.)
    for (n, (limit, q)) in [("${TG_TEST_UNSET:-7}", 7), ("${TG_TEST_SECOND}", 4)]
        .into_iter()
        .enumerate()
    {
        gw.replace_config(&config(&up, limit, "1h"));
        gw.sighup();
        eventually(format!("reload {} by SIGHUP", n + 1), APPLY_WITHIN)
            .holds(|| count(&gw.output(), "config reloaded (SIGHUP)") > n)
            .await;
        assert_eq!(quota().await, of(q), "{limit}");
    }
    let generation = gw.generation().await;

    // A variable that is not set: rejected, named with its line, and the last config stays.
    gw.replace_config(&config(&up, "${TG_TEST_MISSING}", "1h"));
    gw.sighup();
    gw.wait_output(
        "line 5 column 64: environment variable TG_TEST_MISSING is not set, and ${TG_TEST_MISSING} has no default",
        APPLY_WITHIN,
    )
    .await;
    assert!(gw.output().contains("config reload rejected (SIGHUP)"));
    assert_eq!(gw.generation().await, generation);
    assert_eq!(quota().await, of(4));
}
