//! `bench-e2e`: the product end to end against what a team would build
//! instead, and against the machine's floors, side by side in one run
//! (README "Benchmarks"; `scripts/bench-e2e.sh` builds and runs it).
//!
//! One Redis holds every dataset's features (under its own key prefix);
//! every system of a scenario reads the same rows and gets the same request
//! sequence. Results go to `<out>/report.json`, `report.md` and the plots
//! (`bench/python/plots.py`).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context};
use bench::floors::{self, Features};
use bench::http::HttpClient;
use bench::load::{self, Caller};
use bench::report::{self, Breakdown, FetchResult, Machine, Report, ScenarioResult, SystemResult};
use bench::scenario::{self, Cache, Scenario, Store};
use bench::systems::{
    FastApi, Naive, ProductGrpc, ProductHttp, ProductV2Grpc, ProductV2Http, Requests, V2_MODEL,
};
use clap::Parser;
use gnn_worker::api::grpc::PredictorClient;
use gnn_worker::api::v2::grpc::GrpcInferenceServiceClient;
use sidecar::graph::CsrIndex;
use tests::redis::RedisServer;
use tests::stack::{self, Daemon, Stack, StackOptions};
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::HealthCheckRequest;

#[derive(Debug, Parser)]
#[command(
    name = "bench-e2e",
    about = "The end-to-end benchmark: the product against the key-by-key JSON design, a FastAPI \
             service, Feast, bare Redis and the machine's floors, in one run"
)]
struct Args {
    /// A short run: four scenarios, a 100k-node synthetic graph, short steps.
    #[arg(long)]
    quick: bool,
    /// Directory of the results [default: bench/results/<date>, <date>-quick
    /// with --quick].
    #[arg(long)]
    out: Option<PathBuf>,
    /// Python with bench/requirements.txt installed (FastAPI, uvicorn,
    /// redis-py, onnxruntime, Feast, matplotlib).
    #[arg(long, default_value = ".venv-bench/bin/python")]
    python: PathBuf,
    /// Where the synthetic graph, the imports and the untrained model are
    /// kept (the graph is generated again only when missing).
    #[arg(long, default_value = "target/bench-e2e")]
    work_dir: PathBuf,
    /// Only the scenarios whose name contains one of these (e.g. `cora/`;
    /// several separated by commas).
    #[arg(long, value_delimiter = ',')]
    only: Option<Vec<String>>,
    /// A directory holding another build's `sidecar`, `sidecarctl` and
    /// `gnn-worker` (an earlier commit's, say): its product runs beside
    /// this build's in every scenario, on its own import of the same data,
    /// as the systems `baseline-grpc` and `baseline-http` (lone calls
    /// interleaved call by call with this build's; report.md, "Beside
    /// another build").
    #[arg(long)]
    baseline: Option<PathBuf>,
}

impl Args {
    /// Whether `--only` selects the scenario named `name`.
    fn selects(&self, name: &str) -> bool {
        self.only
            .as_ref()
            .is_none_or(|only| only.iter().any(|o| name.contains(o.as_str())))
    }
}

/// How long each measurement runs.
#[derive(Debug, Clone)]
struct Timing {
    /// Requests in each scenario's sequence.
    requests: usize,
    lone_calls: usize,
    lone_budget: Duration,
    closed_for: Duration,
    closed_concurrency: usize,
    step: Duration,
    fractions: Vec<f64>,
    floor_calls: usize,
    floor_throughput_for: Duration,
    fetch_requests: usize,
    naive_fetch_calls: usize,
    /// With `--baseline`: pairs of slices (each `step` long) in which the
    /// two builds' CPU per call is measured at one rate, alternating.
    pairs: usize,
}

impl Timing {
    fn new(quick: bool) -> Self {
        if quick {
            Self {
                requests: 500,
                lone_calls: 200,
                lone_budget: Duration::from_secs(1),
                closed_for: Duration::from_secs(1),
                closed_concurrency: 32,
                step: Duration::from_millis(1000),
                fractions: vec![0.5, 0.8, 1.0, 1.2],
                floor_calls: 200,
                floor_throughput_for: Duration::from_secs(1),
                fetch_requests: 60,
                naive_fetch_calls: 20,
                pairs: 2,
            }
        } else {
            Self {
                requests: 2000,
                lone_calls: 500,
                lone_budget: Duration::from_secs(3),
                closed_for: Duration::from_secs(3),
                closed_concurrency: 32,
                step: Duration::from_secs(3),
                fractions: vec![0.4, 0.6, 0.8, 1.0, 1.2],
                floor_calls: 500,
                floor_throughput_for: Duration::from_secs(2),
                fetch_requests: 300,
                naive_fetch_calls: 100,
                pairs: 8,
            }
        }
    }
}

