//! `sidecar import` as an operator runs it.

use std::path::Path;
use std::process::Command;

const SIDECAR: &str = env!("CARGO_BIN_EXE_sidecar");

/// Runs `sidecar import <input> --data-dir <data_dir>`.
fn import(input: &Path, data_dir: &Path) -> std::process::Output {
    Command::new(SIDECAR)
        .arg("import")
        .arg(input)
        .arg("--data-dir")
        .arg(data_dir)
        .output()
        .unwrap()
}

#[test]
fn import_builds_the_index_and_reports_it() {
    let data = tests::stack::dataset("cora");
    let out = tempfile::tempdir().unwrap();
    let output = import(&data, out.path());
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(stdout.contains("2708 nodes, 10556 edges"), "{stdout}");
    let index = sidecar::graph::CsrIndex::open(&out.path().join("graph.csr")).unwrap();
    assert_eq!(index.n_edges(), 10556);
    // The features went into the embedded store of record.
    assert!(
        stdout.contains("features: 2708 rows of 1433 f32"),
        "{stdout}"
    );
    let manifest = sidecar::features::import::FeatureManifest::read(out.path()).unwrap();
    assert_eq!(
        (manifest.store.as_str(), manifest.num_nodes),
        ("rocksdb", 2708)
    );
    // Running it again replaces the index atomically and succeeds.
    assert!(import(&data, out.path()).status.success());
}

#[test]
fn import_of_a_bad_input_exits_non_zero_with_one_clear_line() {
    let out = tempfile::tempdir().unwrap();
    let list = out.path().join("edges.txt");
    std::fs::write(&list, "0 1\n2 three\n").unwrap();
    let output = import(&list, out.path());
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    let last = stderr.lines().last().unwrap_or_default();
    assert!(
        last.starts_with("sidecar: ") && last.contains(":2: node id \"three\""),
        "{stderr}"
    );
    assert!(
        !out.path().join("graph.csr").exists(),
        "no index from a failed import"
    );
}

#[test]
fn an_import_with_an_impossible_feature_shape_is_refused_not_a_panic() {
    let cora = tests::stack::dataset("cora");
    for (dim, expect) in [
        ("0", "feature_dim 0 is outside 1..=1048576"),
        ("2147483648", "feature_dim 2147483648 is outside"),
    ] {
        let input = tempfile::tempdir().unwrap();
        for file in ["edges.u32", "features.f32", "labels.i32", "split.u8"] {
            std::fs::copy(cora.join(file), input.path().join(file)).unwrap();
        }
        let meta = std::fs::read_to_string(cora.join("meta.json")).unwrap();
        let mut meta: serde_json::Value = serde_json::from_str(&meta).unwrap();
        meta["feature_dim"] = serde_json::json!(dim.parse::<u64>().unwrap());
        std::fs::write(input.path().join("meta.json"), meta.to_string()).unwrap();
        let out = tempfile::tempdir().unwrap();
        let output = import(input.path(), out.path());
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(
            output.status.code(),
            Some(1),
            "exit 1, not a panic: {stderr}"
        );
        assert!(stderr.contains(expect), "{stderr}");
    }
}

/// A missing or emptied store of record is refused at start, naming the
/// path and `sidecar import`, as a damaged one is: RocksDB would otherwise
/// create an empty store and every answer would be a default row.
#[test]
fn serve_refuses_a_missing_or_empty_store_of_record() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let output = import(&tests::stack::dataset("cora"), &data);
    assert!(output.status.success());
    let store = data.join("features.db");
    let start = || {
        let out = Command::new(SIDECAR)
            .arg("serve")
            .arg("--data-dir")
            .arg(&data)
            .args(["--shm-name", &tests::unique_name("gnn-test-no-store")])
            .arg("--admin-socket")
            .arg(dir.path().join("admin.sock"))
            .args(["--metrics-addr", "127.0.0.1:0"])
            .output()
            .unwrap();
        assert!(!out.status.success(), "the sidecar started");
        let stderr = String::from_utf8_lossy(&out.stderr).to_string();
        let last = stderr.trim_end().lines().last().unwrap_or("").to_string();
        assert!(last.contains(&store.display().to_string()), "{stderr}");
        assert!(last.contains("sidecar import"), "{stderr}");
        last
    };
    std::fs::remove_dir_all(&store).unwrap();
    assert!(start().contains("is missing"));
    assert!(!store.exists(), "the refusal created a store");
    // An empty RocksDB store in its place (what a start without the check
    // would have created).
    drop(rocksdb::DB::open_default(&store).expect("an empty RocksDB store"));
    assert!(start().contains("holds no rows"));
}

