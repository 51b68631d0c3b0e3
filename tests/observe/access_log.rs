//! The access log: every field, the request id forwarded upstream, no secret in any line,
//! text and JSON, sampling, and a stalled writer that neither slows proxying nor loses count.

use std::io::BufRead;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tollgate::fingerprint::fingerprint;

use crate::common::gateway::Gateway;
use crate::common::http::{client, get};
use crate::common::upstream::Upstream;
use crate::common::wait::eventually;
use crate::{config, start, SECRET_KEY};

const JWT_SECRET: &str = "observe-test-jwt-secret-0123456789";

/// The lines of `path` once there are `n`; panics after 10 s.
async fn lines(path: &Path, n: usize) -> Vec<String> {
    eventually(
        format!("{n} lines in {}", path.display()),
        Duration::from_secs(10),
    )
    .holds(|| {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        let lines: Vec<String> = text.lines().map(str::to_string).collect();
        if lines.len() == n {
            Ok(lines)
        } else {
            Err(format!("{} lines: {text}", lines.len()))
        }
    })
    .await
}

fn jwt(user: &str) -> String {
    let exp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
        + 3600;
    jsonwebtoken::encode(
        &jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256),
        &json!({ "sub": user, "exp": exp }),
        &jsonwebtoken::EncodingKey::from_secret(JWT_SECRET.as_bytes()),
    )
    .expect("encode JWT")
}

#[tokio::test(flavor = "multi_thread")]
async fn one_json_line_per_request_with_every_field_and_no_secret() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("access.log");
    let up = Upstream::start().await;
    let extra = format!(
        "access_log: {{ format: json, path: \"{}\" }}\nidentity: {{ jwt: {{ hs256_secret_env: OBSERVE_JWT }} }}\n",
        log.display()
    );
    let gw = Gateway::start_with_env(&config(&up, &extra), &[("OBSERVE_JWT", JWT_SECRET)]).await;
    let c = client();
    let token = jwt("alice");
    let bearer = format!("Bearer {token}");
    let fp = fingerprint(SECRET_KEY).to_string();

    // 1. The client's own request id, an API key also in the query and the user agent.
    let r = get(
        &c,
        &gw.url(&format!("/orders/7?api_key={SECRET_KEY}")),
        &[
            ("x-api-key", SECRET_KEY),
            ("x-request-id", "client-id-1"),
            ("user-agent", &format!("tester {SECRET_KEY}")),
        ],
    )
    .await;
    assert_eq!(r.json()["headers"]["x-request-id"], json!(["client-id-1"]));
    // 2. No request id: one is made and forwarded. The path is normalized.
    let r = get(&c, &gw.url("/a//b/./../c"), &[]).await;
    let made = r.json()["headers"]["x-request-id"][0]
        .as_str()
        .expect("an id")
        .to_string();
    // 3. A JWT user, with the token copied into the user agent too.
    get(
        &c,
        &gw.url("/me"),
        &[("authorization", &bearer), ("user-agent", &token)],
    )
    .await;
    // 4. The API key's tier allows 5 an hour: 4 more pass, the 6th is denied.
    for _ in 0..5 {
        get(&c, &gw.url("/orders"), &[("x-api-key", SECRET_KEY)]).await;
    }
    // 5. A target over 8 KiB, refused before identity: its line still names the peer.
    let long = format!("/{}", "a".repeat(9000));
    let r = get(&c, &gw.url(&long), &[]).await;
    assert_eq!(r.status.as_u16(), 414);

    let lines = lines(&log, 9).await;
    let all = lines.join("\n");
    for secret in [SECRET_KEY, token.as_str(), "Bearer", "authorization"] {
        assert!(
            !all.contains(secret),
            "the access log holds {secret:?}:\n{all}"
        );
    }
    let line: Vec<Value> = lines
        .iter()
        .map(|l| serde_json::from_str(l).expect("JSON"))
        .collect();
    let first = &line[0];
    for field in [
        "time",
        "request_id",
        "client_ip",
        "caller",
        "method",
        "path",
        "route",
        "status",
        "limit",
        "outcome",
        "degraded",
        "class",
        "upstream",
        "upstream_ms",
        "duration_ms",
        "bytes_in",
        "bytes_out",
        "user_agent",
    ] {
        assert!(first.get(field).is_some(), "no {field} in {first}");
    }
    assert_eq!(first["request_id"], "client-id-1");
    assert_eq!(first["client_ip"], "127.0.0.1");
    assert_eq!(first["caller"], fp.as_str());
    assert_eq!(first["path"], "/orders/7");
    assert_eq!(
        (&first["method"], &first["route"], &first["status"]),
        (&json!("GET"), &json!("default"), &json!(200))
    );
    assert_eq!(
        (&first["limit"], &first["outcome"]),
        (&json!("free-hour"), &json!("allow"))
    );
    assert_eq!(
        (&first["class"], &first["degraded"]),
        (&json!("get"), &Value::Null)
    );
    assert_eq!(first["upstream"], up.addr.to_string());
    assert_eq!(first["user_agent"], format!("tester {fp}"));
    assert!(
        first["bytes_out"].as_u64().unwrap() > 0 && first["upstream_ms"].as_f64().unwrap() > 0.0
    );
    assert!(first["duration_ms"].as_f64().unwrap() >= first["upstream_ms"].as_f64().unwrap());
    assert!(first["time"].as_str().unwrap().ends_with('Z'));
    assert_eq!(
        (&line[1]["request_id"], &line[1]["path"]),
        (&json!(made), &json!("/a/c"))
    );
    assert_eq!(
        (&line[1]["caller"], &line[1]["limit"]),
        (&Value::Null, &json!("per-ip"))
    );
    assert_eq!(
        (&line[2]["caller"], &line[2]["user_agent"]),
        (&json!("user:alice"), &json!("[token]"))
    );
    let last = &line[7];
    assert_eq!(
        (&last["status"], &last["limit"], &last["outcome"]),
        (&json!(429), &json!("free-hour"), &json!("deny"))
    );
    assert_eq!(
        (&last["upstream"], &last["upstream_ms"]),
        (&Value::Null, &Value::Null)
    );
    let refused = &line[8];
    assert_eq!(
        (&refused["status"], &refused["client_ip"], &refused["route"]),
        (&json!(414), &json!("127.0.0.1"), &Value::Null)
    );

    // /top names the key by its fingerprint only.
    let top = gw.admin_get("/top", &[]).await;
    assert!(!top.text().contains(SECRET_KEY), "{}", top.text());
    assert_eq!(
        top.json()["callers"][0],
        json!({ "limit": "free-hour", "caller": fp, "denials": 1, "error": 0 })
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn text_to_stdout_by_default_and_json_with_log_format_json() {
    let (up, text) = start("").await;
    let c = client();
    get(&c, &text.url("/plain"), &[("x-api-key", SECRET_KEY)]).await;
    text.wait_output("path=/plain", Duration::from_secs(5))
        .await;
    let line = text
        .output()
        .lines()
        .find(|l| l.contains("path=/plain"))
        .unwrap()
        .to_string();
    let fp = fingerprint(SECRET_KEY);
    assert!(
        line.starts_with("time=") && line.contains(&format!("caller={fp} ")),
        "{line}"
    );
    assert!(
        line.contains(" status=200 limit=free-hour outcome=allow "),
        "{line}"
    );
    assert!(!text.output().contains(SECRET_KEY));

    let json = Gateway::start_named("json", &config(&up, ""), &["--log-format", "json"], &[]).await;
    get(&c, &json.url("/as-json"), &[]).await;
    json.wait_output("\"path\":\"/as-json\"", Duration::from_secs(5))
        .await;
    let out = json.output();
    let line = out.lines().find(|l| l.contains("/as-json")).unwrap();
    let v: Value = serde_json::from_str(line).expect("a JSON line");
    assert_eq!(v["status"], 200);
}

#[tokio::test(flavor = "multi_thread")]
async fn sample_logs_that_fraction_of_requests() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("sampled.log");
    let (_up, gw) = start(&format!(
        "access_log: {{ path: \"{}\", sample: 0.5 }}\n",
        log.display()
    ))
    .await;
    let c = client();
    for _ in 0..10 {
        get(&c, &gw.url("/s"), &[]).await;
    }
    assert_eq!(lines(&log, 5).await.len(), 5);
}