/// A dataset, imported twice (embedded store and Redis), with its model
/// and its features in RAM (the floors).
struct Dataset {
    name: String,
    dir: PathBuf,
    feature_dim: usize,
    super_nodes: u32,
    features: Arc<Features>,
    index: Arc<CsrIndex>,
    model: PathBuf,
    embedded: Option<PathBuf>,
    redis_data: PathBuf,
    /// The other build's imports (`--baseline`): embedded, Redis.
    beside_data: Option<(Option<PathBuf>, PathBuf)>,
    prefix: String,
    /// The key-by-key design's model server (started once per dataset).
    naive: Option<(Daemon, String)>,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let root = stack::repo_root();
    let command = std::env::args().collect::<Vec<_>>().join(" ");
    let python = absolute(&root, &args.python);
    ensure!(
        python.is_file(),
        "{} is missing: run scripts/bench-e2e.sh, which creates .venv-bench from \
         bench/requirements.txt (or pass --python)",
        python.display()
    );
    let work = absolute(&root, &args.work_dir);
    std::fs::create_dir_all(&work)?;
    let baseline = args.baseline.as_ref().map(|dir| absolute(&root, dir));
    if let Some(dir) = &baseline {
        for name in ["sidecar", "sidecarctl", "gnn-worker"] {
            ensure!(
                dir.join(name).is_file(),
                "--baseline {}: no {name} there; give the directory of another build's \
                 release binaries (target/release of a checkout of that commit)",
                dir.display()
            );
        }
    }
    let date = now_utc_date();
    let out = args.out.clone().map_or_else(
        || {
            root.join("bench/results").join(if args.quick {
                format!("{date}-quick")
            } else {
                date.clone()
            })
        },
        |o| absolute(&root, &o),
    );
    std::fs::create_dir_all(&out)?;
    let timing = Timing::new(args.quick);
    let started = Instant::now();

    let redis = RedisServer::start();
    let redis_url = redis.url();
    say(&format!("redis-server on {redis_url}"));

    // Datasets: cora (real) and the synthetic power-law graph, each only
    // when a scenario `--only` selects reads it.
    let (nodes, edges) = if args.quick {
        (100_000u64, 5_000_000u64)
    } else {
        (1_000_000, 50_000_000)
    };
    let synthetic = if args.quick { "rmat-100k" } else { "rmat-1m" };
    let scenarios: Vec<Scenario> = scenario::scenarios(args.quick, synthetic)
        .into_iter()
        .filter(|s| args.selects(&s.name))
        .collect();
    ensure!(!scenarios.is_empty(), "no scenario matches --only");
    let wanted = |name: &str| scenarios.iter().any(|s| s.dataset == name);
    let mut datasets = Vec::new();
    if wanted("cora") {
        datasets.push(prepare(
            "cora",
            &stack::dataset("cora"),
            None,
            &work,
            &redis_url,
            baseline.as_deref(),
        )?);
    }
    if wanted(synthetic) {
        datasets.push(prepare(
            synthetic,
            &generate(&work, synthetic, nodes, edges)?,
            Some(128),
            &work,
            &redis_url,
            baseline.as_deref(),
        )?);
    }

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let lone_runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let ort_env = gnn_worker::onnxruntime::init(Some(&stack::onnxruntime_lib()))?;

