//! `tollgate quotas …`: the quota admin API from the command line. It calls a gateway's admin
//! listener (`--admin-url`, default the config's `server.admin_listen`) with the admin token
//! from the environment variable the config's `admin.token_env` names, and prints a table (or
//! the JSON with `--json`).
//!
//! Phase: its own short-lived process; never part of a running gateway.

use std::fmt::Write as _;

use percent_encoding::{utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};
use serde_json::{json, Value};

use crate::cli::QuotaAction;

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

/// What a key segment keeps unescaped: RFC 3986's unreserved characters, and `:` (so `fp:…`
/// stays as it is).
const KEY_SEGMENT: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~')
    .remove(b':');

/// `fp:…` stays as it is; a raw key is percent-encoded for the path.
pub fn key_segment(key: &str) -> String {
    utf8_percent_encode(key, KEY_SEGMENT).to_string()
}

/// `?limit=&cursor=` of a listing.
fn page_query(limit: Option<u32>, cursor: Option<&str>) -> String {
    let mut q = Vec::new();
    if let Some(n) = limit {
        q.push(format!("limit={n}"));
    }
    if let Some(c) = cursor {
        q.push(format!("cursor={}", key_segment(c)));
    }
    if q.is_empty() {
        String::new()
    } else {
        format!("?{}", q.join("&"))
    }
}

/// `NAME=LIMIT[/WINDOW][,burst=N]`: a limit's name and its new parameters.
pub fn parse_limit(arg: &str) -> Result<(String, Value), String> {
    let bad = |why: &str| {
        format!("--limit {arg:?}: {why} (expected NAME=LIMIT[/WINDOW][,burst=N], e.g. api=5000/1m,burst=100)")
    };
    let (name, rest) = arg.split_once('=').ok_or_else(|| bad("no '='"))?;
    if name.is_empty() {
        return Err(bad("no limit name"));
    }
    let (rate, burst) = match rest.split_once(',') {
        Some((rate, b)) => {
            let n = b
                .strip_prefix("burst=")
                .ok_or_else(|| bad("after ',' only burst=N may follow"))?;
            (
                rate,
                Some(
                    n.parse::<u64>()
                        .map_err(|_| bad("burst is not a whole number"))?,
                ),
            )
        }
        None => (rest, None),
    };
    let (limit, window) = match rate.split_once('/') {
        Some((l, w)) => (l, Some(w)),
        None => (rate, None),
    };
    let mut p = serde_json::Map::new();
    if !limit.is_empty() {
        let n = limit
            .parse::<u64>()
            .map_err(|_| bad("the limit is not a whole number"))?;
        p.insert("limit".into(), json!(n));
    }
    if let Some(w) = window.filter(|w| !w.is_empty()) {
        p.insert("window".into(), json!(w));
    }
    if let Some(b) = burst {
        p.insert("burst".into(), json!(b));
    }
    if p.is_empty() {
        return Err(bad("nothing to set"));
    }
    Ok((name.to_string(), Value::Object(p)))
}

/// The admin API call a `tollgate quotas` command makes.
pub fn call_of(action: &QuotaAction) -> Result<Call, String> {
    use reqwest::Method;
    let call = |method: Method, path: String| Call {
        method,
        path,
        body: None,
    };
    Ok(match action {
        QuotaAction::List { limit, cursor } => call(
            Method::GET,
            format!("/admin/v1/quotas{}", page_query(*limit, cursor.as_deref())),
        ),
        QuotaAction::Audit { limit, cursor } => call(
            Method::GET,
            format!("/admin/v1/audit{}", page_query(*limit, cursor.as_deref())),
        ),
        QuotaAction::Get { key } => call(
            Method::GET,
            format!("/admin/v1/quotas/{}", key_segment(key)),
        ),
        QuotaAction::Delete { key } => call(
            Method::DELETE,
            format!("/admin/v1/quotas/{}", key_segment(key)),
        ),
        QuotaAction::Usage { key } => {
            call(Method::GET, format!("/admin/v1/usage/{}", key_segment(key)))
        }
        QuotaAction::Reset { key } => call(
            Method::POST,
            format!("/admin/v1/usage/{}/reset", key_segment(key)),
        ),
        QuotaAction::Set { key, .. } => Call {
            method: Method::PUT,
            path: format!(
                "/admin/v1/quotas/{}",
                key_segment(key.as_deref().ok_or("set: no key given")?)
            ),
            body: Some(set_body(action)?),
        },
    })
}

