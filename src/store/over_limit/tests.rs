use super::*;
use crate::limit::Algorithm;

fn check(key: u8, cost: u64, limit: u64) -> Check {
    Check {
        id: 0,
        name: "l".into(),
        key: CounterKey([key; 16]),
        quota: Quota::new(Algorithm::FixedWindow, limit, 1000),
        cost,
        shadow: false,
    }
}

fn denied(retry: u64) -> Decision {
    Decision::deny(5, 0, 800, retry)
}

#[test]
fn a_denial_is_answered_until_its_retry_time_on_the_clock_of_the_send() {
    let c = OverLimitCache::new(100);
    let checks = [check(1, 1, 5)];
    c.remember(&checks, &[denied(800)], 10_000, 100, |_| Some(u64::MAX));
    assert_eq!(c.len(), 1);
    let (i, d, at) = c.lookup(&checks, 350, |_| true).expect("cached");
    assert_eq!(i, 0);
    assert_eq!(d, Decision::deny(5, 0, 550, 550));
    assert_eq!(at, 10_250);
    assert!(c.lookup(&checks, 899, |_| true).is_some());
    assert!(
        c.lookup(&checks, 900, |_| true).is_none(),
        "ends at sent + retry"
    );
    assert_eq!(c.len(), 0, "an ended entry is dropped");
    assert_eq!(c.hits.load(Ordering::Relaxed), 2);
}

#[test]
fn a_cheaper_request_another_quota_or_an_ineligible_check_asks_the_store() {
    let c = OverLimitCache::new(100);
    c.remember(&[check(1, 3, 5)], &[denied(500)], 0, 0, |_| Some(u64::MAX));
    assert!(c.lookup(&[check(1, 2, 5)], 1, |_| true).is_none());
    assert!(c.lookup(&[check(1, 3, 5)], 1, |_| true).is_some());
    assert!(c.lookup(&[check(1, 4, 5)], 1, |_| true).is_some());
    assert!(c.lookup(&[check(1, 3, 5)], 1, |_| false).is_none());
    assert!(c.lookup(&[check(1, 3, 6)], 1, |_| true).is_none());
    assert_eq!(c.len(), 0, "an entry of another quota is dropped");
}

#[test]
fn admissions_and_ineligible_denials_are_not_kept() {
    let c = OverLimitCache::new(100);
    let checks = [check(1, 1, 5), check(2, 1, 5)];
    c.remember(
        &checks,
        &[Decision::allow(5, 1, 100), denied(100)],
        0,
        0,
        |c| (c.key.0[0] == 1).then_some(u64::MAX),
    );
    assert!(c.is_empty());
}

#[test]
fn the_most_restrictive_cached_denial_answers() {
    let c = OverLimitCache::new(100);
    let checks = [check(1, 1, 5), check(2, 1, 5)];
    c.remember(&checks, &[denied(100), denied(700)], 0, 0, |_| {
        Some(u64::MAX)
    });
    assert_eq!(c.lookup(&checks, 0, |_| true).unwrap().0, 1);
}

#[test]
fn bounded_and_off_at_zero() {
    let c = OverLimitCache::new(32);
    for k in 0..=255u8 {
        c.remember(&[check(k, 1, 5)], &[denied(100)], 0, 0, |_| Some(u64::MAX));
    }
    assert_eq!(c.len(), 32);
    let off = OverLimitCache::new(0);
    off.remember(&[check(1, 1, 5)], &[denied(100)], 0, 0, |_| Some(u64::MAX));
    assert!(off.lookup(&[check(1, 1, 5)], 0, |_| true).is_none());
    assert!(!off.enabled());
}

#[test]
fn invalidations_round_trip_and_drop_what_they_name() {
    let keys = Invalidation::Keys(vec![CounterKey([7; 16]), CounterKey([0xab; 16])]);
    for inv in [
        Invalidation::All,
        keys.clone(),
        Invalidation::Limits(vec!["a".into(), "b-c".into()]),
        Invalidation::Denials(vec![CounterKey([9; 16])]),
    ] {
        assert_eq!(Invalidation::decode(&inv.encode()), Some(inv));
    }
    assert_eq!(Invalidation::decode("keys zz"), None);
    let c = OverLimitCache::new(100);
    c.remember(
        &[check(7, 1, 5), check(8, 1, 5)],
        &[denied(100), denied(100)],
        0,
        0,
        |_| Some(u64::MAX),
    );
    c.invalidate(&keys);
    assert_eq!(c.len(), 1);
    c.invalidate(&Invalidation::Limits(vec!["other".into()]));
    assert_eq!(c.len(), 1);
    c.invalidate(&Invalidation::Limits(vec!["l".into()]));
    assert_eq!(c.len(), 0);
}

#[test]
fn a_denial_is_kept_at_most_as_long_as_its_bound() {
    let c = OverLimitCache::new(100);
    let checks = [check(1, 1, 5)];
    c.remember(&checks, &[denied(800)], 0, 0, |_| Some(300));
    assert!(c.lookup(&checks, 299, |_| true).is_some());
    assert!(c.lookup(&checks, 300, |_| true).is_none());
}

#[test]
fn an_entry_put_after_the_lookup_read_its_clock_answers_as_it_is() {
    // Another thread can remember a denial between this request reading `now` and its lookup.
    let c = OverLimitCache::new(100);
    let checks = [check(1, 1, 5)];
    c.remember(&checks, &[denied(800)], 10_000, 500, |_| Some(u64::MAX));
    let (_, d, at) = c.lookup(&checks, 499, |_| true).expect("cached");
    assert_eq!((d, at), (Decision::deny(5, 0, 800, 800), 10_000));
}