    let mut results = Vec::new();
    // The product's stack and its sidecar's metrics address.
    let mut product: Option<(String, Stack, String)> = None;
    // The other build's, with `--baseline`.
    let mut beside: Option<(String, Stack, String)> = None;
    let mut fastapi: Option<(String, Daemon, String)> = None;
    for (i, scenario) in scenarios.iter().enumerate() {
        say(&format!(
            "scenario {}/{}: {}",
            i + 1,
            scenarios.len(),
            scenario.name
        ));
        let d = datasets
            .iter_mut()
            .find(|d| d.name == scenario.dataset)
            .context("the scenario's dataset")?;
        let requests: Requests = Arc::new(scenario::requests(
            &d.index,
            d.super_nodes,
            scenario.targets,
            timing.requests,
            scenario.super_mix,
            0x5eed + i as u64,
        ));

        // (f) the floors, measured with nothing else running.
        let floors = floors::floors(
            &d.index,
            &d.features,
            &requests,
            scenario.fanouts,
            &ort_env,
            &d.model,
            timing.floor_calls,
            2,
            timing.floor_throughput_for,
        )?;
        say(&format!(
            "  floors: gather p50 {:.1} us, onnx p50 {:.0} us, onnx {:.0} requests/s, {:.0} rows",
            floors.gather.p50_us, floors.onnx.p50_us, floors.onnx_throughput, floors.mean_rows
        ));

        // (a) the product: one stack per configuration, kept while the
        // next scenario needs the same one.
        let key = scenario.product_key();
        if product.as_ref().is_none_or(|(k, _, _)| *k != key) {
            if let Some((_, old, _)) = product.take() {
                old.stop();
            }
            let (stack, metrics) = start_product(d, scenario, &redis_url, None)?;
            product = Some((key.clone(), stack, metrics));
        }
        let (_, stack, sidecar_metrics) = product.as_ref().expect("started");
        if let Some(dir) = &baseline {
            if beside.as_ref().is_none_or(|(k, _, _)| *k != key) {
                if let Some((_, old, _)) = beside.take() {
                    old.stop();
                }
                let (stack, metrics) = start_product(d, scenario, &redis_url, Some(dir))?;
                beside = Some((key.clone(), stack, metrics));
            }
        }
        let beside_stack = beside.as_ref().map(|(_, stack, _)| stack);

        // (c) FastAPI: one service per dataset and fanouts.
        let fast_key = format!("{}/{:?}", d.name, scenario.fanouts);
        if fastapi.as_ref().is_none_or(|(k, _, _)| *k != fast_key) {
            drop(fastapi.take());
            let (daemon, addr) = start_fastapi(&python, &root, d, scenario.fanouts, &redis_url)?;
            fastapi = Some((fast_key, daemon, addr));
        }
        let fast_addr = fastapi.as_ref().expect("started").2.clone();

        // (b) the naive model server: one per dataset.
        if d.naive.is_none() {
            d.naive = Some(start_naive(d)?);
        }
        let naive_addr = d.naive.as_ref().expect("started").1.clone();

        let systems = |label: &'static str| {
            callers(
                stack,
                beside_stack,
                &requests,
                d,
                scenario.fanouts,
                &redis_url,
                &fast_addr,
                &naive_addr,
                label,
            )
        };
        // Lone calls, one at a time, from a client on one thread (a
        // current-thread runtime): a client's own hand-offs between
        // threads are not the server's, and would add to every door.
        let lone = lone_runtime.block_on(async {
            let systems = systems("lone").await?;
            // The transport alone: a round trip to the worker that does no
            // work, the floor under any call through each door (HTTP GET
            // /healthz; gRPC grpc.health.v1 Check), interleaved call by
            // call with the product's lone calls through its four doors
            // (native and Open Inference Protocol, gRPC and HTTP), so
            // that the floors and the calls see the machine alike. Where a
            // lone call's time goes: the worker's and the sidecar's
            // histograms around that run (means over every door's calls).
            let health = tonic::transport::Endpoint::from_shared(stack.grpc.clone())?
                .tcp_nodelay(true)
                .connect()
                .await
                .context("connecting to the worker's gRPC")?;
            let scrape = || async {
                let worker = HttpClient::new(&stack.http).get("/metrics").await?;
                let sidecar = HttpClient::new(sidecar_metrics).get("/metrics").await?;
                anyhow::Ok(format!(
                    "{}\n{}",
                    String::from_utf8_lossy(&worker),
                    String::from_utf8_lossy(&sidecar)
                ))
            };
            let product = |name: &str| {
                systems
                    .iter()
                    .find(|(n, _)| *n == name)
                    .map(|(_, caller)| caller.clone())
                    .context("the product's system")
            };
            let (http, grpc) = (product("product-http")?, product("product-grpc")?);
            let (v2_http, v2_grpc) = (product("product-v2-http")?, product("product-v2-grpc")?);
            let health_check = HealthCheck(HttpClient::new(&stack.http));
            let grpc_health_check = GrpcHealthCheck(HealthClient::new(health));
            let mut interleaved: Vec<&dyn Caller> = vec![
                &health_check,
                &grpc_health_check,
                &*http,
                &*grpc,
                &*v2_http,
                &*v2_grpc,
            ];
            // The other build's doors, call by call with this build's.
            let beside_doors = match beside_stack {
                Some(_) => Some((product("baseline-http")?, product("baseline-grpc")?)),
                None => None,
            };
            if let Some((b_http, b_grpc)) = &beside_doors {
                interleaved.push(&**b_http);
                interleaved.push(&**b_grpc);
            }
            let before = scrape().await?;
            let mut measured =
                load::interleaved(&interleaved, timing.lone_calls, 20, timing.lone_budget).await;
            let after = scrape().await?;
            let beside_lone = measured.split_off(6);
            let [round_trip, grpc_round_trip, lone_http, lone_grpc, lone_v2_http, lone_v2_grpc] =
                <[load::Summary; 6]>::try_from(measured)
                    .map_err(|_| anyhow::anyhow!("six summaries"))?;
            let breakdown = Breakdown::between(&before, &after, lone_http.mean_us);
            let mut lone = Vec::new();
            for (name, caller) in &systems {
                lone.push(match *name {
                    "product-http" => lone_http.clone(),
                    "product-grpc" => lone_grpc.clone(),
                    "product-v2-http" => lone_v2_http.clone(),
                    "product-v2-grpc" => lone_v2_grpc.clone(),
                    "baseline-http" => beside_lone[0].clone(),
                    "baseline-grpc" => beside_lone[1].clone(),
                    _ => load::lone(&**caller, timing.lone_calls, 10, timing.lone_budget).await,
                });
                say(&format!(
                    "  {name:<13} lone p50 {:>9.0} us p99 {:>9.0} us",
                    lone.last().map_or(0.0, |l| l.p50_us),
                    lone.last().map_or(0.0, |l| l.p99_us)
                ));
            }
            anyhow::Ok((round_trip, grpc_round_trip, breakdown, lone))
        })?;
        let (round_trip, grpc_round_trip, breakdown, lone) = lone;
        let result = runtime.block_on(async {
            let systems = systems("load").await?;
            let mut measured = Vec::new();
            // The product's CPU: its worker's and its sidecar's (the load
            // generator is this process).
            let product_cpu = load::CpuWatch {
                pids: [&stack.worker, &stack.sidecar]
                    .into_iter()
                    .flatten()
                    .map(|d| d.child.id())
                    .collect(),
            };
            let beside_cpu = load::CpuWatch {
                pids: beside_stack
                    .into_iter()
                    .flat_map(|s| [&s.worker, &s.sidecar])
                    .flatten()
                    .map(|d| d.child.id())
                    .collect(),
            };
            for ((name, caller), lone) in systems.iter().zip(lone) {
                let cpu = if name.starts_with("product") {
                    product_cpu.clone()
                } else if name.starts_with("baseline") {
                    beside_cpu.clone()
                } else {
                    load::CpuWatch::default()
                };
                measured.push(measure(name, caller.clone(), lone, &timing, &cpu).await);
            }
            // With another build beside this one: both builds' CPU per
            // call at one rate (70% of the lower of their saturations),
            // door by door, in alternating slices, which a saturation
            // step's CPU (each at its own rate, measured minutes apart)
            // cannot give on a shared machine.
            let mut paired = Vec::new();
            if beside_stack.is_some() {
                for (door, other, this) in [
                    ("gRPC", "baseline-grpc", "product-grpc"),
                    ("HTTP", "baseline-http", "product-http"),
                ] {
                    let caller = |name: &str| {
                        systems
                            .iter()
                            .find(|(n, _)| *n == name)
                            .map(|(_, caller)| caller.clone())
                    };
                    let saturation = |name: &str| {
                        measured
                            .iter()
                            .find(|s| s.system == name)
                            .map(|s| s.saturation)
                    };
                    if let (Some(a), Some(b), Some(sa), Some(sb)) = (
                        caller(other),
                        caller(this),
                        saturation(other),
                        saturation(this),
                    ) {
                        let rate = 0.7 * sa.min(sb);
                        if rate > 0.0 {
                            let result = load::paired_cpu(
                                door,
                                (a, &beside_cpu),
                                (b, &product_cpu),
                                rate,
                                timing.step,
                                timing.pairs,
                            )
                            .await;
                            say(&format!(
                                "  {door:<5} paired at {rate:.0} calls/s: CPU per call other {} \
                                 us, this {} us, this over other {} (median of {} pairs)",
                                load::median(&result.a_us)
                                    .map_or("-".into(), |v| format!("{v:.0}")),
                                load::median(&result.b_us)
                                    .map_or("-".into(), |v| format!("{v:.0}")),
                                load::median(&result.ratios())
                                    .map_or("-".into(), |v| format!("{v:.3}x")),
                                result.a_us.len()
                            ));
                            paired.push(result);
                        }
                    }
                }
            }
            // (c) at equal p99: the product's HTTP front end at 5x the rate
            // the FastAPI service sustains within its p99 at 70% load.
            let fast = measured.iter().find(|s| s.system == "fastapi");
            if let Some(budget) = fast
                .and_then(|f| f.at_70.as_ref())
                .map(|s| s.summary.p99_us)
            {
                let rate = fast.map_or(0.0, |f| f.throughput_within(budget));
                let http = systems
                    .iter()
                    .find(|(name, _)| *name == "product-http")
                    .map(|(_, caller)| caller.clone());
                if let (Some(http), true) = (http, rate > 0.0) {
                    let steps = load::sweep(http, rate, &[5.0], timing.step, &product_cpu).await;
                    if let Some(ours) = measured.iter_mut().find(|s| s.system == "product-http") {
                        ours.extra = steps;
                    }
                }
            }
            anyhow::Ok(ScenarioResult {
                scenario: scenario.clone(),
                requests: requests.len(),
                floors,
                http_round_trip: round_trip,
                grpc_round_trip,
                breakdown,
                systems: measured,
                paired,
            })
        })?;
        results.push(result);
    }
    if let Some((_, stack, _)) = product.take() {
        stack.stop();
    }
    if let Some((_, stack, _)) = beside.take() {
        stack.stop();
    }
    drop(fastapi);

    // (d) Feast against our cold fetch, and (e) bare MGET and naive GETs,
    // on the rows of each Redis dataset's [20, 10] one-target requests.
    let mut fetches = Vec::new();
    for d in &datasets {
        if !scenarios
            .iter()
            .any(|s| s.dataset == d.name && args.selects(&s.name))
        {
            continue;
        }
        say(&format!("feature fetch: {}", d.name));
        let requests =
            scenario::requests(&d.index, d.super_nodes, 1, timing.fetch_requests, false, 7);
        let rows = floors::row_lists(&d.index, &requests, [20, 10], timing.fetch_requests);
        let mut fetched = runtime.block_on(floors::fetches(
            &redis_url,
            &d.prefix,
            d.feature_dim,
            &rows,
            timing.naive_fetch_calls,
        ))?;
        fetched.feast = Some(feast(&python, &root, &work, d, &redis, &rows)?);
        fetches.push(FetchResult {
            dataset: d.name.clone(),
            requests: rows.len(),
            fetches: fetched,
        });
    }

    let report = Report {
        machine: Machine::probe(),
        commit: git_commit(&root),
        command,
        date,
        quick: args.quick,
        seconds: started.elapsed().as_secs_f64(),
        scenarios: results,
        fetches,
        goals: Vec::new(),
    }
    .with_goals();
    report::write(&report, &out)?;
    let plotted = Command::new(&python)
        .arg(root.join("bench/python/plots.py"))
        .arg(out.join("report.json"))
        .arg(&out)
        .status()
        .context("running bench/python/plots.py")?;
    ensure!(plotted.success(), "bench/python/plots.py failed");
    say(&format!(
        "report: {} ({:.0} s)",
        out.join("report.md").display(),
        started.elapsed().as_secs_f64()
    ));
    Ok(())
}

