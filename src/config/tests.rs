use std::time::Duration;

use super::*;

fn check(yaml: &str) -> Result<Config, Vec<String>> {
    from_yaml("gateway.yaml", yaml, &Overrides::default()).map_err(|e| e.0)
}

const MIN: &str = "upstreams: { backend: [\"127.0.0.1:9000\"] }\nroutes: [ { name: default, match: { path_prefix: / }, upstream: backend } ]\n";

#[test]
fn minimal_config_gets_defaults() {
    let c = check(MIN).unwrap();
    assert_eq!(c.startup.server.listen.to_string(), "0.0.0.0:8080");
    assert_eq!(c.startup.server.admin_listen.to_string(), "127.0.0.1:9901");
    assert_eq!(c.startup.store.timeout, Duration::from_millis(25));
    assert_eq!(c.failure.on_error, OnError::Allow);
    assert!(c.headers.ietf && c.headers.legacy);
    assert!(c.limits.is_empty());
}

#[test]
fn rate_limit_headers_on_admitted_answers_default_on_and_can_be_switched_off() {
    let headers = |h: &str| check(&format!("{MIN}headers: {{ {h} }}\n")).map(|c| c.headers);
    let by_default = headers("ietf: true").unwrap();
    assert!(by_default.on_admitted && by_default.ietf && by_default.legacy);
    let off = headers("on_admitted: false").unwrap();
    assert!(!off.on_admitted && off.ietf && off.legacy);
    assert_eq!(
        headers("on_admitted: 1").unwrap_err(),
        ["gateway.yaml: headers.on_admitted: invalid type: integer `1`, expected a boolean"]
    );
}

#[test]
fn collects_errors_from_every_section() {
    let yaml = format!(
        "{MIN}store: {{ timeout: 1x }}\nlimits:\n  - {{ name: a, limit: 0, window: 1m }}\n  - {{ name: b, limt: 5, window: 1m }}\n"
    );
    let errs = check(&yaml).unwrap_err();
    assert_eq!(
        errs,
        vec![
            "gateway.yaml: store.timeout: \"1x\" is not a duration (examples: 500ms, 30s, 1m, 1h, 1d)",
            "gateway.yaml: limits[0].limit: must be at least 1",
            "gateway.yaml: limits[1].limt: unknown field `limt`, expected one of `name`, `kind`, `key`, `algorithm`, `limit`, `window`, `timeout`, `burst`, `anonymous_only`, `shadow`, `on_error`, `over_limit_cache`, `lease`, `routes`",
        ]
    );
}

#[test]
fn top_level_limits_attach_to_named_routes_only() {
    let yaml = "upstreams: { b: [\"127.0.0.1:9000\"] }\nroutes:\n  - { name: login, match: { path_prefix: /login }, upstream: b }\n  - { name: rest, match: { path_prefix: / }, upstream: b }\nlimits:\n  - { name: l, key: [client_ip], limit: 5, window: 1m, routes: [login] }\n  - { name: g, key: [], limit: 5, window: 1s }\n";
    let c = check(yaml).unwrap();
    let login = c.routes.iter().find(|r| &*r.name == "login").unwrap();
    let rest = c.routes.iter().find(|r| &*r.name == "rest").unwrap();
    assert_eq!(login.limits.rate, vec![0, 1]);
    assert_eq!(rest.limits.rate, vec![1]);
    assert_eq!(
        c.limits[0].rate().policy_line.as_bytes(),
        b"ratelimit-policy: \"l\";q=5;w=60\r\n"
    );
    assert_eq!(
        c.limits[0].rate().limit_line.as_bytes(),
        b"x-ratelimit-limit: 5\r\n"
    );
}

