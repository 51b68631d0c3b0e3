//! Where the upgrade socket is. A `--upgrade` process binds it and the running gateway, on
//! SIGQUIT, hands its listening sockets (proxy and admin) to whatever is bound there; so the
//! default is in a directory only the gateway's user may enter: `$XDG_RUNTIME_DIR/tollgate`,
//! `/run/tollgate` when run as root, or else `tollgate-<uid>` in the temp directory. The
//! directory is made mode 0700 and checked at start (a directory, not a symbolic link, owned by
//! this user, writable by nobody else); a gateway whose default directory fails the check does
//! not start. Pingora (patched, `patches/README.md`) binds the socket 0600 and, on both sides,
//! exchanges nothing with a process of another uid, wherever the socket is.
//!
//! Phase: startup. Nothing here runs per request.

use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::{Path, PathBuf};

use crate::config::ServerSettings;

/// The upgrade socket's directory cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum UpgradeDirError {
    #[error("cannot create {dir}, the upgrade socket's directory: {source} (or set server.upgrade_sock to a path in a directory only this user may write to)")]
    Create {
        dir: PathBuf,
        source: std::io::Error,
    },
    #[error("{dir}, the upgrade socket's directory, is not private: {why}; remove it (it is made again, mode 0700) or set server.upgrade_sock to a path in a directory only this user may write to")]
    NotPrivate { dir: PathBuf, why: String },
}

/// The effective uid of this process.
fn own_uid() -> u32 {
    nix::unistd::geteuid().as_raw()
}

/// The default directory of the upgrade socket, for a process of `uid`: `$XDG_RUNTIME_DIR`
/// (`runtime`) when set, else `/run` for root, else the temp directory (`tmp`) with the uid.
pub fn default_dir_for(runtime: Option<&Path>, uid: u32, tmp: &Path) -> PathBuf {
    match runtime.filter(|d| d.is_absolute()) {
        Some(d) => d.join("tollgate"),
        None if uid == 0 => PathBuf::from("/run/tollgate"),
        None => tmp.join(format!("tollgate-{uid}")),
    }
}

/// The default directory of the upgrade socket for this process.
pub fn default_dir() -> PathBuf {
    let runtime = std::env::var_os("XDG_RUNTIME_DIR")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from);
    default_dir_for(runtime.as_deref(), own_uid(), &std::env::temp_dir())
}

/// The socket an upgrading process takes the listening sockets over through: the configured
/// one, or one per proxy port in [`default_dir`], so two gateways on one host never share it.
pub fn sock_path(s: &ServerSettings) -> PathBuf {
    s.upgrade_sock
        .clone()
        .unwrap_or_else(|| default_dir().join(format!("upgrade-{}.sock", s.listen.port())))
}

/// Make the default directory (mode 0700) unless it exists, and check that it is private. A
/// configured `server.upgrade_sock` is used as it is (the peer checks still hold there), with a
/// warning when others may write to its directory.
pub fn prepare(s: &ServerSettings) -> Result<(), UpgradeDirError> {
    if let Some(sock) = &s.upgrade_sock {
        if let Some(dir) = sock.parent() {
            if let Err(UpgradeDirError::NotPrivate { why, .. }) = check_private(dir, own_uid()) {
                tracing::warn!(
                    "server.upgrade_sock {}: its directory is not private ({why}); another user \
                     may bind the path first, and the upgrade then fails (no listening socket is \
                     handed to another user): use a directory only this user may write to",
                    sock.display()
                );
            }
        }
        return Ok(());
    }
    let dir = default_dir();
    match std::fs::DirBuilder::new().mode(0o700).create(&dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(source) => return Err(UpgradeDirError::Create { dir, source }),
    }
    check_private(&dir, own_uid())
}

/// `dir` is a directory (not a symbolic link), owned by `uid`, that no one else may write to
/// (so no one else can bind, remove or replace a socket in it). It is made 0700; an existing
/// one may let others read it (0755).
pub fn check_private(dir: &Path, uid: u32) -> Result<(), UpgradeDirError> {
    let not_private = |why: String| UpgradeDirError::NotPrivate {
        dir: dir.to_path_buf(),
        why,
    };
    let meta = std::fs::symlink_metadata(dir).map_err(|e| not_private(e.to_string()))?;
    if meta.file_type().is_symlink() {
        return Err(not_private("it is a symbolic link".into()));
    }
    if !meta.is_dir() {
        return Err(not_private("it is not a directory".into()));
    }
    if meta.uid() != uid {
        return Err(not_private(format!(
            "it is owned by uid {}, not by this gateway's uid {uid}",
            meta.uid()
        )));
    }
    let mode = meta.mode() & 0o7777;
    if mode & 0o022 != 0 {
        return Err(not_private(format!(
            "its mode is {mode:04o}; only its owner may write to it (0700 or 0755)"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn the_default_directory_is_the_runtime_one_or_run_or_a_per_uid_one() {
        let tmp = Path::new("/tmp");
        let run = Some(Path::new("/run/user/1000"));
        assert_eq!(
            default_dir_for(run, 1000, tmp),
            Path::new("/run/user/1000/tollgate")
        );
        assert_eq!(default_dir_for(None, 0, tmp), Path::new("/run/tollgate"));
        assert_eq!(
            default_dir_for(None, 1000, tmp),
            Path::new("/tmp/tollgate-1000")
        );
        // A relative XDG_RUNTIME_DIR is ignored, as the spec says.
        let relative = Some(Path::new("run/user"));
        assert_eq!(
            default_dir_for(relative, 1000, tmp),
            Path::new("/tmp/tollgate-1000")
        );
    }

    #[test]
    fn only_a_directory_of_ours_closed_to_others_is_private() {
        let t = tempfile::tempdir().expect("temp dir");
        let uid = std::fs::metadata(t.path()).expect("stat").uid();
        let dir = t.path().join("d");
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&dir)
            .expect("mkdir");
        check_private(&dir, uid).expect("0700 and ours");
        let err = check_private(&dir, uid + 1).unwrap_err().to_string();
        assert!(
            err.contains(&format!(
                "owned by uid {uid}, not by this gateway's uid {}",
                uid + 1
            )),
            "{err}"
        );
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        check_private(&dir, uid).expect("others may read, not write");
        for mode in [0o775, 0o757, 0o1777] {
            std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(mode)).expect("chmod");
            let err = check_private(&dir, uid).unwrap_err().to_string();
            assert!(err.contains(&format!("its mode is {mode:04o}")), "{err}");
        }
        let link = t.path().join("link");
        std::os::unix::fs::symlink(&dir, &link).expect("symlink");
        let err = check_private(&link, uid).unwrap_err().to_string();
        assert!(err.contains("is a symbolic link"), "{err}");
        let file = t.path().join("f");
        std::fs::write(&file, b"").expect("file");
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).expect("chmod");
        let err = check_private(&file, uid).unwrap_err().to_string();
        assert!(err.contains("not a directory"), "{err}");
    }
}