/// Lone calls; a closed-loop estimate of the most the system answers; an
/// open-loop sweep around it, whose highest sustained rate is the
/// saturation; and an open-loop step at 70% of that saturation.
/// A system under load; `lone`: its lone calls, measured before.
async fn measure(
    name: &str,
    caller: Arc<dyn Caller>,
    lone: load::Summary,
    timing: &Timing,
    cpu: &load::CpuWatch,
) -> SystemResult {
    let closed = load::closed(caller.clone(), timing.closed_concurrency, timing.closed_for).await;
    let sweep = if closed.throughput > 0.0 {
        load::sweep(
            caller.clone(),
            closed.throughput,
            &timing.fractions,
            timing.step,
            cpu,
        )
        .await
    } else {
        Vec::new()
    };
    let saturation = report::saturation_of(&sweep);
    let at_70 = if saturation > 0.0 {
        load::sweep(caller, saturation, &[0.7], timing.step, cpu)
            .await
            .pop()
    } else {
        None
    };
    let errors = lone.errors
        + closed.errors
        + sweep
            .iter()
            .chain(&at_70)
            .map(|s| s.summary.errors)
            .sum::<u64>();
    let cpu_us_per_call = report::cpu_at_saturation(&sweep, saturation);
    let cpu_us_per_call_each =
        report::step_at_saturation(&sweep, saturation).and_then(|s| s.cpu_us_per_call_each.clone());
    say(&format!(
        "  {name:<13} lone p50 {:>9.0} us p99 {:>9.0} us | saturation {:>8.0} calls/s{} | at \
         70%: p50 {:>8.0} us p99 {:>8.0} us | errors {errors}",
        lone.p50_us,
        lone.p99_us,
        saturation,
        cpu_us_per_call.map_or(String::new(), |c| format!(", CPU {c:.0} us a call")),
        at_70.as_ref().map_or(0.0, |s| s.summary.p50_us),
        at_70.as_ref().map_or(0.0, |s| s.summary.p99_us),
    ));
    SystemResult {
        system: name.to_string(),
        lone,
        closed,
        sweep,
        saturation,
        at_70,
        extra: Vec::new(),
        cpu_us_per_call,
        cpu_us_per_call_each,
    }
}

