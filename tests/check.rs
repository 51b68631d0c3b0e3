//! `tollgate check FILE` on one fixture per configuration mistake (tests/fixtures/config/),
//! asserting the exit status and the exact output: `ok` on standard output for a valid file,
//! otherwise every error on standard error, one per line, as
//! `<path as passed>: <field.path>: <message>`.

use std::path::Path;
use std::process::{Command, Output};

const FIXTURES: &str = "tests/fixtures/config";

/// Runs `tollgate check <path>` from the crate root, with a fixed environment for the JWT
/// fixtures (TOLLGATE_TEST_JWT_SECRET set, TOLLGATE_TEST_EMPTY_SECRET empty,
/// TOLLGATE_TEST_UNSET_SECRET absent) and the `${VAR}` fixtures (TOLLGATE_TEST_LIMIT=10,
/// TOLLGATE_TEST_WORD=ten, TOLLGATE_TEST_STRUCTURE="10, shadow: true",
/// TOLLGATE_TEST_UNSET_VAR absent), and no other TOLLGATE_ variable.
fn check(path: &str) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_tollgate"));
    for (k, _) in std::env::vars().filter(|(k, _)| k.starts_with("TOLLGATE_")) {
        cmd.env_remove(k);
    }
    cmd.args(["check", path])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .env("TOLLGATE_TEST_JWT_SECRET", "test-secret")
        .env("TOLLGATE_TEST_EMPTY_SECRET", "")
        .env("TOLLGATE_TEST_LIMIT", "10")
        .env("TOLLGATE_TEST_WORD", "ten")
        .env("TOLLGATE_TEST_STRUCTURE", "10, shadow: true")
        .output()
        .expect("run tollgate check")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// `path` checks ok: exit 0 and stdout exactly "ok\n".
fn assert_ok(path: &str) {
    let out = check(path);
    assert_eq!(
        text(&out.stdout),
        "ok\n",
        "stdout of `tollgate check {path}` (stderr: {})",
        text(&out.stderr)
    );
    assert_eq!(
        out.status.code(),
        Some(0),
        "exit status of `tollgate check {path}`"
    );
}

/// `path` fails with exactly these errors, in this order, on standard error (standard output
/// stays empty); each is `field.path: message` and gets the path as passed on the command line
/// in front.
fn assert_errors(path: &str, errors: &[&str]) {
    let out = check(path);
    let expected: String = errors.iter().map(|e| format!("{path}: {e}\n")).collect();
    assert_eq!(
        text(&out.stderr),
        expected,
        "stderr of `tollgate check {path}` (stdout: {})",
        text(&out.stdout)
    );
    assert_eq!(text(&out.stdout), "", "stdout of `tollgate check {path}`");
    assert_eq!(
        out.status.code(),
        Some(1),
        "exit status of `tollgate check {path}`"
    );
}

/// One `#[test]` per fixture: `test_name => "file.yaml": [error lines without the path]`.
macro_rules! fixtures {
    ($($test:ident => $file:literal: [$($error:expr),* $(,)?]),* $(,)?) => {
        /// Every fixture with errors that has a test below.
        const ERROR_FIXTURES: &[&str] = &[$($file),*];
        $(
            #[test]
            fn $test() {
                assert_errors(&format!("{FIXTURES}/{}", $file), &[$($error),*]);
            }
        )*
    };
}

