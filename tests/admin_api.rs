//! The admin API's small doors, against the real gateway and a real quota database (an
//! embedded SQLite file, and PostgreSQL where the database must go away): a declared body over
//! the cap is refused at once, the bearer scheme is read in any case, a reload leaves an audit
//! row, a usage reset that cannot be audited is not made, and `tollgate quotas set` takes the
//! key from standard input or an environment variable and prints labels escaped.

mod common;

use std::io::Write as _;
use std::process::{Command, Stdio};
use std::time::Duration;

use reqwest::Method;
use serde_json::{json, Value};
use tempfile::TempDir;

use common::gateway::Gateway;
use common::http::{client, get, send, Resp};
use common::postgres::Postgres;
use common::raw::RawConn;
use common::upstream::Upstream;

const TOKEN: &str = "doors-admin-token-0451";
const TOKEN_ENV: (&str, &str) = ("TG_DOORS_TOKEN", TOKEN);

/// Anonymous callers unlimited, keys in `free` (3 an hour), the quota store at `db_url`, and
/// the admin token.
fn config(up: &Upstream, db_url: &str) -> String {
    format!(
        "store: {{ backend: memory }}\n{}\
routes: [ {{ name: all, match: {{ path_prefix: / }}, upstream: backend }} ]
identity: {{ api_key_header: x-api-key }}
tiers:
  free:
    - {{ name: free-hour, algorithm: fixed_window, limit: 3, window: 1h }}
default_tier: free
quotas: {{ database: \"{db_url}\", refresh: 1s }}
admin: {{ token_env: TG_DOORS_TOKEN }}
",
        up.upstreams_yaml()
    )
}

/// A gateway on an embedded SQLite quota store in `dir`.
async fn on_sqlite(up: &Upstream, dir: &TempDir) -> Gateway {
    let url = format!("sqlite://{}", dir.path().join("quotas.db").display());
    Gateway::start_with_env(&config(up, &url), &[TOKEN_ENV]).await
}

async fn admin(gw: &Gateway, method: Method, path: &str, auth: &str, body: Option<Value>) -> Resp {
    send(
        &client(),
        method,
        &format!("http://{}{path}", gw.admin),
        &[
            ("authorization", auth),
            ("content-type", "application/json"),
        ],
        body.map(|b| b.to_string().into_bytes()),
    )
    .await
}

fn bearer() -> String {
    format!("Bearer {TOKEN}")
}

async fn audit(gw: &Gateway) -> Vec<Value> {
    let r = admin(gw, Method::GET, "/admin/v1/audit", &bearer(), None).await;
    assert_eq!(r.status.as_u16(), 200, "{}", r.text());
    r.json()["entries"].as_array().cloned().unwrap_or_default()
}

/// Requests with `key` until one is refused: how many were admitted (at most 10).
async fn admitted(gw: &Gateway, key: &str) -> usize {
    let c = client();
    for n in 0..10 {
        let r = get(&c, &gw.url("/x"), &[("x-api-key", key)]).await;
        match r.status.as_u16() {
            200 => {}
            429 => return n,
            s => panic!("{key}: {s} {}", r.text()),
        }
    }
    10
}

/// A `Content-Length` far over the 64 KiB cap, with no body sent: the answer is 413 without
/// waiting for the body (today it came after the 60 s body timeout), and the connection is
/// closed rather than the body drained. The login form has its own, smaller cap.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_declared_body_over_the_cap_gets_413_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let up = Upstream::start().await;
    let gw = on_sqlite(&up, &dir).await;
    for (path, auth) in [
        (
            "PUT /admin/v1/quotas/big-key-1",
            format!("Authorization: {}\r\n", bearer()),
        ),
        ("POST /login", String::new()),
    ] {
        let mut conn = RawConn::connect(gw.admin).await;
        let head = format!(
            "{path} HTTP/1.1\r\nHost: 127.0.0.1\r\n{auth}Content-Type: application/json\r\nContent-Length: 10000000000\r\n\r\n"
        );
        conn.send(head.as_bytes()).await.unwrap();
        // read_response gives up (and fails the test) after 10 s without an answer.
        let r = conn
            .read_response()
            .await
            .expect("an answer before the body");
        let body = r.problem(413);
        assert_eq!(body["field"], "body", "{path}: {body}");
        assert!(
            conn.wait_closed(Duration::from_secs(5)).await.is_some(),
            "{path}: the connection stays open, waiting for 10 GB"
        );
    }
    // Within the cap, a body still works.
    let r = admin(
        &gw,
        Method::PUT,
        "/admin/v1/quotas/big-key-1",
        &bearer(),
        Some(json!({"label": "fits"})),
    )
    .await;
    assert_eq!(r.status.as_u16(), 201, "{}", r.text());
}

/// RFC 9110 §11.1: the authentication scheme is case-insensitive.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_bearer_scheme_is_accepted_in_any_case() {
    let dir = tempfile::tempdir().unwrap();
    let up = Upstream::start().await;
    let gw = on_sqlite(&up, &dir).await;
    for scheme in ["Bearer", "bearer", "BEARER", "bEaReR"] {
        let auth = format!("{scheme} {TOKEN}");
        let r = admin(&gw, Method::GET, "/admin/v1/quotas", &auth, None).await;
        assert_eq!(r.status.as_u16(), 200, "{scheme}: {}", r.text());
        let r = gw.admin_get("/stats", &[("authorization", &auth)]).await;
        assert_eq!(r.status.as_u16(), 200, "{scheme}");
    }
    let r = admin(&gw, Method::GET, "/admin/v1/quotas", "Basic xyz", None).await;
    assert_eq!(r.status.as_u16(), 401, "{}", r.text());
}

