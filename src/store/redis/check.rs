//! Rate-limit checks: one script call per request (per cluster slot), see the parent module.
//! With quota leasing, a check may also take extra units for the gateway to spend locally
//! (`lua/check.lua`).
//!
//! Phase: `request_filter`.

use redis::cluster_routing::Slot;
use smallvec::SmallVec;

use super::call::KeyArg;
use super::{quota, Call, Conn, RedisStore, CHECK_SCRIPTS};
use crate::limit::Decision;
use crate::store::{Check, Decisions, StoreError};

/// Indexes of the keys of one call (one cluster slot).
pub(super) type Group = SmallVec<[usize; 8]>;

/// `0..n` for a call over every check of a request, taken as `&INDEXES[..n]` rather than
/// collected for each ([`every`]).
const INDEXES: [usize; 64] = {
    let mut all = [0; 64];
    let mut i = 0;
    while i < all.len() {
        all[i] = i;
        i += 1;
    }
    all
};

/// `0..n`: a slice of [`INDEXES`], or, past its 64, collected into `spill`.
fn every(n: usize, spill: &mut Group) -> &[usize] {
    match INDEXES.get(..n) {
        Some(all) => all,
        None => {
            *spill = (0..n).collect();
            spill
        }
    }
}

/// The units each check of a leasing call took beyond its cost.
pub type Took = SmallVec<[u64; 8]>;

impl RedisStore {
    /// Check `checks` (with their limit names); see the module docs. Returns the time the
    /// decisions were made at: Redis's clock (or `now` when time is explicit).
    pub async fn check(
        &self,
        checks: &[Check],
        now: u64,
        out: &mut Decisions,
    ) -> Result<u64, StoreError> {
        if matches!(self.conn, Conn::Cluster(_)) {
            // Boxed: a cluster's checks keep more state across their calls (keys as strings,
            // slot groups), which would otherwise be part of every check's future, boxed and
            // copied on each request (`Store::check`).
            return Box::pin(self.check_leasing(checks, &[], now, out, &mut Took::new())).await;
        }
        // One call over every check, its keys written straight into its command.
        out.clear();
        let keys = |i: usize| self.base_key_name(&checks[i]);
        let mut spill = Group::new();
        let all = every(checks.len(), &mut spill);
        let (_, at) = self.call(keys, checks, &[], all, now, out, &mut []).await?;
        Ok(at)
    }

    /// [`RedisStore::check`], where check `i` may also take up to `extra[i]` more units as a
    /// lease (`extra` empty: no leases); `took[i]` receives the units each took.
    pub async fn check_leasing(
        &self,
        checks: &[Check],
        extra: &[u64],
        now: u64,
        out: &mut Decisions,
        took: &mut Took,
    ) -> Result<u64, StoreError> {
        out.clear();
        took.clear();
        took.resize(checks.len(), 0);
        if !matches!(self.conn, Conn::Cluster(_)) {
            // One call, its keys written straight into its command; the decisions go straight
            // to `out`.
            let mut spill = Group::new();
            let all = every(checks.len(), &mut spill);
            let keys = |i: usize| self.base_key_name(&checks[i]);
            let (_, at) = self.call(keys, checks, extra, all, now, out, took).await?;
            return Ok(at);
        }
        let texts: Vec<String> = checks.iter().map(|c| self.base_key(c)).collect();
        let groups = self.slot_groups(&texts);
        let keys = |i: usize| texts[i].as_str();
        if let [all] = groups.as_slice() {
            // One slot: as above.
            let (_, at) = self.call(keys, checks, extra, all, now, out, took).await?;
            return Ok(at);
        }
        // Cluster: one call per slot, in sequence, stopping at the first denial.
        let mut slots: Vec<Option<Decision>> = vec![None; checks.len()];
        let mut group_out = Decisions::new();
        let mut denied = false;
        let mut decided_at = now;
        for group in &groups {
            if denied {
                // Not consulted, nothing consumed. The request is denied by an earlier group,
                // whose decision is the one reported, so these placeholders never reach a client.
                for &i in group {
                    slots[i] = Some(Decision::allow(
                        checks[i].quota.limit,
                        checks[i].quota.limit,
                        0,
                    ));
                }
                continue;
            }
            group_out.clear();
            let (admitted, at) = self
                .call(keys, checks, extra, group, now, &mut group_out, took)
                .await?;
            for (&i, d) in group.iter().zip(&group_out) {
                slots[i] = Some(*d);
            }
            denied = !admitted;
            decided_at = at;
        }
        out.extend(slots.into_iter().map(|d| d.expect("every check decided")));
        Ok(decided_at)
    }

    /// Indexes of `keys` grouped by cluster slot, in first-seen order (one group outside a
    /// cluster). Rate-limit checks and concurrency slots share this. Inline up to one group of
    /// eight: no allocation outside a cluster.
    pub(super) fn slot_groups(&self, keys: &[String]) -> SmallVec<[Group; 1]> {
        if !matches!(self.conn, Conn::Cluster(_)) {
            return smallvec::smallvec![(0..keys.len()).collect()];
        }
        let mut groups: Vec<(Slot, Group)> = Vec::new();
        for (i, k) in keys.iter().enumerate() {
            let slot = Slot::for_key(k);
            match groups.iter_mut().find(|(s, _)| *s == slot) {
                Some((_, g)) => g.push(i),
                None => groups.push((slot, smallvec::smallvec![i])),
            }
        }
        groups.into_iter().map(|(_, g)| g).collect()
    }

