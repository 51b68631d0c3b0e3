//! Build script: the commit the binary is built from, for `tollgate --version`.
//!
//! `TOLLGATE_COMMIT` from the environment wins (the container build passes it, since its
//! context holds no `.git`); otherwise `git rev-parse --short=7 HEAD` in this checkout; otherwise
//! `unknown`. Cargo runs this again when HEAD or the branch it names moves, so an incremental
//! build right after a commit reports the new commit.

use std::path::{Path, PathBuf};
use std::process::Command;

fn git(dir: &Path, args: &[&str]) -> Option<String> {
    let out = Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(args)
        .output()
        .ok()?;
    let text = String::from_utf8(out.stdout).ok()?;
    (out.status.success() && !text.trim().is_empty()).then(|| text.trim().to_string())
}

fn main() {
    println!("cargo:rerun-if-env-changed=TOLLGATE_COMMIT");
    let dir = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").expect("CARGO_MANIFEST_DIR"));
    let from_env = std::env::var("TOLLGATE_COMMIT")
        .ok()
        .filter(|c| !c.is_empty());
    let commit = from_env.or_else(|| {
        let commit = git(&dir, &["rev-parse", "--short=7", "HEAD"])?;
        // What moves on a commit, a checkout or a gc: HEAD, the branch's loose ref and the
        // packed refs (a worktree's HEAD lives in its own git dir, refs in the common one).
        let head_dir = dir.join(git(&dir, &["rev-parse", "--git-dir"])?);
        let common = dir.join(git(&dir, &["rev-parse", "--git-common-dir"])?);
        println!("cargo:rerun-if-changed={}", head_dir.join("HEAD").display());
        println!(
            "cargo:rerun-if-changed={}",
            common.join("packed-refs").display()
        );
        if let Some(branch) = git(&dir, &["symbolic-ref", "-q", "HEAD"]) {
            println!("cargo:rerun-if-changed={}", common.join(branch).display());
        }
        Some(commit)
    });
    let commit = commit.unwrap_or_else(|| {
        // Outside a checkout: nothing to watch but the variable.
        println!("cargo:rerun-if-changed=build.rs");
        "unknown".to_string()
    });
    println!("cargo:rustc-env=TOLLGATE_COMMIT={commit}");
}
