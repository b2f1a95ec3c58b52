//! Invalidation: a Redis pub/sub channel carrying node ids evicts them from
//! L1 and from the L2 cache of their node type, so the next request reads
//! the new row from Redis. A message is tokens separated by spaces or
//! commas, each `<type>:<id>` (`airport:42`) or, where the graph has one
//! node type (a one-type graph's), a bare `<id>`; ids in decimal. An
//! unparsable token (a type the graph lacks or that has no rows, a bare id
//! in a graph of several types, an id that is not a number) is logged and
//! counted, the rest still applied. If a message is lost (disconnect), the
//! L2 TTL bounds the staleness; the listener resubscribes with backoff.

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
            "tokens of invalidation messages that name no node with rows",
            s.bad_tokens,
        )?;
        out.counter(
            "reconnects",
            "times the invalidation subscription was lost and made again",
            s.reconnects,
        )
    }
}

/// The node types a message may name: each one's name and its tiers
/// (`None` for a type without rows).
#[derive(Debug, Clone)]
pub struct NodeTypes(pub Vec<(String, Option<FeatureTiers>)>);

/// Parses a message into `(node type, id)` pairs of the types `has_rows`
/// lists (`(name, whether it has rows)`, in the graph's order); returns
/// them and the unparsable tokens.
pub fn parse_nodes(message: &str, has_rows: &[(&str, bool)]) -> (Vec<(usize, u64)>, usize) {
    let mut bad = 0;
    let nodes = message
        .split(|c: char| c.is_whitespace() || c == ',')
        .filter(|t| !t.is_empty())
        .filter_map(|token| {
            let (t, id) = match token.rsplit_once(':') {
                Some((name, id)) => (has_rows.iter().position(|(n, _)| *n == name), id),
                None => ((has_rows.len() == 1).then_some(0), token),
            };
            match (t, id.parse::<u64>()) {
                (Some(t), Ok(id)) if has_rows[t].1 => Some((t, id)),
                _ => {
                    bad += 1;
                    None
                }
            }
        })
        .collect();
    (nodes, bad)
}

/// Subscribes to `channel` on the first node of `redis` (with its TLS
/// settings; on a cluster, PUBLISH reaches every node) and applies
/// invalidations to each node type's tiers until the task is aborted. Returns once the
/// first subscription is in place (so a test or a readiness check can rely
/// on it).
pub async fn spawn_listener(
    types: NodeTypes,
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
        let names: Vec<(String, bool)> = types
            .0
            .iter()
            .map(|(name, tiers)| (name.clone(), tiers.is_some()))
            .collect();
        let has_rows: Vec<(&str, bool)> =
            names.iter().map(|(n, rows)| (n.as_str(), *rows)).collect();
        let mut backoff = Duration::from_millis(50);
        loop {
            {
                let mut messages = pubsub.on_message();
                while let Some(message) = messages.next().await {
                    let Ok(text) = message.get_payload::<String>() else {
                        stats.bad_tokens.fetch_add(1, Ordering::Relaxed);
                        continue;
                    };
                    let (nodes, bad) = parse_nodes(&text, &has_rows);
                    stats.messages.fetch_add(1, Ordering::Relaxed);
                    stats.ids.fetch_add(nodes.len() as u64, Ordering::Relaxed);
                    if bad > 0 {
                        stats.bad_tokens.fetch_add(bad as u64, Ordering::Relaxed);
                        tracing::warn!(
                            bad_tokens = bad,
                            "invalidation message with tokens that name no node with rows \
                             (`<type>:<id>`, or a bare id of a one-type graph)"
                        );
                    }
                    for (t, (_, tiers)) in types.0.iter().enumerate() {
                        let ids: Vec<u64> = nodes
                            .iter()
                            .filter(|&&(of, _)| of == t)
                            .map(|&(_, id)| id)
                            .collect();
                        if let (Some(tiers), false) = (tiers, ids.is_empty()) {
                            tiers.invalidate(&ids).await;
                        }
                    }
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
    use super::parse_nodes;

    #[test]
    fn a_one_type_graph_s_messages_are_ids_separated_by_spaces_or_commas() {
        let one = [("node", true)];
        assert_eq!(
            parse_nodes("1 2,3  ,4", &one),
            (vec![(0, 1), (0, 2), (0, 3), (0, 4)], 0)
        );
        assert_eq!(parse_nodes("7 x 8", &one), (vec![(0, 7), (0, 8)], 1));
        assert_eq!(parse_nodes("", &one), (vec![], 0));
        assert_eq!(parse_nodes("node:9", &one), (vec![(0, 9)], 0));
    }

    #[test]
    fn a_typed_graph_s_tokens_name_their_type() {
        let types = [("airport", true), ("airline", true), ("country", false)];
        assert_eq!(
            parse_nodes("airport:42 airline:3,airport:7", &types),
            (vec![(0, 42), (1, 3), (0, 7)], 0)
        );
        // A bare id, a type without rows, an unknown type, a bad id.
        assert_eq!(
            parse_nodes("42 country:1 plane:2 airport:x airport:5", &types),
            (vec![(0, 5)], 4)
        );
    }
}
