//! The datasets and scenarios of the end-to-end benchmark, and the request
//! sequence every system of a scenario gets.

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;
use sidecar::graph::CsrIndex;

/// Where the product reads the features from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Store {
    /// The embedded RocksDB store in the sidecar's data directory.
    Embedded,
    /// Redis (the other systems always read Redis).
    Redis,
}

/// The product's caches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Cache {
    /// Every row pinned in L1 before the run (`--warm-up <all nodes>`).
    Warm,
    /// No L1 (`--l1-mib 0 --warm-up 0`) and no L2 (`--no-l2`): every row of
    /// every request is read from the store.
    Cold,
}

/// One scenario: a dataset, where its features live, the product's cache
/// state, the fanouts, targets per request and whether 10% of requests
/// touch a super node.
#[derive(Debug, Clone, Serialize)]
pub struct Scenario {
    pub name: String,
    pub dataset: String,
    pub store: Store,
    pub cache: Cache,
    pub fanouts: [u32; 2],
    pub targets: usize,
    pub super_mix: bool,
}

impl Scenario {
    pub fn new(
        dataset: &str,
        store: Store,
        cache: Cache,
        fanouts: [u32; 2],
        targets: usize,
        super_mix: bool,
    ) -> Self {
        let store_name = match store {
            Store::Embedded => "embedded",
            Store::Redis => "redis",
        };
        let cache_name = match cache {
            Cache::Warm => "warm",
            Cache::Cold => "cold",
        };
        let mut name = format!(
            "{dataset}/{store_name}/{cache_name}/f{}x{}/t{targets}",
            fanouts[0], fanouts[1]
        );
        if super_mix {
            name.push_str("/super10");
        }
        Self {
            name,
            dataset: dataset.to_string(),
            store,
            cache,
            fanouts,
            targets,
            super_mix,
        }
    }

    /// The product configuration this scenario needs: scenarios with the
    /// same key share one running sidecar + worker.
    pub fn product_key(&self) -> String {
        format!(
            "{}/{:?}/{:?}/{:?}",
            self.dataset, self.store, self.cache, self.fanouts
        )
    }

    /// A file-name-safe form of the name (plots).
    pub fn slug(&self) -> String {
        self.name.replace('/', "-")
    }
}

/// The scenarios of a run. The full run covers every dimension the issue
/// names (cora in the embedded store and in Redis, the synthetic graph in
/// Redis; fanouts [20,10] and [20,20]; warm and cold; 1, 8 and 64 targets;
/// a 10% super-node mix) without the whole cross product, which would take
/// hours on two cores. The quick run keeps one of each kind of store.
pub fn scenarios(quick: bool, synthetic: &str) -> Vec<Scenario> {
    use Cache::{Cold, Warm};
    use Store::{Embedded, Redis};
    let s = Scenario::new;
    if quick {
        return vec![
            s("cora", Embedded, Warm, [20, 10], 1, false),
            s("cora", Redis, Cold, [20, 10], 1, false),
            s(synthetic, Redis, Warm, [20, 10], 1, false),
            s(synthetic, Redis, Cold, [20, 10], 8, true),
        ];
    }
    vec![
        s("cora", Embedded, Warm, [20, 10], 1, false),
        s("cora", Embedded, Warm, [20, 10], 8, false),
        s("cora", Embedded, Warm, [20, 10], 64, false),
        s("cora", Embedded, Cold, [20, 10], 1, false),
        s("cora", Embedded, Warm, [20, 20], 1, false),
        s("cora", Redis, Warm, [20, 10], 1, false),
        s("cora", Redis, Cold, [20, 10], 1, false),
        s("cora", Redis, Cold, [20, 10], 8, false),
        s(synthetic, Redis, Warm, [20, 10], 1, false),
        s(synthetic, Redis, Warm, [20, 10], 8, false),
        s(synthetic, Redis, Warm, [20, 10], 64, false),
        s(synthetic, Redis, Warm, [20, 10], 1, true),
        s(synthetic, Redis, Cold, [20, 10], 1, false),
        s(synthetic, Redis, Cold, [20, 10], 8, false),
        s(synthetic, Redis, Cold, [20, 10], 1, true),
        s(synthetic, Redis, Warm, [20, 20], 1, false),
    ]
}

/// `count` requests of `targets` ids each, seeded: targets are drawn
/// uniformly among nodes with at least one neighbour (and outside the
/// super nodes `0..super_nodes`); with `super_mix`, every tenth request's
/// first target is a super node.
pub fn requests(
    index: &CsrIndex,
    super_nodes: u32,
    targets: usize,
    count: usize,
    super_mix: bool,
    seed: u64,
) -> Vec<Vec<u64>> {
    let mut rng = SmallRng::seed_from_u64(seed);
    let n = index.n_nodes();
    let draw = |rng: &mut SmallRng| loop {
        let v = rng.random_range(super_nodes.min(n - 1)..n);
        if index.degree(v) > 0 {
            return u64::from(v);
        }
    };
    (0..count)
        .map(|k| {
            let mut ids: Vec<u64> = (0..targets).map(|_| draw(&mut rng)).collect();
            if super_mix && super_nodes > 0 && k % 10 == 0 {
                ids[0] = u64::from(rng.random_range(0..super_nodes));
            }
            ids
        })
        .collect()
}
