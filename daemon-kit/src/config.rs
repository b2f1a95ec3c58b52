//! Layered configuration for a daemon: **flags > environment > file >
//! defaults**, the one precedence both daemons document.
//!
//! A daemon declares its settings once, as a `serde` struct whose
//! `Default` is the one set of defaults; every field is a key. The layers:
//!
//! 1. the defaults (`T::default()`);
//! 2. a TOML file (`--config <file>`, or `<PREFIX>CONFIG`), whose top-level
//!    keys are the field names;
//! 3. environment variables `<PREFIX><KEY>` (the key in upper case, e.g.
//!    `SIDECAR_L1_MIB`);
//! 4. command-line flags `--<key>` (underscores as dashes), of which only
//!    those given on the command line take part.
//!
//! figment merges them. What this module adds is the refusal: an unknown
//! key (in the file or the environment), a value of the wrong type, or one
//! that [`Validate`] rejects stops the daemon with one line that names the
//! key, where its value came from ([`Source`]: `file:line`, the variable or
//! the flag) and the fix.

use std::collections::BTreeSet;
use std::fmt;
use std::path::{Path, PathBuf};

use figment::providers::{Format, Serialized, Toml};
use figment::value::{Dict, Map};
use figment::{Figment, Metadata, Profile, Provider};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// The daemon a configuration belongs to.
#[derive(Debug, Clone, Copy)]
pub struct Spec {
    /// Prefix of its environment variables, e.g. `SIDECAR_`.
    pub env_prefix: &'static str,
    /// Where its keys are documented (named in every fix).
    pub docs: &'static str,
}

impl Spec {
    /// The variable that names the configuration file (`<PREFIX>CONFIG`).
    pub fn config_var(&self) -> String {
        format!("{}CONFIG", self.env_prefix)
    }

    fn var_of(&self, key: &str) -> String {
        format!("{}{}", self.env_prefix, key.to_ascii_uppercase())
    }
}

/// Where a setting's value came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    Default,
    /// A line of the configuration file (`None` when the key spans no line
    /// of its own).
    File {
        path: PathBuf,
        line: Option<usize>,
    },
    /// An environment variable.
    Env(String),
    /// A command-line flag.
    Flag(String),
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Source::Default => write!(f, "the default"),
            Source::File {
                path,
                line: Some(line),
            } => write!(f, "{}:{line}", path.display()),
            Source::File { path, line: None } => write!(f, "{}", path.display()),
            Source::Env(var) => write!(f, "environment variable {var}"),
            Source::Flag(flag) => write!(f, "flag {flag}"),
        }
    }
}

/// A configuration the daemon refuses. Its `Display` is one line.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// A key's value (or the key itself) is wrong.
    #[error("invalid configuration: `{key}` from {origin}: {problem}; {fix}")]
    Key {
        key: String,
        /// Where the value came from.
        origin: Source,
        problem: String,
        fix: String,
    },
    /// The file as a whole cannot be used (unreadable, not TOML).
    #[error("invalid configuration file {}{}: {problem}; {fix}", path.display(), line.map(|l| format!(":{l}")).unwrap_or_default())]
    File {
        path: PathBuf,
        line: Option<usize>,
        problem: String,
        fix: String,
    },
}

/// A value a [`Validate`] implementation rejects.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Invalid {
    pub key: &'static str,
    pub problem: String,
    pub fix: String,
}

impl Invalid {
    pub fn new(key: &'static str, problem: impl Into<String>, fix: impl Into<String>) -> Self {
        Self {
            key,
            problem: problem.into(),
            fix: fix.into(),
        }
    }
}

/// Range and consistency checks that types alone do not express.
pub trait Validate {
    /// The first problem found, if any.
    fn validate(&self) -> Result<(), Invalid>;
}

/// A fanout of -1, PyG's "every neighbour": the node's whole neighbour
/// list, up to the hop's cap (the sidecar's `max_fanouts`, which a -1 in
/// `max_fanouts` itself makes the largest, 32,768). Held as `u32::MAX`
/// until the cap is known ([`at_cap`]); written back as -1.
pub const EVERY_NEIGHBOUR: u32 = u32::MAX;