/// The systems of a scenario, their clients made on the runtime that
/// runs this (`label` names it in an error).
#[allow(clippy::too_many_arguments)]
async fn callers(
    stack: &Stack,
    beside: Option<&Stack>,
    requests: &Requests,
    d: &Dataset,
    fanouts: [u32; 2],
    redis_url: &str,
    fast_addr: &str,
    naive_addr: &str,
    label: &str,
) -> anyhow::Result<Vec<(&'static str, Arc<dyn Caller>)>> {
    let grpc = PredictorClient::connect(stack.grpc.clone())
        .await
        .with_context(|| format!("connecting to the worker's gRPC ({label} calls)"))?;
    let v2_grpc = GrpcInferenceServiceClient::connect(stack.grpc.clone())
        .await
        .with_context(|| format!("connecting to the worker's gRPC ({label} V2 calls)"))?;
    let redis_conn = redis::Client::open(redis_url)?
        .get_multiplexed_async_connection()
        .await?;
    let mut beside_systems: Vec<(&'static str, Arc<dyn Caller>)> = Vec::new();
    if let Some(beside) = beside {
        let client = PredictorClient::connect(beside.grpc.clone())
            .await
            .with_context(|| format!("connecting to the other build's gRPC ({label} calls)"))?;
        beside_systems.push((
            "baseline-grpc",
            Arc::new(ProductGrpc {
                client,
                requests: requests.clone(),
            }),
        ));
        beside_systems.push((
            "baseline-http",
            Arc::new(ProductHttp {
                http: HttpClient::new(&beside.http),
                requests: requests.clone(),
            }),
        ));
    }
    let mut systems: Vec<(&'static str, Arc<dyn Caller>)> = vec![
        (
            "product-grpc",
            Arc::new(ProductGrpc {
                client: grpc,
                requests: requests.clone(),
            }),
        ),
        (
            "product-http",
            Arc::new(ProductHttp {
                http: HttpClient::new(&stack.http),
                requests: requests.clone(),
            }),
        ),
        (
            "product-v2-grpc",
            Arc::new(ProductV2Grpc {
                client: v2_grpc,
                requests: requests.clone(),
            }),
        ),
        (
            "product-v2-http",
            Arc::new(ProductV2Http {
                http: HttpClient::new(&stack.http),
                requests: requests.clone(),
            }),
        ),
        (
            "fastapi",
            Arc::new(FastApi {
                http: HttpClient::new(fast_addr),
                requests: requests.clone(),
            }),
        ),
        (
            "naive-json",
            Arc::new(Naive {
                index: d.index.clone(),
                fanouts,
                redis: redis_conn,
                prefix: d.prefix.clone(),
                feature_dim: d.feature_dim,
                http: HttpClient::new(naive_addr),
                requests: requests.clone(),
                samplers: Mutex::new(Vec::new()),
            }),
        ),
    ];
    // Each right after this build's door of its transport: measured in
    // turn, door by door.
    for (i, system) in beside_systems.into_iter().enumerate() {
        systems.insert(2 * i + 1, system);
    }
    Ok(systems)
}

/// GET /healthz: an HTTP round trip doing no work.
struct HealthCheck(HttpClient);

/// `grpc.health.v1.Health/Check`: a gRPC round trip doing no work.
struct GrpcHealthCheck(HealthClient<tonic::transport::Channel>);

impl Caller for GrpcHealthCheck {
    fn call(
        &self,
        _: usize,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = anyhow::Result<()>> + Send + '_>> {
        Box::pin(async move {
            self.0
                .clone()
                .check(HealthCheckRequest {
                    service: String::new(),
                })
                .await?;
            Ok(())
        })
    }
}

impl Caller for HealthCheck {
    fn call(
        &self,
        _: usize,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = anyhow::Result<()>> + Send + '_>> {
        Box::pin(async move {
            self.0.get("/healthz").await?;
            Ok(())
        })
    }
}

fn say(line: &str) {
    println!("bench-e2e: {line}");
}

fn absolute(root: &Path, path: &Path) -> PathBuf {
    if path.is_absolute() {
        path.to_path_buf()
    } else {
        root.join(path)
    }
}

/// Today's date (UTC), YYYY-MM-DD.
fn now_utc_date() -> String {
    let days = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() / 86_400) as i64;
    // Civil from days (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02}")
}

