//! `${VAR}` and `${VAR:-default}` in `gateway.yaml` on the real gateway: expanded at start
//! and again on every reload; a variable that is unset and has no default stops the start
//! with an error naming the file, the variable and its line, and a reload that meets one is
//! rejected while the last good config keeps serving. (`tests/check.rs` has one fixture per
//! mistake through `tollgate check`.)
//!
//! A substituted value stays one scalar (issue 39, item 7): `tollgate check` refuses, naming
//! the file, the line, the column and the variable, every value that would add structure
//! where its reference stands (each character that can, outside quotes, inside double and
//! inside single quotes, and the shipped file's two known abuses); values that cannot are
//! accepted, quoted ones holding YAML indicators reach the running config as one string,
//! and the shipped `docker/gateway.yaml` checks and runs with its variables set and unset.
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

// ---------------------------------------------------------------------------------------
// A substituted value stays one scalar (issue 39, item 7): through `tollgate check`.
// ---------------------------------------------------------------------------------------

/// `tollgate check FILE` with no `TOLLGATE_` variable but `env`: exit code, stdout + stderr.
fn check(path: &std::path::Path, env: &[(&str, &str)]) -> (Option<i32>, String) {
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_tollgate"));
    for (k, _) in std::env::vars().filter(|(k, _)| k.starts_with("TOLLGATE_")) {
        cmd.env_remove(k);
    }
    let out = cmd
        .args(["check", &path.display().to_string()])
        .envs(env.iter().copied())
        .output()
        .expect("run tollgate check");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code(), text)
}

/// Where YAML reads a reference: outside quotes, or inside double or single quotes.
#[derive(Clone, Copy)]
enum Place {
    Plain,
    Double,
    Single,
}

/// The error `check` prints for `name`, whose value holds `what`, at `line`/`column`.
fn refused(
    file: &str,
    (line, column): (usize, usize),
    name: &str,
    what: &str,
    place: Place,
) -> String {
    let (place, hint) = match place {
        Place::Plain => (
            "outside quotes",
            format!(" (quoted, as \"${{{name}}}\", a string may hold spaces and , # : [ ] {{ }})"),
        ),
        Place::Double => ("inside double quotes", String::new()),
        Place::Single => ("inside single quotes", String::new()),
    };
    format!(
        "{file}: line {line} column {column}: environment variable {name} holds {what}, which \
         would add YAML structure where ${{{name}}} stands ({place}): a value must stay one \
         scalar{hint}\n"
    )
}

/// The line and column (1-based) of the first `${name` in `text`.
fn position(text: &str, name: &str) -> (usize, usize) {
    let needle = format!("${{{name}");
    text.lines()
        .enumerate()
        .find_map(|(i, l)| l.find(&needle).map(|c| (i + 1, c + 1)))
        .unwrap_or_else(|| panic!("{needle} not in the file"))
}

/// A valid file with `TG_V` in each kind of place: a number outside quotes in a flow mapping
/// (line 5), a block sequence entry (line 8), inside double quotes (line 9) and inside single
/// quotes (line 10). `at` keeps one reference and gives the others a value.
fn places_yaml(at: &str) -> String {
    let keep = |p: &str, other: &str| {
        if p == at {
            "${TG_V}".to_string()
        } else {
            other.to_string()
        }
    };
    format!(
        "upstreams: {{ backend: [\"127.0.0.1:9000\"] }}\n\
         routes:\n  - {{ name: default, match: {{ path_prefix: / }}, upstream: backend }}\n\
         limits:\n  - {{ name: l, key: [], algorithm: fixed_window, limit: {}, window: 1m }}\n\
         identity:\n  trusted_proxies:\n    - {}\n    - \"{}\"\n  api_key_header: '{}'\n",
        keep("plain", "10"),
        keep("item", "10.0.0.1/32"),
        keep("double", "10.0.0.2/32"),
        keep("single", "x-api-key"),
    )
}