/// `fanout`, or `cap` where it is [`EVERY_NEIGHBOUR`].
pub fn at_cap(fanout: u32, cap: u32) -> u32 {
    if fanout == EVERY_NEIGHBOUR {
        cap
    } else {
        fanout
    }
}

/// One fanout as written by a user: a count, or -1 ([`EVERY_NEIGHBOUR`]).
fn fanout_from(value: i64) -> Option<u32> {
    match value {
        -1 => Some(EVERY_NEIGHBOUR),
        v => u32::try_from(v).ok().filter(|&f| f != EVERY_NEIGHBOUR),
    }
}

/// Fanouts written `f1,f2,...` (a flag, a variable, a TOML string): each a
/// count or -1; `None` if a word is neither.
fn fanouts_from_text(text: &str) -> Option<Vec<u32>> {
    text.split(',')
        .map(|w| fanout_from(w.trim().parse().ok()?))
        .collect()
}

/// Fanouts as a TOML or JSON list or a `"20,10"` string, each a count or
/// -1, as serde reads them (`#[serde(deserialize_with = ...)]`, for a
/// model's manifest as for the daemons' settings).
pub fn fanout_list<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u32>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Either {
        Text(String),
        List(Vec<i64>),
    }
    let bad = |what: String| {
        serde::de::Error::custom(format!(
            "fanouts {what}: expected counts or -1 (every neighbour), as [20, 10] or \"20,10\""
        ))
    };
    match Either::deserialize(d).map_err(|_| bad("of another kind".into()))? {
        Either::Text(text) => fanouts_from_text(&text).ok_or_else(|| bad(format!("{text:?}"))),
        Either::List(list) => list
            .iter()
            .map(|&v| fanout_from(v))
            .collect::<Option<Vec<u32>>>()
            .ok_or_else(|| bad(format!("{list:?}"))),
    }
}

/// Fanouts as serde writes them: a list, -1 for [`EVERY_NEIGHBOUR`].
pub fn write_fanout_list<S: Serializer>(fanouts: &[u32], s: S) -> Result<S::Ok, S::Error> {
    let values: Vec<i64> = fanouts
        .iter()
        .map(|&f| match f {
            EVERY_NEIGHBOUR => -1,
            f => i64::from(f),
        })
        .collect();
    values.serialize(s)
}

/// Fanouts as text, `20,10` or `-1,-1`.
fn fanouts_text(fanouts: &[u32]) -> String {
    let words: Vec<String> = fanouts
        .iter()
        .map(|&f| match f {
            EVERY_NEIGHBOUR => "-1".to_string(),
            f => f.to_string(),
        })
        .collect();
    words.join(",")
}

/// Fanouts per hop: `"20,10"` or `[20, 10]` in TOML, `20,10` in a flag or
/// variable; -1 is every neighbour ([`EVERY_NEIGHBOUR`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fanouts(pub [u32; 2]);

impl Fanouts {
    /// Each hop's fanout, -1 made that hop's cap.
    pub fn at_caps(&self, caps: [u32; 2]) -> [u32; 2] {
        [at_cap(self.0[0], caps[0]), at_cap(self.0[1], caps[1])]
    }
}

impl TryFrom<Vec<u32>> for Fanouts {
    type Error = String;

    fn try_from(fanouts: Vec<u32>) -> Result<Self, String> {
        let text = fanouts_text(&fanouts);
        let two: [u32; 2] = fanouts
            .try_into()
            .map_err(|_| format!("{text:?}: expected two fanouts such as 20,10"))?;
        Ok(Fanouts(two))
    }
}

impl std::str::FromStr for Fanouts {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        fanouts_from_text(s)
            .ok_or_else(|| {
                format!("{s:?}: expected two fanouts such as 20,10 (-1: every neighbour)")
            })?
            .try_into()
    }
}

impl Serialize for Fanouts {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        write_fanout_list(&self.0, s)
    }
}

impl<'de> Deserialize<'de> for Fanouts {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        fanout_list(d)?.try_into().map_err(serde::de::Error::custom)
    }
}

