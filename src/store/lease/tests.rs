use super::*;

fn check(cost: u64, algorithm: Algorithm) -> Check {
    Check {
        id: 0,
        name: "l".into(),
        key: CounterKey([3; 16]),
        quota: Quota::new(algorithm, 1000, 10_000),
        cost,
        shadow: false,
    }
}

fn taken(remaining: u64) -> Decision {
    Decision::allow(1000, remaining, 5_000)
}

#[test]
fn a_cold_caller_leases_nothing_and_a_hot_one_up_to_max() {
    let l = Leases::new(100);
    let c = check(1, Algorithm::TokenBucket);
    assert!(l.reserve(0, &c, 0).is_none());
    assert_eq!(l.extra(&c, 50, 0), 0, "seen once: no lease");
    for _ in 0..30 {
        assert!(l.reserve(0, &c, 10).is_none());
    }
    assert_eq!(l.extra(&c, 1, 10), 0, "max 1: no leasing");
    assert_eq!(
        l.extra(&c, 50, 10),
        49,
        "hot: max, less the request's own unit"
    );
    assert_eq!(l.extra(&c, 50, 11), 0, "one call asks at a time");
    l.asked(&c);
    assert_eq!(l.extra(&c, 50, 12), 49);
    assert_eq!(
        l.extra(&c, 50, 1012),
        49,
        "a call that never returned blocks for 1 s"
    );
}

#[test]
fn a_lease_pays_until_its_units_or_its_time_run_out_and_the_rest_goes_back() {
    let l = Leases::new(100);
    let c = check(2, Algorithm::TokenBucket);
    l.take(&c, 5, &taken(100), 1_000_000, 0);
    let r = l.reserve(0, &c, 10).expect("from the lease");
    assert_eq!(r.decision, Decision::allow(1000, 103, 4_990));
    assert_eq!(r.at_ms, 1_000_010);
    assert!(l.reserve(0, &c, 20).is_some());
    assert!(l.reserve(0, &c, 30).is_none(), "1 unit left, cost 2");
    assert_eq!(l.held(), 1);
    // The lease lasts lease_ttl(10 s) = 1 s; then its unit goes back.
    assert!(l.sweep(999).is_empty());
    let ended = l.sweep(1000);
    assert_eq!(ended.len(), 1);
    assert_eq!((ended[0].units, ended[0].window), (1, 0));
    assert_eq!(l.held(), 0);
}

#[test]
fn a_refused_request_gives_its_units_back_to_the_lease() {
    let l = Leases::new(100);
    let c = check(1, Algorithm::Gcra);
    l.take(&c, 3, &taken(10), 0, 0);
    let r = l.reserve(0, &c, 1).unwrap();
    assert_eq!(l.held(), 2);
    l.roll_back(&r, &c, 2);
    assert_eq!(l.held(), 3);
}

#[test]
fn a_window_lease_ends_before_its_window_and_names_it() {
    let l = Leases::new(100);
    let c = check(1, Algorithm::FixedWindow);
    // Taken 300 ms before the 10 s window ends (Redis time 19_700): it lasts 200 ms.
    l.take(&c, 4, &taken(10), 19_700, 50);
    assert!(l.reserve(0, &c, 249).is_some());
    assert!(
        l.reserve(0, &c, 250).is_none(),
        "ended 100 ms before the window"
    );
    let ended = l.sweep(250);
    assert_eq!((ended[0].units, ended[0].window), (3, 10_000));
    // Taken within the last 100 ms: ends at once, given back whole.
    l.take(&c, 4, &taken(10), 29_950, 300);
    assert!(l.reserve(0, &c, 300).is_none());
    assert_eq!(l.sweep(300)[0].units, 4);
    let s = check(1, Algorithm::SlidingWindow);
    l.take(&s, 2, &taken(10), 25_000, 400);
    assert_eq!(l.sweep(10_000)[0].window, 2);
}

#[test]
fn another_quota_or_an_invalidation_ends_a_lease() {
    let l = Leases::new(100);
    let c = check(1, Algorithm::TokenBucket);
    l.take(&c, 4, &taken(10), 0, 0);
    let mut other = c.clone();
    other.quota.limit = 2000;
    assert!(l.reserve(0, &other, 1).is_none());
    assert_eq!(l.sweep(1)[0].units, 4);
    l.take(&c, 4, &taken(10), 0, 2);
    l.mark(&Invalidation::Limits(vec!["other".into()]));
    assert!(l.sweep(3).is_empty());
    l.mark(&Invalidation::Limits(vec!["l".into()]));
    assert_eq!(l.sweep(3)[0].units, 4);
    l.take(&c, 4, &taken(10), 0, 4);
    l.mark(&Invalidation::Keys(vec![c.key]));
    assert_eq!(l.held(), 0, "a usage reset drops the lease");
    assert_eq!(l.stats.ended_early.load(Ordering::Relaxed), 3);
    // A lease that ran out or was spent is not ended early.
    l.take(&c, 1, &taken(10), 0, 5);
    assert!(l.reserve(0, &c, 6).is_some());
    l.mark(&Invalidation::All);
    assert!(l.sweep(7).is_empty());
    assert_eq!(l.stats.ended_early.load(Ordering::Relaxed), 3);
}

#[test]
fn bounded_and_an_evicted_lease_is_given_back() {
    let l = Leases::new(16);
    let mut c = check(1, Algorithm::TokenBucket);
    l.take(&c, 4, &taken(10), 0, 0);
    for k in 0..64u8 {
        c.key = CounterKey([k; 16]);
        c.key.0[2] = 3;
        l.take(&c, 1, &taken(10), 0, 0);
    }
    let ended = l.sweep(0);
    assert!(ended.iter().any(|e| e.units == 4), "{ended:?}");
    assert_eq!(l.held(), 1, "one entry per shard of 1");
}

#[test]
fn a_lease_taken_after_the_request_read_its_clock_pays_as_it_is() {
    let l = Leases::new(100);
    let c = check(1, Algorithm::TokenBucket);
    l.take(&c, 3, &taken(10), 7_000, 50);
    let r = l.reserve(0, &c, 49).expect("from the lease");
    assert_eq!((r.decision.reset_after_ms, r.at_ms), (5_000, 7_000));
}
