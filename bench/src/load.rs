//! Load, two ways, both recorded with HdrHistogram (microseconds):
//!
//! - **lone calls**: one call at a time, closed loop (the latency of a call
//!   that has the system to itself);
//! - **open loop** at a fixed rate: call `k` is due at `start + k / rate`,
//!   whether or not earlier calls have answered, and its latency is
//!   measured from that due time, not from when it was actually sent: a
//!   system that falls behind is charged for the wait it causes (no
//!   coordinated omission).
//!
//! Every system gets the same request sequence: call `k` is request
//! `k % n` of the scenario's list.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use serde::Serialize;

/// A system under test: answers request `k` of the scenario's sequence.
pub trait Caller: Send + Sync + 'static {
    fn call(&self, request: usize)
        -> Pin<Box<dyn Future<Output = anyhow::Result<()>> + Send + '_>>;
}

/// Latencies, microseconds.
pub fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 120_000_000, 3).expect("histogram bounds")
}

/// What a run measured.
#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    pub calls: u64,
    pub errors: u64,
    pub p50_us: f64,
    pub p90_us: f64,
    pub p99_us: f64,
    pub p999_us: f64,
    pub max_us: f64,
    pub mean_us: f64,
    /// Calls answered per second over the run.
    pub throughput: f64,
    /// (percentile, microseconds) for the CDF plots.
    pub cdf: Vec<(f64, f64)>,
    /// The first error seen, if any.
    pub first_error: Option<String>,
}

impl Summary {
    pub fn of(h: &Histogram<u64>, errors: u64, seconds: f64, first_error: Option<String>) -> Self {
        let q = |p: f64| {
            if h.is_empty() {
                0.0
            } else {
                h.value_at_quantile(p) as f64
            }
        };
        let cdf = [
            0.0, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.97, 0.99, 0.995, 0.999,
            1.0,
        ]
        .iter()
        .map(|&p| (p * 100.0, q(p)))
        .collect();
        Self {
            calls: h.len(),
            errors,
            p50_us: q(0.5),
            p90_us: q(0.9),
            p99_us: q(0.99),
            p999_us: q(0.999),
            max_us: if h.is_empty() { 0.0 } else { h.max() as f64 },
            mean_us: if h.is_empty() { 0.0 } else { h.mean() },
            throughput: if seconds > 0.0 {
                h.len() as f64 / seconds
            } else {
                0.0
            },
            cdf,
            first_error,
        }
    }

    /// The same summary with every latency divided by `by` (a histogram
    /// recorded in nanoseconds, shown in microseconds).
    pub fn scaled(mut self, by: f64) -> Self {
        for v in [
            &mut self.p50_us,
            &mut self.p90_us,
            &mut self.p99_us,
            &mut self.p999_us,
            &mut self.max_us,
            &mut self.mean_us,
        ] {
            *v /= by;
        }
        for point in &mut self.cdf {
            point.1 /= by;
        }
        self
    }
}

/// Up to `calls` lone calls (requests 0, 1, ... of the sequence), one at a
/// time, stopping early once `budget` has passed and 20 calls are in.
pub async fn lone(caller: &dyn Caller, calls: usize, warmup: usize, budget: Duration) -> Summary {
    for k in 0..warmup {
        let _ = caller.call(k).await;
    }
    let mut h = histogram();
    let mut errors = 0;
    let mut first_error = None;
    let started = Instant::now();
    for k in 0..calls {
        if k >= 20 && started.elapsed() > budget {
            break;
        }
        let t = Instant::now();
        match caller.call(warmup + k).await {
            Ok(()) => {
                let _ = h.record((t.elapsed().as_micros() as u64).max(1));
            }
            Err(e) => {
                errors += 1;
                first_error.get_or_insert_with(|| format!("{e:#}"));
            }
        }
    }
    Summary::of(&h, errors, started.elapsed().as_secs_f64(), first_error)
}