impl std::fmt::Display for Fanouts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&fanouts_text(&self.0))
    }
}

/// Most microseconds a fixed [`RingSpin`] may spin.
pub const MAX_RING_SPIN_US: u64 = 1_000_000;

/// How long a ring waiter spins before it parks (`ring_spin_us`): `"auto"`
/// (learned from the thread's own waits and whether the machine's CPUs are
/// busy, the default) or a fixed count of microseconds, 0 to 1,000,000, as
/// an integer or text (docs/serving.md, "Spinning").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RingSpin {
    #[default]
    Auto,
    Micros(u64),
}

impl RingSpin {
    fn checked(us: u64) -> Result<Self, String> {
        if us > MAX_RING_SPIN_US {
            return Err(format!(
                "{us}: at most {MAX_RING_SPIN_US} microseconds (or auto: learned, the default)"
            ));
        }
        Ok(RingSpin::Micros(us))
    }

    /// The fixed spin, or `None` for auto.
    pub fn fixed(&self) -> Option<std::time::Duration> {
        match self {
            RingSpin::Auto => None,
            RingSpin::Micros(us) => Some(std::time::Duration::from_micros(*us)),
        }
    }
}

impl std::str::FromStr for RingSpin {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let s = s.trim();
        if s.eq_ignore_ascii_case("auto") {
            return Ok(RingSpin::Auto);
        }
        let us = s.parse::<u64>().map_err(|_| {
            format!(
                "{s:?}: expected auto (learned, the default) or microseconds 0 to \
                 {MAX_RING_SPIN_US}"
            )
        })?;
        RingSpin::checked(us)
    }
}

impl Serialize for RingSpin {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            RingSpin::Auto => s.serialize_str("auto"),
            RingSpin::Micros(us) => s.serialize_u64(*us),
        }
    }
}

impl<'de> Deserialize<'de> for RingSpin {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Either {
            Text(String),
            Number(i64),
        }
        let spin = match Either::deserialize(d).map_err(|_| {
            serde::de::Error::custom(format!(
                "expected auto or microseconds 0 to {MAX_RING_SPIN_US}"
            ))
        })? {
            Either::Text(text) => text.parse(),
            Either::Number(us) => u64::try_from(us)
                .map_err(|_| format!("{us}: expected auto or microseconds 0 to {MAX_RING_SPIN_US}"))
                .and_then(RingSpin::checked),
        };
        spin.map_err(serde::de::Error::custom)
    }
}

impl std::fmt::Display for RingSpin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RingSpin::Auto => f.write_str("auto"),
            RingSpin::Micros(us) => write!(f, "{us}"),
        }
    }
}

/// Fanouts of one to three hops, for a model that names its own hop count
/// (the worker's subgraph-layout models): `"20,10"`, `"15"` or
/// `"20,10,5"` as text, or a TOML list; -1 is every neighbour.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HopFanouts(pub Vec<u32>);

/// Most hops [`HopFanouts`] holds.
pub const MAX_HOP_FANOUTS: usize = 3;

impl HopFanouts {
    /// Each hop's fanout, -1 made the cap `cap(hop)`.
    pub fn at_caps(&self, cap: impl Fn(usize) -> u32) -> HopFanouts {
        HopFanouts(
            self.0
                .iter()
                .enumerate()
                .map(|(hop, &f)| at_cap(f, cap(hop)))
                .collect(),
        )
    }
}

impl TryFrom<Vec<u32>> for HopFanouts {
    type Error = String;

    fn try_from(fanouts: Vec<u32>) -> Result<Self, String> {
        if fanouts.is_empty() || fanouts.len() > MAX_HOP_FANOUTS {
            return Err(format!(
                "{:?}: expected one to {MAX_HOP_FANOUTS} fanouts such as 20,10 or 15,10,5",
                fanouts_text(&fanouts)
            ));
        }
        Ok(HopFanouts(fanouts))
    }
}

impl std::str::FromStr for HopFanouts {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        fanouts_from_text(s)
            .ok_or_else(|| {
                format!(
                    "{s:?}: expected one to {MAX_HOP_FANOUTS} fanouts such as 20,10 or \
                     15,10,5 (-1: every neighbour)"
                )
            })?
            .try_into()
    }
}