/// A reload is a change of every tenant's limits at once: it leaves an audit row with the
/// generation before and after and who asked, and so does a refused one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_writes_an_audit_row() {
    let dir = tempfile::tempdir().unwrap();
    let up = Upstream::start().await;
    let gw = on_sqlite(&up, &dir).await;
    assert_eq!(audit(&gw).await, Vec::<Value>::new());
    let r = admin(&gw, Method::POST, "/admin/v1/reload", &bearer(), None).await;
    assert_eq!(r.status.as_u16(), 200, "{}", r.text());
    let answer = r.json();
    assert_eq!(answer["audited"], true, "{answer}");
    let generation = answer["config_generation"].as_u64().unwrap();
    let rows = audit(&gw).await;
    assert_eq!(rows.len(), 1, "{rows:?}");
    let row = &rows[0];
    assert_eq!(row["action"], "reload", "{row}");
    assert_eq!(row["key"], Value::Null, "{row}");
    assert_eq!(row["before"]["config_generation"], generation - 1, "{row}");
    assert_eq!(row["after"]["config_generation"], generation, "{row}");
    assert!(
        row["client"].as_str().unwrap().starts_with("127.0.0.1:"),
        "{row}"
    );

    // A file that does not validate: 400, the old config serves, and the attempt is audited.
    let good = std::fs::read_to_string(gw.config_path()).unwrap();
    std::fs::write(gw.config_path(), good.replace("limit: 3", "limit: 0")).unwrap();
    let r = admin(&gw, Method::POST, "/admin/v1/reload", &bearer(), None).await;
    assert_eq!(r.status.as_u16(), 400, "{}", r.text());
    assert_eq!(r.json()["audited"], true);
    let rows = audit(&gw).await;
    assert_eq!(rows.len(), 2, "{rows:?}");
    assert_eq!(rows[0]["action"], "reload_refused", "{rows:?}");
    assert_eq!(rows[0]["after"]["errors"], 1, "{rows:?}");
    assert_eq!(
        rows[0]["after"]["config_generation"], generation,
        "{rows:?}"
    );
}

/// With PostgreSQL stopped, a usage reset cannot be audited: 503, and the counters are
/// untouched. Once it is back, the reset is made and audited.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_usage_reset_that_cannot_be_audited_is_refused_with_503() {
    let mut pg = Postgres::start();
    let up = Upstream::start().await;
    let gw = Gateway::start_with_env(&config(&up, &pg.url()), &[TOKEN_ENV]).await;
    let key = "reset-key-7c1d";
    assert_eq!(admitted(&gw, key).await, 3);
    let reset = format!("/admin/v1/usage/{key}/reset");

    pg.stop();
    let r = admin(&gw, Method::POST, &reset, &bearer(), None).await;
    assert_eq!(r.status.as_u16(), 503, "{}", r.text());
    let detail = r.json()["detail"].as_str().unwrap().to_string();
    assert!(detail.contains("audit log"), "{detail}");
    assert_eq!(
        admitted(&gw, key).await,
        0,
        "the counters were reset anyway"
    );

    pg.start_again();
    let auth = bearer();
    let r = common::wait::eventually(
        "the reset succeeds once PostgreSQL is back",
        Duration::from_secs(15),
    )
    .holds_on(
        || admin(&gw, Method::POST, &reset, &auth, None),
        |r| r.status.as_u16() == 200,
    )
    .await;
    assert_eq!(r.json()["reset"], true);
    assert_eq!(admitted(&gw, key).await, 3);
    let rows = audit(&gw).await;
    let resets: Vec<&Value> = rows.iter().filter(|r| r["action"] == "reset").collect();
    assert_eq!(resets.len(), 1, "{rows:?}");
}

