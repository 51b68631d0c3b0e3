//! HTTP through reqwest: clients with bounded timeouts and no proxy from the environment,
//! [`Resp`] (a whole response, read), and `send` / `get` / `get_json`.

use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpStream};
use std::time::Duration;

use reqwest::header::{HeaderMap, HeaderName, HeaderValue};
use reqwest::{Method, StatusCode};

/// Timeout of every HTTP request a test makes.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(20);

/// Problem type of a request refused by a limit.
pub const QUOTA_EXCEEDED: &str = "https://iana.org/assignments/http-problem-types#quota-exceeded";
/// Problem type of a request shed, or refused because the store is down.
pub const REDUCED_CAPACITY: &str =
    "https://iana.org/assignments/http-problem-types#temporary-reduced-capacity";
/// The header that says a request was decided without the store, and by which policy.
pub const DEGRADED: &str = "tollgate-degraded";

/// A client of the gateway: no proxy from the environment, bounded timeouts.
pub fn client() -> reqwest::Client {
    client_builder().build().expect("reqwest client")
}

pub fn client_builder() -> reqwest::ClientBuilder {
    reqwest::Client::builder()
        .no_proxy()
        .timeout(REQUEST_TIMEOUT)
        .connect_timeout(Duration::from_secs(5))
}

/// A client whose connections come from `local` (any 127.x.y.z works on Linux: all of
/// 127.0.0.0/8 is routed to `lo`).
pub fn client_from(local: Ipv4Addr) -> reqwest::Client {
    client_builder()
        .local_address(IpAddr::V4(local))
        .build()
        .expect("reqwest client")
}

/// A whole response, read.
#[derive(Debug, Clone)]
pub struct Resp {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Vec<u8>,
}

impl Resp {
    pub async fn read(r: reqwest::Response) -> Resp {
        Resp::try_read(r).await.expect("response body")
    }

    /// [`Resp::read`], with a body that fails to arrive as an error.
    pub async fn try_read(r: reqwest::Response) -> reqwest::Result<Resp> {
        let status = r.status();
        let headers = r.headers().clone();
        let body = r.bytes().await?.to_vec();
        Ok(Resp {
            status,
            headers,
            body,
        })
    }

    /// The single value of header `name`; panics (showing the response) when absent or
    /// repeated.
    pub fn header(&self, name: &str) -> &str {
        let mut all = self.headers.get_all(name).iter();
        let Some(v) = all.next() else {
            panic!("no {name} header in {self:#?}");
        };
        assert!(
            all.next().is_none(),
            "{name} sent more than once: {self:#?}"
        );
        v.to_str().expect("visible ASCII header")
    }

    pub fn opt_header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).map(|v| v.to_str().expect("ascii"))
    }

    /// A header parsed as an unsigned integer.
    pub fn header_u64(&self, name: &str) -> u64 {
        let v = self.header(name);
        v.parse()
            .unwrap_or_else(|_| panic!("{name}: {v:?} is not a number"))
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| {
            panic!(
                "body is not JSON ({e}): {:?}",
                String::from_utf8_lossy(&self.body)
            )
        })
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// The `t` parameter of the `RateLimit` header.
    pub fn ratelimit_t(&self) -> u64 {
        let v = self.header("ratelimit");
        let t = v
            .split(';')
            .find_map(|p| p.strip_prefix("t="))
            .unwrap_or_else(|| panic!("no t= in RateLimit {v:?}"));
        t.parse()
            .unwrap_or_else(|_| panic!("RateLimit t={t:?} is not a number"))
    }

    /// None of the rate-limit headers is present.
    pub fn assert_no_ratelimit_headers(&self) {
        for h in [
            "ratelimit",
            "ratelimit-policy",
            "x-ratelimit-limit",
            "x-ratelimit-remaining",
            "x-ratelimit-reset",
            "retry-after",
        ] {
            assert!(
                self.headers.get(h).is_none(),
                "unexpected {h} header: {self:#?}"
            );
        }
    }
}

/// Send `method url` with `headers` (appended in order, so a name may repeat) and `body`.
pub async fn send(
    client: &reqwest::Client,
    method: Method,
    url: &str,
    headers: &[(&str, &str)],
    body: Option<Vec<u8>>,
) -> Resp {
    let mut map = HeaderMap::new();
    for (k, v) in headers {
        map.append(
            HeaderName::from_bytes(k.as_bytes()).expect("header name"),
            HeaderValue::from_bytes(v.as_bytes()).expect("header value"),
        );
    }
    let mut req = client.request(method.clone(), url).headers(map);
    if let Some(b) = body {
        req = req.body(b);
    }
    let r = req
        .send()
        .await
        .unwrap_or_else(|e| panic!("{method} {url}: {e:?}"));
    Resp::read(r).await
}

pub async fn get(client: &reqwest::Client, url: &str, headers: &[(&str, &str)]) -> Resp {
    send(client, Method::GET, url, headers, None).await
}

/// `GET url`, which must answer 200 with JSON.
pub async fn get_json<T: serde::de::DeserializeOwned>(client: &reqwest::Client, url: &str) -> T {
    let r = client
        .get(url)
        .send()
        .await
        .unwrap_or_else(|e| panic!("GET {url}: {e}"));
    assert_eq!(r.status(), StatusCode::OK, "GET {url}");
    r.json()
        .await
        .unwrap_or_else(|e| panic!("GET {url}: not JSON: {e}"))
}

/// Whether `GET url` answers 200 (a readiness probe: any error is "not yet").
pub async fn http_ok(client: &reqwest::Client, url: &str) -> bool {
    match client.get(url).send().await {
        Ok(r) => r.status() == StatusCode::OK,
        Err(_) => false,
    }
}

/// Whether a TCP connection to `addr` is accepted within 200 ms.
pub fn tcp_open(addr: SocketAddr) -> bool {
    TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok()
}
