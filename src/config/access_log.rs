//! `access_log`: one line per request, in text or JSON, to standard output or a file, written
//! off the request path by its own thread.

use std::path::PathBuf;

use super::errors::{words, Errors};
use super::{defaults, raw};

words! {
    /// How an access-log line is written.
    pub enum AccessLogFormat ("an access-log format") {
        /// `key=value` pairs (logfmt).
        Text = "text",
        /// One JSON object per line.
        Json = "json",
    }
}

/// `access_log`. `path` and `buffer` take effect on restart; the rest reloads.
#[derive(Debug, Clone, PartialEq)]
pub struct AccessLogSettings {
    pub enabled: bool,
    pub format: AccessLogFormat,
    /// `None`: standard output.
    pub path: Option<PathBuf>,
    /// The fraction of requests logged.
    pub sample: f64,
    /// Lines waiting for the writer at most.
    pub buffer: usize,
}

pub(super) fn validate(errs: &mut Errors, r: raw::AccessLog, json_logs: bool) -> AccessLogSettings {
    let default_format = if json_logs {
        AccessLogFormat::Json
    } else {
        AccessLogFormat::Text
    };
    let format = r
        .format
        .and_then(|f| errs.word("access_log.format", &f))
        .unwrap_or(default_format);
    let sample = match r.sample {
        Some(s) if errs.fraction("access_log.sample", s, "") => s,
        _ => defaults::ACCESS_LOG_SAMPLE,
    };
    let buffer = r.buffer.map_or(defaults::ACCESS_LOG_BUFFER, |b| {
        errs.at_least_one("access_log.buffer", b, defaults::ACCESS_LOG_BUFFER)
    });
    let path = r.path.map(|p| {
        if p.is_empty() {
            errs.at(
                "access_log.path",
                "empty: leave it out to log to standard output",
            );
        }
        PathBuf::from(p)
    });
    AccessLogSettings {
        enabled: r.enabled.unwrap_or(defaults::ACCESS_LOG_ENABLED),
        format,
        path,
        sample,
        buffer,
    }
}
