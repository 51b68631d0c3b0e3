//! Concurrency slots in Redis: one sorted set per concurrency limit and caller, taken and given
//! back by two scripts of their own (`lua/concurrency_take.lua`, `lua/concurrency_release.lua`),
//! each one EVALSHA on the store's connection, behind the same deadline and circuit breaker as
//! the rate-limit check (`RedisStore::guarded`).
//!
//! Keys: `{<prefix>:<limit>:<hash>}:inflight`, one hash tag per limit and caller like the rate
//! limits' keys. On a cluster, the sets of one request can live in different slots: they are
//! taken one slot group at a time, and a denial in a later group gives back what the earlier
//! groups took.
//!
//! Phase: `request_filter` (take) and the end of the request (release, on a spawned task).

use std::sync::LazyLock;

use redis::Script;

use super::{Call, RedisStore};
use crate::store::{Claim, InUse, StoreError};

/// Takes one slot of every limit of a request, all or nothing.
pub const TAKE_SCRIPT: &str = include_str!("../../../lua/concurrency_take.lua");
/// Gives a request's slots back.
pub const RELEASE_SCRIPT: &str = include_str!("../../../lua/concurrency_release.lua");

static TAKE: LazyLock<Script> = LazyLock::new(|| Script::new(TAKE_SCRIPT));
static RELEASE: LazyLock<Script> = LazyLock::new(|| Script::new(RELEASE_SCRIPT));

impl RedisStore {
    /// The sorted set of a concurrency limit and caller.
    pub fn slot_key(&self, c: &Claim) -> String {
        self.key(&c.name, &c.key, "inflight")
    }

    /// Take a slot of every claim (`keys[i]` is claim `i`'s set) for the request `member`.
    /// `in_use` receives the slots each limit had in use before this request. Returns whether
    /// the request holds its slots: exactly when every enforcing limit had room.
    pub async fn take_slots(
        &self,
        keys: &[String],
        claims: &[Claim],
        member: &str,
        in_use: &mut InUse,
    ) -> Result<bool, StoreError> {
        let groups = self.slot_groups(keys);
        in_use.clear();
        in_use.resize(claims.len(), 0);
        for (g, group) in groups.iter().enumerate() {
            let mut inv = Call::new(&TAKE, group.iter().map(|&i| keys[i].as_str()));
            inv.arg(member);
            for &i in group {
                let c = &claims[i];
                inv.arg(c.cap).arg(c.timeout_ms).arg(u8::from(c.shadow));
            }
            let reply = self.guarded::<Vec<i64>>(&inv, self.timeout()).await;
            let reply = match reply {
                Ok(r) if r.len() == group.len() + 1 => r,
                other => {
                    // Give back what earlier groups took (and this one, if it ran).
                    let taken: Vec<String> = groups[..=g]
                        .iter()
                        .flatten()
                        .map(|&i| keys[i].clone())
                        .collect();
                    let _ = self.release_slots(&taken, member).await;
                    return Err(match other {
                        Err(e) => e,
                        Ok(r) => StoreError::Reply(format!(
                            "{} values from the concurrency take script",
                            r.len()
                        )),
                    });
                }
            };
            for (&i, &n) in group.iter().zip(&reply[1..]) {
                in_use[i] = n.max(0) as u64;
            }
            if reply[0] != 1 {
                if g > 0 {
                    let taken: Vec<String> = groups[..g]
                        .iter()
                        .flatten()
                        .map(|&i| keys[i].clone())
                        .collect();
                    let _ = self.release_slots(&taken, member).await;
                }
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// Give back the slots of `member` in `keys`. Returns how many were freed.
    pub async fn release_slots(&self, keys: &[String], member: &str) -> Result<u64, StoreError> {
        let mut freed = 0;
        for group in self.slot_groups(keys) {
            let mut inv = Call::new(&RELEASE, group.iter().map(|&i| keys[i].as_str()));
            inv.arg(member);
            let reply: Vec<i64> = self.guarded(&inv, self.timeout()).await?;
            freed += reply.first().map_or(0, |&n| n.max(0) as u64);
        }
        Ok(freed)
    }
}