fn git_commit(root: &Path) -> String {
    let run = |args: &[&str]| {
        Command::new("git")
            .args(args)
            .current_dir(root)
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
    };
    let commit = run(&["rev-parse", "HEAD"]).unwrap_or_else(|| "unknown".into());
    let dirty =
        run(&["status", "--porcelain", "--untracked-files=no"]).is_some_and(|s| !s.is_empty());
    if dirty {
        format!("{commit} (with uncommitted changes)")
    } else {
        commit
    }
}

/// The synthetic dataset: `sidecar generate` with one super node adjacent
/// to every other node, D = 128; kept in `work` between runs.
fn generate(work: &Path, name: &str, nodes: u64, edges: u64) -> anyhow::Result<PathBuf> {
    let dir = work.join(name);
    if dir.join("meta.json").is_file() && dir.join("features.f32").is_file() {
        return Ok(dir);
    }
    say(&format!(
        "generating {name}: {nodes} nodes, {edges} edges, D = 128"
    ));
    let status = Command::new(stack::workspace_bin("sidecar"))
        .arg("generate")
        .arg("--out")
        .arg(&dir)
        .args(["--nodes", &nodes.to_string(), "--edges", &edges.to_string()])
        .args([
            "--super-nodes",
            "1",
            "--super-degree",
            &(nodes - 1).to_string(),
        ])
        .args(["--feature-dim", "128"])
        .status()?;
    ensure!(status.success(), "sidecar generate failed");
    Ok(dir)
}

