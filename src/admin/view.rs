//! `GET /admin/v1/config`: the effective config as JSON, what a gateway runs on right now.
//! Secrets stay out: raw API keys are shown as fingerprints, URLs lose their passwords and
//! credential query values ([`crate::redact::url`]), the
//! JWT secret and the admin token are named only by their environment variables.
//!
//! Phase: the admin listener.

use std::time::Duration;

use serde_json::{json, Value};

use crate::config::{Config, KeyPart, Limit, Spec, Topology};
use crate::fingerprint::fingerprint;
use crate::redact::url_shown;

fn secs(d: Duration) -> String {
    humantime::format_duration(d).to_string()
}

fn key(parts: &[KeyPart]) -> Vec<String> {
    parts.iter().map(KeyPart::to_string).collect()
}

fn limit(l: &Limit) -> Value {
    let mut v = json!({
        "name": &*l.name,
        "key": key(&l.key),
        "anonymous_only": l.anonymous_only,
        "shadow": l.shadow,
        "on_error": l.on_error.as_str(),
    });
    match &l.spec {
        Spec::Rate(r) => {
            v["kind"] = json!("rate");
            v["algorithm"] = json!(r.quota.algorithm.as_str());
            v["limit"] = json!(r.quota.limit);
            v["window"] = json!(secs(Duration::from_millis(r.quota.window_ms)));
            v["burst"] = json!(r.quota.burst);
        }
        Spec::Concurrency(c) => {
            v["kind"] = json!("concurrency");
            v["limit"] = json!(c.limit);
            v["timeout"] = json!(secs(c.timeout));
        }
    }
    v
}

fn topology(t: &Topology) -> Value {
    match t {
        Topology::Single { url } => json!({ "url": url_shown(url) }),
        Topology::Cluster { nodes } => {
            json!({ "cluster_nodes": nodes.iter().map(|n| url_shown(n)).collect::<Vec<_>>() })
        }
        Topology::Sentinel {
            master_name,
            nodes,
            url,
        } => json!({
            "sentinel": { "master_name": master_name, "nodes": nodes.iter().map(|n| url_shown(n)).collect::<Vec<_>>() },
            "url": url.as_deref().map(url_shown),
        }),
    }
}

/// The whole effective config.
pub fn config(cfg: &Config) -> Value {
    let s = &cfg.startup.server;
    let st = &cfg.startup.store;
    let names = |ids: &[usize]| -> Vec<&str> { ids.iter().map(|&i| &*cfg.limit(i).name).collect() };
    json!({
        "source": cfg.source,
        "server": {
            "listen": s.listen.to_string(),
            "admin_listen": s.admin_listen.to_string(),
            "threads": s.threads,
            "grace_period": secs(s.grace_period),
            "drain_period": secs(s.drain_period),
            "header_timeout": secs(s.header_timeout),
            "max_connections": s.max_connections,
            "keepalive_timeout": secs(cfg.http.keepalive_timeout),
            "max_request_header_bytes": cfg.http.max_request_header_bytes,
            "max_uri_bytes": cfg.http.max_uri_bytes,
            "max_body_bytes": cfg.http.max_body_bytes,
            "path_normalization": cfg.http.path_normalization.as_str(),
            "escaped_slashes": cfg.http.escaped_slashes.as_str(),
        },
        "store": {
            "backend": st.backend.as_str(),
            "redis": st.redis.as_ref().map(topology),
            "timeout": secs(st.timeout),
            "key_prefix": st.key_prefix,
            "max_keys": st.max_keys,
            "on_error": cfg.failure.on_error.as_str(),
            "local_share": cfg.failure.local_share,
        },
        "identity": {
            "api_key_header": cfg.identity.api_key_header.as_str(),
            "trusted_proxies": cfg.identity.trusted_proxies.iter().map(|n| n.to_string()).collect::<Vec<_>>(),
            "ipv6_prefix": cfg.identity.ipv6_prefix,
            "require_known_keys": cfg.identity.require_known_keys,
            "jwt": cfg.identity.jwt.as_ref().map(|j| json!({
                "header": j.header.as_str(), "user_claim": j.user_claim, "tier_claim": j.tier_claim,
                "leeway": secs(Duration::from_secs(j.validation.leeway)), "secret": "<from the environment>",
                "require_exp": j.require_exp, "audience": j.audience, "issuer": j.issuer,
            })),
        },
        "tiers": cfg.tiers.iter().map(|t| json!({
            "name": t.name, "limits": names(&t.limits.rate), "concurrency": names(&t.limits.concurrency),
        })).collect::<Vec<_>>(),
        "api_keys": cfg.api_keys.iter().map(|(k, &t)| json!({
            "key": fingerprint(k).to_string(), "tier": cfg.tiers[t].name,
        })).collect::<Vec<_>>(),
        "default_tier": cfg.default_tier.map(|t| cfg.tiers[t].name.clone()),
        "upstreams": cfg.upstreams.iter().map(|u| json!({
            "name": u.name, "servers": u.servers.iter().map(|a| a.to_string()).collect::<Vec<_>>(),
            "timeouts": { "connect": secs(u.timeouts.connect), "read": secs(u.timeouts.read),
                          "write": secs(u.timeouts.write), "idle": secs(u.timeouts.idle) },
        })).collect::<Vec<_>>(),
        "routes": cfg.routes.iter().map(|r| json!({
            "name": &*r.name, "path_prefix": r.path_prefix, "host": r.host,
            "methods": r.methods.as_ref().map(|ms| ms.iter().map(|m| m.as_str()).collect::<Vec<_>>()),
            "upstream": cfg.upstream(r.upstream).name, "cost": r.cost,
            "priority": r.priority.map(|p| p.as_str()), "max_body_bytes": r.max_body_bytes,
            "limits": names(&r.limits.rate), "concurrency": names(&r.limits.concurrency),
        })).collect::<Vec<_>>(),
        "limits": cfg.limits.iter().map(limit).collect::<Vec<_>>(),
        "shedding": cfg.shedding.as_ref().map(|sh| json!({
            "max_in_flight": sh.max_in_flight, "thresholds": sh.thresholds,
        })),
        "headers": {
            "ietf": cfg.headers.ietf, "legacy": cfg.headers.legacy,
            "on_admitted": cfg.headers.on_admitted,
        },
        "quotas": cfg.startup.quotas.as_ref().map(|q| json!({
            "database": q.database_redacted(), "refresh": secs(q.refresh),
        })),
        "access_log": {
            "enabled": cfg.access_log.enabled,
            "path": cfg.access_log.path.as_ref().map(|p| p.display().to_string()),
            "sample": cfg.access_log.sample,
        },
        "admin": { "token_env": cfg.admin.token_env, "allowed_hosts": cfg.admin.allowed_hosts },
    })
}
