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
        // What moves on a commit, a checkout or a gc: HEAD, the branches' loose refs and the
        // packed refs (a worktree's HEAD lives in its own git dir, refs in the common one).
        let head_dir = dir.join(git(&dir, &["rev-parse", "--git-dir"])?);
        let common = dir.join(git(&dir, &["rev-parse", "--git-common-dir"])?);
        // Only paths that exist: Cargo reruns a script on every build while a path it watches
        // is missing. A branch is a line in packed-refs (as a fresh clone has it) until a commit
        // writes its loose file under refs/heads/, a directory Cargo scans file by file.
        let watch = |path: PathBuf| {
            if path.exists() {
                println!("cargo:rerun-if-changed={}", path.display());
            }
        };
        watch(head_dir.join("HEAD"));
        watch(common.join("packed-refs"));
        watch(common.join("refs").join("heads"));
        Some(commit)
    });
    let commit = commit.unwrap_or_else(|| {
        // Outside a checkout: nothing to watch but the variable.
        println!("cargo:rerun-if-changed=build.rs");
        "unknown".to_string()
    });
    println!("cargo:rustc-env=TOLLGATE_COMMIT={commit}");
}
