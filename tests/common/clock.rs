//! The wall clock the gateway reads too, and the boundaries of fixed windows aligned to the
//! Unix epoch.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Milliseconds since the Unix epoch (the gateway's clock: the same system clock).
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock after 1970")
        .as_millis() as u64
}

/// Fixed windows are aligned to the Unix epoch. If fewer than `margin` seconds are left in
/// the current window of `window_s` seconds, sleep into the next one, so a test that takes
/// less than `margin` seconds never sees a window boundary. Sleeps at most `margin` + 1 s.
pub async fn clear_of_window_boundary(window_s: u64, margin_s: u64) {
    assert!(margin_s < window_s);
    let now = now_ms();
    let window_ms = window_s * 1000;
    let left = window_ms - now % window_ms;
    if left < margin_s * 1000 {
        tokio::time::sleep(Duration::from_millis(left + 200)).await;
    }
}

/// Unix seconds at which the fixed window of `window_s` seconds containing `ms` ends.
pub fn window_end_s(ms: u64, window_s: u64) -> u64 {
    (ms / 1000 / window_s + 1) * window_s
}

/// For a fixed window of `window_s` seconds and a request sent at `before` and answered at
/// `after` (ms), the `t` the gateway may report: it is `end − floor(now_s)` for the gateway's
/// `now` in `[before, after]`, because the window end is a whole second.
pub fn fixed_window_t_range(
    before: u64,
    after: u64,
    window_s: u64,
) -> std::ops::RangeInclusive<u64> {
    let end = window_end_s(before, window_s);
    assert_eq!(
        end,
        window_end_s(after, window_s),
        "a window boundary passed during one request"
    );
    (end - after / 1000)..=(end - before / 1000)
}
