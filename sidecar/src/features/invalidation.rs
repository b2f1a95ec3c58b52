//! Invalidation: a Redis pub/sub channel carrying node ids evicts them from
//! L1 and from the L2 cache, so the next request reads the new row from
//! Redis. A message is node ids in decimal, separated by spaces or commas;
//! an unparsable token is logged and counted, the rest still applied. If a
//! message is lost (disconnect), the L2 TTL bounds the staleness; the
//! listener resubscribes with backoff.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;

use crate::features::redis_tier::RedisConfig;
use crate::features::FeatureTiers;
use daemon_kit::redact::redact_url as redact;

/// Default channel name.
pub const DEFAULT_CHANNEL: &str = "feat-invalidate";

/// Counters of the listener.
#[derive(Debug, Default)]
pub struct InvalidationStats {
    pub messages: AtomicU64,
    pub ids: AtomicU64,
    pub bad_tokens: AtomicU64,
    pub reconnects: AtomicU64,
}

/// The listener's counters at one moment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct InvalidationSnapshot {
    pub messages: u64,
    pub ids: u64,
    pub bad_tokens: u64,
    pub reconnects: u64,
}

impl InvalidationStats {
    pub fn snapshot(&self) -> InvalidationSnapshot {
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
        InvalidationSnapshot {
            messages: load(&self.messages),
            ids: load(&self.ids),
            bad_tokens: load(&self.bad_tokens),
            reconnects: load(&self.reconnects),
        }
    }
}

/// Registered under the `invalidation` prefix (zeros when no channel is
/// configured).
impl daemon_kit::metrics::Telemetry for InvalidationStats {
    fn encode(&self, out: &mut daemon_kit::metrics::Out<'_>) -> std::fmt::Result {
        let s = self.snapshot();
        out.counter(
            "messages",
            "messages received on the invalidation channel",
            s.messages,
        )?;
        out.counter(
            "ids",
            "node ids invalidated through the invalidation channel",
            s.ids,
        )?;
        out.counter(
            "bad_tokens",
            "tokens of invalidation messages that are not node ids",
            s.bad_tokens,
        )?;
        out.counter(
            "reconnects",
            "times the invalidation subscription was lost and made again",
            s.reconnects,
        )
    }
}

/// Parses a message into node ids; returns (ids, unparsable tokens).
pub fn parse_ids(message: &str) -> (Vec<u64>, usize) {
    let mut bad = 0;
    let ids = message
        .split(|c: char| c.is_whitespace() || c == ',')
        .filter(|t| !t.is_empty())
        .filter_map(|t| match t.parse() {
            Ok(id) => Some(id),
            Err(_) => {
                bad += 1;
                None
            }
        })
        .collect();
    (ids, bad)
}

/// Subscribes to `channel` on the first node of `redis` (with its TLS
/// settings; on a cluster, PUBLISH reaches every node) and applies
/// invalidations to `tiers` until the task is aborted. Returns once the
/// first subscription is in place (so a test or a readiness check can rely
/// on it).
pub async fn spawn_listener(
    tiers: FeatureTiers,
    redis: &RedisConfig,
    channel: String,
    stats: Arc<InvalidationStats>,
) -> anyhow::Result<tokio::task::JoinHandle<()>> {
    let url = redis
        .urls
        .first()
        .ok_or_else(|| anyhow::anyhow!("the invalidation channel needs a Redis URL"))?;
    let client = redis.client(url)?;
    let mut pubsub = client.get_async_pubsub().await?;
    pubsub.subscribe(&channel).await?;
    let shown = redact(url);
    Ok(tokio::spawn(async move {
        let mut backoff = Duration::from_millis(50);
        loop {
            {
                let mut messages = pubsub.on_message();
                while let Some(message) = messages.next().await {
                    let Ok(text) = message.get_payload::<String>() else {
                        stats.bad_tokens.fetch_add(1, Ordering::Relaxed);
                        continue;
                    };
                    let (ids, bad) = parse_ids(&text);
                    stats.messages.fetch_add(1, Ordering::Relaxed);
                    stats.ids.fetch_add(ids.len() as u64, Ordering::Relaxed);
                    if bad > 0 {
                        stats.bad_tokens.fetch_add(bad as u64, Ordering::Relaxed);
                        tracing::warn!(
                            bad_tokens = bad,
                            "invalidation message with non-numeric ids"
                        );
                    }
                    tiers.invalidate(&ids).await;
                }
            }
            // The stream ended: the connection dropped. Resubscribe.
            tracing::warn!(redis = %shown, %channel, "invalidation subscription lost; resubscribing");
            loop {
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(5));
                let resubscribed = async {
                    let mut fresh = client.get_async_pubsub().await?;
                    fresh.subscribe(&channel).await?;
                    Ok::<_, redis::RedisError>(fresh)
                }
                .await;
                if let Ok(fresh) = resubscribed {
                    pubsub = fresh;
                    stats.reconnects.fetch_add(1, Ordering::Relaxed);
                    backoff = Duration::from_millis(50);
                    break;
                }
            }
        }
    }))
}

#[cfg(test)]
mod tests {
    use super::parse_ids;

    #[test]
    fn messages_are_ids_separated_by_spaces_or_commas() {
        assert_eq!(parse_ids("1 2,3  ,4"), (vec![1, 2, 3, 4], 0));
        assert_eq!(parse_ids("7 x 8"), (vec![7, 8], 1));
        assert_eq!(parse_ids(""), (vec![], 0));
    }
}
