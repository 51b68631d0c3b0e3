// Copyright 2026 Cloudflare, Inc.
//
// Licensed under the Apache License, Version 2.0 (the "License");
// you may not use this file except in compliance with the License.
// You may obtain a copy of the License at
//
// http://www.apache.org/licenses/LICENSE-2.0
//
// Unless required by applicable law or agreed to in writing, software
// distributed under the License is distributed on an "AS IS" BASIS,
// WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
// See the License for the specific language governing permissions and
// limitations under the License.

//! Clocks read to the kernel's tick instead of to the nanosecond, for times that need no
//! more: the `Date` header's second, and idle deadlines counted in seconds.
//!
//! On Linux they are `CLOCK_REALTIME_COARSE` and `CLOCK_MONOTONIC_COARSE`. The vDSO answers
//! them from the time the kernel stored at its last tick, without reading the time-stamp
//! counter. A precise read (`SystemTime::now`, `Instant::now`) reads the counter, ordered
//! after every instruction before it; on a virtual machine that is about 20 ns a read, against
//! about 3 ns for a coarse one. A coarse clock lags its precise twin by at most one tick
//! (1-10 ms, by the kernel's `CONFIG_HZ`). Elsewhere these are the precise clocks.

use std::time::Duration;

/// The time since the Unix epoch, to the tick.
pub(crate) fn unix_time() -> Duration {
    #[cfg(target_os = "linux")]
    if let Some(t) = read(libc::CLOCK_REALTIME_COARSE) {
        return t;
    }
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
}

/// A monotonic time, to the tick: only the difference of two of these means anything.
pub(crate) fn monotonic() -> Duration {
    #[cfg(target_os = "linux")]
    if let Some(t) = read(libc::CLOCK_MONOTONIC_COARSE) {
        return t;
    }
    static ORIGIN: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    ORIGIN.get_or_init(std::time::Instant::now).elapsed()
}

/// `clock`'s time, `None` if the kernel refuses it (it does not on Linux 2.6.32 and later;
/// then both functions above fall back to the precise clocks, on the same time bases).
#[cfg(target_os = "linux")]
fn read(clock: libc::clockid_t) -> Option<Duration> {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid timespec that `clock_gettime` only writes.
    let ok = unsafe { libc::clock_gettime(clock, &mut ts) } == 0;
    (ok && ts.tv_sec >= 0).then(|| Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Instant, SystemTime, UNIX_EPOCH};

    /// The kernel's tick is at most 10 ms (`CONFIG_HZ` 100); a read may also be preempted.
    const TICK_AND_SLACK: Duration = Duration::from_millis(50);

    #[test]
    fn unix_time_lags_the_system_clock_by_at_most_a_tick() {
        let before = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
        let coarse = unix_time();
        let after = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
        assert!(coarse <= after, "{coarse:?} after {after:?}");
        assert!(
            coarse + TICK_AND_SLACK >= before,
            "{coarse:?} long before {before:?}"
        );
    }

    /// `read`, the module's one `unsafe` block (`clock_gettime`), gets both coarse clocks from
    /// the kernel: a `None` would leave every reading to the precise clocks' fallback, which the
    /// other tests would not notice. Run under Miri by scripts/upstream-tests.sh.
    #[cfg(target_os = "linux")]
    #[test]
    fn both_coarse_clocks_are_read_from_the_kernel() {
        let before = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
        let coarse = read(libc::CLOCK_REALTIME_COARSE).expect("CLOCK_REALTIME_COARSE");
        let after = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
        assert!(coarse <= after, "{coarse:?} after {after:?}");
        assert!(
            coarse + TICK_AND_SLACK >= before,
            "{coarse:?} long before {before:?}"
        );
        let first = read(libc::CLOCK_MONOTONIC_COARSE).expect("CLOCK_MONOTONIC_COARSE");
        let second = read(libc::CLOCK_MONOTONIC_COARSE).expect("CLOCK_MONOTONIC_COARSE");
        assert!(second >= first, "{second:?} before {first:?}");
    }

    #[test]
    fn monotonic_time_moves_with_the_precise_clock_and_never_back() {
        let (coarse0, precise0) = (monotonic(), Instant::now());
        let mut last = coarse0;
        while precise0.elapsed() < Duration::from_millis(120) {
            let now = monotonic();
            assert!(now >= last, "{now:?} before {last:?}");
            last = now;
        }
        let coarse = last - coarse0;
        let precise = precise0.elapsed();
        assert!(
            coarse <= precise + TICK_AND_SLACK,
            "{coarse:?} against {precise:?}"
        );
        assert!(
            coarse + TICK_AND_SLACK >= precise,
            "{coarse:?} against {precise:?}"
        );
    }
}