    /// One script call over the checks at `idx` (check `i`'s key is `keys(i)`), appending
    /// their decisions to `out`; when leasing (`extra` not empty), `took[i]` receives the units
    /// check `i` took. Returns whether the group admitted, and the time the decisions were
    /// made at.
    #[allow(clippy::too_many_arguments)]
    async fn call<K: KeyArg>(
        &self,
        keys: impl Fn(usize) -> K,
        checks: &[Check],
        extra: &[u64],
        idx: &[usize],
        now: u64,
        out: &mut Decisions,
        took: &mut [u64],
    ) -> Result<(bool, u64), StoreError> {
        let script = CHECK_SCRIPTS.for_checks(checks, idx);
        let mut inv = Call::new(script, idx.iter().map(|&i| keys(i)));
        if self.explicit_time {
            inv.arg(now);
        } else {
            inv.arg("");
        }
        for &i in idx {
            let c = &checks[i];
            quota(&mut inv, &c.quota)
                .arg(c.cost)
                .arg(u8::from(c.shadow));
        }
        let leasing = !extra.is_empty();
        if leasing {
            for &i in idx {
                inv.arg(extra[i]);
            }
        }
        // The bulk string's bytes as Redis sent them: the reply is checked digit by digit
        // below, so a UTF-8 pass first would be a second read of the same bytes.
        let reply: Vec<u8> = self.guarded(&inv, self.timeout()).await?;
        let leased = if leasing { idx.len() } else { 0 };
        let reply = integers(&reply, idx.len() * 4 + 2 + leased)?;
        let n = |v: i64| v.max(0) as u64;
        out.extend(
            idx.iter()
                .zip(reply.chunks_exact(4))
                .map(|(&i, r)| Decision {
                    allowed: r[0] == 1,
                    limit: checks[i].quota.limit,
                    remaining: n(r[1]),
                    reset_after_ms: n(r[2]),
                    retry_after_ms: n(r[3]),
                }),
        );
        let at = reply[idx.len() * 4 + 1].max(0) as u64;
        if leasing {
            for (&i, &t) in idx.iter().zip(&reply[idx.len() * 4 + 2..]) {
                took[i] = n(t);
            }
        }
        Ok((reply[idx.len() * 4] == 1, at))
    }
}

/// The check script's reply: `expected` decimal integers separated by single spaces
/// (`lua/check.lua` says why it is one string and not an array), each an optional `-` and 1
/// to 18 digits (18 digits always fit an `i64`; the config bounds the script's values by 2^53,
/// 16 digits, and times in ms have 13). Read in
/// one pass over the bytes: `str`'s `split` and `parse` cost 1.4k instructions for a
/// one-limit reply, this about a fifth.
fn integers(reply: &[u8], expected: usize) -> Result<SmallVec<[i64; 8]>, StoreError> {
    let bad = || {
        let reply = String::from_utf8_lossy(reply);
        StoreError::Reply(format!("check script replied {reply:?}"))
    };
    let mut out = SmallVec::new();
    let (mut v, mut negative, mut digits) = (0i64, false, 0u32);
    for &b in reply {
        match b {
            b'0'..=b'9' if digits < 18 => {
                v = v * 10 + i64::from(b - b'0');
                digits += 1;
            }
            b'-' if digits == 0 && !negative => negative = true,
            b' ' if digits > 0 => {
                out.push(if negative { -v } else { v });
                (v, negative, digits) = (0, false, 0);
            }
            _ => return Err(bad()),
        }
    }
    if digits == 0 {
        return Err(bad());
    }
    out.push(if negative { -v } else { v });
    if out.len() != expected {
        return Err(StoreError::Reply(format!(
            "{} values from the check script, not {expected}",
            out.len()
        )));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_index_up_to_the_table_and_past_it() {
        for n in [0, 1, 8, 63, 64, 65, 200] {
            let mut spill = Group::new();
            let all = every(n, &mut spill);
            assert_eq!(all, (0..n).collect::<Vec<_>>().as_slice(), "n = {n}");
            assert_eq!(spill.is_empty(), n <= 64, "n = {n}");
        }
    }

    #[test]
    fn a_reply_is_exactly_the_expected_count_of_decimal_integers() {
        let r = integers(b"1 99 60000 0 1 1764032400123", 6).unwrap();
        assert_eq!(r.as_slice(), &[1, 99, 60000, 0, 1, 1_764_032_400_123]);
        assert_eq!(
            integers(b"0 -3 5 1 0 7 2", 7).unwrap().as_slice(),
            &[0, -3, 5, 1, 0, 7, 2]
        );
        // 18 digits are the most a field may have; 19 are refused below.
        assert_eq!(
            integers(b"999999999999999999 -999999999999999999 0", 3)
                .unwrap()
                .as_slice(),
            &[999_999_999_999_999_999, -999_999_999_999_999_999, 0]
        );
        for (bad, expected) in [
            ("1 99 60000 0 1", 6),
            ("1 99 60000 0 1 2 3", 6),
            ("1 99 60000 0 1 1.5", 6),
            ("1  99 60000 0 1 2", 6),
            ("", 6),
            ("1 99 60000 0 1 99999999999999999999", 6),
            ("1 99 60000 0 1 1000000000000000000", 6),
            ("1 99 60000 0 1 -1000000000000000000", 6),
            ("1 99 60000 0 1 -", 6),
            ("1 99 60000 0 1 +2", 6),
            ("1 99 60000 0 1 2 ", 6),
            (" 1 99 60000 0 1 2", 6),
            ("1 99 60000 0 1 --2", 6),
            ("1 99 60000 0 1 2-", 6),
        ] {
            let e = integers(bad.as_bytes(), expected).unwrap_err();
            assert!(matches!(e, StoreError::Reply(_)), "{bad:?}: {e}");
        }
    }
}
