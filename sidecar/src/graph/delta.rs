//! The rows added to the graph since its base index, as a persistent map
//! from node id to row: an update copies only the paths it touches.
//!
//! A radix trie over the node id, 32 children per level, as deep as the
//! largest id needs (cora's ids take 3 levels, 2^32 ids 7). Snapshots share
//! every node they did not change: `insert` copies the root-to-leaf path of
//! the id it writes (at most 7 arrays of 32 pointers) the first time a batch
//! touches it, and writes in place afterwards (`Arc::make_mut` finds the
//! path no longer shared). An update therefore costs time and memory in
//! proportion to the ids it touches, whatever the size of the delta; a
//! lookup follows at most 7 pointers.
//!
//! An entry's presence makes the node known (an added node's row may be
//! empty); its row holds the added neighbours, sorted, unique, none already
//! in the base row. An edge type whose edges carry data keeps the added
//! edges' data in a map of its own, of [`EdgeRowData`] (`Delta<DataRow>`),
//! aligned with the row (graph::live).

use std::sync::Arc;

const BITS: u32 = 5;
const WIDTH: usize = 1 << BITS;
const MASK: u64 = WIDTH as u64 - 1;

/// An added node's row: sorted, unique neighbour ids.
pub type Row = Arc<[u32]>;

/// The data of an added row's edges, aligned with it: `attrs` row-major
/// (`attr_dim` per edge), `weights` and `times` one per edge or empty.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct EdgeRowData {
    pub attrs: Box<[f32]>,
    pub weights: Box<[f32]>,
    pub times: Box<[i64]>,
}

/// An added row's edge data.
pub type DataRow = Arc<EdgeRowData>;

#[derive(Debug, Clone)]
enum Node<T> {
    Inner(Box<[Option<Arc<Node<T>>>; WIDTH]>),
    Leaf(Box<[Option<T>; WIDTH]>),
}

impl<T> Node<T> {
    fn inner() -> Self {
        Node::Inner(Box::new(std::array::from_fn(|_| None)))
    }

    fn leaf() -> Self {
        Node::Leaf(Box::new(std::array::from_fn(|_| None)))
    }
}

/// The persistent map; cloning it is O(1).
#[derive(Debug, Clone)]
pub struct Delta<T = Row> {
    root: Option<Arc<Node<T>>>,
    /// Levels below and including the root; the root covers ids below
    /// `32^levels`.
    levels: u32,
    /// Entries present.
    len: u64,
}

impl<T> Default for Delta<T> {
    fn default() -> Self {
        Self {
            root: None,
            levels: 0,
            len: 0,
        }
    }
}

impl<T: Clone> Delta<T> {
    /// Ids below this bound fit the current depth.
    fn capacity(&self) -> u64 {
        1u64 << (BITS * self.levels)
    }