/// A FIFO whose reader holds it open without reading until told to drain it; counts lines.
struct StalledReader {
    lines: Arc<AtomicU64>,
    drain: std::sync::mpsc::Sender<()>,
}

impl StalledReader {
    fn open(path: &Path) -> StalledReader {
        let status = std::process::Command::new("mkfifo")
            .arg(path)
            .status()
            .expect("mkfifo");
        assert!(status.success());
        let (drain, go) = std::sync::mpsc::channel::<()>();
        let lines = Arc::new(AtomicU64::new(0));
        let (count, path) = (lines.clone(), path.to_path_buf());
        std::thread::spawn(move || {
            let f = std::fs::File::open(&path).expect("open the FIFO for reading");
            if go.recv().is_err() {
                return;
            }
            for _ in std::io::BufReader::new(f).lines().map_while(Result::ok) {
                count.fetch_add(1, Ordering::SeqCst);
            }
        });
        StalledReader { lines, drain }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_stalled_log_never_slows_proxying_and_dropped_lines_are_counted() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("stalled.log");
    let reader = StalledReader::open(&fifo);
    let (_up, gw) = start(&format!(
        "access_log: {{ path: \"{}\", buffer: 16 }}\n",
        fifo.display()
    ))
    .await;
    let c = client();
    const N: u64 = 600;
    let mut slowest = Duration::ZERO;
    for _ in 0..N {
        let t = Instant::now();
        let r = get(&c, &gw.url("/stalled"), &[]).await;
        assert!(r.status.as_u16() == 200 || r.status.as_u16() == 429);
        slowest = slowest.max(t.elapsed());
    }
    // Nothing reads the log, yet every request was answered at once.
    assert!(
        slowest < Duration::from_secs(1),
        "slowest request {slowest:?}"
    );
    // Drained: every line was either written or counted as dropped. (A request's line is
    // logged after its response is sent, so the last few may still be dropped after the loop;
    // the count is read with the lines.)
    reader.drain.send(()).unwrap();
    let (read, dropped) = eventually(
        format!("{N} lines read or dropped"),
        Duration::from_secs(10),
    )
    .holds_async(|| async {
        let dropped = gw
            .metrics()
            .await
            .value("tollgate_access_log_dropped_total", &[]) as u64;
        let read = reader.lines.load(Ordering::SeqCst);
        (read + dropped == N).then_some((read, dropped))
    })
    .await;
    assert!(dropped > 0, "a full buffer drops lines");
    let m = gw.metrics().await;
    assert_eq!(
        m.value("tollgate_access_log_dropped_total", &[]),
        dropped as f64
    );
    assert_eq!(m.value("tollgate_access_log_lines_total", &[]), read as f64);
}
