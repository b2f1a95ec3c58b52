//! Logging: `tracing` to stderr, as text or one JSON object per line, with a
//! level (an `EnvFilter` directive such as `info` or `sidecar=debug,warn`)
//! that can be changed while the daemon runs.

use std::sync::Mutex;

use serde::{Deserialize, Serialize};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{reload, EnvFilter, Registry};

/// How log lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Text,
    /// One JSON object per line (for log collectors).
    Json,
}

impl std::str::FromStr for LogFormat {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "text" => Ok(Self::Text),
            "json" => Ok(Self::Json),
            other => Err(format!("{other:?} is not a log format: use text or json")),
        }
    }
}

/// Checks a level directive without installing it.
pub fn parse_level(directives: &str) -> Result<EnvFilter, String> {
    if directives.trim().is_empty() {
        return Err("an empty log level: use e.g. info, debug or sidecar=debug,warn".into());
    }
    // EnvFilter reads a bare word as a target name ("inof" would enable
    // every level of a target called inof): insist on level names.
    const LEVELS: [&str; 6] = ["off", "error", "warn", "info", "debug", "trace"];
    for directive in directives.split(',').map(str::trim) {
        let level = directive
            .rsplit_once('=')
            .map_or(directive, |(_, level)| level);
        if !LEVELS.contains(&level.to_ascii_lowercase().as_str()) {
            return Err(format!(
                "{directives:?} is not a log level ({level:?} is not one of {}): use e.g. info, \
                 debug or sidecar=debug,warn",
                LEVELS.join(", ")
            ));
        }
    }
    EnvFilter::builder()
        .with_regex(false)
        .parse(directives)
        .map_err(|e| format!("{directives:?} is not a log level ({e}): use e.g. info, debug or sidecar=debug,warn"))
}

/// The installed subscriber's level, changeable at run time.
pub struct LogHandle {
    reload: reload::Handle<EnvFilter, Registry>,
    current: Mutex<String>,
}

impl std::fmt::Debug for LogHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LogHandle")
            .field("level", &self.level())
            .finish()
    }
}

impl LogHandle {
    /// The level directives in force.
    pub fn level(&self) -> String {
        self.current
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Replaces the level directives; the old ones stay on error.
    pub fn set_level(&self, directives: &str) -> Result<(), String> {
        let filter = parse_level(directives)?;
        self.reload
            .reload(filter)
            .map_err(|e| format!("cannot change the log level: {e}"))?;
        *self.current.lock().unwrap_or_else(|p| p.into_inner()) = directives.to_string();
        Ok(())
    }
}

/// Logging for a one-shot command (`sidecar import`, `gnn-worker predict`):
/// text on stderr at `$RUST_LOG`, else `info`.
pub fn init_for_command() {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()))
        .init();
}

/// Installs the process-wide subscriber: the log at `level`, and with
/// `tracer`, the OpenTelemetry layer ([`crate::traces`]) taking the spans
/// of the `traced` targets alone (their TRACE-level spans included, and
/// no events). Fails if `level` does not parse or a subscriber is already
/// installed.
pub fn init(
    format: LogFormat,
    level: &str,
    tracer: Option<opentelemetry_sdk::trace::SdkTracer>,
    traced: &'static [&'static str],
) -> Result<LogHandle, String> {
    use tracing_subscriber::Layer;
    let filter = parse_level(level)?;
    let (filter, reload) = reload::Layer::new(filter);
    let log = match format {
        LogFormat::Text => tracing_subscriber::fmt::layer()
            .with_writer(std::io::stderr)
            .with_filter(filter)
            .boxed(),
        LogFormat::Json => tracing_subscriber::fmt::layer()
            .json()
            .flatten_event(true)
            .with_current_span(false)
            .with_writer(std::io::stderr)
            .with_filter(filter)
            .boxed(),
    };
    let mut layers: Vec<Box<dyn Layer<Registry> + Send + Sync>> = vec![log];
    if let Some(tracer) = tracer {
        layers.push(
            tracing_opentelemetry::layer()
                .with_tracer(tracer)
                .with_location(false)
                .with_threads(false)
                .with_tracked_inactivity(false)
                .with_filter(tracing_subscriber::filter::filter_fn(move |meta| {
                    meta.is_span()
                        && traced.iter().any(|t| {
                            meta.target() == *t
                                || meta
                                    .target()
                                    .strip_prefix(t)
                                    .is_some_and(|rest| rest.starts_with("::"))
                        })
                }))
                .boxed(),
        );
    }
    tracing_subscriber::registry()
        .with(layers)
        .try_init()
        .map_err(|e| format!("cannot install the logger: {e}"))?;
    Ok(LogHandle {
        reload,
        current: Mutex::new(level.to_string()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn levels_parse_or_say_what_is_wrong() {
        assert!(parse_level("info").is_ok());
        assert!(parse_level("sidecar=debug,warn").is_ok());
        let e = parse_level("loud").unwrap_err();
        assert!(e.contains("\"loud\""), "{e}");
        assert!(parse_level(" ").is_err());
        assert_eq!("json".parse::<LogFormat>(), Ok(LogFormat::Json));
        assert!("xml".parse::<LogFormat>().is_err());
    }
}