impl Serialize for HopFanouts {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        write_fanout_list(&self.0, s)
    }
}

impl<'de> Deserialize<'de> for HopFanouts {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        fanout_list(d)?.try_into().map_err(serde::de::Error::custom)
    }
}

impl std::fmt::Display for HopFanouts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&fanouts_text(&self.0))
    }
}

/// The metadata name of the flags layer (how a value is recognised as
/// coming from the command line).
const FLAG_LAYER: &str = "command-line flag";

/// The flags given on the command line, as a figment provider: a struct
/// whose fields are the keys, serialised with the flags that were not given
/// left out.
struct Flags<'a, F>(&'a F);

impl<F: Serialize> Provider for Flags<'_, F> {
    fn metadata(&self) -> Metadata {
        Metadata::named(FLAG_LAYER)
            .interpolater(|_, keys| format!("--{}", keys.join(".").replace('_', "-")))
    }

    fn data(&self) -> Result<Map<Profile, Dict>, figment::Error> {
        Serialized::defaults(self.0).data()
    }
}

/// A loaded, validated configuration and the layers it came from.
#[derive(Debug)]
pub struct Layered<T> {
    pub value: T,
    figment: Figment,
    file: Option<FileText>,
    spec: Spec,
}

#[derive(Debug, Clone)]
struct FileText {
    path: PathBuf,
    text: String,
}

impl FileText {
    /// The 1-based line that sets top-level `key` (`key = ...`, or a
    /// `[key]` table header).
    fn line_of(&self, key: &str) -> Option<usize> {
        self.text
            .lines()
            .position(|line| {
                let line = line.trim_start();
                let rest = line
                    .strip_prefix(key)
                    .or_else(|| line.strip_prefix(&format!("\"{key}\"")))
                    .or_else(|| line.strip_prefix(&format!("'{key}'")));
                match rest {
                    Some(rest) => {
                        let rest = rest.trim_start();
                        rest.starts_with('=') || rest.starts_with('.')
                    }
                    None => line
                        .strip_prefix('[')
                        .and_then(|l| l.strip_prefix(key))
                        .is_some_and(|r| r.trim_start().starts_with(']')),
                }
            })
            .map(|i| i + 1)
    }

    fn line_of_offset(&self, offset: usize) -> usize {
        self.text[..offset.min(self.text.len())]
            .bytes()
            .filter(|&b| b == b'\n')
            .count()
            + 1
    }
}

/// The keys of `T`: the fields of its default value.
pub fn keys_of<T: Serialize + Default>() -> BTreeSet<String> {
    match serde_json::to_value(T::default()) {
        Ok(serde_json::Value::Object(map)) => map.keys().cloned().collect(),
        _ => BTreeSet::new(),
    }
}

fn unknown_key(spec: &Spec, known: &BTreeSet<String>, key: &str, source: Source) -> ConfigError {
    let closest = known
        .iter()
        .map(|k| (strsim::jaro_winkler(k, key), k))
        .filter(|(score, _)| *score > 0.8)
        .max_by(|a, b| a.0.total_cmp(&b.0))
        .map(|(_, k)| k);
    let fix = match (closest, &source) {
        (Some(k), Source::Env(_)) => {
            format!("did you mean {}? (keys: {})", spec.var_of(k), spec.docs)
        }
        (Some(k), _) => format!("did you mean `{k}`? (keys: {})", spec.docs),
        (None, _) => format!("remove it; the keys are listed in {}", spec.docs),
    };
    ConfigError::Key {
        key: key.to_string(),
        origin: source,
        problem: "unknown key".into(),
        fix,
    }
}

