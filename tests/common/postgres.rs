//! A real PostgreSQL server for the quota tests: `initdb` into a temp directory and `postgres`
//! on a free loopback port, each test its own. PostgreSQL refuses to run as root, so when the
//! tests run as root the server runs as the `postgres` user (created by Debian's package), with
//! the directory handed to it. Killed by PID when the guard drops. A missing PostgreSQL fails
//! the test naming what to install.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use tempfile::TempDir;

use super::process::{free_port, Proc};
use super::wait::eventually;

const INSTALL: &str =
    "PostgreSQL is needed: run scripts/setup.sh or `apt-get install -y postgresql`";

/// The directory of PostgreSQL's server programs (`initdb`, `postgres`).
fn bin_dir() -> PathBuf {
    let versions = std::fs::read_dir("/usr/lib/postgresql")
        .unwrap_or_else(|e| panic!("no /usr/lib/postgresql ({e}). {INSTALL}"));
    let mut dirs: Vec<PathBuf> = versions
        .filter_map(|e| e.ok())
        .map(|e| e.path().join("bin"))
        .filter(|p| p.join("postgres").exists())
        .collect();
    dirs.sort();
    dirs.pop()
        .unwrap_or_else(|| panic!("no PostgreSQL server under /usr/lib/postgresql. {INSTALL}"))
}

/// `(uid, gid)` to run the server as: the `postgres` user when this process is root.
fn server_user() -> Option<(u32, u32)> {
    let me = Command::new("id").arg("-u").output().expect("run id");
    if String::from_utf8_lossy(&me.stdout).trim() != "0" {
        return None;
    }
    let id = |flag: &str| -> u32 {
        let out = Command::new("id")
            .args([flag, "postgres"])
            .output()
            .expect("run id");
        assert!(
            out.status.success(),
            "no postgres user to run PostgreSQL as. {INSTALL}"
        );
        String::from_utf8_lossy(&out.stdout)
            .trim()
            .parse()
            .expect("a number")
    };
    Some((id("-u"), id("-g")))
}

/// A command for PostgreSQL's `program`, as the server user.
fn command(program: &Path, user: Option<(u32, u32)>) -> Command {
    match user {
        None => Command::new(program),
        Some((uid, gid)) => {
            let mut c = Command::new("setpriv");
            c.args([
                format!("--reuid={uid}"),
                format!("--regid={gid}"),
                "--clear-groups".to_string(),
                "--".to_string(),
            ])
            .arg(program);
            c
        }
    }
}

/// One PostgreSQL server.
pub struct Postgres {
    pub port: u16,
    dir: TempDir,
    proc: Option<Proc>,
    user: Option<(u32, u32)>,
}

impl Postgres {
    pub fn start() -> Postgres {
        let dir = tempfile::tempdir().expect("tempdir");
        let user = server_user();
        if let Some((uid, gid)) = user {
            std::os::unix::fs::chown(dir.path(), Some(uid), Some(gid)).expect("chown the data dir");
        }
        let data = dir.path().join("data");
        let out = command(&bin_dir().join("initdb"), user)
            .args([
                "-D",
                &data.display().to_string(),
                "-U",
                "tollgate",
                "-A",
                "trust",
            ])
            .args(["--no-sync", "-E", "UTF8", "--locale", "C"])
            .output()
            .unwrap_or_else(|e| panic!("cannot run initdb: {e}. {INSTALL}"));
        assert!(
            out.status.success(),
            "initdb failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let mut pg = Postgres {
            port: free_port(),
            dir,
            proc: None,
            user,
        };
        pg.spawn();
        pg
    }

    fn spawn(&mut self) {
        let mut cmd = command(&bin_dir().join("postgres"), self.user);
        cmd.args(["-D", &self.dir.path().join("data").display().to_string()])
            .args([
                "-p",
                &self.port.to_string(),
                "-k",
                &self.dir.path().display().to_string(),
            ])
            .args(["-c", "listen_addresses=127.0.0.1", "-c", "fsync=off"]);
        self.proc = Some(Proc::spawn(
            &format!("postgres :{}", self.port),
            cmd,
            INSTALL,
        ));
        let addr = std::net::SocketAddr::from(([127, 0, 0, 1], self.port));
        eventually(
            format!("PostgreSQL on port {} accepts connections", self.port),
            Duration::from_secs(30),
        )
        .holds_blocking(|| {
            std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok()
        });
    }

    /// `postgres://tollgate@127.0.0.1:PORT/postgres`.
    pub fn url(&self) -> String {
        format!("postgres://tollgate@127.0.0.1:{}/postgres", self.port)
    }

    /// Stop the server (kill -9).
    pub fn stop(&mut self) {
        self.proc = None;
    }

    /// Start it again on the same port and data directory.
    pub fn start_again(&mut self) {
        // A killed postgres leaves its pid file; the new one finds it stale and starts.
        self.spawn();
    }

    /// Every row of the quota store's tables, as `psql` prints them.
    pub fn dump(&self) -> String {
        let out = Command::new("psql")
            .args([
                self.url().as_str(),
                "-c",
                "SELECT * FROM tollgate_quota_overrides",
                "-c",
                "SELECT * FROM tollgate_quota_audit",
            ])
            .output()
            .expect("psql (apt-get install -y postgresql-client)");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}