/// Imports `dir` into the embedded store (cora only: the embedded scenarios
/// are cora's) and into Redis under `<name>:`, and finds its model.
fn prepare(
    name: &str,
    dir: &Path,
    synthetic_dim: Option<u32>,
    work: &Path,
    redis_url: &str,
    baseline: Option<&Path>,
) -> anyhow::Result<Dataset> {
    let meta: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("meta.json"))?)?;
    let feature_dim = meta["feature_dim"]
        .as_u64()
        .context("meta.json has no feature_dim")? as usize;
    let prefix = format!("{name}:");
    // With `bin` another build's sidecar (`--baseline`): its own imports,
    // the same Redis rows.
    let import = |bin: PathBuf, data: &Path, extra: &[&str]| -> anyhow::Result<()> {
        let _ = std::fs::remove_dir_all(data);
        let t = Instant::now();
        let out = Command::new(bin)
            .arg("import")
            .arg(dir)
            .arg("--data-dir")
            .arg(data)
            .args(extra)
            .stdout(Stdio::null())
            .output()?;
        ensure!(
            out.status.success(),
            "sidecar import {}: {}",
            dir.display(),
            String::from_utf8_lossy(&out.stderr)
        );
        say(&format!(
            "imported {name} into {} in {:.1} s",
            data.display(),
            t.elapsed().as_secs_f64()
        ));
        Ok(())
    };
    let mut imports = vec![(stack::workspace_bin("sidecar"), String::new())];
    if let Some(dir) = baseline {
        imports.push((dir.join("sidecar"), "-baseline".to_string()));
    }
    let (mut redis_data, mut embedded) = (Vec::new(), Vec::new());
    for (bin, suffix) in imports {
        let data = work.join(format!("{name}-redis{suffix}"));
        import(
            bin.clone(),
            &data,
            &["--redis", redis_url, "--redis-prefix", &prefix],
        )?;
        redis_data.push(data);
        if synthetic_dim.is_none() {
            let data = work.join(format!("{name}-embedded{suffix}"));
            import(bin, &data, &[])?;
            embedded.push(data);
        }
    }
    let model = match synthetic_dim {
        None => stack::trained_model_for(dir),
        Some(dim) => {
            let model = work.join(format!("{name}-model"));
            let status = Command::new(stack::python())
                .arg(stack::repo_root().join("gnn-worker/model/sage.py"))
                .args(["init", "--feature-dim", &dim.to_string(), "--classes", "16"])
                .arg("--out")
                .arg(&model)
                .stdout(Stdio::null())
                .status()?;
            ensure!(status.success(), "sage.py init failed");
            model
        }
    };
    let mut embedded = embedded.into_iter();
    let mut redis_data = redis_data.into_iter();
    let (this_embedded, this_redis) = (embedded.next(), redis_data.next().expect("imported"));
    let beside_data = redis_data.next().map(|redis| (embedded.next(), redis));
    let (embedded, redis_data) = (this_embedded, this_redis);
    let index = Arc::new(CsrIndex::open(&redis_data.join("graph.csr"))?);
    let features = Arc::new(Features::read(&dir.join("features.f32"), feature_dim)?);
    let super_nodes = meta["generator"]["super_nodes"].as_u64().unwrap_or(0) as u32;
    Ok(Dataset {
        name: name.to_string(),
        dir: dir.to_path_buf(),
        feature_dim,
        super_nodes,
        features,
        index,
        model,
        embedded,
        redis_data,
        beside_data,
        prefix,
        naive: None,
    })
}

/// Sidecar + worker for the scenario's store, cache and fanouts.
/// The product's stack, and its sidecar's metrics address; with `beside`
/// another build's binaries (`--baseline`), on that build's imports.
fn start_product(
    d: &Dataset,
    scenario: &Scenario,
    redis_url: &str,
    beside: Option<&Path>,
) -> anyhow::Result<(Stack, String)> {
    let metrics = format!("127.0.0.1:{}", stack::free_port());
    let mut sidecar_args: Vec<String> = vec![
        "--log-level".into(),
        "warn".into(),
        "--metrics-addr".into(),
        metrics.clone(),
    ];
    let (embedded, redis_data) = match beside {
        None => (d.embedded.clone(), d.redis_data.clone()),
        Some(_) => d
            .beside_data
            .clone()
            .context("no import of this dataset by the other build")?,
    };
    let imported = match scenario.store {
        Store::Embedded => embedded.context("no embedded import of this dataset")?,
        Store::Redis => {
            sidecar_args.extend(["--redis".into(), redis_url.into()]);
            redis_data
        }
    };
    match scenario.cache {
        Cache::Warm => {
            let rows = d.index.n_nodes() as u64;
            let mib = ((rows * d.feature_dim as u64 * 4) >> 20) + 64;
            sidecar_args.extend([
                "--warm-up".into(),
                rows.to_string(),
                "--l1-mib".into(),
                mib.to_string(),
            ]);
        }
        Cache::Cold => {
            sidecar_args.extend([
                "--warm-up".into(),
                "0".into(),
                "--l1-mib".into(),
                "0".into(),
            ]);
            if scenario.store == Store::Redis {
                sidecar_args.push("--no-l2".into());
            }
        }
    }
    // L2 is kept across restarts in the data directory; a warm stack over
    // Redis starts from an empty one so runs do not depend on earlier ones.
    let _ = std::fs::remove_dir_all(imported.join("l2-cache"));
    let options = StackOptions {
        dataset_dir: Some(d.dir.clone()),
        fanouts: scenario.fanouts,
        response_mib: 32,
        imported: Some(imported),
        model: Some(d.model.clone()),
        sidecar_args,
        // Deadlines long enough that a cold 64-target batch is never served
        // default rows: every system answers with the real features.
        worker_args: vec![
            "--model-name".into(),
            V2_MODEL.into(),
            "--ring-timeout-ms".into(),
            "5000".into(),
            "--log-level".into(),
            "warn".into(),
        ],
        bin_dir: beside.map(Path::to_path_buf),
        ..StackOptions::new(&d.name)
    };
    let t = Instant::now();
    let stack = Stack::start(&options)?;
    say(&format!(
        "  {} started ({}) in {:.1} s",
        if beside.is_some() {
            "the other build's product"
        } else {
            "product"
        },
        scenario.product_key(),
        t.elapsed().as_secs_f64()
    ));
    Ok((stack, metrics))
}

