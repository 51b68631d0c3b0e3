//! `tollgate_requests_total` and `tollgate_request_duration_seconds`, counted by each thread in
//! a shard of its own. A shard has one writer, so a response is counted with plain loads and
//! stores, where a Prometheus counter and histogram cost it five atomic read-modify-writes;
//! a scrape sums the shards ([`RequestSeries`] is their `Collector`).
//!
//! A route's series lives while a config has the route: a reload that keeps it keeps its
//! counts, one that removes it stops exporting it ([`RequestSeries::remove`]), and should it
//! come back it starts from zero, as a Prometheus series removed and made again does.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::ThreadId;

use parking_lot::Mutex;
use prometheus::core::{Collector, Desc};
use prometheus::proto::{self, LabelPair, MetricFamily, MetricType};

/// `code_class` values; `none` is a request that ended without a response (client gone).
pub const CODE_CLASSES: [&str; 6] = ["1xx", "2xx", "3xx", "4xx", "5xx", "none"];

/// The index in [`CODE_CLASSES`] of a status (`none` for anything outside 100-599).
pub fn code_class(status: u16) -> usize {
    match status {
        100..=199 => 0,
        200..=299 => 1,
        300..=399 => 2,
        400..=499 => 3,
        500..=599 => 4,
        _ => 5,
    }
}

/// Upper bounds of the request-duration buckets, in seconds.
pub const REQUEST_BUCKETS: [f64; 14] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

thread_local! {
    /// This thread's shards of the routes of the labels it last counted for (by
    /// [`Routes::id`]), by route index; made on a route's first response on this thread.
    static SHARDS: RefCell<(u64, Vec<Option<Arc<Shard>>>)> = const { RefCell::new((0, Vec::new())) };
}

/// Distinguishes one [`Routes`] from another, for [`SHARDS`].
static NEXT_ROUTES_ID: AtomicU64 = AtomicU64::new(1);

/// One thread's counts of one route.
#[derive(Debug)]
struct Shard {
    owner: ThreadId,
    /// Responses by code class ([`CODE_CLASSES`]).
    responses: [AtomicU64; 6],
    /// Durations by bucket: [`REQUEST_BUCKETS`]' bounds, then `+Inf`.
    buckets: [AtomicU64; REQUEST_BUCKETS.len() + 1],
    /// The durations' sum, in seconds (an `f64`'s bits).
    sum: AtomicU64,
}

/// Add `n` to a counter that only this thread writes: a load and a store, which a concurrent
/// reader sees as the old or the new value.
fn add(counter: &AtomicU64, n: u64) {
    counter.store(counter.load(Ordering::Relaxed) + n, Ordering::Relaxed);
}

impl Shard {
    fn new(owner: ThreadId) -> Shard {
        Shard {
            owner,
            responses: Default::default(),
            buckets: Default::default(),
            sum: AtomicU64::new(0f64.to_bits()),
        }
    }

    fn count(&self, class: usize, seconds: Option<f64>) {
        add(&self.responses[class], 1);
        if let Some(s) = seconds {
            let bucket = REQUEST_BUCKETS
                .iter()
                .position(|&b| s <= b)
                .unwrap_or(REQUEST_BUCKETS.len());
            add(&self.buckets[bucket], 1);
            let sum = f64::from_bits(self.sum.load(Ordering::Relaxed)) + s;
            self.sum.store(sum.to_bits(), Ordering::Relaxed);
        }
    }
}

/// One route's series: the shards of every thread that counted a response of it.
#[derive(Debug)]
pub struct Route {
    name: Arc<str>,
    shards: Mutex<Vec<Arc<Shard>>>,
}

/// The sums of a route's shards.
#[derive(Debug, Default, Clone, Copy, PartialEq)]
pub struct Totals {
    pub responses: [u64; 6],
    pub buckets: [u64; REQUEST_BUCKETS.len() + 1],
    pub sum: f64,
}

impl Route {
    /// The calling thread's shard: its own, made on its first response of this route.
    fn shard(&self) -> Arc<Shard> {
        let me = std::thread::current().id();
        let mut shards = self.shards.lock();
        if let Some(s) = shards.iter().find(|s| s.owner == me) {
            return s.clone();
        }
        let s = Arc::new(Shard::new(me));
        shards.push(s.clone());
        s
    }

