//! Usage read and reset in Redis, for the quota admin API: one read-only script that asks every
//! algorithm about a request of cost 0 and drops what it would write (`lua/peek.lua`), and one
//! that deletes a caller's keys (`lua/reset.lua`).
//!
//! Phase: the admin API, never a request.

use std::sync::LazyLock;

use redis::Script;

use super::{algorithm_code, quota, Call, RedisStore};
use crate::store::{Check, StoreError};

/// The algorithms and the read-only dispatcher.
const PEEK_SCRIPT: &str = concat!(
    include_str!("../../../lua/prelude.lua"),
    include_str!("../../../lua/sliding_window.lua"),
    include_str!("../../../lua/fixed_window.lua"),
    include_str!("../../../lua/sliding_log.lua"),
    include_str!("../../../lua/token_bucket.lua"),
    include_str!("../../../lua/gcra.lua"),
    include_str!("../../../lua/peek.lua"),
);

static PEEK: LazyLock<Script> = LazyLock::new(|| Script::new(PEEK_SCRIPT));
static RESET: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../../../lua/reset.lua")));

impl RedisStore {
    /// Each check's (remaining, reset after ms) now, and Redis's time, changing nothing.
    pub async fn peek(
        &self,
        checks: &[Check],
        out: &mut Vec<(u64, u64)>,
    ) -> Result<u64, StoreError> {
        out.clear();
        out.resize(checks.len(), (0, 0));
        let keys: Vec<String> = checks.iter().map(|c| self.base_key(c)).collect();
        let mut at = 0;
        for group in self.slot_groups(&keys) {
            let mut inv = Call::new(&PEEK, group.iter().map(|&i| keys[i].as_str()));
            inv.arg("");
            for &i in &group {
                quota(&mut inv, &checks[i].quota);
            }
            let reply: Vec<i64> = self.guarded(&inv, self.timeout()).await?;
            if reply.len() != group.len() * 2 + 1 {
                return Err(StoreError::Reply(format!(
                    "{} values from the peek script",
                    reply.len()
                )));
            }
            for (&i, r) in group.iter().zip(reply.chunks_exact(2)) {
                out[i] = (r[0].max(0) as u64, r[1].max(0) as u64);
            }
            at = reply[group.len() * 2].max(0) as u64;
        }
        Ok(at)
    }

    /// Delete the counters of `checks`; how many keys there were.
    pub async fn reset(&self, checks: &[Check]) -> Result<u64, StoreError> {
        let keys: Vec<String> = checks.iter().map(|c| self.base_key(c)).collect();
        let mut removed = 0;
        for group in self.slot_groups(&keys) {
            let mut inv = Call::new(&RESET, group.iter().map(|&i| keys[i].as_str()));
            for &i in &group {
                let q = checks[i].quota;
                inv.arg(format!("{}:{}", algorithm_code(q.algorithm), q.window_ms));
            }
            let reply: Vec<i64> = self.guarded(&inv, self.timeout()).await?;
            removed += reply.first().map_or(0, |&n| n.max(0) as u64);
        }
        Ok(removed)
    }
}
