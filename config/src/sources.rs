//! Where settings come from: the process's `GGML_VIZ_*` variables (which need not be UTF-8), the
//! CLI's overrides and the config file's name, and the variables that look like a mistyped
//! setting's.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::PathBuf;

use serde_json::{Map, Value};

use crate::settings::{CONFIG_FILE_ENV, read_variables};

/// The raw inputs: environment variables, the CLI's overrides and config file.
#[derive(Clone, Debug, Default)]
pub struct Sources {
    pub env: BTreeMap<String, String>,
    /// `--config FILE`; outranks `GGML_VIZ_CONFIG`.
    pub config_file: Option<PathBuf>,
    /// The CLI's flags, as a JSON object of setting names.
    pub overrides: Map<String, Value>,
    /// `GGML_VIZ_*` variables whose values are not UTF-8: [`Config::load`](crate::Config::load) says so.
    pub not_text: Vec<String>,
}

impl Sources {
    /// The `GGML_VIZ_*` variables of this process, its overrides and config file.
    pub fn from_process_env() -> Sources {
        Sources::from_os_pairs(std::env::vars_os())
    }

    /// The `GGML_VIZ_*` variables among `vars`, which need not be UTF-8: the host's own
    /// variables are none of ours (`std::env::vars` would panic on one that is not), and one of
    /// ours that is not is kept out and said by [`Config::load`](crate::Config::load).
    pub fn from_os_pairs(vars: impl IntoIterator<Item = (OsString, OsString)>) -> Sources {
        let mut not_text = Vec::new();
        let mut ours = Vec::new();
        for (key, value) in vars {
            let Some(key) = key.to_str().filter(|k| k.starts_with("GGML_VIZ_")) else {
                continue;
            };
            match value.into_string() {
                Ok(value) => ours.push((key.to_string(), value)),
                Err(_) => not_text.push(key.to_string()),
            }
        }
        Sources {
            not_text,
            ..Sources::from_pairs(ours)
        }
    }

    /// The `GGML_VIZ_*` variables here that are no setting's but look like one's mistyped
    /// (`GGML_VIZ_FLUSH_INTERVAL_MS`), each with that setting's variable, in name order: they
    /// are ignored, which a user should hear. Variables far from every setting (this project's
    /// own scripts set several) are not named.
    pub fn misspelt(&self) -> Vec<(&str, &'static str)> {
        self.env
            .keys()
            .filter(|var| read_variables().all(|(_, env)| env != var.as_str()))
            .filter_map(|var| {
                read_variables()
                    .filter_map(|(_, known)| Some((looks_like(var, known)?, known)))
                    .min()
                    .map(|(_, known)| (var.as_str(), known))
            })
            .collect()
    }

    /// Sources from environment-like pairs (`GGML_VIZ_OVERRIDES` and `GGML_VIZ_CONFIG` included).
    pub fn from_pairs<K: Into<String>, V: Into<String>>(
        pairs: impl IntoIterator<Item = (K, V)>,
    ) -> Sources {
        let env: BTreeMap<String, String> = pairs
            .into_iter()
            .map(|(k, v)| (k.into(), v.into()))
            .collect();
        Sources {
            config_file: env.get(CONFIG_FILE_ENV).map(PathBuf::from),
            env,
            overrides: Map::new(),
            not_text: Vec::new(),
        }
    }
}

/// How far `var` is from the variable `known` (edits), where it looks like a mistyped `known`:
/// within two edits of it, or it with a short suffix added or taken off (`_MS`, `S`).
fn looks_like(var: &str, known: &str) -> Option<usize> {
    let (var, known) = (
        var.strip_prefix("GGML_VIZ_")?.as_bytes(),
        known.strip_prefix("GGML_VIZ_")?.as_bytes(),
    );
    let (short, long) = if var.len() < known.len() {
        (var, known)
    } else {
        (known, var)
    };
    if short.len() < 4 {
        return None;
    }
    // At least this many edits; exactly this many when `long` is `short` with a suffix added.
    let apart = long.len() - short.len();
    let suffixed = long.starts_with(short) && apart <= 3;
    if suffixed {
        return Some(apart);
    }
    // The hook checks every `GGML_VIZ_*` variable that is no setting's against every setting
    // when it starts: only those of about the same length need the distance.
    (apart <= 2).then(|| edits_within(var, known, 2)).flatten()
}

/// The Levenshtein distance of `a` and `b` if it is at most `most`.
fn edits_within(a: &[u8], b: &[u8], most: usize) -> Option<usize> {
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, &x) in a.iter().enumerate() {
        let mut diagonal = row[0];
        row[0] = i + 1;
        for (j, &y) in b.iter().enumerate() {
            let above = row[j + 1];
            row[j + 1] = (above + 1)
                .min(row[j] + 1)
                .min(diagonal + usize::from(x != y));
            diagonal = above;
        }
        // A row's least value never falls in the rows below it: once past `most`, so is the
        // distance.
        if row.iter().all(|&d| d > most) {
            return None;
        }
    }
    Some(row[b.len()]).filter(|&d| d <= most)
}