    pub fn totals(&self) -> Totals {
        let mut t = Totals::default();
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
        for s in self.shards.lock().iter() {
            t.responses
                .iter_mut()
                .zip(&s.responses)
                .for_each(|(t, a)| *t += load(a));
            t.buckets
                .iter_mut()
                .zip(&s.buckets)
                .for_each(|(t, a)| *t += load(a));
            t.sum += f64::from_bits(load(&s.sum));
        }
        t
    }
}

/// The routes of one config, by index, as its requests count them.
#[derive(Debug)]
pub struct Routes {
    id: u64,
    routes: Vec<Arc<Route>>,
}

impl Routes {
    /// One response of route `r` with code class `class`, and its duration when known.
    pub fn count(&self, r: usize, class: usize, seconds: Option<f64>) {
        SHARDS.with_borrow_mut(|(id, shards)| {
            if *id != self.id {
                *id = self.id;
                shards.clear();
                shards.resize(self.routes.len(), None);
            }
            shards[r]
                .get_or_insert_with(|| self.routes[r].shard())
                .count(class, seconds);
        })
    }

    pub fn iter(&self) -> impl Iterator<Item = &Arc<Route>> {
        self.routes.iter()
    }
}

/// Every exported route's series; the `Collector` of both metric families.
#[derive(Clone)]
pub struct RequestSeries {
    descs: Arc<[Desc; 2]>,
    routes: Arc<Mutex<BTreeMap<Arc<str>, Arc<Route>>>>,
}

const REQUESTS: (&str, &str) = (
    "tollgate_requests_total",
    "Responses, by route and status class.",
);
const DURATION: (&str, &str) = (
    "tollgate_request_duration_seconds",
    "Whole requests, from the request head to the end of the response.",
);

impl RequestSeries {
    pub fn new() -> RequestSeries {
        let desc = |(name, help): (&str, &str), labels: &[&str]| {
            let labels = labels.iter().map(|l| l.to_string()).collect();
            Desc::new(name.into(), help.into(), labels, Default::default()).expect("valid metric")
        };
        RequestSeries {
            descs: Arc::new([
                desc(REQUESTS, &["route", "code_class"]),
                desc(DURATION, &["route"]),
            ]),
            routes: Arc::default(),
        }
    }

    /// The series of routes `names`, in order: the exported ones, or new ones from zero.
    pub fn routes(&self, names: &[Arc<str>]) -> Routes {
        let mut exported = self.routes.lock();
        let routes = names
            .iter()
            .map(|name| {
                let route = exported.entry(name.clone()).or_insert_with(|| {
                    Arc::new(Route {
                        name: name.clone(),
                        shards: Mutex::default(),
                    })
                });
                route.clone()
            })
            .collect();
        Routes {
            id: NEXT_ROUTES_ID.fetch_add(1, Ordering::Relaxed),
            routes,
        }
    }

    /// Stop exporting route `name`'s series.
    pub fn remove(&self, name: &str) {
        self.routes.lock().remove(name);
    }
}

impl Default for RequestSeries {
    fn default() -> Self {
        RequestSeries::new()
    }
}

fn label(name: &str, value: &str) -> LabelPair {
    let mut l = LabelPair::default();
    l.set_name(name.into());
    l.set_value(value.into());
    l
}

fn family(
    (name, help): (&str, &str),
    kind: MetricType,
    metrics: Vec<proto::Metric>,
) -> MetricFamily {
    let mut f = MetricFamily::default();
    f.set_name(name.into());
    f.set_help(help.into());
    f.set_field_type(kind);
    f.set_metric(metrics);
    f
}