    /// Entries present (known nodes with an entry).
    pub fn len(&self) -> u64 {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The entry of `id`, if any.
    pub fn get(&self, id: u32) -> Option<&T> {
        let id = u64::from(id);
        if id >= self.capacity() {
            return None;
        }
        let mut node = self.root.as_deref()?;
        let mut level = self.levels;
        loop {
            level -= 1;
            let slot = ((id >> (BITS * level)) & MASK) as usize;
            match node {
                Node::Inner(children) => node = children[slot].as_deref()?,
                Node::Leaf(rows) => return rows[slot].as_ref(),
            }
        }
    }

    /// Sets the entry of `id` to `row`, returning the entry it replaces.
    pub fn insert(&mut self, id: u32, row: T) -> Option<T> {
        let id = u64::from(id);
        if self.root.is_none() {
            self.levels = 1;
            self.root = Some(Arc::new(Node::leaf()));
        }
        while id >= self.capacity() {
            // One level more: the old root becomes the first child.
            let mut top = Node::inner();
            if let Node::Inner(children) = &mut top {
                children[0] = self.root.take();
            }
            self.root = Some(Arc::new(top));
            self.levels += 1;
        }
        let mut node = Arc::make_mut(self.root.as_mut().expect("a root"));
        let mut level = self.levels;
        let old = loop {
            level -= 1;
            let slot = ((id >> (BITS * level)) & MASK) as usize;
            match node {
                Node::Inner(children) => {
                    let child = children[slot].get_or_insert_with(|| {
                        Arc::new(if level == 1 {
                            Node::leaf()
                        } else {
                            Node::inner()
                        })
                    });
                    node = Arc::make_mut(child);
                }
                Node::Leaf(rows) => break rows[slot].replace(row),
            }
        };
        if old.is_none() {
            self.len += 1;
        }
        old
    }

    /// The leaf holding `id`'s entry (tests: which paths an insert copied).
    #[cfg(test)]
    fn leaf_of(&self, id: u32) -> Option<*const Node<T>> {
        let id = u64::from(id);
        let mut node = self.root.as_deref()?;
        let mut level = self.levels;
        loop {
            level -= 1;
            match node {
                Node::Inner(children) => {
                    node = children[((id >> (BITS * level)) & MASK) as usize].as_deref()?
                }
                Node::Leaf(_) => return Some(node as *const Node<T>),
            }
        }
    }

    /// Calls `each` with every entry, in increasing id order.
    pub fn for_each(&self, mut each: impl FnMut(u32, &T)) {
        fn walk<T>(node: &Node<T>, prefix: u64, level: u32, each: &mut impl FnMut(u32, &T)) {
            match node {
                Node::Inner(children) => {
                    for (slot, child) in children.iter().enumerate() {
                        if let Some(child) = child {
                            let prefix = prefix | ((slot as u64) << (BITS * (level - 1)));
                            walk(child, prefix, level - 1, each);
                        }
                    }
                }
                Node::Leaf(rows) => {
                    for (slot, row) in rows.iter().enumerate() {
                        if let Some(row) = row {
                            each((prefix | slot as u64) as u32, row);
                        }
                    }
                }
            }
        }
        if let Some(root) = &self.root {
            walk(root, 0, self.levels, &mut each);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn row(values: &[u32]) -> Row {
        values.into()
    }

    #[test]
    fn behaves_like_a_map_and_old_versions_stay_intact() {
        let mut delta = Delta::default();
        let mut model = BTreeMap::new();
        let mut versions = Vec::new();
        let mut x = 12345u64;
        for k in 0..2000u32 {
            // Ids spread from small to near 2^32, so the trie deepens.
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let id = match k % 4 {
                0 => (x >> 60) as u32,
                1 => (x >> 48) as u32,
                2 => (x >> 40) as u32,
                _ => ((x >> 32) as u32).min(u32::MAX - 1),
            };
            let r = row(&[k, k + 1]);
            assert_eq!(
                delta.insert(id, r.clone()).as_deref(),
                model.get(&id).map(|r: &Row| &r[..])
            );
            model.insert(id, r);
            if k % 250 == 0 {
                versions.push((delta.clone(), model.clone()));
            }
        }
        assert_eq!(delta.len(), model.len() as u64);
        for (version, expected) in versions
            .iter()
            .chain([(delta.clone(), model.clone())].iter())
        {
            let mut seen = Vec::new();
            version.for_each(|id, row| seen.push((id, row.clone())));
            let want: Vec<(u32, Row)> = expected.iter().map(|(k, v)| (*k, v.clone())).collect();
            assert_eq!(seen, want, "a version changed after it was taken");
            for (id, row) in expected {
                assert_eq!(version.get(*id), Some(row));
            }
            assert_eq!(version.get(7_777_777), expected.get(&7_777_777));
        }
    }

    #[test]
    fn an_insert_copies_one_path_only() {
        let mut delta = Delta::default();
        for id in 0..32 * 32 * 32u32 {
            delta.insert(id, row(&[]));
        }
        let before = delta.clone();
        delta.insert(5, row(&[1]));
        let leaves = |d: &Delta| -> Vec<*const Node<Row>> {
            (0..32 * 32 * 32u32)
                .step_by(WIDTH)
                .map(|id| d.leaf_of(id).expect("a leaf"))
                .collect()
        };
        let (old, new) = (leaves(&before), leaves(&delta));
        let copied: Vec<usize> = (0..old.len()).filter(|&i| old[i] != new[i]).collect();
        assert_eq!(copied, vec![0], "only the leaf of id 5 was copied");
        assert_eq!(before.get(5).map(|r| r.len()), Some(0));
        assert_eq!(delta.get(5).map(|r| r.len()), Some(1));
        // A second write to the same path, not shared any more: in place.
        delta.insert(6, row(&[2]));
        assert_eq!(delta.leaf_of(6), Some(new[0]));
    }
}
