//! A seeded synthetic power-law graph: R-MAT, plus planted super nodes.
//!
//! R-MAT (Chakrabarti, Zhan, Faloutsos 2004) places each edge by descending
//! `ceil(log2 n)` levels of the adjacency matrix, choosing a quadrant with
//! probabilities (a, b, c, d) = (0.57, 0.19, 0.19, 0.05) at each level; ids
//! at or above `n` wrap modulo `n`. The degree distribution is heavy-tailed.
//! Super nodes (ids `0..k`) additionally get `super_degree` distinct
//! out-neighbours each, visited with a stride coprime to `n`.
//!
//! The output is a dataset directory in the shared layout (`edges.u32`,
//! `meta.json`, and with `feature_dim` > 0 `features.f32`: seeded values
//! uniform in [0, 1)), so `sidecar import` reads it like any other dataset.
//! With `classes` > 0 as well, `labels.i32` (each node's label: the largest
//! of `classes` seeded random projections of its row less 0.5, so a model
//! can learn it and the classes are about equally common) and `split.u8` (seeded: 60% train, 20% validation, 20% test), so the
//! model tooling can train on it.
//! Edges are unsorted and may repeat; the importer sorts and deduplicates.
//!
//! With [`GenerateOptions::items`] it writes a typed dataset instead
//! (docs/graph-index.md, "Typed datasets"): the nodes are users beside
//! items, the edges user-item interactions placed by R-MAT over both id
//! spaces (power-law degrees on both sides) with their reverse type, and
//! optionally user-user follows, each edge type sorted and without
//! repeats.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::Path;
use std::time::Instant;

use anyhow::{ensure, Context};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

/// What to generate: a one-type graph, or with `items` a typed graph of
/// users and items.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GenerateOptions {
    /// Nodes; with `items`, the users.
    pub nodes: u64,
    /// R-MAT edges (super-node edges come on top); with `items`, the
    /// user-item interactions drawn (repeats are dropped).
    pub edges: u64,
    pub seed: u64,
    /// One-type only.
    pub super_nodes: u64,
    pub super_degree: u64,
    /// Features per node, with `items` per user (0: none).
    pub feature_dim: u32,
    /// Classes of the labels (with the split); 0: neither. Needs
    /// `feature_dim` > 0.
    pub classes: u32,
    /// A typed graph of users (`nodes`) and these items.
    pub items: Option<Items>,
}

/// The items of a users-items graph ([`GenerateOptions::items`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Items {
    pub count: u64,
    /// Features per item (0: items have none).
    pub feature_dim: u32,
    /// User-user follows drawn (repeats and self loops are dropped); 0: no
    /// follows edge type.
    pub follows: u64,
}

/// What was generated.
#[derive(Debug, Clone, Copy)]
pub struct Generated {
    pub edges_written: u64,
    pub seconds: f64,
}

const A: u32 = (0.57 * 65536.0) as u32;
const AB: u32 = ((0.57 + 0.19) * 65536.0) as u32;
const ABC: u32 = ((0.57 + 0.19 + 0.19) * 65536.0) as u32;

/// One R-MAT edge in a `2^scale` matrix, 16 random bits per level.
fn rmat_edge(rng: &mut SmallRng, scale: u32) -> (u64, u64) {
    let (mut src, mut dst) = (0u64, 0u64);
    let mut bits = 0u64;
    for level in 0..scale {
        if level % 4 == 0 {
            bits = rng.random();
        }
        let r = (bits & 0xffff) as u32;
        bits >>= 16;
        let (s, d) = if r < A {
            (0, 0)
        } else if r < AB {
            (0, 1)
        } else if r < ABC {
            (1, 0)
        } else {
            (1, 1)
        };
        src = (src << 1) | s;
        dst = (dst << 1) | d;
    }
    (src, dst)
}

fn gcd(mut a: u64, mut b: u64) -> u64 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

/// Writes `n x dim` seeded features to `<out>/features.f32` and, with
/// `classes` > 0, each row's label to `<out>/labels.i32` and a seeded split
/// to `<out>/split.u8` (0 train, 1 validation, 2 test).
fn write_features(out: &Path, n: u64, dim: u32, classes: u32, seed: u64) -> anyhow::Result<()> {
    write_features_to(&out.join("features.f32"), out, n, dim, classes, seed)
}