/// The FastAPI service under uvicorn with two worker processes (one per
/// core), ready once a predict answers.
fn start_fastapi(
    python: &Path,
    root: &Path,
    d: &Dataset,
    fanouts: [u32; 2],
    redis_url: &str,
) -> anyhow::Result<(Daemon, String)> {
    let port = stack::free_port();
    let child = Command::new(python)
        .args(["-m", "uvicorn", "fastapi_service:app", "--app-dir"])
        .arg(root.join("bench/python"))
        .args(["--host", "127.0.0.1", "--port", &port.to_string()])
        .args([
            "--workers",
            "2",
            "--log-level",
            "warning",
            "--no-access-log",
        ])
        .env("GRAPH_CSR", d.redis_data.join("graph.csr"))
        .env("REDIS_URL", redis_url)
        .env("MODEL_DIR", &d.model)
        .env("FANOUTS", format!("{},{}", fanouts[0], fanouts[1]))
        .env("FEATURE_DIM", d.feature_dim.to_string())
        .env("REDIS_PREFIX", &d.prefix)
        .spawn()
        .context("starting uvicorn")?;
    let daemon = Daemon {
        child,
        name: "fastapi",
    };
    let addr = format!("127.0.0.1:{port}");
    wait_for_predict(&addr, "/predict", br#"{"node_ids":[1]}"#)?;
    Ok((daemon, addr))
}

/// The key-by-key design's axum model server.
fn start_naive(d: &Dataset) -> anyhow::Result<(Daemon, String)> {
    let addr = format!("127.0.0.1:{}", stack::free_port());
    let child = Command::new(stack::workspace_bin("naive-model-server"))
        .arg("--model")
        .arg(&d.model)
        .args(["--listen", &addr])
        .arg("--onnxruntime-lib")
        .arg(stack::onnxruntime_lib())
        .args(["--sessions", "2"])
        .spawn()
        .context("starting naive-model-server")?;
    let daemon = Daemon {
        child,
        name: "naive-model-server",
    };
    let body = serde_json::to_vec(&serde_json::json!({
        "feature_dim": d.feature_dim,
        "fanouts": [1, 1],
        "features": vec![0.0f32; d.feature_dim],
        "target_row": [0],
        "hop1_count": [0],
        "hop1_rows": [0],
        "hop2_count": [0],
        "hop2_rows": [0],
    }))?;
    wait_for_predict(&addr, "/predict", &body)?;
    Ok((daemon, addr))
}

fn wait_for_predict(addr: &str, path: &str, body: &[u8]) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let client = HttpClient::new(addr);
    let until = Instant::now() + Duration::from_secs(60);
    let mut last = None;
    while Instant::now() < until {
        match runtime.block_on(client.post(path, body)) {
            Ok(_) => return Ok(()),
            Err(e) => last = Some(e),
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    bail!(
        "{addr}{path} did not answer within 60 s: {:#}",
        last.expect("tried")
    )
}

/// (d) Feast's `get_online_features` for the same row lists, by
/// bench/python/feast_fetch.py.
fn feast(
    python: &Path,
    root: &Path,
    work: &Path,
    d: &Dataset,
    redis: &RedisServer,
    rows: &[Vec<u64>],
) -> anyhow::Result<load::Summary> {
    let rows_file = work.join(format!("{}-feast-rows.json", d.name));
    let out_file = work.join(format!("{}-feast.json", d.name));
    std::fs::write(&rows_file, serde_json::to_vec(rows)?)?;
    let status = Command::new(python)
        .arg(root.join("bench/python/feast_fetch.py"))
        .args(["--redis", &format!("127.0.0.1:{}", redis.port)])
        .arg("--features")
        .arg(d.dir.join("features.f32"))
        .args(["--dim", &d.feature_dim.to_string()])
        .args(["--num-nodes", &d.index.n_nodes().to_string()])
        .arg("--rows")
        .arg(&rows_file)
        .arg("--out")
        .arg(&out_file)
        .status()
        .context("running bench/python/feast_fetch.py")?;
    ensure!(status.success(), "bench/python/feast_fetch.py failed");
    let out: serde_json::Value = serde_json::from_slice(&std::fs::read(&out_file)?)?;
    let mut h = load::histogram();
    for v in out["latencies_us"].as_array().context("latencies_us")? {
        let _ = h.record((v.as_f64().unwrap_or(0.0) as u64).max(1));
    }
    Ok(load::Summary::of(&h, 0, 0.0, None))
}