#[test]
fn concurrency_limits_are_kept_apart_from_rate_limits() {
    let yaml = r#"
store: { local_share: 0.5 }
tiers:
  free:
    - { name: free-minute, limit: 100, window: 1m }
    - { name: free-inflight, kind: concurrency, limit: 5, timeout: 30s }
upstreams: { b: ["127.0.0.1:9000"] }
routes:
  - name: pay
    match: { path_prefix: /pay }
    upstream: b
    priority: critical
    limits: [ { name: pay-inflight, kind: concurrency, key: [route], limit: 3, timeout: 1m, on_error: deny } ]
  - { name: rest, match: { path_prefix: / }, upstream: b }
limits:
  - { name: inflight, kind: concurrency, key: [api_key], limit: 20, timeout: 60s, routes: [rest] }
  - { name: g, kind: rate, key: [], limit: 5, window: 1s }
"#;
    let c = check(yaml).unwrap();
    let names = |ids: &[usize]| -> Vec<String> {
        ids.iter().map(|&i| c.limits[i].name.to_string()).collect()
    };
    let rate: Vec<&str> = c
        .limits
        .iter()
        .filter(|l| matches!(l.spec, Spec::Rate(_)))
        .map(|l| &*l.name)
        .collect();
    assert_eq!(rate, ["free-minute", "g"]);
    let free = &c.tiers[0];
    assert_eq!(names(&free.limits.rate), ["free-minute"]);
    assert_eq!(names(&free.limits.concurrency), ["free-inflight"]);
    assert_eq!(c.limits[free.limits.concurrency[0]].key, [KeyPart::ApiKey]);
    let pay = c.routes.iter().find(|r| &*r.name == "pay").unwrap();
    let rest = c.routes.iter().find(|r| &*r.name == "rest").unwrap();
    assert_eq!(names(&pay.limits.concurrency), ["pay-inflight"]);
    assert_eq!(names(&rest.limits.concurrency), ["inflight"]);
    assert_eq!(names(&rest.limits.rate), ["g"]);
    assert_eq!(pay.priority, Some(Priority::Critical));
    assert_eq!(rest.priority, None);
    let inflight = c.limits[rest.limits.concurrency[0]].concurrency();
    assert_eq!(
        (inflight.limit, inflight.timeout, inflight.local_limit),
        (20, Duration::from_secs(60), 10)
    );
    assert_eq!(c.limits[pay.limits.concurrency[0]].on_error, OnError::Deny);
    assert!(c.shedding.is_none());
}

#[test]
fn shedding_defaults_and_names_shared_with_rate_limits() {
    let yaml = format!("{MIN}shedding: {{ max_in_flight: 40 }}\n");
    let s = check(&yaml).unwrap().shedding.unwrap();
    assert_eq!(s.thresholds, defaults::SHED_THRESHOLDS);
    assert_eq!(s.cap(Priority::Test), Some(28));
    assert_eq!(s.cap(Priority::Critical), None);
    assert!(s.test_traffic.header.is_none());

    // One name space for both kinds.
    let yaml = format!("{MIN}limits:\n  - {{ name: a, limit: 1, window: 1s }}\n  - {{ name: a, kind: concurrency, limit: 1, timeout: 1s }}\n");
    assert_eq!(
        check(&yaml).unwrap_err(),
        ["gateway.yaml: limits[1].name: duplicate limit name \"a\" (limit names are unique across tiers, routes and limits)"]
    );
}

#[test]
fn one_thread_runs_without_work_stealing_unless_asked() {
    let runtime = |server: &str| {
        let c = check(&format!("{MIN}server: {{ {server} }}\n")).unwrap();
        (c.startup.server.threads, c.startup.server.work_stealing)
    };
    assert_eq!(runtime("threads: 1"), (1, false));
    assert_eq!(runtime("threads: 2"), (2, true));
    assert_eq!(runtime("threads: 1, work_stealing: true"), (1, true));
    assert_eq!(runtime("threads: 4, work_stealing: false"), (4, false));
    let a = check(&format!("{MIN}server: {{ threads: 2 }}\n")).unwrap();
    let b = check(&format!(
        "{MIN}server: {{ threads: 2, work_stealing: false }}\n"
    ))
    .unwrap();
    assert_eq!(a.startup.changes(&b.startup), ["server.work_stealing"]);
    assert!(check(&format!("{MIN}server: {{ work_stealing: sometimes }}\n")).is_err());
}

#[test]
fn header_case_is_discarded_unless_preserved_and_is_a_startup_setting() {
    let preserve = |server: &str| {
        check(&format!("{MIN}server: {{ {server} }}\n"))
            .map(|c| c.startup.server.preserve_header_case)
    };
    assert_eq!(preserve("threads: 1"), Ok(false));
    assert_eq!(preserve("preserve_header_case: true"), Ok(true));
    assert_eq!(preserve("preserve_header_case: false"), Ok(false));
    assert!(preserve("preserve_header_case: sometimes").is_err());
    let a = check(&format!("{MIN}server: {{ preserve_header_case: true }}\n")).unwrap();
    let b = check(MIN).unwrap();
    assert_eq!(
        a.startup.changes(&b.startup),
        ["server.preserve_header_case"]
    );
}

