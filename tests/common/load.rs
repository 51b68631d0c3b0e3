//! The one load generator of the tests: `conns` reqwest connections, each sending GETs one
//! after the other to its target (connection `i` to `targets[i % targets.len()]`), recording
//! every [`Reply`] with when it was sent and how long it took.
//!
//! [`Load::run`] sends a fixed number of requests per connection and returns the replies (a
//! burst); [`Load::start`] keeps sending in the background until [`Driver::finish`] (a
//! driver, aborted when dropped). Both are bounded in time and in requests.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;
use std::time::{Duration, Instant};

use super::http::{client_builder, Resp};
use super::wait::eventually;

/// Default bound of a whole [`Load::run`] (every request also has its own timeout).
pub const RUN_TIMEOUT: Duration = Duration::from_secs(90);
/// At most this many requests per connection of a [`Driver`].
const DRIVER_MAX_REQUESTS: usize = 20_000;
/// How long a [`Driver`] gets to stop once told to.
const STOP_TIMEOUT: Duration = Duration::from_secs(30);

/// Headers of one request, as `(name, value)` pairs.
pub type Headers = Vec<(String, String)>;
type HeaderFn = Arc<dyn Fn(usize, usize) -> Headers + Send + Sync>;

/// One request of a load: its connection and target, when it was sent, how long it took, and
/// the response or the transport error.
#[derive(Clone)]
pub struct Reply {
    pub conn: usize,
    pub target: usize,
    pub sent: Instant,
    pub latency: Duration,
    pub result: Result<Resp, String>,
}

impl Reply {
    /// The status, 0 for a transport error.
    pub fn status(&self) -> u16 {
        self.result.as_ref().map_or(0, |r| r.status.as_u16())
    }

    /// Header `name`, if there was a response and it had one.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.result.as_ref().ok()?.opt_header(name)
    }

    /// The response; panics with the transport error if there was none.
    pub fn resp(&self) -> &Resp {
        self.result
            .as_ref()
            .unwrap_or_else(|e| panic!("request on connection {}: {e}", self.conn))
    }
}

impl std::fmt::Debug for Reply {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut d = f.debug_struct("Reply");
        d.field("conn", &self.conn)
            .field("target", &self.target)
            .field("latency", &self.latency);
        match &self.result {
            Ok(r) => d
                .field("status", &r.status)
                .field("headers", &r.headers)
                .field("body", &r.text()),
            Err(e) => d.field("error", e),
        };
        d.finish()
    }
}

/// Replies by status (0 = transport error).
pub fn by_status<'a>(replies: impl IntoIterator<Item = &'a Reply>) -> BTreeMap<u16, u64> {
    let mut m = BTreeMap::new();
    for r in replies {
        *m.entry(r.status()).or_default() += 1;
    }
    m
}

/// What to send: targets, connections, pace and headers.
#[derive(Clone)]
pub struct Load {
    targets: Arc<Vec<String>>,
    conns: usize,
    pace: Duration,
    fixed: Arc<Headers>,
    per_request: Option<HeaderFn>,
    progress: Option<Arc<AtomicU64>>,
    within: Duration,
}

impl Load {
    /// GETs of `url` on one connection, back to back, without extra headers.
    pub fn new(url: &str) -> Load {
        Load::across(&[url.to_string()])
    }

    /// Connection `i` sends to `targets[i % targets.len()]`.
    pub fn across(targets: &[String]) -> Load {
        assert!(!targets.is_empty(), "a load needs a target");
        Load {
            targets: Arc::new(targets.to_vec()),
            conns: 1,
            pace: Duration::ZERO,
            fixed: Arc::new(Vec::new()),
            per_request: None,
            progress: None,
            within: RUN_TIMEOUT,
        }
    }

    pub fn conns(mut self, n: usize) -> Load {
        self.conns = n;
        self
    }

    /// Each connection waits `pace` after each answer (default: none).
    pub fn pace(mut self, pace: Duration) -> Load {
        self.pace = pace;
        self
    }

    /// Every request carries `name: value` (after the headers added before).
    pub fn header(mut self, name: &str, value: &str) -> Load {
        Arc::make_mut(&mut self.fixed).push((name.to_string(), value.to_string()));
        self
    }

    /// Request `n` of connection `conn` also carries `f(conn, n)`.
    pub fn headers(mut self, f: impl Fn(usize, usize) -> Headers + Send + Sync + 'static) -> Load {
        self.per_request = Some(Arc::new(f));
        self
    }

    /// Count answered requests (and transport errors) in `progress`.
    pub fn progress(mut self, progress: &Arc<AtomicU64>) -> Load {
        self.progress = Some(progress.clone());
        self
    }

    /// Bound of [`Load::run`] (default [`RUN_TIMEOUT`]).
    pub fn within(mut self, within: Duration) -> Load {
        self.within = within;
        self
    }

    /// Send `per_conn` requests on every connection; every reply, in the order they came.
    pub async fn run(self, per_conn: usize) -> Vec<Reply> {
        let within = self.within;
        let driver = self.spawn(per_conn);
        driver.join("load run did not finish", within).await
    }

