//! A `/metrics` scrape, parsed by a real exposition-format parser (`prometheus-parse`), and
//! Prometheus' own linter (`promtool check metrics`).

use std::collections::BTreeSet;
use std::io::Write;
use std::process::{Command, Stdio};

use prometheus_parse::{Scrape, Value};

pub const PROMETHEUS_INSTALL: &str =
    "Prometheus and promtool are needed: run scripts/setup.sh or `apt-get install -y prometheus`";

/// One scrape: the text and what the parser made of it.
pub struct Metrics {
    pub text: String,
    pub scrape: Scrape,
}

/// A scrape shows as its text (in a wait's "last value").
impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.text)
    }
}

impl Metrics {
    /// Parse `text`; every sample line must parse (the parser skips what it cannot read, so
    /// the lines are counted against the samples).
    pub fn parse(text: &str) -> Metrics {
        let scrape = Scrape::parse(text.lines().map(|l| Ok(l.to_string())))
            .unwrap_or_else(|e| panic!("/metrics does not parse: {e}\n{text}"));
        let lines = text
            .lines()
            .filter(|l| !l.trim().is_empty() && !l.starts_with('#'))
            .count();
        let parsed: usize = scrape
            .samples
            .iter()
            .map(|s| match &s.value {
                Value::Histogram(b) => b.len(),
                _ => 1,
            })
            .sum();
        assert_eq!(
            parsed, lines,
            "every sample line of /metrics parses:\n{text}"
        );
        Metrics {
            text: text.to_string(),
            scrape,
        }
    }

    /// Samples of `name` whose labels include every pair of `labels`.
    fn matching<'a>(
        &'a self,
        name: &'a str,
        labels: &'a [(&'a str, &'a str)],
    ) -> impl Iterator<Item = &'a prometheus_parse::Sample> + 'a {
        self.scrape.samples.iter().filter(move |s| {
            s.metric == name && labels.iter().all(|(k, v)| s.labels.get(k) == Some(*v))
        })
    }

    /// The value of the one sample of counter, gauge or untyped `name` with `labels`.
    pub fn value(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        let found: Vec<_> = self.matching(name, labels).collect();
        assert_eq!(
            found.len(),
            1,
            "one sample {name}{labels:?}, found {found:?}"
        );
        match found[0].value {
            Value::Counter(v) | Value::Gauge(v) | Value::Untyped(v) => v,
            ref other => panic!("{name}{labels:?} is not a single value: {other:?}"),
        }
    }

    /// The sum of every sample of `name` with `labels`; 0 when there is none.
    pub fn sum(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.matching(name, labels)
            .map(|s| match s.value {
                Value::Counter(v) | Value::Gauge(v) | Value::Untyped(v) => v,
                ref other => panic!("{name} is not a single value: {other:?}"),
            })
            .sum()
    }

    /// The count (the `+Inf` bucket) of the one histogram `name` with `labels`; its
    /// `_count` sample must agree.
    pub fn histogram_count(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        let found: Vec<_> = self.matching(name, labels).collect();
        assert_eq!(
            found.len(),
            1,
            "one histogram {name}{labels:?}, found {found:?}"
        );
        let Value::Histogram(buckets) = &found[0].value else {
            panic!("{name} is not a histogram: {:?}", found[0]);
        };
        let inf = buckets
            .iter()
            .find(|b| b.less_than.is_infinite())
            .expect("a +Inf bucket")
            .count;
        assert_eq!(
            self.value(&format!("{name}_count"), labels),
            inf,
            "{name}_count"
        );
        inf
    }

    /// Every metric name the scrape has, as PromQL sees them: counters and gauges by name,
    /// histograms as `_bucket`, `_sum` and `_count`.
    pub fn names(&self) -> BTreeSet<String> {
        let mut out = BTreeSet::new();
        for s in &self.scrape.samples {
            match s.value {
                Value::Histogram(_) => {
                    for suffix in ["_bucket", "_sum", "_count"] {
                        out.insert(format!("{}{suffix}", s.metric));
                    }
                }
                _ => {
                    out.insert(s.metric.clone());
                }
            }
        }
        out
    }

    /// Every label value of every sample.
    pub fn label_values(&self) -> Vec<String> {
        self.scrape
            .samples
            .iter()
            .flat_map(|s| s.labels.values().cloned().collect::<Vec<_>>())
            .collect()
    }
}

/// Run `promtool` with `args` and `stdin`: (success, stdout + stderr). A missing promtool fails
/// the test naming what to install.
pub fn promtool(args: &[&str], stdin: &str) -> (bool, String) {
    let mut child = Command::new("promtool")
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run promtool: {e}. {PROMETHEUS_INSTALL}"));
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(stdin.as_bytes())
        .expect("write promtool's stdin");
    let out = child.wait_with_output().expect("promtool ran");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}