fixtures! {
    unknown_section => "unknown-section.yaml": [
        "limit: unknown section, expected one of server, store, identity, tiers, api_keys, default_tier, upstreams, routes, limits, shedding, headers, quotas, access_log, admin",
    ],
    misspelled_limit_key => "misspelled-limit-key.yaml": [
        "limits[0].limt: unknown field `limt`, expected one of `name`, `kind`, `key`, `algorithm`, `limit`, `window`, `timeout`, `burst`, `anonymous_only`, `shadow`, `on_error`, `over_limit_cache`, `lease`, `routes`",
    ],
    zero_limit => "zero-limit.yaml": [
        "limits[0].limit: must be at least 1",
    ],
    bad_duration => "bad-duration.yaml": [
        r#"routes[0].limits[0].window: "1x" is not a duration (examples: 500ms, 30s, 1m, 1h, 1d)"#,
    ],
    undefined_upstream => "undefined-upstream.yaml": [
        r#"routes[0].upstream: upstream "backnd" is not defined under upstreams"#,
    ],
    undefined_tier_in_api_keys => "undefined-tier-api-key.yaml": [
        // The key itself is a secret: only its first four characters are shown.
        r#"api_keys.demo…: tier "pro" is not defined under tiers"#,
    ],
    undefined_default_tier => "undefined-default-tier.yaml": [
        r#"default_tier: tier "basic" is not defined under tiers"#,
    ],
    undefined_route_in_limit => "undefined-route-in-limit.yaml": [
        r#"limits[0].routes[1]: route "signup" is not defined under routes"#,
    ],
    duplicate_limit_name_across_tier_and_route => "duplicate-limit-name.yaml": [
        r#"routes[0].limits[0].name: duplicate limit name "per-minute" (limit names are unique across tiers, routes and limits)"#,
    ],
    duplicate_route_name => "duplicate-route-name.yaml": [
        r#"routes[1].name: duplicate route name "api""#,
    ],
    duplicate_tier_name => "duplicate-tier-name.yaml": [
        r#"line 2 column 3: invalid YAML: tiers: duplicate entry with key "free""#,
    ],
    bad_algorithm => "bad-algorithm.yaml": [
        r#"limits[0].algorithm: "leaky_bucket" is not an algorithm (sliding_window, fixed_window, sliding_log, token_bucket, gcra)"#,
    ],
    burst_on_fixed_window => "burst-on-fixed-window.yaml": [
        "limits[0].burst: applies only to token_bucket and gcra, not fixed_window",
    ],
    bad_key_part => "bad-key-part.yaml": [
        r#"limits[0].key[1]: "ip" is not a key part (api_key, user, client_ip, route, method, tier, header:<name>)"#,
    ],
    bad_on_error => "bad-on-error.yaml": [
        r#"limits[0].on_error: "ignore" is not a failure policy (allow, deny, local)"#,
    ],
    path_prefix_without_slash => "path-prefix-without-slash.yaml": [
        r#"routes[0].match.path_prefix: "api/v1/orders" must start with '/'"#,
    ],
    bad_method => "bad-method.yaml": [
        r#"routes[0].match.methods[1]: "PSOT" is not an HTTP method (GET, HEAD, POST, PUT, DELETE, PATCH, OPTIONS, CONNECT, TRACE)"#,
    ],
    host_with_port => "host-with-port.yaml": [
        r#"routes[0].match.host: "api.example.com:8443" must be a host name without scheme, port or path"#,
    ],
    bad_ready_requires_store => "bad-ready-requires-store.yaml": [
        r#"server.ready_requires_store: invalid type: string "sometimes", expected a boolean"#,
    ],
    bad_trusted_proxy => "bad-trusted-proxy.yaml": [
        r#"identity.trusted_proxies[1]: "10.0.0.0/33" is not an IP address or CIDR network"#,
    ],
    bad_ipv6_prefix => "bad-ipv6-prefix.yaml": [
        "identity.ipv6_prefix: 129 is not a prefix length from 1 to 128",
    ],
    jwt_secret_env_not_set => "jwt-secret-unset.yaml": [
        "identity.jwt.hs256_secret_env: environment variable TOLLGATE_TEST_UNSET_SECRET is not set (it must hold the HS256 secret)",
    ],
    jwt_secret_env_empty => "jwt-secret-empty.yaml": [
        "identity.jwt.hs256_secret_env: environment variable TOLLGATE_TEST_EMPTY_SECRET is empty (it must hold the HS256 secret)",
    ],
    jwt_audience_entries_are_non_empty_strings => "jwt-bad-audience.yaml": [
        "identity.jwt.audience[1]: must be a string",
        "identity.jwt.audience[2]: must not be empty",
    ],
    jwt_issuer_is_a_string_or_a_list => "jwt-bad-issuer.yaml": [
        "identity.jwt.issuer: must be a string or a list of strings",
    ],
    jwt_require_exp_is_a_boolean => "jwt-require-exp-not-bool.yaml": [
        "identity.jwt.require_exp: invalid type: string \"sometimes\", expected a boolean",
    ],
    admin_allowed_hosts_are_host_names => "admin-bad-allowed-host.yaml": [
        r#"admin.allowed_hosts[1]: "http://admin.example.com" must be a host name without scheme, port or path"#,
        r#"admin.allowed_hosts[2]: "admin.example.com:9901" must be a host name without scheme, port or path"#,
    ],
    missing_upstreams => "missing-upstreams.yaml": [
        "upstreams: missing: define at least one upstream",
        r#"routes[0].upstream: upstream "backend" is not defined under upstreams"#,
    ],
    missing_routes => "missing-routes.yaml": [
        "routes: missing: define at least one route",
    ],
    empty_routes => "empty-routes.yaml": [
        "routes: empty: define at least one route",
    ],
    yaml_syntax_error => "yaml-syntax-error.yaml": [
        // Where the parser gave up (end of file) and where the unclosed `{` is.
        "line 4 column 1: invalid YAML: did not find expected ',' or '}', while parsing a flow mapping at line 3 column 5",
    ],
    wrong_type => "wrong-type.yaml": [
        r#"limits[0].limit: invalid type: string "ten", expected u64"#,
    ],
    route_error_does_not_hide_its_limit_errors => "route-error-hides-limit-error.yaml": [
        r#"routes[0].upstream: upstream "backnd" is not defined under upstreams"#,
        r#"routes[0].limits[0].window: "1x" is not a duration (examples: 500ms, 30s, 1m, 1h, 1d)"#,
    ],
    route_error_does_not_make_the_route_undefined => "route-error-no-cascade.yaml": [
        r#"routes[0].upstream: upstream "backnd" is not defined under upstreams"#,
    ],
    several_mistakes_all_reported_in_file_order => "several-mistakes.yaml": [
        r#"server.listen: "0.0.0.0:80800" is not an address (ip:port)"#,
        r#"store.timeout: "1x" is not a duration (examples: 500ms, 30s, 1m, 1h, 1d)"#,
        r#"identity.trusted_proxies[0]: "localhost" is not an IP address or CIDR network"#,
        "tiers.free[0].limit: must be at least 1",
        r#"api_keys.demo…: tier "pro" is not defined under tiers"#,
        r#"default_tier: tier "basic" is not defined under tiers"#,
        r#"routes[0].limits[0].window: "1x" is not a duration (examples: 500ms, 30s, 1m, 1h, 1d)"#,
        r#"routes[1].upstream: upstream "backnd" is not defined under upstreams"#,
        r#"limits[0].algorithm: "leaky_bucket" is not an algorithm (sliding_window, fixed_window, sliding_log, token_bucket, gcra)"#,
        r#"headers.ietf: invalid type: string "maybe", expected a boolean"#,
    ],
    concurrency_limit_without_timeout => "concurrency-without-timeout.yaml": [
        "limits[0].timeout: missing: a concurrency limit needs a timeout, after which the slot of a request that has not ended is freed (examples: 30s, 1m)",
    ],
    concurrency_limit_with_rate_fields => "concurrency-with-window.yaml": [
        "limits[0].algorithm: does not apply to kind: concurrency",
        "limits[0].window: does not apply to kind: concurrency",
    ],
    over_limit_cache_on_a_concurrency_limit => "over-limit-cache-on-concurrency.yaml": [
        "limits[0].over_limit_cache: does not apply to kind: concurrency",
    ],
    lease_where_it_cannot_lease => "lease-on-sliding-log.yaml": [
        "limits[0].lease: sliding_log cannot lease (it logs every request); use another algorithm or drop lease",
        "limits[1].lease.max: must be at least 1 (1: no leasing)",
        "limits[2].lease: does not apply to kind: concurrency",
    ],
    bad_limit_kind => "bad-limit-kind.yaml": [
        r#"limits[0].kind: "semaphore" is not a limit kind (rate, concurrency)"#,
    ],
    timeout_on_rate_limit => "timeout-on-rate-limit.yaml": [
        "limits[0].timeout: applies only to kind: concurrency",
    ],
    rate_limit_without_window => "rate-limit-without-window.yaml": [
        "limits[0].window: missing: a rate limit needs a window (examples: 1s, 1m, 1h)",
    ],
    bad_route_priority => "bad-priority.yaml": [
        r#"routes[0].priority: "urgent" is not a priority class (critical, post, get, test)"#,
    ],
    shedding_threshold_out_of_range => "shedding-threshold-out-of-range.yaml": [
        "shedding.thresholds.test: 1.5 must be greater than 0 and at most 1",
        "shedding.thresholds.post: 0 must be greater than 0 and at most 1",
    ],
    shedding_thresholds_not_increasing => "shedding-thresholds-not-increasing.yaml": [
        "shedding.thresholds: must increase with priority (test < get < post), got test 0.9, get 0.8, post 0.95",
    ],
    shedding_zero_max_in_flight => "shedding-zero-max-in-flight.yaml": [
        "shedding.max_in_flight: must be at least 1",
    ],
    shedding_without_max_in_flight => "shedding-without-max-in-flight.yaml": [
        "shedding: missing field `max_in_flight`",
    ],
    critical_is_never_shed => "shedding-critical-threshold.yaml": [
        "shedding.thresholds.critical: unknown field `critical`, expected one of `test`, `get`, `post`",
    ],
    bad_path_normalization => "bad-path-normalization.yaml": [
        r#"server.path_normalization: "fix" is not a path normalization mode (normalize, reject)"#,
    ],
    bad_upstream_timeouts => "bad-upstream-timeouts.yaml": [
        "upstreams.backend.timeouts.read: must be greater than zero",
        r#"upstreams.backend.timeouts.idle: "5x" is not a duration (examples: 500ms, 30s, 1m, 1h, 1d)"#,
    ],
    shedding_empty_test_traffic => "shedding-empty-test-traffic.yaml": [
        "shedding.test_traffic: set `header`, `api_key_prefix` or both",
    ],
    env_variable_unset_without_default => "env-unset.yaml": [
        "line 2 column 25: environment variable TOLLGATE_TEST_UNSET_VAR is not set, and ${TOLLGATE_TEST_UNSET_VAR} has no default (write ${TOLLGATE_TEST_UNSET_VAR:-default} to give one)",
    ],
    env_reference_not_closed => "env-unclosed.yaml": [
        r#"line 2 column 22: "${TOLLGATE_TEST_PORT" is not closed: write ${NAME} or ${NAME:-default}, NAME of letters, digits and '_'"#,
    ],
    env_shell_default_form_is_not_a_reference => "env-shell-default-form.yaml": [
        r#"line 2 column 25: "${TOLLGATE_TEST_UPSTREAM-127.0.0.1:9000}" is not a variable reference: write ${NAME} or ${NAME:-default}, NAME of letters, digits and '_'"#,
    ],
    env_set_value_is_validated => "env-set-value-is-validated.yaml": [
        r#"limits[0].limit: invalid type: string "ten", expected u64"#,
    ],
    env_default_is_validated => "env-default-is-validated.yaml": [
        r#"limits[0].window: "1x" is not a duration (examples: 500ms, 30s, 1m, 1h, 1d)"#,
    ],
    env_value_that_adds_structure_is_refused => "env-value-adds-structure.yaml": [
        r#"line 7 column 46: environment variable TOLLGATE_TEST_STRUCTURE holds ',', which would add YAML structure where ${TOLLGATE_TEST_STRUCTURE} stands (outside quotes): a value must stay one scalar (quoted, as "${TOLLGATE_TEST_STRUCTURE}", a string may hold spaces and , # : [ ] { })"#,
    ],
    redis_url_that_does_not_parse_is_not_shown => "redis-url-does-not-parse.yaml": [
        "store.url: not a Redis URL: it does not parse as a URL (invalid port number); it is not shown, as it may hold a password",
    ],
    quotas_database_that_does_not_parse_is_not_shown => "quotas-database-does-not-parse.yaml": [
        "quotas.database: not a PostgreSQL or SQLite URL (postgres://user@host/db, sqlite://PATH): it does not parse as a URL (invalid port number); it is not shown, as it may hold a password",
    ],
    admin_token_env_not_set => "admin-token-unset.yaml": [
        "admin.token_env: environment variable TOLLGATE_TEST_UNSET_SECRET is not set (it must hold the admin bearer token)",
    ],
    admin_max_connections_zero => "admin-max-connections-zero.yaml": [
        "admin.max_connections: must be at least 1",
    ],
    bad_access_log => "bad-access-log.yaml": [
        r#"access_log.format: "xml" is not an access-log format (text, json)"#,
        "access_log.sample: 1.5 must be greater than 0 and at most 1",
        "access_log.buffer: must be at least 1",
    ],
}