/// `set --key-stdin` / `--key-env NAME`: the key read from `stdin` or the variable `env`
/// names, put in place of the argument. One line, the line break not part of it; empty is an
/// error.
pub fn resolve_key(
    action: &mut QuotaAction,
    stdin: impl std::io::Read,
    env: impl Fn(&str) -> Option<String>,
) -> Result<(), String> {
    let QuotaAction::Set {
        key,
        key_stdin,
        key_env,
        ..
    } = action
    else {
        return Ok(());
    };
    let read = if *key_stdin {
        let mut text = String::new();
        let mut limited = std::io::Read::take(stdin, 64 * 1024);
        std::io::Read::read_to_string(&mut limited, &mut text)
            .map_err(|e| format!("--key-stdin: cannot read standard input: {e}"))?;
        let line = text.strip_suffix('\n').unwrap_or(&text);
        let line = line.strip_suffix('\r').unwrap_or(line);
        if line.contains(['\n', '\r']) {
            return Err("--key-stdin: standard input holds more than one line".into());
        }
        Some(("--key-stdin: standard input", line.to_string()))
    } else if let Some(var) = key_env.as_deref() {
        let v = env(var).ok_or_else(|| format!("--key-env: the variable {var} is not set"))?;
        Some(("--key-env: the variable", v))
    } else {
        None
    };
    if let Some((from, k)) = read {
        if k.is_empty() {
            return Err(format!("{from} holds an empty key"));
        }
        *key = Some(k);
    }
    Ok(())
}

/// The body of `PUT /admin/v1/quotas/{key}` that `set`'s flags describe.
fn set_body(action: &QuotaAction) -> Result<Value, String> {
    let QuotaAction::Set {
        tier,
        label,
        status,
        limits,
        effective_at,
        expires_at,
        clear,
        ..
    } = action
    else {
        return Err("not a set command".into());
    };
    let mut body = serde_json::Map::new();
    for field in clear {
        if !CLEARABLE.contains(&field.as_str()) {
            return Err(format!(
                "--clear {field:?}: not a field that can be cleared (one of {})",
                CLEARABLE.join(", ")
            ));
        }
        body.insert(field.clone(), Value::Null);
    }
    let given = [
        ("tier", tier),
        ("label", label),
        ("status", status),
        ("effective_at", effective_at),
        ("expires_at", expires_at),
    ];
    for (field, v) in given {
        if let Some(v) = v {
            body.insert(field.into(), json!(v));
        }
    }
    if !limits.is_empty() {
        let mut m = serde_json::Map::new();
        for l in limits {
            let (name, p) = parse_limit(l)?;
            m.insert(name, p);
        }
        body.insert("limits".into(), Value::Object(m));
    }
    if body.is_empty() {
        return Err("set: give at least one of --tier, --label, --status, --limit, --effective-at, --expires-at, --clear".into());
    }
    Ok(Value::Object(body))
}