/// `sidecar serve` on data directory `data` with `extra` flags, expected to
/// refuse: its last line of stderr.
fn refused_serve(dir: &Path, data: &Path, extra: &[&str]) -> String {
    let out = Command::new(SIDECAR)
        .arg("serve")
        .arg("--data-dir")
        .arg(data)
        .args(["--shm-name", &tests::unique_name("gnn-test-wrong-store")])
        .arg("--admin-socket")
        .arg(dir.join("admin.sock"))
        .args(["--metrics-addr", "127.0.0.1:0"])
        .args(extra)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(!out.status.success(), "the sidecar started: {stderr}");
    stderr.trim_end().lines().last().unwrap_or("").to_string()
}

/// The outside probe's case: another dataset's `features.db` put in the
/// data directory was served as ready, 101 answers of 101 from default
/// rows, nothing logged. Now the import's fingerprint is checked at start,
/// and a store of another width is refused even without one.
#[test]
fn serve_refuses_another_imports_store_of_record_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let (cora, citeseer) = (dir.path().join("cora"), dir.path().join("citeseer"));
    assert!(import(&tests::stack::dataset("cora"), &cora)
        .status
        .success());
    assert!(import(&tests::stack::dataset("citeseer"), &citeseer)
        .status
        .success());
    let manifest: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(cora.join("features.json")).unwrap())
            .unwrap();
    let fingerprint = manifest["fingerprint"].as_str().expect("a fingerprint");
    assert!(fingerprint.starts_with("2708x1433:"), "{fingerprint}");
    std::fs::remove_dir_all(cora.join("features.db")).unwrap();
    let copy = Command::new("cp")
        .arg("-a")
        .arg(citeseer.join("features.db"))
        .arg(cora.join("features.db"))
        .status()
        .unwrap();
    assert!(copy.success());
    let refused = refused_serve(dir.path(), &cora, &[]);
    assert!(refused.contains("holds another import's rows"), "{refused}");
    assert!(refused.contains(fingerprint), "{refused}");
    assert!(refused.contains("sidecar import"), "{refused}");
    // A data directory imported before fingerprints existed: the rows'
    // width still tells another dataset's store apart.
    let mut old = manifest.clone();
    old.as_object_mut().unwrap().remove("fingerprint");
    std::fs::write(cora.join("features.json"), old.to_string()).unwrap();
    let refused = refused_serve(dir.path(), &cora, &[]);
    assert!(refused.contains("rows of 14812 bytes"), "{refused}");
    assert!(refused.contains("1433 values"), "{refused}");
}

/// A Redis reached without its password was served as ready, every row a
/// default; a wrong one was named "connect timed out". Both are refused at
/// start naming the cause, and so is a Redis holding another import's rows
/// under the same prefix.
#[test]
fn serve_refuses_a_redis_without_the_password_or_with_another_import_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let password = "p4ss-for-the-store";
    let redis = tests::redis::RedisServer::start_with_password(password);
    let cora = dir.path().join("cora");
    let url = redis.url();
    tests::stack::sidecar_import(&tests::stack::dataset("cora"), &cora, &["--redis", &url]);
    let no_password = url.replacen(&format!(":{password}@"), "", 1);
    assert!(!no_password.contains(password), "{no_password}");
    let refused = refused_serve(dir.path(), &cora, &["--redis", &no_password]);
    assert!(
        refused.contains("requires a password (NOAUTH)"),
        "{refused}"
    );
    let wrong = url.replacen(password, "not-the-password", 1);
    let refused = refused_serve(dir.path(), &cora, &["--redis", &wrong]);
    assert!(refused.contains("refused the URL's password"), "{refused}");
    assert!(!refused.contains("timed out"), "{refused}");
    assert!(!refused.contains("not-the-password"), "{refused}");
    // citeseer imported into the same Redis and prefix: cora's data
    // directory no longer matches what Redis holds.
    let citeseer = dir.path().join("citeseer");
    tests::stack::sidecar_import(
        &tests::stack::dataset("citeseer"),
        &citeseer,
        &["--redis", &url],
    );
    let refused = refused_serve(dir.path(), &cora, &["--redis", &url]);
    assert!(refused.contains("holds another import's rows"), "{refused}");
    assert!(!refused.contains(password), "{refused}");
}
