//! One start-up for both daemons' `serve`: the layered configuration,
//! `--print-config` (secrets redacted), the signal mask, traces, logging,
//! and the signal thread (SIGTERM and SIGINT stop, SIGHUP re-reads
//! `log_level`), in that order.
//!
//! The signals are blocked in the calling thread and taken by one thread of
//! their own, so [`start`] must run on the main thread before any other
//! thread starts (an async runtime included): threads inherit the mask, and
//! none of them is then killed by a signal's default action.

use std::sync::Arc;

use crate::config::{ConfigError, Layered, Validate};
use crate::logging::{LogFormat, LogHandle};

/// What the start-up needs of a daemon's settings.
pub trait Settings: Sized {
    /// The settings as `--print-config` shows them: every secret
    /// (a Redis URL's password) replaced.
    fn redacted(&self) -> Self;
    fn log_format(&self) -> LogFormat;
    fn log_level(&self) -> &str;
    /// The traces (`otlp_endpoint`: off when unset).
    fn traces(&self) -> crate::traces::TraceSettings;
    /// The targets whose spans are traced (the daemon's crates).
    fn traced_targets(&self) -> &'static [&'static str];
}

/// A daemon started: its settings and its log handle (for SIGHUP and the
/// admin socket's `log-level set`).
#[derive(Debug)]
pub struct Started<T> {
    pub config: T,
    pub log: Arc<LogHandle>,
    /// The span exporter, with traces on: drop it last (it exports what is
    /// left).
    pub traces: Option<crate::traces::Traces>,
}

/// Loads the configuration with `load` (which the SIGHUP handler calls
/// again); with `print_config`, prints it redacted and returns `None`;
/// otherwise starts logging and the signal thread, which calls `on_stop`
/// once at the first SIGTERM or SIGINT, and `on_hup` after the log level
/// at every SIGHUP.
pub fn start<T, L>(
    load: L,
    print_config: bool,
    on_stop: impl FnOnce() + Send + 'static,
    on_hup: impl Fn() + Send + 'static,
) -> anyhow::Result<Option<Started<T>>>
where
    T: Settings + Clone + serde::Serialize + serde::de::DeserializeOwned + Default + Validate,
    L: Fn() -> Result<Layered<T>, ConfigError> + Send + 'static,
{
    let layered = load().map_err(anyhow::Error::msg)?;
    if print_config {
        print!("{}", layered.to_toml(&layered.value.redacted()));
        return Ok(None);
    }
    let config = layered.value.clone();
    // Every thread from here on (the exporter's included) inherits the mask.
    let signals = block_signals()?;
    let (traces, tracer) = match crate::traces::start(&config.traces())? {
        Some((traces, tracer)) => (Some(traces), Some(tracer)),
        None => (None, None),
    };
    let log = Arc::new(
        crate::logging::init(
            config.log_format(),
            config.log_level(),
            tracer,
            config.traced_targets(),
        )
        .map_err(anyhow::Error::msg)?,
    );
    let for_hup = log.clone();
    watch_signals(
        signals,
        move || {
            match load() {
                Ok(fresh) => match for_hup.set_level(fresh.value.log_level()) {
                    Ok(()) => tracing::info!(
                        level = %fresh.value.log_level(),
                        "log level reloaded (SIGHUP)"
                    ),
                    Err(e) => tracing::warn!(error = %e, "SIGHUP: log level not changed"),
                },
                Err(e) => tracing::warn!(error = %e, "SIGHUP: configuration not reloaded"),
            }
            on_hup();
        },
        on_stop,
    )?;
    Ok(Some(Started {
        config,
        log,
        traces,
    }))
}

/// Blocks SIGTERM, SIGINT and SIGHUP in the calling thread (and so in
/// every thread it starts later).
fn block_signals() -> anyhow::Result<nix::sys::signal::SigSet> {
    use nix::sys::signal::{SigSet, Signal};
    let mut set = SigSet::empty();
    set.add(Signal::SIGTERM);
    set.add(Signal::SIGINT);
    set.add(Signal::SIGHUP);
    set.thread_block()?;
    Ok(set)
}

/// Handles the blocked `set` on one thread: SIGHUP calls `reload`; the
/// first SIGTERM or SIGINT calls `on_stop` and ends it.
fn watch_signals(
    set: nix::sys::signal::SigSet,
    reload: impl Fn() + Send + 'static,
    on_stop: impl FnOnce() + Send + 'static,
) -> anyhow::Result<()> {
    use nix::sys::signal::Signal;
    std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || loop {
            match set.wait() {
                Ok(Signal::SIGHUP) => reload(),
                Ok(signal) => {
                    tracing::info!(%signal, "stopping");
                    on_stop();
                    return;
                }
                Err(_) => return,
            }
        })?;
    Ok(())
}