/// Every fixture that must check ok; each has a test below.
const VALID_FIXTURES: &[&str] = &[
    "valid-full.yaml",
    "valid-concurrency-shedding.yaml",
    "valid-env.yaml",
];

#[test]
fn valid_full_config_checks_ok() {
    assert_ok(&format!("{FIXTURES}/valid-full.yaml"));
}

#[test]
fn valid_concurrency_and_shedding_config_checks_ok() {
    assert_ok(&format!("{FIXTURES}/valid-concurrency-shedding.yaml"));
}

#[test]
fn valid_env_config_checks_ok() {
    assert_ok(&format!("{FIXTURES}/valid-env.yaml"));
}

#[test]
fn bundled_gateway_yaml_checks_ok() {
    assert_ok("gateway.yaml");
}

/// The fleet's config (image, compose, Kubernetes, fleet.sh) with every variable defaulted.
#[test]
fn fleet_gateway_yaml_checks_ok() {
    assert_ok("docker/gateway.yaml");
}

#[test]
fn nonexistent_file_is_named() {
    assert_errors(
        &format!("{FIXTURES}/does-not-exist.yaml"),
        &["cannot read: No such file or directory (os error 2)"],
    );
}

/// A fixture added to the directory without a test here would silently test nothing.
#[test]
fn every_fixture_has_a_test() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join(FIXTURES);
    let mut untested: Vec<String> = std::fs::read_dir(&dir)
        .expect("read fixture directory")
        .map(|e| {
            e.expect("dir entry")
                .file_name()
                .to_string_lossy()
                .into_owned()
        })
        .filter(|name| name.ends_with(".yaml"))
        .filter(|name| {
            !VALID_FIXTURES.contains(&name.as_str()) && !ERROR_FIXTURES.contains(&name.as_str())
        })
        .collect();
    untested.sort();
    assert!(untested.is_empty(), "fixtures without a test: {untested:?}");
}

/// `tollgate --version` names the package version and the commit this checkout is at (build.rs
/// reruns when HEAD moves, so this holds right after a commit too).
#[test]
fn version_names_the_commit_it_was_built_from() {
    let head = Command::new("git")
        .args(["rev-parse", "--short=7", "HEAD"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("run git (install git)");
    assert!(
        head.status.success(),
        "git rev-parse: {}",
        text(&head.stderr)
    );
    let head = text(&head.stdout).trim().to_string();
    assert!(
        head.len() >= 7 && head.chars().all(|c| c.is_ascii_hexdigit()),
        "{head}"
    );
    let out = Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .arg("--version")
        .output()
        .expect("run tollgate --version");
    assert_eq!(
        text(&out.stdout),
        format!("tollgate {} ({head})\n", env!("CARGO_PKG_VERSION"))
    );
}
