//! In-flight tracking and priority load shedding.
//!
//! Every request that gets past routing is in flight until it ends, and is counted in one
//! atomic of the gateway's [`Shedder`]. Each request belongs to a [`Priority`] class: `critical` (routes marked
//! so), `post` (writes), `get` (reads) and `test` (test traffic). With a `shedding` section, a
//! class is refused (`503`) while `threshold × max_in_flight` requests are already in flight,
//! so as load grows `test` is shed first, then `get`, then `post`; `critical` is never shed.
//!
//! The policy ([`Shedding`], [`Priority`]) is config and reloads; the state ([`Shedder`]) is
//! the gateway's and persists.
//!
//! Phase: `request_filter`, after identity and route and before any store call, so a shed
//! request costs no store round trip. Touches only atomics: one compare-and-swap to enter, one
//! decrement (the [`InFlight`] guard's drop) to leave.

use std::sync::atomic::{AtomicU64, Ordering};

use http::{HeaderMap, Method};
use serde_json::json;

use crate::config::{Priority, Shedding};

/// The class of one request: test traffic first (it is synthetic, whatever route it takes),
/// then the route's own `priority`, then the method.
pub fn classify(
    shedding: Option<&Shedding>,
    route_priority: Option<Priority>,
    method: &Method,
    headers: &HeaderMap,
    api_key: Option<&str>,
) -> Priority {
    if shedding.is_some_and(|s| s.test_traffic.matches(headers, api_key)) {
        return Priority::Test;
    }
    route_priority.unwrap_or_else(|| Priority::of_method(method))
}

/// The gateway's requests in flight, and what shedding decided, per class.
#[derive(Debug, Default)]
pub struct Shedder {
    in_flight: AtomicU64,
    admitted: [AtomicU64; 4],
    shed: [AtomicU64; 4],
}

/// A request refused by shedding.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shed {
    pub class: Priority,
}

/// Counters at one moment, for the admin listener.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShedStats {
    pub in_flight: u64,
    /// Per class, indexed by `Priority as usize`.
    pub admitted: [u64; 4],
    pub shed: [u64; 4],
}

impl ShedStats {
    pub fn to_json(&self) -> serde_json::Value {
        let mut classes = serde_json::Map::new();
        for p in Priority::ALL.into_iter().rev() {
            classes.insert(
                p.as_str().into(),
                json!({ "admitted": self.admitted[p as usize], "shed": self.shed[p as usize] }),
            );
        }
        json!({ "in_flight": self.in_flight, "classes": classes })
    }
}

impl Shedder {
    pub const fn new() -> Shedder {
        Shedder {
            in_flight: AtomicU64::new(0),
            admitted: [const { AtomicU64::new(0) }; 4],
            shed: [const { AtomicU64::new(0) }; 4],
        }
    }

    /// A shedder for the rest of the process. The gateway builds one and never drops it, so
    /// that a request's [`InFlight`] holds a plain reference: an `Arc` would cost every request
    /// two more atomic read-modify-writes (its count up, and down again).
    pub fn leaked() -> &'static Shedder {
        Box::leak(Box::new(Shedder::new()))
    }

    /// Admit a request of `class`, or shed it. An admitted request is in flight until the
    /// returned guard drops. Without `shedding` nothing is shed, but requests are still counted.
    /// One shedder serves the gateway process: "in flight" means in this process.
    pub fn admit(
        &'static self,
        class: Priority,
        shedding: Option<&Shedding>,
    ) -> Result<InFlight, Shed> {
        match shedding.and_then(|s| s.cap(class)) {
            None => {
                self.in_flight.fetch_add(1, Ordering::Relaxed);
            }
            Some(cap) => {
                // Exact: a request of this class is admitted only if fewer than `cap` are in
                // flight at that instant, whatever else runs concurrently.
                let entered =
                    self.in_flight
                        .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                            (n < cap).then_some(n + 1)
                        });
                if entered.is_err() {
                    self.shed[class as usize].fetch_add(1, Ordering::Relaxed);
                    return Err(Shed { class });
                }
            }
        }
        self.admitted[class as usize].fetch_add(1, Ordering::Relaxed);
        Ok(InFlight { shedder: self })
    }

    pub fn in_flight(&self) -> u64 {
        self.in_flight.load(Ordering::Relaxed)
    }

    pub fn stats(&self) -> ShedStats {
        let load = |a: &[AtomicU64; 4]| std::array::from_fn(|i| a[i].load(Ordering::Relaxed));
        ShedStats {
            in_flight: self.in_flight(),
            admitted: load(&self.admitted),
            shed: load(&self.shed),
        }
    }
}

/// One request in flight; leaving is dropping it, which happens exactly once, however the
/// request ends.
#[derive(Debug)]
pub struct InFlight {
    shedder: &'static Shedder,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.shedder.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::TestTraffic;
    use http::header::HeaderName;
    use http::HeaderValue;

