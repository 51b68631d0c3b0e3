//! Headless Chromium (Debian's `chromium`): a page's DOM after its scripts ran, and a
//! screenshot of it.

use std::path::Path;
use std::process::Command;

const INSTALL: &str =
    "Chromium is needed for the live-page tests: run scripts/setup.sh or `apt-get install -y chromium`";

/// Chromium with a fresh profile and everything that would reach the network switched off;
/// virtual time lets the page's timers run `budget_ms` before the result is taken.
fn chromium(profile: &Path, budget_ms: u64) -> Command {
    let mut cmd = Command::new("chromium");
    cmd.args([
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-first-run",
        "--hide-scrollbars",
        "--window-size=1280,1000",
    ])
    .arg(format!("--user-data-dir={}", profile.display()))
    .arg(format!("--virtual-time-budget={budget_ms}"));
    cmd
}

fn run(mut cmd: Command, what: &str) -> std::process::Output {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot run chromium: {e}. {INSTALL}"));
    assert!(
        out.status.success(),
        "chromium {what} failed: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// The DOM of `url` once its scripts had `budget_ms` of (virtual) time.
pub fn dump_dom(url: &str, budget_ms: u64) -> String {
    let profile = tempfile::tempdir().expect("profile dir");
    let mut cmd = chromium(profile.path(), budget_ms);
    cmd.arg("--dump-dom").arg(url);
    String::from_utf8_lossy(&run(cmd, "--dump-dom").stdout).into_owned()
}

/// A PNG screenshot of `url` after `budget_ms`, written to `out`; its size in bytes.
pub fn screenshot(url: &str, budget_ms: u64, out: &Path) -> u64 {
    let profile = tempfile::tempdir().expect("profile dir");
    let mut cmd = chromium(profile.path(), budget_ms);
    cmd.arg(format!("--screenshot={}", out.display())).arg(url);
    run(cmd, "--screenshot");
    std::fs::metadata(out)
        .unwrap_or_else(|e| panic!("no screenshot at {}: {e}", out.display()))
        .len()
}