/// [`write_features`] with the features at `features` (labels and split
/// still in `out`).
fn write_features_to(
    features: &Path,
    out: &Path,
    n: u64,
    dim: u32,
    classes: u32,
    seed: u64,
) -> anyhow::Result<()> {
    let mut rng = SmallRng::seed_from_u64(seed ^ 0x5eed_f00d);
    let mut split_rng = SmallRng::seed_from_u64(seed ^ 0x5b11_7000);
    // Class k's direction: `dim` seeded values in [-1, 1).
    let projections: Vec<f32> = (0..classes as usize * dim as usize)
        .map(|_| split_rng.random::<f32>() * 2.0 - 1.0)
        .collect();
    let mut writer = BufWriter::with_capacity(1 << 20, File::create(features)?);
    let mut labelled = if classes > 0 {
        Some((
            BufWriter::new(File::create(out.join("labels.i32"))?),
            BufWriter::new(File::create(out.join("split.u8"))?),
        ))
    } else {
        None
    };
    let mut row = vec![0f32; dim as usize];
    let mut bytes = vec![0u8; dim as usize * 4];
    for node in 0..n {
        for (value, out) in row.iter_mut().zip(bytes.chunks_exact_mut(4)) {
            *value = rng.random::<f32>();
            out.copy_from_slice(&value.to_le_bytes());
        }
        writer.write_all(&bytes)?;
        if let Some((labels, split)) = labelled.as_mut() {
            let score = |k: usize| -> f32 {
                let direction = &projections[k * row.len()..(k + 1) * row.len()];
                row.iter().zip(direction).map(|(a, b)| (a - 0.5) * b).sum()
            };
            let label = (0..classes as usize)
                .max_by(|&a, &b| score(a).total_cmp(&score(b)))
                .unwrap_or(0) as i32;
            labels.write_all(&label.to_le_bytes())?;
            let part = match split_rng.random_range(0..10u8) {
                0..=5 => 0u8,
                6..=7 => 1,
                _ => 2,
            };
            split.write_all(&[part])?;
        }
        if (node + 1).is_multiple_of(10_000_000) {
            tracing::info!(rows = node + 1, "generating features");
        }
    }
    writer.flush()?;
    if let Some((mut labels, mut split)) = labelled {
        labels.flush()?;
        split.flush()?;
    }
    Ok(())
}

