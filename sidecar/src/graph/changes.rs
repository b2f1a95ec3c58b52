//! The sidecar's change clock: which nodes' feature rows and neighbour
//! lists changed, and when, so that an answer computed earlier can be told
//! fresh or stale (docs/protocol.md, "Freshness").
//!
//! The clock is an id drawn at start (`clock`) and a tick that every change
//! (a graph update, a feature invalidation) advances by one. A change
//! marks its nodes with its tick *before* it becomes visible (the snapshot
//! published, the cached rows evicted), and advances the tick only *after*:
//! so a request that sees the change also sees its marks, and a tick read
//! before sampling never claims a change the sample missed. An answer
//! computed from a sample taken at tick `t` still stands while no node of
//! that sample has a feature mark after `t` and neither the target nor a
//! hop-1 node of it has a neighbour-list mark after `t`: sampling is
//! deterministic, so the same nodes would be sampled again.
//!
//! Marks live as long as the process (one entry per node ever changed); a
//! restart draws a new clock id, and answers stamped with the old one are
//! stale.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, RwLock};

use rustc_hash::FxHashMap;

/// A node's key in the clock's marks: its type's index in the high half,
/// its id in the low half (node ids are u32), so a one-type graph's keys
/// are its ids.
pub fn node_key(node_type: usize, id: u64) -> u64 {
    ((node_type as u64) << 32) | id
}

/// The change clock and the nodes' marks.
#[derive(Debug)]
pub struct Changes {
    clock: u64,
    /// Every change up to this one is marked and visible.
    tick: AtomicU64,
    /// Ticks handed out, and those of the changes still in progress: the
    /// visible tick stops below the oldest of them, so that changes that
    /// finish out of order never expose a later tick early.
    issued: Mutex<(u64, BTreeSet<u64>)>,
    /// Node -> tick of the last change of its feature row.
    features: RwLock<FxHashMap<u64, u64>>,
    /// Node -> tick of the last change of its neighbour list.
    edges: RwLock<FxHashMap<u64, u64>>,
}

impl Default for Changes {
    fn default() -> Self {
        Self::new()
    }
}

impl Changes {
    /// A clock with a fresh, non-zero id and no changes.
    pub fn new() -> Self {
        Self {
            // Differs at every start, never 0 (as a segment's epoch).
            clock: protocol::segment::new_epoch(),
            tick: AtomicU64::new(0),
            issued: Mutex::new((0, BTreeSet::new())),
            features: RwLock::default(),
            edges: RwLock::default(),
        }
    }

    pub fn clock(&self) -> u64 {
        self.clock
    }

    /// Changes applied and visible. Read it before loading what a request
    /// samples.
    pub fn tick(&self) -> u64 {
        self.tick.load(Ordering::Acquire)
    }

    /// Starts a change: mark its nodes through the guard, make the change
    /// visible, then drop the guard (which advances the tick once every
    /// earlier change is done too). The guard holds no lock.
    pub fn begin(&self) -> Change<'_> {
        let mut issued = self.issued.lock().unwrap_or_else(|p| p.into_inner());
        issued.0 += 1;
        let tick = issued.0;
        issued.1.insert(tick);
        Change {
            changes: self,
            tick,
        }
    }

    /// Whether an answer computed at `since` still stands for a target whose
    /// current sample holds `nodes` (every node, the target first) and whose
    /// neighbour lists read were those of `listed` (the target and its
    /// hop-1 nodes).
    pub fn unchanged_since(&self, since: u64, nodes: &[u64], listed: &[u64]) -> bool {
        let features = self.features.read().unwrap_or_else(|p| p.into_inner());
        if nodes
            .iter()
            .any(|n| features.get(n).is_some_and(|&t| t > since))
        {
            return false;
        }
        drop(features);
        let edges = self.edges.read().unwrap_or_else(|p| p.into_inner());
        !listed
            .iter()
            .any(|n| edges.get(n).is_some_and(|&t| t > since))
    }

    /// Nodes with a feature mark and with a neighbour-list mark
    /// (`sidecar_change_marks`).
    pub fn marked(&self) -> (usize, usize) {
        let features = self
            .features
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .len();
        let edges = self.edges.read().unwrap_or_else(|p| p.into_inner()).len();
        (features, edges)
    }
}

/// One change in progress; dropping it advances the tick.
#[derive(Debug)]
pub struct Change<'a> {
    changes: &'a Changes,
    tick: u64,
}

impl Change<'_> {
    /// Marks `nodes`' feature rows as changed by this change.
    pub fn features(&self, nodes: impl IntoIterator<Item = u64>) {
        let mut map = self
            .changes
            .features
            .write()
            .unwrap_or_else(|p| p.into_inner());
        for node in nodes {
            map.insert(node, self.tick);
        }
    }

    /// Marks `nodes`' neighbour lists as changed by this change.
    pub fn edges(&self, nodes: impl IntoIterator<Item = u64>) {
        let mut map = self
            .changes
            .edges
            .write()
            .unwrap_or_else(|p| p.into_inner());
        for node in nodes {
            map.insert(node, self.tick);
        }
    }
}

impl Drop for Change<'_> {
    fn drop(&mut self) {
        let mut issued = self
            .changes
            .issued
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        issued.1.remove(&self.tick);
        let visible = issued.1.first().map_or(issued.0, |oldest| oldest - 1);
        // SYNC POINT: the marks and the changes themselves are visible
        // before a reader can see this tick.
        self.changes.tick.store(visible, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mark_after_the_stamp_makes_an_answer_stale() {
        let changes = Changes::new();
        assert_ne!(changes.clock(), 0);
        let stamp = changes.tick();
        assert!(changes.unchanged_since(stamp, &[1, 2, 3], &[1, 2]));
        {
            let change = changes.begin();
            change.features([3]);
            // Not visible as a tick until the change is done.
            assert_eq!(changes.tick(), stamp);
        }
        assert_eq!(changes.tick(), stamp + 1);
        assert!(!changes.unchanged_since(stamp, &[1, 2, 3], &[1, 2]));
        assert!(changes.unchanged_since(stamp + 1, &[1, 2, 3], &[1, 2]));
        changes.begin().edges([2]);
        assert!(!changes.unchanged_since(stamp + 1, &[1, 2, 3], &[1, 2]));
        // A neighbour-list change of a hop-2 node does not matter.
        changes.begin().edges([9]);
        assert!(changes.unchanged_since(stamp + 2, &[1, 2, 9], &[1, 2]));
        assert_eq!(changes.marked(), (1, 2));
    }

    #[test]
    fn a_tick_is_visible_only_once_every_earlier_change_is_done() {
        let changes = Changes::new();
        let first = changes.begin();
        let second = changes.begin();
        second.features([1]);
        drop(second);
        assert_eq!(changes.tick(), 0, "the first change is still in progress");
        first.features([2]);
        drop(first);
        assert_eq!(changes.tick(), 2);
    }
}
