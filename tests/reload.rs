//! Hot reload of the real gateway: by SIGHUP, by rewriting the file, a bad file that is
//! rejected while the old config keeps serving, and counters that survive a reload.
//!
//! The gateway polls its file every second and also reloads on SIGHUP, so a test that sends
//! SIGHUP cannot tell from the headers alone which of the two applied the change; it checks
//! the gateway's log line `config reloaded (SIGHUP)` as well. Every limit is a 1 h
//! `fixed_window`, and each test first makes sure it does not run across an hour boundary.

mod common;

use std::time::{Duration, Instant};

use common::clock::clear_of_window_boundary;
use common::gateway::{path_of, Gateway};
use common::http::{client, get, Resp};
use common::process::count;
use common::upstream::Upstream;
use reqwest::StatusCode;

const HOUR: u64 = 3600;
/// The spec: changes apply within 5 s.
const APPLY_WITHIN: Duration = Duration::from_secs(5);

/// A config with one catch-all route and the given `limits:` items.
fn config(up: &Upstream, limits: &[&str]) -> String {
    let mut s = format!(
        "{}routes:\n  - {{ name: default, match: {{ path_prefix: / }}, upstream: backend }}\n",
        up.upstreams_yaml()
    );
    if !limits.is_empty() {
        s.push_str("limits:\n");
        for l in limits {
            s.push_str(&format!("  - {l}\n"));
        }
    }
    s
}

fn hourly(name: &str, limit: u64) -> String {
    format!("{{ name: {name}, key: [], algorithm: fixed_window, limit: {limit}, window: 1h }}")
}

/// Assert an admitted response reports `name` with quota `q` and `remaining`.
fn assert_policy(r: &Resp, name: &str, q: u64, remaining: u64) {
    assert_eq!(r.status, StatusCode::OK, "{r:#?}");
    assert_eq!(
        r.header("ratelimit-policy"),
        format!("\"{name}\";q={q};w={HOUR}")
    );
    assert!(
        r.header("ratelimit")
            .starts_with(&format!("\"{name}\";r={remaining};t=")),
        "{:?}",
        r.header("ratelimit")
    );
    assert_eq!(r.header_u64("x-ratelimit-limit"), q);
    assert_eq!(r.header_u64("x-ratelimit-remaining"), remaining);
}

#[tokio::test(flavor = "multi_thread")]
async fn sighup_applies_a_changed_limit() {
    clear_of_window_boundary(HOUR, 20).await;
    let up = Upstream::start().await;
    let gw = Gateway::start(&config(&up, &[&hourly("hourly", 10)])).await;
    let c = client();
    let url = gw.url("/x");
    assert_policy(&get(&c, &url, &[]).await, "hourly", 10, 9);
    assert_eq!(gw.generation().await, 0);

    // A new limit next to the old one (a lower quota, so it is the one reported).
    gw.replace_config(&config(&up, &[&hourly("hourly", 10), &hourly("tight", 4)]));
    gw.sighup();
    let took = gw.wait_generation(1, APPLY_WITHIN).await;
    gw.wait_output("config reloaded (SIGHUP)", APPLY_WITHIN)
        .await;
    assert!(took <= APPLY_WITHIN);
    // tight: 4 − 1 = 3 left; hourly: 10 − 2 = 8.
    assert_policy(&get(&c, &url, &[]).await, "tight", 4, 3);
    assert_policy(&get(&c, &url, &[]).await, "tight", 4, 2);

    // SIGHUP with the file unchanged reloads it again and changes nothing.
    let gen = gw.generation().await;
    gw.sighup();
    gw.wait_generation(gen + 1, APPLY_WITHIN).await;
    assert_policy(&get(&c, &url, &[]).await, "tight", 4, 1);
    assert_eq!(count(&gw.output(), "config reloaded (SIGHUP)"), 2);
    assert!(!gw.output().contains("rejected"), "{}", gw.output());
    assert_eq!(up.requests().await, 4);
}