/// `tollgate quotas` with `args`, `env` and `stdin`: exit code, stdout, stderr.
fn cli(args: &[&str], env: &[(&str, &str)], stdin: &[u8]) -> (i32, String, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .arg("quotas")
        .args(args)
        .envs(env.iter().copied())
        .env_remove("TOLLGATE_CONFIG")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run tollgate quotas");
    child.stdin.take().unwrap().write_all(stdin).unwrap();
    let out = child.wait_with_output().expect("tollgate quotas output");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `set --key-stdin` and `set --key-env NAME` make the same override as `set KEY`, without the
/// key on the command line; a label with terminal escapes and line breaks prints escaped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quotas_set_takes_the_key_from_stdin_or_a_variable_and_tables_escape_labels() {
    let dir = tempfile::tempdir().unwrap();
    let up = Upstream::start().await;
    let gw = on_sqlite(&up, &dir).await;
    let url = format!("http://{}", gw.admin);
    let base = ["--admin-url", url.as_str(), "--token-env", TOKEN_ENV.0];
    let run = |extra: &[&str], env: &[(&str, &str)], stdin: &[u8]| {
        let mut args = base.to_vec();
        args.extend_from_slice(extra);
        let mut all_env = vec![TOKEN_ENV];
        all_env.extend_from_slice(env);
        cli(&args, &all_env, stdin)
    };
    let (stdin_key, env_key) = ("sk_stdin_9f8e7d", "sk_env_6c5b4a");
    let label = "acme\u{1b}[31m red\nfp:00000000 forged";
    let (code, out, err) = run(
        &["set", "--key-stdin", "--label", label],
        &[],
        format!("{stdin_key}\n").as_bytes(),
    );
    assert_eq!(code, 0, "{out}{err}");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 2, "one header and one row: {out:?}");
    assert!(!out.contains('\u{1b}'), "{out:?}");
    assert!(
        lines[1].contains(r"acme\u{1b}[31m red\nfp:00000000 forged"),
        "{out:?}"
    );
    let (code, out, err) = run(
        &["set", "--key-env", "MY_TENANT_KEY", "--status", "disabled"],
        &[("MY_TENANT_KEY", env_key)],
        b"",
    );
    assert_eq!(code, 0, "{out}{err}");
    for (key, want) in [(stdin_key, "active"), (env_key, "disabled")] {
        let r = admin(
            &gw,
            Method::GET,
            &format!("/admin/v1/quotas/{key}"),
            &bearer(),
            None,
        )
        .await;
        assert_eq!(r.status.as_u16(), 200, "{key}: {}", r.text());
        assert_eq!(r.json()["status"], want, "{key}");
    }
    // The list prints the label escaped too.
    let (code, out, _) = run(&["list"], &[], b"");
    assert_eq!(code, 0);
    assert_eq!(out.lines().count(), 3, "{out:?}");
    assert!(!out.contains('\u{1b}'), "{out:?}");
    // Mistakes are usage errors (exit 2) naming what is wrong.
    let (code, _, err) = run(
        &["set", "--key-env", "NOT_SET_ANYWHERE", "--tier", "free"],
        &[],
        b"",
    );
    assert_eq!(
        (code, err.trim()),
        (
            2,
            "tollgate quotas: --key-env: the variable NOT_SET_ANYWHERE is not set"
        )
    );
    let (code, _, err) = run(&["set", "--key-stdin", "--tier", "free"], &[], b"\n");
    assert_eq!(
        (code, err.trim()),
        (
            2,
            "tollgate quotas: --key-stdin: standard input holds an empty key"
        )
    );
    let (code, _, err) = run(&["set", "k", "--key-stdin", "--tier", "free"], &[], b"x\n");
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("cannot be used with"), "{err}");
    assert!(!gw.output().contains(stdin_key) && !gw.output().contains(env_key));
}