impl<T> Layered<T>
where
    T: Serialize + DeserializeOwned + Default + Validate,
{
    /// Loads `T` from its layers: `file` (if any), the environment
    /// variables of `spec`, and `flags` (a struct of the flags given, with
    /// absent ones skipped when serialised).
    pub fn load(
        spec: Spec,
        file: Option<&Path>,
        flags: &impl Serialize,
    ) -> Result<Self, ConfigError> {
        let env: Vec<(String, String)> = std::env::vars_os()
            .filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().unwrap_or_default())))
            .collect();
        Self::load_from(spec, file, &env, flags)
    }

    /// [`Layered::load`] for a daemon's command line: the file is the
    /// `--config` flag's, else the one `<PREFIX>CONFIG` names, else none.
    pub fn load_for_command(
        spec: Spec,
        config_flag: Option<&Path>,
        flags: &impl Serialize,
    ) -> Result<Self, ConfigError> {
        let file = config_flag
            .map(Path::to_path_buf)
            .or_else(|| std::env::var_os(spec.config_var()).map(PathBuf::from));
        Self::load(spec, file.as_deref(), flags)
    }

    /// [`Layered::load`] with the environment given (tests).
    pub fn load_from(
        spec: Spec,
        file: Option<&Path>,
        env: &[(String, String)],
        flags: &impl Serialize,
    ) -> Result<Self, ConfigError> {
        let known = keys_of::<T>();
        let config_var = spec.config_var();
        let mut figment = Figment::from(Serialized::defaults(T::default()));

        let file = match file {
            Some(path) => Some(read_file(spec, path, &known)?),
            None => None,
        };
        if let Some(file) = &file {
            figment = figment.merge(Toml::file(&file.path));
        }

        let mut env_keys = Vec::new();
        for (var, _) in env {
            let Some(rest) = var.strip_prefix(spec.env_prefix) else {
                continue;
            };
            if *var == config_var {
                continue;
            }
            let key = rest.to_ascii_lowercase();
            if !known.contains(&key) {
                return Err(unknown_key(&spec, &known, &key, Source::Env(var.clone())));
            }
            env_keys.push(key);
        }
        // Only the variables seen above (not figment's own reading of the
        // process environment), so tests can pass theirs.
        let env_map: Vec<(String, String)> = env
            .iter()
            .filter(|(var, _)| var.starts_with(spec.env_prefix) && *var != config_var)
            .cloned()
            .collect();
        figment = figment.merge(EnvList {
            prefix: spec.env_prefix,
            vars: env_map,
        });
        figment = figment.merge(Flags(flags));

        let layered = Layered {
            value: T::default(),
            figment,
            file,
            spec,
        };
        let value: T = layered
            .figment
            .extract()
            .map_err(|e| layered.type_error(e))?;
        let layered = Layered { value, ..layered };
        if let Err(invalid) = layered.value.validate() {
            return Err(layered.invalid(invalid));
        }
        Ok(layered)
    }

    /// Where the effective value of `key` came from.
    pub fn source_of(&self, key: &str) -> Source {
        match self.figment.find_metadata(key) {
            Some(metadata) => self.source_from(metadata, key),
            None => Source::Default,
        }
    }

    fn source_from(&self, metadata: &Metadata, key: &str) -> Source {
        if metadata.name == FLAG_LAYER {
            return Source::Flag(format!("--{}", key.replace('_', "-")));
        }
        if metadata.name.contains("environment variable") {
            return Source::Env(self.spec.var_of(key));
        }
        if let (Some(figment::Source::File(_)), Some(file)) = (&metadata.source, &self.file) {
            return Source::File {
                path: file.path.clone(),
                line: file.line_of(key),
            };
        }
        Source::Default
    }

    /// The error for a value [`Validate`] rejected, with its source.
    pub fn invalid(&self, invalid: Invalid) -> ConfigError {
        ConfigError::Key {
            key: invalid.key.to_string(),
            origin: self.source_of(invalid.key),
            problem: invalid.problem,
            fix: invalid.fix,
        }
    }

    fn type_error(&self, error: figment::Error) -> ConfigError {
        let key = error.path.first().cloned().unwrap_or_default();
        let source = error
            .metadata
            .as_ref()
            .map(|m| self.source_from(m, &key))
            .unwrap_or(Source::Default);
        let problem = match &error.kind {
            figment::error::Kind::InvalidType(actual, expected)
            | figment::error::Kind::InvalidValue(actual, expected) => {
                format!("{actual} is not {expected}")
            }
            other => other.to_string(),
        };
        ConfigError::Key {
            fix: format!(
                "give `{key}` a value of the documented type ({})",
                self.spec.docs
            ),
            key,
            origin: source,
            problem,
        }
    }

    /// The effective configuration as TOML, each key followed by a comment
    /// naming its source. `shown` is what to print (e.g. the value with
    /// secrets redacted).
    pub fn to_toml(&self, shown: &T) -> String {
        let text = toml::to_string(shown).unwrap_or_else(|e| format!("# cannot print: {e}\n"));
        let mut out = String::with_capacity(text.len() * 2);
        for line in text.lines() {
            out.push_str(line);
            if let Some((key, _)) = line.split_once(" = ") {
                let key = key.trim();
                if !key.starts_with('#') && !key.starts_with('[') {
                    out.push_str("  # ");
                    out.push_str(&self.source_of(key).to_string());
                }
            }
            out.push('\n');
        }
        // Keys without a value (unset options) are left out by TOML.
        out
    }
}