#[test]
fn a_value_that_would_add_structure_is_refused_naming_the_variable() {
    let dir = tempfile::tempdir().expect("temp dir");
    let nl = "a line break or another control character";
    let cases: &[(&str, &str, &str, Place)] = &[
        // Outside quotes, in `{ limit: ${TG_V}, window: 1m }`.
        ("plain", "100\nshadow: true", nl, Place::Plain),
        ("plain", "100, shadow: true", "','", Place::Plain),
        ("plain", "100 # shadow", "'#'", Place::Plain),
        ("plain", "100\"", "a double quote", Place::Plain),
        ("plain", "100'", "a single quote", Place::Plain),
        ("plain", "[100]", "'['", Place::Plain),
        ("plain", "100]", "']'", Place::Plain),
        ("plain", "{100", "'{'", Place::Plain),
        ("plain", "100}", "'}'", Place::Plain),
        ("plain", "x: 100", "': '", Place::Plain),
        ("plain", "x:", "':' at its end", Place::Plain),
        ("plain", " 100", "a space at its start or end", Place::Plain),
        ("plain", "100 ", "a space at its start or end", Place::Plain),
        ("plain", "&a 100", "'&' at its start", Place::Plain),
        ("plain", "*a", "'*' at its start", Place::Plain),
        ("plain", "!!str 100", "'!' at its start", Place::Plain),
        ("plain", "|", "'|' at its start", Place::Plain),
        ("plain", ">", "'>' at its start", Place::Plain),
        ("plain", "%100", "'%' at its start", Place::Plain),
        ("plain", "@100", "'@' at its start", Place::Plain),
        ("plain", "`100", "'`' at its start", Place::Plain),
        // A block sequence entry: `    - ${TG_V}`.
        ("item", "- 0.0.0.0/0", "'-' at its start", Place::Plain),
        ("item", "? 0.0.0.0/0", "'?' at its start", Place::Plain),
        // Inside double quotes: `    - "${TG_V}"`.
        (
            "double",
            "10.0.0.1/32\", \"0.0.0.0/0",
            "a double quote",
            Place::Double,
        ),
        ("double", "10.0.0.1/32\\", "a backslash", Place::Double),
        ("double", "10.0.0.1/32\n", nl, Place::Double),
        // Inside single quotes: `'${TG_V}'`.
        ("single", "x', 'y", "a single quote", Place::Single),
    ];
    for &(at, value, what, place) in cases {
        let path = dir.path().join("places.yaml");
        let yaml = places_yaml(at);
        std::fs::write(&path, &yaml).expect("write");
        let file = path.display().to_string();
        let want = refused(&file, position(&yaml, "TG_V"), "TG_V", what, place);
        assert_eq!(
            check(&path, &[("TG_V", value)]),
            (Some(1), want),
            "{at}: {value:?}"
        );
    }
}

#[test]
fn values_that_stay_one_scalar_check_ok_in_every_place() {
    let dir = tempfile::tempdir().expect("temp dir");
    for (at, value) in [
        ("plain", "100"),
        ("item", "10.0.0.0/8"),
        ("double", "10.0.0.0/8"),
        ("single", "x-key"),
    ] {
        let path = dir.path().join("places.yaml");
        std::fs::write(&path, places_yaml(at)).expect("write");
        assert_eq!(
            check(&path, &[("TG_V", value)]),
            (Some(0), "ok\n".to_string()),
            "{at}: {value:?}"
        );
    }
}

/// The shipped `docker/gateway.yaml`.
fn shipped() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("docker/gateway.yaml")
}

#[test]
fn the_shipped_file_refuses_the_values_that_widened_trust_or_dropped_a_limit() {
    let path = shipped();
    let text = std::fs::read_to_string(&path).expect("read docker/gateway.yaml");
    let file = path.display().to_string();
    for (name, value, what, place) in [
        (
            "TOLLGATE_TRUSTED_PROXY",
            "10.0.0.1/32\", \"0.0.0.0/0",
            "a double quote",
            Place::Double,
        ),
        (
            "TOLLGATE_FREE_LIMIT",
            "100, shadow: true",
            "','",
            Place::Plain,
        ),
    ] {
        let want = refused(&file, position(&text, name), name, what, place);
        assert_eq!(check(&path, &[(name, value)]), (Some(1), want), "{name}");
    }
}