    /// Keep sending in the background until [`Driver::finish`].
    pub fn start(self) -> Driver {
        self.spawn(DRIVER_MAX_REQUESTS)
    }

    fn spawn(self, per_conn: usize) -> Driver {
        let stop = Arc::new(AtomicBool::new(false));
        let replies = Arc::new(Mutex::new(Vec::new()));
        let tasks = (0..self.conns)
            .map(|conn| {
                let (load, stop, replies) = (self.clone(), stop.clone(), replies.clone());
                tokio::spawn(load.connection(conn, per_conn, stop, replies))
            })
            .collect();
        Driver {
            stop,
            replies,
            tasks,
        }
    }

    /// One connection: up to `count` GETs, one after the other, until `stop`.
    async fn connection(
        self,
        conn: usize,
        count: usize,
        stop: Arc<AtomicBool>,
        replies: Arc<Mutex<Vec<Reply>>>,
    ) {
        let client = client_builder()
            .pool_max_idle_per_host(1)
            .build()
            .expect("client");
        let target = conn % self.targets.len();
        for n in 0..count {
            if stop.load(Ordering::SeqCst) {
                break;
            }
            let mut req = client.get(&self.targets[target]);
            for (k, v) in self.fixed.iter() {
                req = req.header(k, v);
            }
            for (k, v) in self.per_request.as_ref().map_or(Vec::new(), |f| f(conn, n)) {
                req = req.header(k, v);
            }
            let sent = Instant::now();
            let result = match req.send().await {
                Ok(r) => Resp::try_read(r).await.map_err(|e| format!("{e:?}")),
                Err(e) => Err(format!("{e:?}")),
            };
            let latency = sent.elapsed();
            let reply = Reply {
                conn,
                target,
                sent,
                latency,
                result,
            };
            replies.lock().push(reply);
            if let Some(p) = &self.progress {
                p.fetch_add(1, Ordering::SeqCst);
            }
            if !self.pace.is_zero() {
                tokio::time::sleep(self.pace).await;
            }
        }
    }
}

/// A load running in the background ([`Load::start`]); aborted when dropped.
pub struct Driver {
    stop: Arc<AtomicBool>,
    replies: Arc<Mutex<Vec<Reply>>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Driver {
    /// Replies so far.
    pub fn len(&self) -> usize {
        self.replies.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn snapshot(&self) -> Vec<Reply> {
        self.replies.lock().clone()
    }

    /// `f` of the replies so far (without copying them).
    pub fn inspect<T>(&self, f: impl FnOnce(&[Reply]) -> T) -> T {
        f(&self.replies.lock())
    }

    /// The first reply from the `from`-th on for which `pred` holds.
    pub fn first_since(&self, from: usize, pred: impl Fn(&Reply) -> bool) -> Option<Reply> {
        self.inspect(|r| r.get(from..)?.iter().find(|x| pred(x)).cloned())
    }

    /// Poll every 5 ms until `cond` holds on the replies so far; panics after `within`.
    pub async fn wait(&self, what: &str, within: Duration, cond: impl Fn(&[Reply]) -> bool) {
        eventually(format!("driver: {what}"), within)
            .every(Duration::from_millis(5))
            .holds(|| {
                self.inspect(|r| {
                    if cond(r) {
                        Ok(())
                    } else {
                        Err(format!("{} requests so far, last: {:?}", r.len(), r.last()))
                    }
                })
            })
            .await
    }

    /// Stop (each connection after its request in flight) and return every reply.
    pub async fn finish(self) -> Vec<Reply> {
        self.stop.store(true, Ordering::SeqCst);
        self.join("driver did not stop", STOP_TIMEOUT).await
    }

    /// Wait for every connection to end, at most `within` (else panic with `what`); every
    /// reply.
    /// (A timeout drops `self`, which aborts the connections.)
    async fn join(mut self, what: &str, within: Duration) -> Vec<Reply> {
        let all = async {
            for t in &mut self.tasks {
                t.await.expect("load task panicked");
            }
        };
        tokio::time::timeout(within, all)
            .await
            .unwrap_or_else(|_| panic!("{what} within {within:?}"));
        self.snapshot()
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

/// Latency figures of a set of samples.
#[derive(Debug, Clone, Copy)]
pub struct Latency {
    pub n: usize,
    pub p50: Duration,
    pub p99: Duration,
    pub max: Duration,
}

impl Latency {
    pub fn of(samples: &[Duration]) -> Latency {
        assert!(!samples.is_empty(), "no latency samples");
        let mut s = samples.to_vec();
        s.sort();
        let at = |p: f64| s[((p * s.len() as f64).ceil() as usize).clamp(1, s.len()) - 1];
        Latency {
            n: s.len(),
            p50: at(0.5),
            p99: at(0.99),
            max: s[s.len() - 1],
        }
    }
}

impl std::fmt::Display for Latency {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "n={} p50={:.2}ms p99={:.2}ms max={:.2}ms",
            self.n,
            ms(self.p50),
            ms(self.p99),
            ms(self.max)
        )
    }
}

/// `d` in milliseconds.
pub fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}