fn read_file(spec: Spec, path: &Path, known: &BTreeSet<String>) -> Result<FileText, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|e| ConfigError::File {
        path: path.to_path_buf(),
        line: None,
        problem: format!("cannot be read: {e}"),
        fix: format!(
            "check the path given with --config or {}",
            spec.config_var()
        ),
    })?;
    let file = FileText {
        path: path.to_path_buf(),
        text,
    };
    let table: toml::Table = toml::from_str(&file.text).map_err(|e| ConfigError::File {
        path: path.to_path_buf(),
        line: e.span().map(|span| file.line_of_offset(span.start)),
        problem: format!(
            "not valid TOML: {}",
            e.message().split_whitespace().collect::<Vec<_>>().join(" ")
        ),
        fix: "fix the syntax (key = value, strings in quotes)".into(),
    })?;
    for key in table.keys() {
        if !known.contains(key) {
            let source = Source::File {
                path: path.to_path_buf(),
                line: file.line_of(key),
            };
            return Err(unknown_key(&spec, known, key, source));
        }
    }
    Ok(file)
}

/// Environment variables as a figment provider, from a given list (figment's
/// `Env` reads the process environment itself).
struct EnvList {
    prefix: &'static str,
    vars: Vec<(String, String)>,
}

impl Provider for EnvList {
    fn metadata(&self) -> Metadata {
        Metadata::named(format!("`{}` environment variable(s)", self.prefix))
    }