/// Lone calls to several callers in turn, call by call (`calls` rounds
/// after `warmup`, until `budget`), so that the machine's state at any
/// moment falls on each alike: one summary per caller, in order.
pub async fn interleaved(
    callers: &[&dyn Caller],
    calls: usize,
    warmup: usize,
    budget: Duration,
) -> Vec<Summary> {
    for k in 0..warmup {
        for caller in callers {
            let _ = caller.call(k).await;
        }
    }
    let mut histograms: Vec<_> = callers.iter().map(|_| histogram()).collect();
    let mut errors = vec![0u64; callers.len()];
    let mut first_errors: Vec<Option<String>> = vec![None; callers.len()];
    let started = Instant::now();
    for k in 0..calls {
        if k >= 20 && started.elapsed() > budget {
            break;
        }
        for (i, caller) in callers.iter().enumerate() {
            let t = Instant::now();
            match caller.call(warmup + k).await {
                Ok(()) => {
                    let _ = histograms[i].record((t.elapsed().as_micros() as u64).max(1));
                }
                Err(e) => {
                    errors[i] += 1;
                    first_errors[i].get_or_insert_with(|| format!("{e:#}"));
                }
            }
        }
    }
    let seconds = started.elapsed().as_secs_f64();
    histograms
        .iter()
        .zip(errors)
        .zip(first_errors)
        .map(|((h, errors), first)| Summary::of(h, errors, seconds, first))
        .collect()
}