/// Writes the dataset `options` describe into `out`: a one-type graph's
/// `edges.u32` and `meta.json` (and `features.f32`, `labels.i32`,
/// `split.u8`), or with `items` a typed dataset ([`users_items`]).
pub fn generate(options: &GenerateOptions, out: &Path) -> anyhow::Result<Generated> {
    let started = Instant::now();
    let n = options.nodes;
    let sides = [
        ("--nodes", Some(n)),
        ("--items", options.items.map(|i| i.count)),
    ];
    for (flag, count) in sides {
        if let Some(count) = count {
            ensure!(
                (2..=u64::from(u32::MAX)).contains(&count),
                "{flag} {count} must be between 2 and 2^32 - 1"
            );
        }
    }
    ensure!(
        options.classes == 0 || options.feature_dim > 0,
        "--classes {} needs --feature-dim: the labels are drawn from the features",
        options.classes
    );
    if let Some(items) = &options.items {
        ensure!(
            options.super_nodes == 0 && options.super_degree == 0,
            "--super-nodes and --super-degree are for one-type graphs: leave them out with \
             --items"
        );
        let written = users_items(options, items, out)?;
        return Ok(Generated {
            edges_written: written,
            seconds: started.elapsed().as_secs_f64(),
        });
    }
    ensure!(
        options.super_nodes <= n,
        "--super-nodes {} exceeds --nodes {n}",
        options.super_nodes
    );
    ensure!(
        options.super_degree < n,
        "--super-degree {} must be below --nodes {n} (neighbours are distinct nodes)",
        options.super_degree
    );
    std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    let scale = 64 - (n - 1).leading_zeros();
    let mut rng = SmallRng::seed_from_u64(options.seed);
    let mut writer = BufWriter::with_capacity(1 << 20, File::create(out.join("edges.u32"))?);
    let mut put = |src: u64, dst: u64| -> std::io::Result<()> {
        writer.write_all(&(src as u32).to_le_bytes())?;
        writer.write_all(&(dst as u32).to_le_bytes())
    };
    let mut written = 0u64;
    for i in 0..options.edges {
        let (src, dst) = rmat_edge(&mut rng, scale);
        put(src % n, dst % n)?;
        written += 1;
        if (i + 1).is_multiple_of(50_000_000) {
            tracing::info!(edges = i + 1, "generating R-MAT edges");
        }
    }
    for hub in 0..options.super_nodes {
        // A stride coprime to n visits distinct nodes; skip the hub itself.
        let mut stride = rng.random_range(1..n);
        while gcd(stride, n) != 1 {
            stride = rng.random_range(1..n);
        }
        let mut at = rng.random_range(0..n);
        let mut planted = 0u64;
        while planted < options.super_degree {
            at = (at + stride) % n;
            if at != hub {
                put(hub, at)?;
                planted += 1;
            }
        }
        written += planted;
    }
    writer.flush()?;
    if options.feature_dim > 0 {
        write_features(out, n, options.feature_dim, options.classes, options.seed)?;
    }
    let mut meta = serde_json::json!({
        "name": format!("rmat-n{}-e{}-s{}", n, options.edges, options.seed),
        "num_nodes": n,
        "num_edges": written,
        "generator": {
            "kind": "R-MAT (a, b, c, d) = (0.57, 0.19, 0.19, 0.05)",
            "seed": options.seed,
            "rmat_edges": options.edges,
            "super_nodes": options.super_nodes,
            "super_degree": options.super_degree,
        },
        "format": "edges.u32: u32 LE (src, dst) pairs, unsorted, may repeat; directed",
    });
    if options.feature_dim > 0 {
        meta["feature_dim"] = options.feature_dim.into();
        meta["features"] =
            "features.f32: f32 LE, num_nodes x feature_dim, uniform in [0, 1)".into();
    }
    if options.classes > 0 {
        meta["num_classes"] = options.classes.into();
        meta["labels"] = "labels.i32: i32 LE, the largest of num_classes seeded random \
                          projections of the node's features less 0.5"
            .into();
        meta["split"] = "split.u8: 0 train, 1 validation, 2 test; seeded, about 60/20/20".into();
    }
    std::fs::write(out.join("meta.json"), serde_json::to_string_pretty(&meta)?)?;
    Ok(Generated {
        edges_written: written,
        seconds: started.elapsed().as_secs_f64(),
    })
}

/// R-MAT pairs over `n_src x n_dst` (ids past a side wrap modulo it),
/// without `src == dst` when `no_loops`, sorted and unique, as u64 keys
/// `src * n_dst + dst`.
fn rmat_keys(rng: &mut SmallRng, count: u64, n_src: u64, n_dst: u64, no_loops: bool) -> Vec<u64> {
    let scale = 64 - (n_src.max(n_dst) - 1).leading_zeros();
    let mut keys = Vec::with_capacity(count as usize);
    for i in 0..count {
        let (src, dst) = rmat_edge(rng, scale);
        let (src, dst) = (src % n_src, dst % n_dst);
        if !(no_loops && src == dst) {
            keys.push(src * n_dst + dst);
        }
        if (i + 1).is_multiple_of(50_000_000) {
            tracing::info!(edges = i + 1, "generating R-MAT edges");
        }
    }
    keys.sort_unstable();
    keys.dedup();
    keys
}

/// Writes keys `src * n_dst + dst` as u32 LE (src, dst) pairs, or each
/// pair reversed (still sorted: the keys are re-sorted by dst first).
fn write_pairs(path: &Path, keys: &[u64], n_dst: u64, reversed: bool) -> anyhow::Result<()> {
    let mut pairs: Vec<(u32, u32)> = keys
        .iter()
        .map(|&k| ((k / n_dst) as u32, (k % n_dst) as u32))
        .map(|(s, d)| if reversed { (d, s) } else { (s, d) })
        .collect();
    if reversed {
        pairs.sort_unstable();
    }
    let mut writer = BufWriter::with_capacity(1 << 20, File::create(path)?);
    for (s, d) in pairs {
        writer.write_all(&s.to_le_bytes())?;
        writer.write_all(&d.to_le_bytes())?;
    }
    writer.flush()?;
    Ok(())
}