#[test]
fn readiness_follows_the_store_only_when_asked_and_that_is_a_startup_setting() {
    let requires = |server: &str| {
        check(&format!("{MIN}server: {{ {server} }}\n"))
            .map(|c| c.startup.server.ready_requires_store)
    };
    assert_eq!(requires("threads: 1"), Ok(false));
    assert_eq!(requires("ready_requires_store: true"), Ok(true));
    assert_eq!(requires("ready_requires_store: false"), Ok(false));
    let err = requires("ready_requires_store: sometimes")
        .unwrap_err()
        .join("\n");
    assert!(
        err.contains(
            "server.ready_requires_store: invalid type: string \"sometimes\", expected a boolean"
        ),
        "{err}"
    );
    let a = check(&format!("{MIN}server: {{ ready_requires_store: true }}\n")).unwrap();
    let b = check(MIN).unwrap();
    assert_eq!(
        a.startup.changes(&b.startup),
        ["server.ready_requires_store"]
    );
}

#[test]
fn the_upstream_keepalive_pool_defaults_to_1024_per_thread_and_is_a_startup_setting() {
    let pool = |server: &str| {
        check(&format!("{MIN}server: {{ {server} }}\n"))
            .map(|c| c.startup.server.upstream_keepalive_pool)
    };
    assert_eq!(pool("threads: 1"), Ok(1024));
    assert_eq!(pool("upstream_keepalive_pool: 64"), Ok(64));
    assert_eq!(
        pool("upstream_keepalive_pool: 0").unwrap_err(),
        ["gateway.yaml: server.upstream_keepalive_pool: must be at least 1"]
    );
    let a = check(MIN).unwrap();
    let b = check(&format!("{MIN}server: {{ upstream_keepalive_pool: 64 }}\n")).unwrap();
    assert_eq!(
        a.startup.changes(&b.startup),
        ["server.upstream_keepalive_pool"]
    );
}

#[test]
fn startup_changes_are_named() {
    let a = check(MIN).unwrap();
    let b = check(&format!(
        "{MIN}server: {{ listen: \"127.0.0.1:1\", grace_period: 1s }}\nstore: {{ timeout: 1s }}\n"
    ))
    .unwrap();
    assert_eq!(a.startup.changes(&a.startup), Vec::<&str>::new());
    assert_eq!(
        a.startup.changes(&b.startup),
        ["server.listen", "server.grace_period", "store.timeout"]
    );
}

#[test]
fn words_list_what_they_expect() {
    assert_eq!(
        "ignore".parse::<OnError>().unwrap_err().to_string(),
        "\"ignore\" is not a failure policy (allow, deny, local)"
    );
    assert_eq!(
        "semaphore".parse::<Kind>().unwrap_err().to_string(),
        "\"semaphore\" is not a limit kind (rate, concurrency)"
    );
    assert_eq!(
        "redis_cluster".parse::<Backend>(),
        Ok(Backend::RedisCluster)
    );
    assert_eq!(
        "urgent".parse::<Priority>().unwrap_err().to_string(),
        "\"urgent\" is not a priority class (critical, post, get, test)"
    );
}

#[test]
fn store_lease_applies_to_every_limit_that_can_lease_unless_it_sets_its_own() {
    let yaml = format!(
        "{MIN}store: {{ lease: {{ max: 20 }}, over_limit_cache: {{ max_entries: 7 }} }}\nlimits:\n  - {{ name: a, limit: 5, window: 1m }}\n  - {{ name: b, limit: 5, window: 1m, lease: {{ max: 3 }}, over_limit_cache: false }}\n  - {{ name: c, algorithm: sliding_log, limit: 5, window: 1m }}\n"
    );
    let c = check(&yaml).unwrap();
    let leases: Vec<u64> = c.limits.iter().map(|l| l.lease_max).collect();
    assert_eq!(leases, [20, 3, 0]);
    let cached: Vec<bool> = c.limits.iter().map(|l| l.over_limit_cache).collect();
    assert_eq!(cached, [true, false, true]);
    assert_eq!(c.startup.store.over_limit_entries, 7);
    assert_eq!(
        check(MIN).unwrap().startup.store.over_limit_entries,
        100_000
    );
}

#[test]
fn a_reload_that_changes_the_admin_cap_is_reported_as_applied_on_restart() {
    let a = check(&format!("{MIN}admin: {{ max_connections: 8 }}\n")).unwrap();
    let b = check(MIN).unwrap();
    assert_eq!(a.startup.admin_max_connections, 8);
    assert_eq!(b.startup.admin_max_connections, 64);
    assert_eq!(a.startup.changes(&b.startup), ["admin.max_connections"]);
}
