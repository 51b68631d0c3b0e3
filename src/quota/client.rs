//! `tollgate quotas …`: the quota admin API from the command line. It calls a gateway's admin
//! listener (`--admin-url`, default the config's `server.admin_listen`) with the admin token
//! from the environment variable the config's `admin.token_env` names, and prints a table (or
//! the JSON with `--json`).
//!
//! Phase: its own short-lived process; never part of a running gateway.

use std::fmt::Write as _;

use serde_json::Value;

/// One call of the admin API.
#[derive(Debug, Clone)]
pub struct Call {
    pub method: reqwest::Method,
    /// Under the admin URL: `/admin/v1/quotas/…`.
    pub path: String,
    pub body: Option<Value>,
}

/// Why a command failed.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("cannot reach the admin API at {url}: {source}")]
    Transport { url: String, source: reqwest::Error },
    #[error("{status}: {message}")]
    Status { status: u16, message: String },
}

/// `fp:…` stays as it is; a raw key is percent-encoded for the path.
pub fn key_segment(key: &str) -> String {
    let mut out = String::with_capacity(key.len());
    for b in key.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~' | b':') {
            out.push(b as char);
        } else {
            let _ = write!(out, "%{b:02X}");
        }
    }
    out
}

/// Run `call` against `admin_url` with `token`; the JSON answer.
pub async fn run(admin_url: &str, token: Option<&str>, call: Call) -> Result<Value, ClientError> {
    let url = format!("{}{}", admin_url.trim_end_matches('/'), call.path);
    let client = reqwest::Client::builder()
        .no_proxy()
        .timeout(std::time::Duration::from_secs(10))
        .build()
        .map_err(|source| ClientError::Transport {
            url: url.clone(),
            source,
        })?;
    let mut req = client.request(call.method, &url);
    if let Some(t) = token {
        req = req.bearer_auth(t);
    }
    if let Some(b) = &call.body {
        req = req.json(b);
    }
    let resp = req.send().await.map_err(|source| ClientError::Transport {
        url: url.clone(),
        source,
    })?;
    let status = resp.status().as_u16();
    let body: Value = resp.json().await.unwrap_or(Value::Null);
    if status >= 400 {
        let message = ["detail", "error", "title"]
            .iter()
            .find_map(|k| body[*k].as_str())
            .unwrap_or("failed")
            .to_string();
        return Err(ClientError::Status { status, message });
    }
    Ok(body)
}

/// A table of what an answer holds: the overrides of a list, one override, usage, or the audit.
pub fn table(v: &Value) -> String {
    let mut out = String::new();
    if let Some(items) = v["overrides"].as_array() {
        let _ = writeln!(
            out,
            "{:<12} {:<20} {:<10} {:<9} LIMITS",
            "KEY", "LABEL", "TIER", "STATUS"
        );
        for o in items {
            row(&mut out, o);
        }
        if let Some(c) = v["next_cursor"].as_str() {
            let _ = writeln!(out, "(more: --cursor {c})");
        }
    } else if let Some(limits) = v["limits"].as_array() {
        let _ = writeln!(out, "{} (tier {})", text(&v["key"]), text(&v["tier"]));
        let _ = writeln!(
            out,
            "{:<24} {:>10} {:>10} {:>10} {:>8}",
            "LIMIT", "USED", "LIMIT", "REMAINING", "RESET"
        );
        for l in limits {
            let _ = writeln!(
                out,
                "{:<24} {:>10} {:>10} {:>10} {:>7}s",
                text(&l["name"]),
                text(&l["used"]),
                text(&l["limit"]),
                text(&l["remaining"]),
                text(&l["reset"])
            );
        }
        for n in v["not_enumerable"].as_array().into_iter().flatten() {
            let _ = writeln!(
                out,
                "{:<24} (counted by {}: not named by the key alone)",
                text(&n["name"]),
                text(&n["key"])
            );
        }
    } else if v["key"].is_string() {
        let _ = writeln!(
            out,
            "{:<12} {:<20} {:<10} {:<9} LIMITS",
            "KEY", "LABEL", "TIER", "STATUS"
        );
        row(&mut out, v);
    } else {
        let _ = writeln!(
            out,
            "{}",
            serde_json::to_string_pretty(v).unwrap_or_default()
        );
    }
    out
}

fn row(out: &mut String, o: &Value) {
    let limits: Vec<String> = o["limits"]
        .as_object()
        .into_iter()
        .flatten()
        .map(|(name, p)| format!("{name}={}", serde_json::to_string(p).unwrap_or_default()))
        .collect();
    let _ = writeln!(
        out,
        "{:<12} {:<20} {:<10} {:<9} {}",
        text(&o["key"]),
        text(&o["label"]),
        text(&o["tier"]),
        text(&o["status"]),
        limits.join(" ")
    );
}

fn text(v: &Value) -> String {
    match v {
        Value::Null => "-".into(),
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn raw_keys_are_escaped_and_fingerprints_kept() {
        assert_eq!(key_segment("fp:1a2b3c4d"), "fp:1a2b3c4d");
        assert_eq!(key_segment("sk/live key"), "sk%2Flive%20key");
    }
}