/// Every variable of the shipped file set as docker/compose.yaml and docker/fleet.sh set them
/// (and a few more).
const SHIPPED_ENV: &[(&str, &str)] = &[
    ("TOLLGATE_LISTEN", "127.0.0.1:18080"),
    ("TOLLGATE_ADMIN_LISTEN", "127.0.0.1:19901"),
    ("TOLLGATE_THREADS", "1"),
    ("TOLLGATE_GRACE_PERIOD", "2s"),
    ("TOLLGATE_DRAIN_PERIOD", "1s"),
    ("TOLLGATE_STORE_TIMEOUT", "50ms"),
    ("TOLLGATE_ON_ERROR", "allow"),
    ("TOLLGATE_LOCAL_SHARE", "0.5"),
    ("TOLLGATE_TRUSTED_PROXY", "172.28.0.0/16"),
    ("TOLLGATE_FREE_LIMIT", "7"),
    ("TOLLGATE_FREE_WINDOW", "1h"),
    ("TOLLGATE_ANONYMOUS_LIMIT", "50"),
    ("TOLLGATE_MAX_IN_FLIGHT", "256"),
];

#[test]
fn the_shipped_file_checks_ok_with_its_variables_set_and_unset() {
    let path = shipped();
    assert_eq!(check(&path, &[]), (Some(0), "ok\n".to_string()), "unset");
    let mut env = SHIPPED_ENV.to_vec();
    env.push(("TOLLGATE_UPSTREAM", "127.0.0.1:9000"));
    env.push(("TOLLGATE_UPGRADE_SOCK", "/tmp/tollgate-check.sock"));
    assert_eq!(check(&path, &env), (Some(0), "ok\n".to_string()), "set");
}

#[tokio::test(flavor = "multi_thread")]
async fn the_shipped_file_runs_with_its_variables_set() {
    clear_of_window_boundary(HOUR, 20).await;
    let up = Upstream::start().await;
    let text = std::fs::read_to_string(shipped()).expect("read docker/gateway.yaml");
    let sock = tempfile::tempdir().expect("temp dir");
    let sock = sock.path().join("upgrade.sock").display().to_string();
    let upstream = up.addr.to_string();
    let mut env = SHIPPED_ENV.to_vec();
    env.push(("TOLLGATE_UPSTREAM", &upstream));
    env.push(("TOLLGATE_UPGRADE_SOCK", &sock));
    let gw = Gateway::start_with_env(&text, &env).await;
    let r = get(&client(), &gw.url("/x"), &[("x-api-key", "demo-free")]).await;
    assert_eq!(policy(&r), format!("\"free\";q=7;w={HOUR}"));
}

#[tokio::test(flavor = "multi_thread")]
async fn quoted_values_holding_yaml_indicators_end_up_as_one_scalar() {
    let up = Upstream::start().await;
    let double = "/d,b#c: [d]{e}'f&*!|>%@`- ?";
    let single = "/s \"y\" # z, w: [v] {u} \\ - ? &*";
    let yaml = format!(
        "{}routes:\n  - {{ name: d, match: {{ path_prefix: \"${{TG_DQ}}\" }}, upstream: backend }}\n  \
         - {{ name: s, match: {{ path_prefix: '${{TG_SQ}}' }}, upstream: backend }}\n\
         admin: {{ token_env: TG_ADMIN }}\n",
        up.upstreams_yaml()
    );
    let env = [
        ("TG_DQ", double),
        ("TG_SQ", single),
        ("TG_ADMIN", "admin-token-1"),
    ];
    let gw = Gateway::start_with_env(&yaml, &env).await;
    let r = gw
        .admin_get(
            "/admin/v1/config",
            &[("authorization", "Bearer admin-token-1")],
        )
        .await;
    let mut routes: Vec<(String, String)> = r.json()["routes"]
        .as_array()
        .expect("routes")
        .iter()
        .map(|r| (r["name"].to_string(), r["path_prefix"].to_string()))
        .collect();
    routes.sort();
    let quoted = |s: &str| serde_json::Value::from(s).to_string();
    let want = vec![(quoted("d"), quoted(double)), (quoted("s"), quoted(single))];
    assert_eq!(routes, want);
}