    fn data(&self) -> Result<Map<Profile, Dict>, figment::Error> {
        let mut dict = Dict::new();
        for (var, value) in &self.vars {
            let key = var[self.prefix.len()..].to_ascii_lowercase();
            // The same value parsing as figment's Env provider (numbers,
            // booleans, arrays in brackets; anything else a string).
            let parsed: figment::value::Value =
                value.parse().unwrap_or_else(|_| value.as_str().into());
            dict.insert(key, parsed);
        }
        Ok(Profile::Default.collect(dict))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ring_spin_is_auto_or_bounded_microseconds_as_text_or_number() {
        assert_eq!("auto".parse::<RingSpin>(), Ok(RingSpin::Auto));
        assert_eq!(" AUTO ".parse::<RingSpin>(), Ok(RingSpin::Auto));
        assert_eq!("0".parse::<RingSpin>(), Ok(RingSpin::Micros(0)));
        assert_eq!("200".parse::<RingSpin>(), Ok(RingSpin::Micros(200)));
        let too_long = "1000001".parse::<RingSpin>().unwrap_err();
        assert!(too_long.contains("at most 1000000"), "{too_long}");
        let word = "fast".parse::<RingSpin>().unwrap_err();
        assert!(word.contains("expected auto"), "{word}");
        assert_eq!(RingSpin::default(), RingSpin::Auto);
        assert_eq!(
            RingSpin::Micros(200).fixed(),
            Some(std::time::Duration::from_micros(200))
        );
        assert_eq!(RingSpin::Auto.fixed(), None);

        #[derive(Debug, Deserialize, Serialize)]
        struct Keys {
            spin: RingSpin,
        }
        let read = |text: &str| toml::from_str::<Keys>(text).map(|k| k.spin);
        assert_eq!(read("spin = \"auto\"").unwrap(), RingSpin::Auto);
        assert_eq!(read("spin = 75").unwrap(), RingSpin::Micros(75));
        assert_eq!(read("spin = \"75\"").unwrap(), RingSpin::Micros(75));
        for bad in [
            "spin = -1",
            "spin = 2000000",
            "spin = 1.5",
            "spin = \"slow\"",
        ] {
            let err = read(bad).unwrap_err().to_string();
            assert!(err.contains("auto"), "{bad}: {err}");
        }
        // Written back as it is read.
        let shown = |spin| toml::to_string(&Keys { spin }).unwrap();
        assert_eq!(shown(RingSpin::Auto).trim(), "spin = \"auto\"");
        assert_eq!(shown(RingSpin::Micros(75)).trim(), "spin = 75");
    }

    #[test]
    fn fanouts_take_minus_one_for_every_neighbour() {
        let every = EVERY_NEIGHBOUR;
        assert_eq!("-1,10".parse::<Fanouts>(), Ok(Fanouts([every, 10])));
        assert_eq!("20, 10".parse::<Fanouts>(), Ok(Fanouts([20, 10])));
        for bad in ["-2,10", "20", "20,10,5", "a,b", "4294967295,1"] {
            let err = bad.parse::<Fanouts>().unwrap_err();
            assert!(err.contains("two fanouts"), "{bad}: {err}");
        }
        assert_eq!(Fanouts([every, 10]).at_caps([50, 50]), [50, 10]);
        assert_eq!(Fanouts([every, 10]).to_string(), "-1,10");
        let hops: HopFanouts = "15,-1,-1".parse().unwrap();
        assert_eq!(hops.0, [15, every, every]);
        assert_eq!(hops.at_caps(|hop| [40, 30][hop.min(1)]).0, [15, 30, 30]);
        assert_eq!(hops.to_string(), "15,-1,-1");
        assert!("".parse::<HopFanouts>().is_err());
        assert!("1,2,3,4".parse::<HopFanouts>().is_err());
        // Written back as -1, read again as every neighbour.
        let json = serde_json::to_string(&hops).unwrap();
        assert_eq!(json, "[15,-1,-1]");
        assert_eq!(serde_json::from_str::<HopFanouts>(&json).unwrap(), hops);
        assert_eq!(
            serde_json::from_str::<Fanouts>("\"-1,3\"").unwrap(),
            Fanouts([every, 3])
        );
        assert!(serde_json::from_str::<Fanouts>("[-3, 3]").is_err());
    }
    use serde::{Deserialize, Serialize};

    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
    #[serde(default, deny_unknown_fields)]
    struct Demo {
        slots: u32,
        name: String,
        ratio: f64,
        path: Option<PathBuf>,
    }

    impl Default for Demo {
        fn default() -> Self {
            Self {
                slots: 64,
                name: "ring".into(),
                ratio: 0.5,
                path: None,
            }
        }
    }

    impl Validate for Demo {
        fn validate(&self) -> Result<(), Invalid> {
            if self.slots == 0 || self.slots > 1024 {
                return Err(Invalid::new(
                    "slots",
                    format!("{} is outside 1..=1024", self.slots),
                    "set slots between 1 and 1024",
                ));
            }
            Ok(())
        }
    }

    #[derive(Debug, Default, Serialize)]
    struct DemoFlags {
        #[serde(skip_serializing_if = "Option::is_none")]
        slots: Option<u32>,
        #[serde(skip_serializing_if = "Option::is_none")]
        name: Option<String>,
    }

    const SPEC: Spec = Spec {
        env_prefix: "DEMO_",
        docs: "docs/configuration.md",
    };

    fn file(text: &str) -> tempfile::NamedTempFile {
        let f = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(f.path(), text).unwrap();
        f
    }

    fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn precedence_is_flags_then_environment_then_file_then_defaults() {
        let f = file("slots = 8\nname = \"from-file\"\nratio = 0.25\n");
        let flags = DemoFlags {
            slots: Some(32),
            name: None,
        };
        let vars = env(&[
            ("DEMO_SLOTS", "16"),
            ("DEMO_NAME", "from-env"),
            ("OTHER", "x"),
        ]);
        let loaded = Layered::<Demo>::load_from(SPEC, Some(f.path()), &vars, &flags).unwrap();
        assert_eq!(loaded.value.slots, 32);
        assert_eq!(loaded.value.name, "from-env");
        assert_eq!(loaded.value.ratio, 0.25);
        assert_eq!(loaded.value.path, None);
        assert_eq!(loaded.source_of("slots"), Source::Flag("--slots".into()));
        assert_eq!(loaded.source_of("name"), Source::Env("DEMO_NAME".into()));
        assert_eq!(
            loaded.source_of("ratio"),
            Source::File {
                path: f.path().to_path_buf(),
                line: Some(3)
            }
        );
        assert_eq!(loaded.source_of("path"), Source::Default);
        let printed = loaded.to_toml(&loaded.value);
        assert!(printed.contains("slots = 32  # flag --slots"), "{printed}");
        assert!(printed.contains("ratio = 0.25  # "), "{printed}");
    }

    #[test]
    fn unknown_keys_are_refused_with_their_source_and_a_suggestion() {
        let f = file("slots = 8\n\nslotz = 9\n");
        let e = Layered::<Demo>::load_from(SPEC, Some(f.path()), &[], &DemoFlags::default())
            .unwrap_err()
            .to_string();
        assert!(e.contains("`slotz`"), "{e}");
        assert!(e.contains(&format!("{}:3", f.path().display())), "{e}");
        assert!(e.contains("did you mean `slots`"), "{e}");

        let e = Layered::<Demo>::load_from(
            SPEC,
            None,
            &env(&[("DEMO_RATO", "1")]),
            &DemoFlags::default(),
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("environment variable DEMO_RATO"), "{e}");
        assert!(e.contains("did you mean DEMO_RATIO"), "{e}");
    }

    #[test]
    fn wrong_types_name_the_key_and_source() {
        let f = file("name = \"x\"\nslots = \"many\"\n");
        let e = Layered::<Demo>::load_from(SPEC, Some(f.path()), &[], &DemoFlags::default())
            .unwrap_err()
            .to_string();
        assert!(e.contains("`slots`"), "{e}");
        assert!(e.contains(&format!("{}:2", f.path().display())), "{e}");
        assert!(!e.contains('\n'), "one line: {e}");

        let e = Layered::<Demo>::load_from(
            SPEC,
            None,
            &env(&[("DEMO_SLOTS", "abc")]),
            &DemoFlags::default(),
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("`slots` from environment variable DEMO_SLOTS"),
            "{e}"
        );
    }

    #[test]
    fn out_of_range_values_name_their_source() {
        let f = file("slots = 0\n");
        let e = Layered::<Demo>::load_from(SPEC, Some(f.path()), &[], &DemoFlags::default())
            .unwrap_err()
            .to_string();
        assert_eq!(
            e,
            format!(
                "invalid configuration: `slots` from {}:1: 0 is outside 1..=1024; set slots between 1 and 1024",
                f.path().display()
            )
        );
        let flags = DemoFlags {
            slots: Some(5000),
            name: None,
        };
        let e = Layered::<Demo>::load_from(SPEC, None, &[], &flags)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("`slots` from flag --slots: 5000 is outside"),
            "{e}"
        );
    }

    #[test]
    fn unreadable_and_malformed_files_are_refused() {
        let e = Layered::<Demo>::load_from(
            SPEC,
            Some(Path::new("/nonexistent/demo.toml")),
            &[],
            &DemoFlags::default(),
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("/nonexistent/demo.toml: cannot be read"), "{e}");
        assert!(e.contains("DEMO_CONFIG"), "{e}");
        let f = file("slots = 8\nname = \n");
        let e = Layered::<Demo>::load_from(SPEC, Some(f.path()), &[], &DemoFlags::default())
            .unwrap_err()
            .to_string();
        assert!(e.contains(&format!("{}:2", f.path().display())), "{e}");
        assert!(!e.contains('\n'), "one line: {e}");
    }
}