/// Writes a typed dataset of users and items into `out`: `meta.json`,
/// `edges/user__interacts__item.u32` and its reverse
/// `item__rev_interacts__user`, with `follows` > 0
/// `edges/user__follows__user.u32`, `nodes/<type>.f32` for a type with
/// features, and with `classes` the users' `labels.i32` and `split.u8`.
/// Memory: 8 bytes per edge of the largest edge type while it is sorted.
/// Returns the edges written.
fn users_items(options: &GenerateOptions, items: &Items, out: &Path) -> anyhow::Result<u64> {
    let (users, n_items) = (options.nodes, items.count);
    std::fs::create_dir_all(out.join("edges"))
        .with_context(|| format!("creating {}", out.display()))?;
    std::fs::create_dir_all(out.join("nodes"))?;
    let mut rng = SmallRng::seed_from_u64(options.seed);
    let interactions = rmat_keys(&mut rng, options.edges, users, n_items, false);
    write_pairs(
        &out.join("edges/user__interacts__item.u32"),
        &interactions,
        n_items,
        false,
    )?;
    write_pairs(
        &out.join("edges/item__rev_interacts__user.u32"),
        &interactions,
        n_items,
        true,
    )?;
    let n_interactions = interactions.len() as u64;
    drop(interactions);
    let mut edge_types = vec![
        serde_json::json!({"src": "user", "relation": "interacts", "dst": "item",
            "num_edges": n_interactions, "edges": "edges/user__interacts__item.u32"}),
        serde_json::json!({"src": "item", "relation": "rev_interacts", "dst": "user",
            "num_edges": n_interactions, "edges": "edges/item__rev_interacts__user.u32"}),
    ];
    let mut written = 2 * n_interactions;
    if items.follows > 0 {
        let follows = rmat_keys(&mut rng, items.follows, users, users, true);
        write_pairs(
            &out.join("edges/user__follows__user.u32"),
            &follows,
            users,
            false,
        )?;
        edge_types.push(
            serde_json::json!({"src": "user", "relation": "follows", "dst": "user",
            "num_edges": follows.len(), "edges": "edges/user__follows__user.u32"}),
        );
        written += follows.len() as u64;
    }
    let mut node_types = Vec::new();
    for (name, n, dim, classes, salt) in [
        ("user", users, options.feature_dim, options.classes, 1u64),
        ("item", n_items, items.feature_dim, 0, 2),
    ] {
        let mut entry = serde_json::json!({"name": name, "num_nodes": n, "feature_dim": dim});
        if dim > 0 {
            let file = format!("nodes/{name}.f32");
            write_features_to(&out.join(&file), out, n, dim, classes, options.seed ^ salt)?;
            entry["dtype"] = "f32".into();
            entry["features"] = file.into();
        }
        node_types.push(entry);
    }
    let mut meta = serde_json::json!({
        "name": format!("users-items-u{users}-i{n_items}-e{}-s{}", options.edges, options.seed),
        "node_types": node_types,
        "edge_types": edge_types,
        "generator": {
            "kind": "R-MAT (a, b, c, d) = (0.57, 0.19, 0.19, 0.05) over each edge type's two id spaces",
            "seed": options.seed,
            "interactions_drawn": options.edges,
            "follows_drawn": items.follows,
        },
        "format": "docs/graph-index.md, \"Typed datasets\": each edge file u32 LE (src, dst) pairs, unique, sorted",
    });
    if options.classes > 0 {
        meta["labels"] = serde_json::json!({
            "node_type": "user", "labels": "labels.i32", "split": "split.u8",
            "num_classes": options.classes,
            "definition": "the largest of num_classes seeded random projections of the user's features less 0.5",
        });
    }
    std::fs::write(out.join("meta.json"), serde_json::to_string_pretty(&meta)?)?;
    Ok(written)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(dir: &Path, name: &str) -> Vec<u8> {
        std::fs::read(dir.join(name)).unwrap()
    }

    #[test]
    fn a_labelled_graph_is_seeded_balanced_and_split_three_ways() {
        let dir = tempfile::tempdir().unwrap();
        let options = GenerateOptions {
            nodes: 3_000,
            edges: 20_000,
            seed: 5,
            super_nodes: 1,
            super_degree: 100,
            feature_dim: 8,
            classes: 3,
            items: None,
        };
        generate(&options, &dir.path().join("a")).unwrap();
        generate(&options, &dir.path().join("b")).unwrap();
        let a = dir.path().join("a");
        for name in ["edges.u32", "features.f32", "labels.i32", "split.u8"] {
            assert_eq!(
                read(&a, name),
                read(&dir.path().join("b"), name),
                "{name} is seeded"
            );
        }
        let labels: Vec<i32> = read(&a, "labels.i32")
            .chunks_exact(4)
            .map(|c| i32::from_le_bytes(c.try_into().unwrap()))
            .collect();
        let split = read(&a, "split.u8");
        assert_eq!((labels.len(), split.len()), (3_000, 3_000));
        for class in 0..3 {
            let share = labels.iter().filter(|&&l| l == class).count() as f64 / 3_000.0;
            assert!(share > 0.1, "class {class}: {share}");
        }
        let parts = |p: u8| split.iter().filter(|&&s| s == p).count() as f64 / 3_000.0;
        assert!((parts(0) - 0.6).abs() < 0.05, "train {}", parts(0));
        assert!((parts(1) - 0.2).abs() < 0.05, "validation {}", parts(1));
        assert!((parts(2) - 0.2).abs() < 0.05, "test {}", parts(2));
        assert!(split.iter().all(|&s| s <= 2));
        let meta: serde_json::Value = serde_json::from_slice(&read(&a, "meta.json")).unwrap();
        assert_eq!(meta["num_classes"], 3);

        let unlabelled = generate(
            &GenerateOptions {
                feature_dim: 0,
                ..options
            },
            &dir.path().join("c"),
        )
        .unwrap_err();
        assert!(
            unlabelled.to_string().contains("--feature-dim"),
            "{unlabelled}"
        );
    }

    #[test]
    fn items_make_a_typed_dataset_and_one_type_flags_are_refused_with_them() {
        let dir = tempfile::tempdir().unwrap();
        let options = GenerateOptions {
            nodes: 500,
            edges: 4_000,
            seed: 7,
            super_nodes: 0,
            super_degree: 0,
            feature_dim: 4,
            classes: 2,
            items: Some(Items {
                count: 300,
                feature_dim: 0,
                follows: 1_000,
            }),
        };
        let out = dir.path().join("users-items");
        let generated = generate(&options, &out).unwrap();
        let meta: serde_json::Value = serde_json::from_slice(&read(&out, "meta.json")).unwrap();
        let names: Vec<&str> = meta["node_types"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["name"].as_str().unwrap())
            .collect();
        assert_eq!(names, ["user", "item"]);
        let edges: u64 = meta["edge_types"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| {
                let file = read(&out, e["edges"].as_str().unwrap());
                assert_eq!(file.len() as u64, 8 * e["num_edges"].as_u64().unwrap());
                e["num_edges"].as_u64().unwrap()
            })
            .sum();
        assert_eq!(edges, generated.edges_written);
        assert_eq!(read(&out, "nodes/user.f32").len(), 500 * 4 * 4);
        assert_eq!(read(&out, "labels.i32").len(), 500 * 4);

        for (wrong, flag) in [
            (
                GenerateOptions {
                    super_nodes: 1,
                    super_degree: 10,
                    ..options.clone()
                },
                "--super-nodes",
            ),
            (
                GenerateOptions {
                    items: Some(Items {
                        count: 1,
                        ..options.items.unwrap()
                    }),
                    ..options.clone()
                },
                "--items 1",
            ),
        ] {
            let e = generate(&wrong, &dir.path().join("refused")).unwrap_err();
            assert!(e.to_string().contains(flag), "{e}");
        }
    }
}