/// The fields `--clear` may name.
const CLEARABLE: [&str; 5] = ["tier", "label", "limits", "effective_at", "expires_at"];

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
        override_header(&mut out);
        for o in items {
            row(&mut out, o);
        }
        more(&mut out, v);
    } else if let Some(entries) = v["entries"].as_array() {
        audit_table(&mut out, entries);
        more(&mut out, v);
    } else if let Some(limits) = v["limits"].as_array() {
        usage_table(&mut out, v, limits);
    } else if v["deleted"] == true {
        let _ = writeln!(out, "{}: override deleted", text(&v["key"]));
    } else if v["reset"] == true {
        let _ = writeln!(
            out,
            "{}: counters reset ({} removed)",
            text(&v["key"]),
            text(&v["counters_removed"])
        );
    } else if v["key"].is_string() {
        override_header(&mut out);
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

fn override_header(out: &mut String) {
    let _ = writeln!(
        out,
        "{:<12} {:<20} {:<10} {:<9} LIMITS",
        "KEY", "LABEL", "TIER", "STATUS"
    );
}

/// Where the next page starts, when there is one.
fn more(out: &mut String, v: &Value) {
    if let Some(c) = v["next_cursor"].as_str() {
        let _ = writeln!(out, "(more: --cursor {c})");
    }
}

fn audit_table(out: &mut String, entries: &[Value]) {
    let _ = writeln!(
        out,
        "{:<22} {:<12} {:<8} {:<24} CHANGE",
        "AT", "KEY", "ACTION", "CLIENT"
    );
    for e in entries {
        let _ = writeln!(
            out,
            "{:<22} {:<12} {:<8} {:<24} {} -> {}",
            text(&e["at"]),
            text(&e["key"]),
            text(&e["action"]),
            text(&e["client"]),
            compact(&e["before"]),
            compact(&e["after"])
        );
    }
}

fn usage_table(out: &mut String, v: &Value, limits: &[Value]) {
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

/// An override in one line: what it sets, without the timestamps.
fn compact(v: &Value) -> String {
    let Some(o) = v.as_object() else {
        return "-".into();
    };
    let parts: Vec<String> = ["tier", "status", "label", "limits"]
        .iter()
        .filter(|k| !o.get(**k).is_none_or(Value::is_null))
        .map(|k| format!("{k}={}", o[*k]))
        .collect();
    parts.join(" ")
}

/// A value for a table cell: a string as it is but for control characters (and the
/// bidirectional overrides), which are escaped (`\u{1b}`, `\n`), so a label cannot move the
/// cursor, recolour the terminal, or forge a row.
fn text(v: &Value) -> String {
    match v {
        Value::Null => "-".into(),
        Value::String(s) => {
            let mut out = String::with_capacity(s.len());
            for c in s.chars() {
                let bidi = matches!(c, '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}');
                if c.is_control() || bidi {
                    out.extend(c.escape_default());
                } else {
                    out.push(c);
                }
            }
            out
        }
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_parse_in_every_form() {
        assert_eq!(
            parse_limit("api=5000/1m,burst=100").unwrap(),
            (
                "api".into(),
                json!({"limit": 5000, "window": "1m", "burst": 100})
            )
        );
        assert_eq!(parse_limit("api=10").unwrap().1, json!({"limit": 10}));
        assert_eq!(parse_limit("api=/1h").unwrap().1, json!({"window": "1h"}));
        for bad in [
            "api",
            "=5",
            "api=",
            "api=x/1m",
            "api=5,b=1",
            "api=5,burst=x",
        ] {
            assert!(
                parse_limit(bad).unwrap_err().starts_with("--limit"),
                "{bad}"
            );
        }
    }

    #[test]
    fn set_builds_the_body_the_api_reads() {
        let set = QuotaAction::Set {
            key: Some("sk live".into()),
            key_stdin: false,
            key_env: None,
            tier: Some("gold".into()),
            label: None,
            status: Some("disabled".into()),
            limits: vec!["api=5/1s".into()],
            effective_at: None,
            expires_at: None,
            clear: vec!["label".into()],
        };
        let call = call_of(&set).unwrap();
        assert_eq!(call.method, reqwest::Method::PUT);
        assert_eq!(call.path, "/admin/v1/quotas/sk%20live");
        assert_eq!(
            call.body.unwrap(),
            json!({"tier": "gold", "status": "disabled", "label": null, "limits": {"api": {"limit": 5, "window": "1s"}}})
        );
        let mut empty = set_with(false, None);
        if let QuotaAction::Set { key, tier, .. } = &mut empty {
            *key = Some("k".into());
            *tier = None;
        }
        assert!(call_of(&empty).is_err());
    }

    fn set_with(key_stdin: bool, key_env: Option<&str>) -> QuotaAction {
        QuotaAction::Set {
            key: None,
            key_stdin,
            key_env: key_env.map(str::to_string),
            tier: Some("gold".into()),
            label: None,
            status: None,
            limits: vec![],
            effective_at: None,
            expires_at: None,
            clear: vec![],
        }
    }

    #[test]
    fn the_key_comes_from_standard_input_or_a_variable() {
        let no_env = |_: &str| None;
        let mut a = set_with(true, None);
        resolve_key(&mut a, &b"sk/live key\r\n"[..], no_env).unwrap();
        assert_eq!(
            call_of(&a).unwrap().path,
            "/admin/v1/quotas/sk%2Flive%20key"
        );
        let mut b = set_with(false, Some("MY_KEY"));
        let env = |v: &str| (v == "MY_KEY").then(|| "from-env".to_string());
        resolve_key(&mut b, &b""[..], env).unwrap();
        assert_eq!(call_of(&b).unwrap().path, "/admin/v1/quotas/from-env");
        let err =
            |mut a: QuotaAction, input: &[u8]| resolve_key(&mut a, input, no_env).unwrap_err();
        assert_eq!(
            err(set_with(true, None), b"\n"),
            "--key-stdin: standard input holds an empty key"
        );
        assert_eq!(
            err(set_with(true, None), b"a\nb\n"),
            "--key-stdin: standard input holds more than one line"
        );
        assert_eq!(
            err(set_with(false, Some("NOPE")), b""),
            "--key-env: the variable NOPE is not set"
        );
    }

    #[test]
    fn tables_escape_control_characters() {
        let o = json!({"key": "fp:1a2b3c4d", "label": "acme\u{1b}[2J\nfp:00000000 forged\u{202e}", "tier": "gold", "status": "active"});
        let t = table(&o);
        assert_eq!(t.lines().count(), 2, "{t}");
        assert!(!t.contains('\u{1b}') && !t.contains('\u{202e}'), "{t}");
        assert!(
            t.contains("acme\\u{1b}[2J\\nfp:00000000 forged\\u{202e}"),
            "{t}"
        );
    }

    #[test]
    fn raw_keys_are_escaped_and_fingerprints_kept() {
        assert_eq!(key_segment("fp:1a2b3c4d"), "fp:1a2b3c4d");
        assert_eq!(key_segment("sk/live key"), "sk%2Flive%20key");
    }
}
