//! Over-limit cache invalidations between gateways: published with one small script (so it
//! goes through the same connection, deadline and breaker as every store call; in a cluster
//! any node broadcasts it) on the channel `<prefix>:over-limit`, and followed by one
//! subscriber connection per gateway. While that connection is down, messages may be missed,
//! so the cache is emptied each time it (re)connects.
//!
//! Phase: admin calls and reloads (publish), a background task (follow).

use std::sync::LazyLock;
use std::time::Duration;

use futures_util::StreamExt;
use redis::Script;

use super::{Call, Conn, RedisStore};
use crate::config::Topology;
use crate::store::lease::Leases;
use crate::store::over_limit::{Invalidation, OverLimitCache};
use crate::store::StoreError;

static PUBLISH: LazyLock<Script> =
    LazyLock::new(|| Script::new("return { redis.call('PUBLISH', ARGV[1], ARGV[2]) }"));

/// The pause before the subscriber connects again.
const RECONNECT: Duration = Duration::from_millis(500);

impl RedisStore {
    /// The pub/sub channel of this store's gateways.
    pub fn invalidation_channel(&self) -> String {
        format!("{}:over-limit", self.prefix)
    }

    /// Tell every gateway (this one too) to drop what `inv` names.
    pub async fn publish_invalidation(&self, inv: &Invalidation) -> Result<(), StoreError> {
        let mut call = Call::new(&PUBLISH, std::iter::empty::<&str>());
        call.arg(self.invalidation_channel()).arg(inv.encode());
        self.guarded::<Vec<i64>>(&call, self.timeout().max(Duration::from_millis(250)))
            .await
            .map(drop)
    }

    /// A client for the subscriber connection: the server, a cluster node (every node
    /// broadcasts), or the master the sentinels name.
    async fn pubsub_client(&self, attempt: usize) -> Result<redis::Client, redis::RedisError> {
        match (&self.conn, &self.topology) {
            (Conn::Single(client, _), _) => Ok(client.clone()),
            (Conn::Cluster(_), Topology::Cluster { nodes }) => {
                redis::Client::open(nodes[attempt % nodes.len()].as_str())
            }
            (Conn::Sentinel(s), _) => s.client.lock().await.async_get_client().await,
            (Conn::Cluster(_), _) => unreachable!("cluster connection has cluster topology"),
        }
    }

    /// Apply every invalidation published on the channel to `cache`, until `shutdown`.
    pub async fn follow_invalidations(
        &self,
        cache: &OverLimitCache,
        leases: &Leases,
        mut shutdown: tokio::sync::watch::Receiver<bool>,
    ) {
        let channel = self.invalidation_channel();
        let mut attempt = 0;
        loop {
            let follow = async {
                let client = self.pubsub_client(attempt).await?;
                let mut pubsub =
                    tokio::time::timeout(super::CONNECT_TIMEOUT, client.get_async_pubsub())
                        .await
                        .map_err(|_| {
                            redis::RedisError::from(std::io::Error::from(
                                std::io::ErrorKind::TimedOut,
                            ))
                        })??;
                pubsub.subscribe(&channel).await?;
                // Whatever was published while no subscription was listening is unknown.
                cache.clear();
                tracing::debug!(channel, "following over-limit cache invalidations");
                let mut messages = pubsub.on_message();
                while let Some(msg) = messages.next().await {
                    let text: String = msg.get_payload().unwrap_or_default();
                    let inv = Invalidation::decode(&text).unwrap_or(Invalidation::All);
                    cache.invalidate(&inv);
                    // Ended at the next sweep (within 50 ms), which gives their units back.
                    leases.mark(&inv);
                }
                Ok::<(), redis::RedisError>(())
            };
            tokio::select! {
                _ = shutdown.changed() => return,
                r = follow => if let Err(e) = r {
                    tracing::debug!("over-limit cache invalidations: {e}; connecting again");
                },
            }
            cache.clear();
            attempt += 1;
            tokio::select! {
                _ = shutdown.changed() => return,
                _ = tokio::time::sleep(RECONNECT) => {}
            }
        }
    }
}