/// `concurrency` callers in closed loop for `duration`: a quick estimate of
/// the most a system can answer per second.
pub async fn closed(caller: Arc<dyn Caller>, concurrency: usize, duration: Duration) -> Summary {
    let h = Arc::new(Mutex::new(histogram()));
    let errors = Arc::new(AtomicU64::new(0));
    let next = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let until = started + duration;
    let mut tasks = Vec::new();
    for _ in 0..concurrency {
        let (caller, h, errors, next) = (caller.clone(), h.clone(), errors.clone(), next.clone());
        tasks.push(tokio::spawn(async move {
            while Instant::now() < until {
                let k = next.fetch_add(1, Ordering::Relaxed) as usize;
                let t = Instant::now();
                match caller.call(k).await {
                    Ok(()) => {
                        let _ = h
                            .lock()
                            .unwrap()
                            .record((t.elapsed().as_micros() as u64).max(1));
                    }
                    Err(_) => {
                        errors.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
        }));
    }
    for task in tasks {
        let _ = task.await;
    }
    let seconds = started.elapsed().as_secs_f64();
    let h = h.lock().unwrap();
    Summary::of(&h, errors.load(Ordering::Relaxed), seconds, None)
}

/// Calls at `rate` per second for `duration`, open loop; latency from each
/// call's due time. Calls still unanswered `grace` after the last one was
/// due are counted as errors.
pub async fn open(
    caller: Arc<dyn Caller>,
    rate: f64,
    duration: Duration,
    grace: Duration,
) -> Summary {
    let n = (rate * duration.as_secs_f64()).ceil().max(1.0) as u64;
    let h = Arc::new(Mutex::new(histogram()));
    let errors = Arc::new(AtomicU64::new(0));
    let first_error = Arc::new(Mutex::new(None::<String>));
    let last_done = Arc::new(Mutex::new(Instant::now()));
    let started = Instant::now() + Duration::from_millis(20);
    let mut tasks = Vec::with_capacity(n as usize);
    for k in 0..n {
        let due = started + Duration::from_secs_f64(k as f64 / rate);
        tokio::time::sleep_until(due.into()).await;
        let (caller, h, errors, first_error, last_done) = (
            caller.clone(),
            h.clone(),
            errors.clone(),
            first_error.clone(),
            last_done.clone(),
        );
        tasks.push(tokio::spawn(async move {
            match caller.call(k as usize).await {
                Ok(()) => {
                    let now = Instant::now();
                    let _ = h
                        .lock()
                        .unwrap()
                        .record((now.duration_since(due).as_micros() as u64).max(1));
                    let mut last = last_done.lock().unwrap();
                    if now > *last {
                        *last = now;
                    }
                }
                Err(e) => {
                    errors.fetch_add(1, Ordering::Relaxed);
                    first_error
                        .lock()
                        .unwrap()
                        .get_or_insert_with(|| format!("{e:#}"));
                }
            }
        }));
    }
    let deadline = Instant::now() + grace;
    for mut task in tasks {
        let left = deadline.saturating_duration_since(Instant::now());
        if tokio::time::timeout(left, &mut task).await.is_err() {
            task.abort();
            errors.fetch_add(1, Ordering::Relaxed);
        }
    }
    let seconds = last_done
        .lock()
        .unwrap()
        .saturating_duration_since(started)
        .as_secs_f64()
        .max(duration.as_secs_f64());
    let h = h.lock().unwrap();
    let first_error = first_error.lock().unwrap().clone();
    Summary::of(&h, errors.load(Ordering::Relaxed), seconds, first_error)
}

/// One step of a rate sweep.
#[derive(Debug, Clone, Serialize)]
pub struct Step {
    /// The offered rate, calls per second.
    pub offered: f64,
    /// The fraction of the rate the step was derived from (the closed-loop
    /// estimate in a sweep; the saturation for the step at 70%).
    pub fraction: f64,
    pub summary: Summary,
    /// CPU (user + system) the watched processes spent per call answered
    /// over the step, microseconds; `None` when none is watched.
    pub cpu_us_per_call: Option<f64>,
    /// The same per watched process (the product: worker, sidecar).
    pub cpu_us_per_call_each: Option<Vec<f64>>,
}

/// The processes whose CPU a step accounts for (the product's worker and
/// sidecar): user + system time from `/proc/<pid>/stat`, every thread
/// included, those that ended too.
#[derive(Debug, Clone, Default)]
pub struct CpuWatch {
    pub pids: Vec<u32>,
}

impl CpuWatch {
    /// The user + system CPU seconds the processes have spent so far;
    /// `None` when there are none, or one cannot be read.
    pub fn seconds(&self) -> Option<f64> {
        self.seconds_each().map(|each| each.iter().sum())
    }

    /// Each process's CPU per call, microseconds, over `calls` answered
    /// since `before` (what [`CpuWatch::seconds_each`] gave then); `None`
    /// when nothing was answered or a process cannot be read.
    pub fn per_call_since(&self, before: Option<Vec<f64>>, calls: u64) -> Option<Vec<f64>> {
        let (before, after) = (before?, self.seconds_each()?);
        (calls > 0).then(|| {
            after
                .iter()
                .zip(&before)
                .map(|(a, b)| (a - b) * 1e6 / calls as f64)
                .collect()
        })
    }

    /// The same per process, in the order of `pids`.
    pub fn seconds_each(&self) -> Option<Vec<f64>> {
        if self.pids.is_empty() {
            return None;
        }
        // SAFETY: sysconf has no preconditions.
        let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
        let mut each = Vec::with_capacity(self.pids.len());
        for pid in &self.pids {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            // Fields after the command name (which may hold spaces), from
            // its closing parenthesis: state is field 3, utime 14, stime 15.
            let rest = &stat[stat.rfind(')')? + 2..];
            let fields: Vec<&str> = rest.split_whitespace().collect();
            let utime: f64 = fields.get(11)?.parse().ok()?;
            let stime: f64 = fields.get(12)?.parse().ok()?;
            each.push((utime + stime) / ticks);
        }
        Some(each)
    }
}

/// Two systems' CPU per call at one offered rate, measured in alternating
/// slices (pair `i` runs A then B when `i` is even, B then A when it is
/// odd), so that what the machine does at any moment falls on both alike
/// and each pair's ratio compares them under the same conditions.
#[derive(Debug, Clone, Serialize)]
pub struct Paired {
    /// The transport both were called through (`gRPC`, `HTTP`).
    pub door: String,
    /// The offered rate of every slice, calls per second.
    pub offered: f64,
    /// Each slice's length, seconds.
    pub slice_s: f64,
    /// A's CPU (user + system of its watched processes) per call answered,
    /// microseconds, one per pair.
    pub a_us: Vec<f64>,
    /// B's, the same pairs.
    pub b_us: Vec<f64>,
    /// A's per watched process (in the order of its `CpuWatch`), pair by
    /// pair.
    pub a_each_us: Vec<Vec<f64>>,
    /// B's, the same.
    pub b_each_us: Vec<Vec<f64>>,
    /// Calls that failed or were not answered in time: A's, B's.
    pub errors: [u64; 2],
}

impl Paired {
    /// The median over the pairs of each watched process's CPU per call:
    /// A's (`b` false) or B's.
    pub fn median_each(&self, b: bool) -> Vec<f64> {
        let each = if b { &self.b_each_us } else { &self.a_each_us };
        let processes = each.first().map_or(0, Vec::len);
        (0..processes)
            .filter_map(|i| {
                median(
                    &each
                        .iter()
                        .filter_map(|p| p.get(i).copied())
                        .collect::<Vec<_>>(),
                )
            })
            .collect()
    }

    /// B's CPU per call over A's, pair by pair.
    pub fn ratios(&self) -> Vec<f64> {
        self.a_us
            .iter()
            .zip(&self.b_us)
            .filter(|(a, _)| **a > 0.0)
            .map(|(a, b)| b / a)
            .collect()
    }
}

/// The median of `values` (the mean of the middle two for an even count);
/// `None` when there are none.
pub fn median(values: &[f64]) -> Option<f64> {
    let mut v: Vec<f64> = values.iter().copied().filter(|x| x.is_finite()).collect();
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let mid = v.len() / 2;
    Some(if v.len().is_multiple_of(2) {
        (v[mid - 1] + v[mid]) / 2.0
    } else {
        v[mid]
    })
}

/// [`Paired`]: `pairs` pairs of `slice`-long open-loop runs of `a` and `b`
/// at `rate`, each slice's CPU per call from its processes in `a_cpu` and
/// `b_cpu`. A pair where either slice answered nothing is left out.
pub async fn paired_cpu(
    door: &str,
    (a, a_cpu): (Arc<dyn Caller>, &CpuWatch),
    (b, b_cpu): (Arc<dyn Caller>, &CpuWatch),
    rate: f64,
    slice: Duration,
    pairs: usize,
) -> Paired {
    async fn one(
        caller: &Arc<dyn Caller>,
        cpu: &CpuWatch,
        rate: f64,
        slice: Duration,
    ) -> (Option<Vec<f64>>, u64) {
        let before = cpu.seconds_each();
        let summary = open(caller.clone(), rate, slice, Duration::from_secs(20)).await;
        (cpu.per_call_since(before, summary.calls), summary.errors)
    }
    let mut paired = Paired {
        door: door.to_string(),
        offered: rate,
        slice_s: slice.as_secs_f64(),
        a_us: Vec::new(),
        b_us: Vec::new(),
        a_each_us: Vec::new(),
        b_each_us: Vec::new(),
        errors: [0, 0],
    };
    for i in 0..pairs {
        let (a_run, b_run) = if i % 2 == 0 {
            let a_run = one(&a, a_cpu, rate, slice).await;
            (a_run, one(&b, b_cpu, rate, slice).await)
        } else {
            let b_run = one(&b, b_cpu, rate, slice).await;
            (one(&a, a_cpu, rate, slice).await, b_run)
        };
        paired.errors[0] += a_run.1;
        paired.errors[1] += b_run.1;
        tracing::info!(door, pair = i, a_us = ?a_run.0, b_us = ?b_run.0, "paired CPU");
        if let (Some(a_each), Some(b_each)) = (a_run.0, b_run.0) {
            paired.a_us.push(a_each.iter().sum());
            paired.b_us.push(b_each.iter().sum());
            paired.a_each_us.push(a_each);
            paired.b_each_us.push(b_each);
        }
    }
    paired
}

/// Open-loop steps at `fractions` of `saturation`, each `step` long (longer,
/// up to four times, where that is too short for 30 calls).
pub async fn sweep(
    caller: Arc<dyn Caller>,
    saturation: f64,
    fractions: &[f64],
    step: Duration,
    cpu: &CpuWatch,
) -> Vec<Step> {
    let mut steps = Vec::new();
    for &fraction in fractions {
        let offered = (saturation * fraction).max(1.0);
        let long_enough = Duration::from_secs_f64(30.0 / offered).min(step * 4);
        let cpu_before = cpu.seconds_each();
        let summary = open(
            caller.clone(),
            offered,
            step.max(long_enough),
            Duration::from_secs(20),
        )
        .await;
        tracing::info!(
            offered,
            achieved = summary.throughput,
            p50_us = summary.p50_us,
            p99_us = summary.p99_us,
            errors = summary.errors,
            "sweep step"
        );
        let cpu_us_per_call_each = cpu.per_call_since(cpu_before, summary.calls);
        let cpu_us_per_call = cpu_us_per_call_each.as_ref().map(|each| each.iter().sum());
        steps.push(Step {
            offered,
            fraction,
            summary,
            cpu_us_per_call,
            cpu_us_per_call_each,
        });
    }
    steps
}