    fn shedder() -> &'static Shedder {
        Shedder::leaked()
    }

    fn forty() -> Shedding {
        Shedding::new(40, [0.7, 0.8, 0.9], TestTraffic::default())
    }

    #[test]
    fn caps_are_exact_and_round_up() {
        let s = forty();
        assert_eq!(s.cap(Priority::Test), Some(28));
        assert_eq!(s.cap(Priority::Get), Some(32));
        assert_eq!(s.cap(Priority::Post), Some(36));
        assert_eq!(s.cap(Priority::Critical), None);
        let small = Shedding::new(3, [0.1, 0.5, 1.0], TestTraffic::default());
        assert_eq!(small.cap(Priority::Test), Some(1));
        assert_eq!(small.cap(Priority::Get), Some(2));
        assert_eq!(small.cap(Priority::Post), Some(3));
        let big = Shedding::new(1024, [0.7, 0.8, 0.9], TestTraffic::default());
        assert_eq!(big.cap(Priority::Test), Some(717));
    }

    #[test]
    fn sheds_lowest_class_first_and_never_critical() {
        let (sh, s) = (shedder(), forty());
        let mut held = Vec::new();
        // Fill to 28 with test traffic: the 29th test request is shed.
        for _ in 0..28 {
            held.push(sh.admit(Priority::Test, Some(&s)).unwrap());
        }
        assert_eq!(
            sh.admit(Priority::Test, Some(&s)).unwrap_err().class,
            Priority::Test
        );
        for _ in 0..4 {
            held.push(sh.admit(Priority::Get, Some(&s)).unwrap());
        }
        assert!(sh.admit(Priority::Get, Some(&s)).is_err());
        for _ in 0..4 {
            held.push(sh.admit(Priority::Post, Some(&s)).unwrap());
        }
        assert!(sh.admit(Priority::Post, Some(&s)).is_err());
        for _ in 0..100 {
            held.push(sh.admit(Priority::Critical, Some(&s)).unwrap());
        }
        assert_eq!(sh.in_flight(), 136);
        let st = sh.stats();
        assert_eq!(st.admitted, [28, 4, 4, 100]);
        assert_eq!(st.shed, [1, 1, 1, 0]);
        // Leaving frees capacity exactly once per request.
        held.truncate(27);
        assert_eq!(sh.in_flight(), 27);
        assert!(sh.admit(Priority::Test, Some(&s)).is_ok());
        assert_eq!(sh.in_flight(), 27);
    }

    #[test]
    fn without_shedding_everything_is_admitted_and_counted() {
        let sh = shedder();
        let held: Vec<_> = (0..1000)
            .map(|_| sh.admit(Priority::Test, None).unwrap())
            .collect();
        assert_eq!(sh.in_flight(), 1000);
        drop(held);
        assert_eq!(sh.in_flight(), 0);
        assert_eq!(sh.stats().admitted[Priority::Test as usize], 1000);
    }

    #[test]
    fn exact_under_concurrency() {
        let (sh, s) = (shedder(), std::sync::Arc::new(forty()));
        let barrier = std::sync::Arc::new(std::sync::Barrier::new(8));
        let threads: Vec<_> = (0..8)
            .map(|_| {
                let (s, barrier) = (s.clone(), barrier.clone());
                std::thread::spawn(move || {
                    barrier.wait();
                    (0..100)
                        .filter_map(|_| sh.admit(Priority::Get, Some(&s)).ok())
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        let held: Vec<InFlight> = threads
            .into_iter()
            .flat_map(|t| t.join().unwrap())
            .collect();
        assert_eq!(held.len(), 32);
        assert_eq!(sh.stats().shed[Priority::Get as usize], 800 - 32);
    }

    #[test]
    fn classification() {
        let s = Shedding::new(
            10,
            [0.7, 0.8, 0.9],
            TestTraffic {
                header: Some(HeaderName::from_static("x-test-mode")),
                api_key_prefix: Some("test_".into()),
            },
        );
        let none = HeaderMap::new();
        let mut test_header = HeaderMap::new();
        test_header.insert("x-test-mode", HeaderValue::from_static("1"));
        let mut empty_header = HeaderMap::new();
        empty_header.insert("x-test-mode", HeaderValue::from_static(""));
        let c = |s: Option<&Shedding>, r, m: Method, h: &HeaderMap, k| classify(s, r, &m, h, k);
        assert_eq!(c(Some(&s), None, Method::GET, &none, None), Priority::Get);
        assert_eq!(c(Some(&s), None, Method::HEAD, &none, None), Priority::Get);
        assert_eq!(
            c(Some(&s), None, Method::OPTIONS, &none, None),
            Priority::Get
        );
        for m in [Method::POST, Method::PUT, Method::PATCH, Method::DELETE] {
            assert_eq!(c(Some(&s), None, m, &none, None), Priority::Post);
        }
        let critical = Some(Priority::Critical);
        assert_eq!(
            c(Some(&s), critical, Method::GET, &none, Some("live_1")),
            Priority::Critical
        );
        assert_eq!(
            c(Some(&s), Some(Priority::Get), Method::POST, &none, None),
            Priority::Get
        );
        // Test traffic: the header with a value, or the key prefix; it wins over the route.
        assert_eq!(
            c(Some(&s), critical, Method::POST, &test_header, None),
            Priority::Test
        );
        assert_eq!(
            c(Some(&s), None, Method::POST, &empty_header, None),
            Priority::Post
        );
        assert_eq!(
            c(Some(&s), None, Method::GET, &none, Some("test_abc")),
            Priority::Test
        );
        assert_eq!(
            c(Some(&s), None, Method::GET, &none, Some("live_test_")),
            Priority::Get
        );
        // Without a shedding section there is no test traffic.
        assert_eq!(
            c(None, None, Method::GET, &test_header, None),
            Priority::Get
        );
    }
}