impl Collector for RequestSeries {
    fn desc(&self) -> Vec<&Desc> {
        self.descs.iter().collect()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        let routes: Vec<Arc<Route>> = self.routes.lock().values().cloned().collect();
        let (mut requests, mut durations) = (Vec::new(), Vec::new());
        for route in routes {
            let t = route.totals();
            for (class, n) in CODE_CLASSES.iter().zip(t.responses) {
                let mut c = proto::Counter::default();
                c.set_value(n as f64);
                let mut m = proto::Metric::from_label(vec![
                    label("code_class", class),
                    label("route", &route.name),
                ]);
                m.set_counter(c);
                requests.push(m);
            }
            let mut h = proto::Histogram::default();
            let mut cumulative = 0;
            let buckets = REQUEST_BUCKETS.iter().zip(&t.buckets).map(|(&bound, &n)| {
                cumulative += n;
                let mut b = proto::Bucket::default();
                b.set_upper_bound(bound);
                b.set_cumulative_count(cumulative);
                b
            });
            h.set_bucket(buckets.collect());
            // The count is the buckets' total, so that `+Inf` and `_count` always agree.
            h.set_sample_count(t.buckets.iter().sum());
            h.set_sample_sum(t.sum);
            let mut m = proto::Metric::from_label(vec![label("route", &route.name)]);
            m.set_histogram(h);
            durations.push(m);
        }
        vec![
            family(REQUESTS, MetricType::COUNTER, requests),
            family(DURATION, MetricType::HISTOGRAM, durations),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus::{Encoder, HistogramOpts, HistogramVec, IntCounterVec, Opts, Registry};

    fn text(r: &Registry) -> String {
        let mut out = Vec::new();
        prometheus::TextEncoder::new()
            .encode(&r.gather(), &mut out)
            .unwrap();
        String::from_utf8(out).unwrap()
    }

    fn names(names: &[&str]) -> Vec<Arc<str>> {
        names.iter().map(|&n| n.into()).collect()
    }

    /// The same responses, counted on two threads, read as Prometheus's own counter and
    /// histogram families would show them: the exposition did not change.
    #[test]
    fn the_exposition_is_prometheus_own_for_the_same_responses() {
        let (ours, theirs) = (Registry::new(), Registry::new());
        let series = RequestSeries::new();
        ours.register(Box::new(series.clone())).unwrap();
        let requests =
            IntCounterVec::new(Opts::new(REQUESTS.0, REQUESTS.1), &["route", "code_class"])
                .unwrap();
        let opts = HistogramOpts::new(DURATION.0, DURATION.1).buckets(REQUEST_BUCKETS.to_vec());
        let durations = HistogramVec::new(opts, &["route"]).unwrap();
        theirs.register(Box::new(requests.clone())).unwrap();
        theirs.register(Box::new(durations.clone())).unwrap();

        let routes = series.routes(&names(&["b", "a"]));
        // (route, status class, seconds): on a bound, between bounds, past the last, none.
        let responses = [
            (0, 1, Some(0.001)),
            (0, 1, Some(0.0007)),
            (1, 3, Some(12.0)),
            (0, 5, None),
            (1, 1, Some(0.25)),
        ];
        let count = |(r, class, s): (usize, usize, Option<f64>)| {
            routes.count(r, class, s);
            let name = ["b", "a"][r];
            requests
                .with_label_values(&[name, CODE_CLASSES[class]])
                .inc();
            if let Some(s) = s {
                durations.with_label_values(&[name]).observe(s);
            }
        };
        std::thread::scope(|s| {
            s.spawn(|| responses[..2].iter().for_each(|&r| count(r)));
        });
        responses[2..].iter().for_each(|&r| count(r));
        // Every class of both routes, counted or not, as ours always shows them.
        for name in ["a", "b"] {
            for class in CODE_CLASSES {
                requests.with_label_values(&[name, class]);
            }
        }
        assert_eq!(text(&ours), text(&theirs));
        assert!(text(&ours).contains("tollgate_request_duration_seconds_count{route=\"b\"} 2\n"));
    }

    /// A route kept by the next config keeps its counts; one removed starts from zero when it
    /// comes back; a thread counts into one shard of a route, whichever config it counts for.
    #[test]
    fn a_kept_route_keeps_its_counts_and_a_removed_one_starts_again() {
        let series = RequestSeries::new();
        let first = series.routes(&names(&["a", "b"]));
        for _ in 0..3 {
            first.count(0, 1, Some(0.002));
            first.count(1, 4, None);
        }
        series.remove("b");
        let next = series.routes(&names(&["a", "b"]));
        next.count(0, 1, Some(0.002));
        next.count(1, 4, None);
        let mut a = next.iter().next().unwrap().totals();
        let b = next.iter().nth(1).unwrap().totals();
        assert_eq!(
            (a.responses[1], a.buckets[2]),
            (4, 4),
            "0.002 s is in the 2.5 ms bucket"
        );
        assert_eq!(b.responses[4], 1);
        assert_eq!(next.iter().next().unwrap().shards.lock().len(), 1);
        a.sum = (a.sum * 1000.0).round();
        assert_eq!(a.sum, 8.0);
    }
}
