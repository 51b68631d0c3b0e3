//! Collecting validation errors: each one prefixed with the file and the field path
//! (`gateway.yaml: routes[0].limits[0].window: "1x" is not a duration`), reported in file order.
//!
//! Phase: startup and reload only.

use std::fmt::Display;
use std::str::FromStr;
use std::time::Duration;

use serde::de::DeserializeOwned;
use serde_yaml::Value;

use super::raw;

/// Every error found in one file, each already prefixed with the file and the field path.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}", .0.join("\n"))]
pub struct ConfigErrors(pub Vec<String>);

/// The errors of one file, as they are found.
pub(super) struct Errors {
    file: String,
    /// Each error with its place in the file: (section, element index).
    list: Vec<((i32, usize), String)>,
}

/// Where an error sorts: root errors and unknown sections first, then the sections in their
/// documented order, then the element index (`routes[3]` after `routes[1]`).
fn place(path: &str) -> (i32, usize) {
    let section_end = path.find(['.', '[']).unwrap_or(path.len());
    let section = match &path[..section_end] {
        "--listen" | "--admin-listen" => "server",
        "--redis-url" => "store",
        other => other,
    };
    let Some(i) = raw::SECTIONS.iter().position(|s| *s == section) else {
        return (-1, 0);
    };
    let index = path[section_end..]
        .strip_prefix('[')
        .and_then(|r| r.split(']').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    (i as i32, index)
}

impl Errors {
    pub(super) fn new(file: &str) -> Errors {
        Errors {
            file: file.to_string(),
            list: Vec::new(),
        }
    }

    /// Report `msg` at the field `path` (empty: the whole file). A URL in the message (serde
    /// quotes the value it refused) is shown without its secrets ([`crate::redact::urls_in`]).
    pub(super) fn at(&mut self, path: &str, msg: impl Display) {
        let msg = msg.to_string();
        let msg = crate::redact::urls_in(&msg);
        let line = if path.is_empty() {
            format!("{}: {msg}", self.file)
        } else {
            format!("{}: {path}: {msg}", self.file)
        };
        self.list.push((place(path), line));
    }

    /// Errors so far.
    pub(super) fn count(&self) -> usize {
        self.list.len()
    }

    /// Every error, in file order; `Ok` when there are none.
    pub(super) fn finish(mut self) -> Result<(), ConfigErrors> {
        if self.list.is_empty() {
            return Ok(());
        }
        self.list.sort_by_key(|(p, _)| *p);
        Err(ConfigErrors(
            self.list.into_iter().map(|(_, l)| l).collect(),
        ))
    }

    /// A mapping section as `(name, value)` pairs in file order.
    pub(super) fn entries(&mut self, path: &str, value: Value) -> Vec<(String, Value)> {
        match value {
            Value::Mapping(m) => m
                .into_iter()
                .filter_map(|(k, v)| match k {
                    Value::String(name) => Some((name, v)),
                    other => {
                        self.at(path, format!("names must be strings, found {other:?}"));
                        None
                    }
                })
                .collect(),
            _ => {
                self.at(path, "must be a mapping of names to values");
                Vec::new()
            }
        }
    }

    /// Deserialize `value` as `T`, reporting a structural error at `path` (plus the path
    /// inside `value` where serde stopped).
    pub(super) fn parse<T: DeserializeOwned>(&mut self, path: &str, value: Value) -> Option<T> {
        match serde_path_to_error::deserialize::<_, T>(value) {
            Ok(v) => Some(v),
            Err(e) => {
                let inner = e.path().to_string();
                let full = join_path(path, if inner == "." { "" } else { &inner });
                let msg = e.into_inner().to_string();
                self.at(&full, clean_serde_message(&msg));
                None
            }
        }
    }

    /// A word setting (`on_error: deny`, `algorithm: gcra`) through its `FromStr`, whose error
    /// says what was expected.
    pub(super) fn word<T>(&mut self, path: &str, s: &str) -> Option<T>
    where
        T: FromStr,
        T::Err: Display,
    {
        s.parse().map_err(|e| self.at(path, e)).ok()
    }

    /// A duration setting: `500ms`, `30s`, `1m`, `1h`, `1d` (and compounds such as `1m30s`).
    pub(super) fn duration(&mut self, path: &str, s: &str) -> Option<Duration> {
        humantime::parse_duration(s)
            .map_err(|_| {
                self.at(
                    path,
                    format!("{s:?} is not a duration (examples: 500ms, 30s, 1m, 1h, 1d)"),
                )
            })
            .ok()
    }

    /// A whole number setting that must be at least 1; `default` stands in when it is not.
    pub(super) fn at_least_one<N: PartialEq + From<u8>>(
        &mut self,
        path: &str,
        n: N,
        default: N,
    ) -> N {
        if n == N::from(0) {
            self.at(path, "must be at least 1");
            return default;
        }
        n
    }

    /// A fraction setting in (0, 1].
    pub(super) fn fraction(&mut self, path: &str, v: f64, note: &str) -> bool {
        let ok = v > 0.0 && v <= 1.0;
        if !ok {
            self.at(
                path,
                format!("{v} must be greater than 0 and at most 1{note}"),
            );
        }
        ok
    }
}

/// The value of the environment variable `var`, which must be set and not empty; `what` says
/// what it must hold. Reported at `path` otherwise.
pub(super) fn secret_from_env(
    errs: &mut Errors,
    path: &str,
    var: &str,
    what: &str,
) -> Option<String> {
    match std::env::var(var) {
        Ok(secret) if !secret.is_empty() => Some(secret),
        other => {
            let state = if other.is_ok() {
                "is empty"
            } else {
                "is not set"
            };
            errs.at(
                path,
                format!("environment variable {var} {state} (it must hold {what})"),
            );
            None
        }
    }
}

fn join_path(outer: &str, inner: &str) -> String {
    match (outer.is_empty(), inner.is_empty()) {
        (_, true) => outer.to_string(),
        (true, false) => inner.to_string(),
        (false, false) if inner.starts_with('[') => format!("{outer}{inner}"),
        (false, false) => format!("{outer}.{inner}"),
    }
}

/// serde_yaml puts the error's own position (" at line L column C") into its message; the
/// field path (or the prefix we add) already says where, so drop that one position and keep
/// any other ("while parsing a flow mapping at line 3 column 5").
pub(super) fn clean_serde_message(msg: &str) -> String {
    let Some(i) = msg.find(" at line ") else {
        return msg.to_string();
    };
    let rest = &msg[i + " at line ".len()..];
    let digits = |s: &str| s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let line_len = digits(rest);
    let Some(after_line) = rest[line_len..].strip_prefix(" column ") else {
        return msg.to_string();
    };
    let col_len = digits(after_line);
    let end = i + " at line ".len() + line_len + " column ".len() + col_len;
    format!("{}{}", &msg[..i], &msg[end..])
}

/// A name a config entry may have: letters, digits, `_ - .`.
pub(super) fn is_name(s: &str) -> bool {
    !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
}

/// Report `name` at `path` unless it [`is_name`].
pub(super) fn check_name(errs: &mut Errors, path: &str, name: &str) {
    if !is_name(name) {
        errs.at(
            path,
            format!("{name:?} must be non-empty and use only letters, digits, '_', '-', '.'"),
        );
    }
}

/// The error of a word setting that is not one of its words.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{got:?} is not {what} ({})", .expected.join(", "))]
pub struct WordError {
    pub got: String,
    /// With its article: "a failure policy".
    pub what: &'static str,
    pub expected: &'static [&'static str],
}

/// An enum of settings written as words: `ALL`, `as_str`, `Display` and a `FromStr` whose
/// error lists the words.
macro_rules! words {
    ($(#[$meta:meta])* pub enum $name:ident ($what:literal) {
        $($(#[$vmeta:meta])* $variant:ident = $word:literal),+ $(,)?
    }) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum $name { $($(#[$vmeta])* $variant),+ }

        impl $name {
            /// Every value, in the order the docs list them.
            pub const ALL: &'static [$name] = &[$($name::$variant),+];
            const WORDS: &'static [&'static str] = &[$($word),+];

            /// The word for it in `gateway.yaml`.
            pub fn as_str(self) -> &'static str {
                match self { $($name::$variant => $word),+ }
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl std::str::FromStr for $name {
            type Err = $crate::config::WordError;
            fn from_str(s: &str) -> Result<Self, Self::Err> {
                match s {
                    $($word => Ok($name::$variant),)+
                    _ => Err($crate::config::WordError {
                        got: s.to_string(),
                        what: $what,
                        expected: $name::WORDS,
                    }),
                }
            }
        }
    };
}
pub(crate) use words;
