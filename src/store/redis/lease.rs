//! Leased units given back (`lua/lease_return.lua`): one call per cluster slot for every lease
//! that ended with units unspent.
//!
//! Phase: the lease sweeper, a background task; never a request.

use std::sync::LazyLock;

use redis::Script;

use super::call::key_tag;
use super::{quota, Call, RedisStore};
use crate::store::lease::Ended;
use crate::store::StoreError;

static RETURN: LazyLock<Script> = LazyLock::new(|| {
    Script::new(concat!(
        include_str!("../../../lua/prelude.lua"),
        include_str!("../../../lua/lease_return.lua"),
    ))
});

impl RedisStore {
    /// Give back the unspent units of `ended`: (units given back, units dropped because their
    /// window had ended).
    pub async fn give_back(&self, ended: &[Ended]) -> Result<(u64, u64), StoreError> {
        let keys: Vec<String> = ended
            .iter()
            .map(|e| self.key(&e.name, &e.key, key_tag(e.quota.algorithm)))
            .collect();
        let (mut back, mut dropped) = (0, 0);
        for group in self.slot_groups(&keys) {
            let mut inv = Call::new(&RETURN, group.iter().map(|&i| keys[i].as_str()));
            for &i in &group {
                let e = &ended[i];
                quota(&mut inv, &e.quota).arg(e.units).arg(e.window);
            }
            let reply: Vec<i64> = self.guarded(&inv, self.timeout()).await?;
            let [b, d] = reply[..] else {
                return Err(StoreError::Reply(format!(
                    "{} values from the lease return script",
                    reply.len()
                )));
            };
            back += b.max(0) as u64;
            dropped += d.max(0) as u64;
        }
        Ok((back, dropped))
    }
}