#[tokio::test(flavor = "multi_thread")]
async fn rewriting_the_file_applies_within_5_seconds_without_a_signal() {
    clear_of_window_boundary(HOUR, 20).await;
    let up = Upstream::start().await;
    let gw = Gateway::start(&config(&up, &[&hourly("hourly", 10)])).await;
    let c = client();
    let url = gw.url("/x");
    assert_policy(&get(&c, &url, &[]).await, "hourly", 10, 9);

    // Rewritten in place, as an editor saving it would; no signal.
    let written = Instant::now();
    gw.rewrite_config(&config(&up, &[&hourly("hourly-v2", 3)]));
    gw.wait_generation(1, APPLY_WITHIN).await;
    let took = written.elapsed();
    assert!(took <= APPLY_WITHIN, "applied after {took:?}");
    gw.wait_output("config reloaded (file changed)", APPLY_WITHIN)
        .await;
    // The old limit is gone; the new one starts from zero.
    assert_policy(&get(&c, &url, &[]).await, "hourly-v2", 3, 2);
    assert_policy(&get(&c, &url, &[]).await, "hourly-v2", 3, 1);
    assert_policy(&get(&c, &url, &[]).await, "hourly-v2", 3, 0);
    let r = get(&c, &url, &[]).await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(r.json()["policy"], "hourly-v2");
    assert!(!gw.output().contains("SIGHUP"));
    assert_eq!(up.requests().await, 4);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_bad_file_is_rejected_and_the_last_good_config_keeps_serving() {
    clear_of_window_boundary(HOUR, 20).await;
    let up = Upstream::start().await;
    let good = config(&up, &[&hourly("hourly", 10)]);
    let gw = Gateway::start(&good).await;
    let path = path_of(&gw.config_path());
    let c = client();
    let url = gw.url("/x");
    assert_policy(&get(&c, &url, &[]).await, "hourly", 10, 9);

    // 1. A YAML syntax error, picked up by the file watcher.
    gw.replace_config(&format!(
        "{}limits:\n  - {{ name: hourly, limit: 5\n",
        config(&up, &[])
    ));
    gw.wait_output("config reload rejected (file changed)", APPLY_WITHIN)
        .await;
    let out = gw.output();
    assert!(
        out.contains(&format!("{path}: line ")) && out.contains("invalid YAML"),
        "the error names the file and the line: {out}"
    );
    assert_policy(&get(&c, &url, &[]).await, "hourly", 10, 8);

    // 2. A semantic error, on SIGHUP: the message names the file and the field.
    gw.replace_config(&config(
        &up,
        &["{ name: hourly, key: [], algorithm: fixed_window, limit: 20, window: 1x }"],
    ));
    gw.sighup();
    let expected = format!(
        "{path}: limits[0].window: \"1x\" is not a duration (examples: 500ms, 30s, 1m, 1h, 1d)"
    );
    gw.wait_output(&expected, APPLY_WITHIN).await;
    assert!(
        gw.output().contains("config reload rejected"),
        "{}",
        gw.output()
    );
    // Still the old config, and its counter: 10 − 3 = 7.
    assert_policy(&get(&c, &url, &[]).await, "hourly", 10, 7);
    // An undefined upstream and a zero limit: every error is reported.
    gw.replace_config(&format!(
        "{}routes:\n  - {{ name: default, match: {{ path_prefix: / }}, upstream: nowhere }}\nlimits:\n  - {{ name: hourly, key: [], algorithm: fixed_window, limit: 0, window: 1h }}\n",
        up.upstreams_yaml()
    ));
    gw.wait_output(
        &format!("{path}: routes[0].upstream: upstream \"nowhere\" is not defined under upstreams"),
        APPLY_WITHIN,
    )
    .await;
    gw.wait_output(
        &format!("{path}: limits[0].limit: must be at least 1"),
        APPLY_WITHIN,
    )
    .await;
    assert_policy(&get(&c, &url, &[]).await, "hourly", 10, 6);
    assert_eq!(gw.generation().await, 0, "no bad file was applied");
    // The gateway kept running and answering its health checks.
    assert_eq!(gw.readyz().await["status"], "ready");

    // A good file after the bad ones is applied, and the counter of `hourly` survives.
    gw.replace_config(&config(&up, &[&hourly("hourly", 12)]));
    gw.wait_generation(1, APPLY_WITHIN).await;
    assert_policy(&get(&c, &url, &[]).await, "hourly", 12, 7);
    assert_eq!(up.requests().await, 5);
}

#[tokio::test(flavor = "multi_thread")]
async fn counters_of_limits_that_keep_their_name_survive_a_reload() {
    clear_of_window_boundary(HOUR, 20).await;
    let up = Upstream::start().await;
    let per_key = |name: &str, limit: u64, algorithm: &str| {
        format!("{{ name: {name}, key: [api_key], algorithm: {algorithm}, limit: {limit}, window: 1h }}")
    };
    let v1 = config(
        &up,
        &[
            &per_key("keep", 10, "fixed_window"),
            &per_key("keep-log", 8, "sliding_log"),
        ],
    );
    let gw = Gateway::start(&v1).await;
    let c = client();
    let url = gw.url("/x");
    let a = [("x-api-key", "a")];
    let b = [("x-api-key", "b")];
    // a: 4 requests (keep-log is the tighter one: 8 − 4 = 4 left); b: 1 request.
    for remaining in [7, 6, 5, 4] {
        assert_policy(&get(&c, &url, &a).await, "keep-log", 8, remaining);
    }
    assert_policy(&get(&c, &url, &b).await, "keep-log", 8, 7);

    // v2: `keep` gets a lower limit under the same name; `keep-log` is renamed.
    gw.replace_config(&config(
        &up,
        &[
            &per_key("keep", 7, "fixed_window"),
            &per_key("renamed-log", 8, "sliding_log"),
        ],
    ));
    gw.sighup();
    gw.wait_generation(1, APPLY_WITHIN).await;
    // a: keep has counted 4, so 7 − 5 = 2 left (it is now the tighter one); the renamed
    // limit is a new counter: 8 − 1 = 7.
    assert_policy(&get(&c, &url, &a).await, "keep", 7, 2);
    assert_policy(&get(&c, &url, &a).await, "keep", 7, 1);
    assert_policy(&get(&c, &url, &a).await, "keep", 7, 0);
    let r = get(&c, &url, &a).await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(r.json()["policy"], "keep");
    // b: keep counted 1 → 7 − 2 = 5; renamed-log is fresh → 8 − 1 = 7, keep is tighter.
    assert_policy(&get(&c, &url, &b).await, "keep", 7, 5);
    assert_eq!(up.requests().await, 9);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_request_in_flight_finishes_on_the_config_it_started_with() {
    clear_of_window_boundary(HOUR, 20).await;
    let up = Upstream::start().await;
    let gw = Gateway::start(&config(&up, &[&hourly("old", 10)])).await;
    let c = client();
    let url = gw.url("/slow");
    // Held 3 s by the upstream.
    let slow = {
        let (c, url) = (c.clone(), url.clone());
        tokio::spawn(async move { get(&c, &url, &[("x-demo-delay-ms", "3000")]).await })
    };
    // Once the upstream holds it, the request has passed the limits on the old config.
    up.wait_stats("the slow request arrives", Duration::from_secs(5), |s| {
        s.in_flight > 0
    })
    .await;
    gw.replace_config(&config(&up, &[&hourly("new", 5)]));
    gw.sighup();
    gw.wait_generation(1, APPLY_WITHIN).await;
    assert_eq!(
        up.stats().await.in_flight,
        1,
        "reloaded while the request was held"
    );
    // A new request runs on the new config, while the old one is still in flight.
    assert_policy(&get(&c, &url, &[]).await, "new", 5, 4);
    let r = slow.await.expect("slow request");
    assert_policy(&r, "old", 10, 9);
    assert_eq!(up.requests().await, 2);
}

/// A config file rewritten in place slowly, a byte at a time (as an editor or a copy over a
/// slow disk might), is never applied half-written: while it changes, every version the
/// gateway could read differs from one read 200 ms later. Some of those versions are valid
/// configs without the limit (everything before `limits:`), which would switch it off.
#[tokio::test(flavor = "multi_thread")]
async fn a_config_rewritten_in_place_byte_by_byte_is_never_applied_half_written() {
    clear_of_window_boundary(HOUR, 40).await;
    let up = Upstream::start().await;
    let first = config(&up, &[&hourly("hourly", 1000)]);
    let gw = Gateway::start(&first).await;
    let c = client();
    let url = gw.url("/x");
    assert_policy(&get(&c, &url, &[]).await, "hourly", 1000, 999);

    let next = config(&up, &[&hourly("hourly", 1000), &hourly("tight", 4)]);
    let path = gw.config_path();
    let writer = std::thread::spawn(move || {
        use std::io::Write;
        let mut f = std::fs::File::create(&path).expect("truncate the config in place");
        for b in next.as_bytes() {
            f.write_all(&[*b]).expect("write a byte");
            f.flush().expect("flush");
            std::thread::sleep(Duration::from_millis(15));
        }
    });
    // While it is being written, every request is still limited by the old config.
    let mut during = 0;
    while !writer.is_finished() {
        let r = get(&c, &url, &[]).await;
        assert_eq!(r.status, StatusCode::OK, "{r:#?}");
        assert_eq!(
            r.header("ratelimit-policy"),
            format!("\"hourly\";q=1000;w={HOUR}"),
            "a half-written config was applied"
        );
        during += 1;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    writer.join().expect("writer");
    assert!(during > 20, "only {during} requests while writing");
    assert_eq!(
        gw.generation().await,
        0,
        "nothing was applied while the file changed"
    );
    gw.wait_generation(1, APPLY_WITHIN).await;
    assert_eq!(
        gw.generation().await,
        1,
        "applied once, when it had settled"
    );
    assert_eq!(
        count(&gw.output(), "config reload rejected"),
        0,
        "{}",
        gw.output()
    );
    let r = get(&c, &url, &[]).await;
    assert_eq!(
        r.header("ratelimit-policy"),
        format!("\"tight\";q=4;w={HOUR}")
    );
}
