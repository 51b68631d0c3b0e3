//! The upgrade socket is private (issue 39, item 4), with real processes: the default one is
//! mode 0600 in a directory of mode 0700 owned by the gateway's user, and a binary upgrade
//! through it works; a gateway whose default directory is open to others refuses to start; a
//! socket another user (`nobody`, through `setpriv`) bound at the configured path first never
//! receives a listening socket, and the old gateway says why; a connection from another user
//! to a waiting new process is refused, and the upgrade still completes with the real one.

mod common;

use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::gateway::Gateway;
use common::http::{client, get, http_ok};
use common::process::Proc;
use common::upstream::Upstream;
use common::wait::eventually;

const NOBODY: u32 = 65534;
const PYTHON: &str = "/usr/bin/python3";
const INSTALL: &str =
    "setpriv (util-linux) and /usr/bin/python3 are needed: apt-get install -y util-linux python3";

/// Binds a unix socket at argv[1] (open to all), then for each connection prints how many
/// descriptors (SCM_RIGHTS) and bytes it received.
const THIEF: &str = r#"
import os, socket, sys
path = sys.argv[1]
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.bind(path)
os.chmod(path, 0o777)
s.listen(8)
print("listening", flush=True)
s.settimeout(60)
while True:
    c, _ = s.accept()
    c.settimeout(20)
    fds, data = 0, b""
    while True:
        msg, anc, _, _ = c.recvmsg(4096, socket.CMSG_SPACE(64 * 4))
        for level, kind, payload in anc:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds += len(payload) // 4
        if not msg:
            break
        data += msg
    print(f"connection: {fds} fds, {len(data)} bytes", flush=True)
    c.close()
"#;

/// Connects to the unix socket at argv[1] and offers its own stdin and stdout as the
/// "listening sockets" of two addresses.
const IMPOSTOR: &str = r#"
import array, socket, sys
c = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
c.connect(sys.argv[1])
fds = array.array("i", [0, 1]).tobytes()
c.sendmsg([b"127.0.0.1:1 127.0.0.1:2"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, fds)])
print("offered", flush=True)
"#;

fn config(up: &Upstream, server: &str) -> String {
    format!(
        "server: {{ {server} }}\n{}routes: [ {{ name: all, match: {{ path_prefix: / }}, upstream: backend }} ]\n",
        up.upstreams_yaml()
    )
}

/// This test process's uid, as the owner of a directory it makes.
fn own_uid() -> u32 {
    let t = tempfile::tempdir().expect("temp dir");
    std::fs::metadata(t.path()).expect("stat").uid()
}

/// A python script run as `nobody`.
fn as_nobody(name: &str, script: &str, arg: &Path) -> Proc {
    assert_eq!(
        own_uid(),
        0,
        "this test runs a process as another user (nobody) with setpriv, which needs root"
    );
    let mut cmd = Command::new("setpriv");
    cmd.args([
        format!("--reuid={NOBODY}"),
        format!("--regid={NOBODY}"),
        "--clear-groups".into(),
        "--".into(),
        PYTHON.into(),
        "-c".into(),
        script.into(),
    ])
    .arg(arg);
    Proc::spawn(name, cmd, INSTALL)
}

/// A directory anyone may create files in, like /tmp (mode 1777).
fn shared_dir() -> tempfile::TempDir {
    let d = tempfile::tempdir().expect("temp dir");
    std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o1777)).expect("chmod");
    d
}

/// `tollgate --upgrade` on the old gateway's config and addresses.
fn upgrading(old: &Gateway, env: &[(&str, &str)]) -> Proc {
    let args = [
        "--config".to_string(),
        old.config_path().display().to_string(),
        "--listen".into(),
        old.listen.to_string(),
        "--admin-listen".into(),
        old.admin.to_string(),
        "--upgrade".into(),
    ];
    Proc::tollgate("gateway new", &args, env)
}

/// Wait until a unix socket is bound at `path` (while `proc` runs); its metadata.
async fn bound(path: &Path, proc: &mut Proc) -> std::fs::Metadata {
    eventually(
        format!("a socket is bound at {path:?}"),
        Duration::from_secs(10),
    )
    .every(Duration::from_millis(10))
    .holds(|| {
        if let Some(s) = proc.exited() {
            return Err(format!("{} exited ({s}): {}", proc.name(), proc.output()));
        }
        match std::fs::symlink_metadata(path) {
            Ok(m) if m.file_type().is_socket() => Ok(m),
            _ => Err("not yet".to_string()),
        }
    })
    .await
}

/// Wait until `proc` has exited.
async fn exits(proc: &mut Proc, within: Duration) {
    eventually(format!("{} exits", proc.name()), within)
        .every(Duration::from_millis(50))
        .holds(|| proc.exited().is_some())
        .await;
}

async fn wait_output(proc: &Proc, needle: &str, within: Duration) -> String {
    eventually(format!("{} says {needle:?}", proc.name()), within)
        .every(Duration::from_millis(20))
        .holds(|| proc.output().contains(needle).then(|| proc.output()))
        .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_default_upgrade_socket_is_0600_in_a_private_0700_directory_and_the_upgrade_works() {
    let up = Upstream::start().await;
    let runtime = tempfile::tempdir().expect("temp dir");
    let env = [("XDG_RUNTIME_DIR", runtime.path().to_str().expect("utf-8"))];
    let mut old = Gateway::start_named("old", &config(&up, ""), &[], &env).await;
    let dir = runtime.path().join("tollgate");
    let meta = std::fs::symlink_metadata(&dir).expect("the default directory is made");
    assert!(meta.is_dir(), "{dir:?}");
    assert_eq!(meta.mode() & 0o7777, 0o700, "{dir:?}'s mode");
    assert_eq!(meta.uid(), own_uid(), "{dir:?}'s owner");

    let mut new = upgrading(&old, &env);
    let sock = dir.join(format!("upgrade-{}.sock", old.listen.port()));
    let meta = bound(&sock, &mut new).await;
    assert_eq!(meta.mode() & 0o7777, 0o600, "{sock:?}'s mode");
    assert_eq!(meta.uid(), own_uid(), "{sock:?}'s owner");
    old.proc.signal("QUIT");
    exits(&mut old.proc, Duration::from_secs(20)).await;
    let c = client();
    let healthz = format!("http://{}/healthz", old.admin);
    new.wait_ready(|| http_ok(&c, &healthz))
        .await
        .expect("the new gateway serves");
    let r = get(&c, &old.url("/after-upgrade"), &[]).await;
    assert_eq!(r.status.as_u16(), 200, "{}", r.text());
    assert!(
        !old.output().contains("Refusing"),
        "a process of our own user is not refused: {}",
        old.output()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_whose_default_upgrade_directory_is_open_to_others_does_not_start() {
    let up = Upstream::start().await;
    let runtime = tempfile::tempdir().expect("temp dir");
    let dir = runtime.path().join("tollgate");
    std::fs::create_dir(&dir).expect("mkdir");
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).expect("chmod");
    let yaml_dir = tempfile::tempdir().expect("temp dir");
    let yaml = yaml_dir.path().join("gateway.yaml");
    std::fs::write(&yaml, config(&up, "")).expect("write config");
    let args = [
        "--config".to_string(),
        yaml.display().to_string(),
        "--listen".into(),
        "127.0.0.1:0".into(),
        "--admin-listen".into(),
        "127.0.0.1:0".into(),
    ];
    let env = [("XDG_RUNTIME_DIR", runtime.path().to_str().expect("utf-8"))];
    let mut gw = Proc::tollgate("gateway", &args, &env);
    exits(&mut gw, Duration::from_secs(10)).await;
    assert!(!gw.exited().expect("exited").success());
    let want = format!(
        "{}, the upgrade socket's directory, is not private: its mode is 0777; only its owner may write to it (0700 or 0755)",
        dir.display()
    );
    assert!(gw.output().contains(&want), "{}", gw.output());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_socket_another_user_bound_at_the_upgrade_path_never_receives_the_listening_sockets() {
    let up = Upstream::start().await;
    let shared = shared_dir();
    let path: PathBuf = shared.path().join("upgrade.sock");
    let yaml = config(&up, &format!("upgrade_sock: \"{}\"", path.display()));
    let old = Gateway::start_named("old", &yaml, &[], &[]).await;
    let warning = format!(
        "server.upgrade_sock {}: its directory is not private (its mode is 1777;",
        path.display()
    );
    assert!(old.output().contains(&warning), "{}", old.output());
    let thief = as_nobody("nobody's listener", THIEF, &path);
    wait_output(&thief, "listening", Duration::from_secs(10)).await;
    let meta = std::fs::symlink_metadata(&path).expect("bound");
    assert_eq!(meta.uid(), NOBODY, "the socket at {path:?} is nobody's");

    old.proc.signal("QUIT");
    // The old gateway connects, sees whose socket it is, and sends nothing.
    let out = wait_output(&thief, "connection:", Duration::from_secs(10)).await;
    let connections: Vec<&str> = out
        .lines()
        .filter(|l| l.starts_with("connection:"))
        .collect();
    assert_eq!(connections, ["connection: 0 fds, 0 bytes"], "{out}");
    let refusal = format!(
        "Refusing to send listening sockets through {}: the process at the other end runs as uid {NOBODY}, not as this process's uid 0",
        path.display()
    );
    wait_output(&old.proc, &refusal, Duration::from_secs(10)).await;
    assert!(
        old.output()
            .contains("Unable to send listener sockets to new process"),
        "the upgrade fails with an error: {}",
        old.output()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_process_takes_nothing_from_another_user_and_the_upgrade_still_completes() {
    let up = Upstream::start().await;
    let shared = shared_dir();
    let path: PathBuf = shared.path().join("upgrade.sock");
    let yaml = config(&up, &format!("upgrade_sock: \"{}\"", path.display()));
    let mut old = Gateway::start_named("old", &yaml, &[], &[]).await;
    let mut new = upgrading(&old, &[]);
    let meta = bound(&path, &mut new).await;
    assert_eq!(meta.mode() & 0o7777, 0o600, "{path:?}'s mode");
    // Were the socket's mode widened, another user's offer would still be refused. The socket
    // is made 0600 before its bind and again right after: widen it until it stays widened, so
    // the second cannot undo it.
    eventually("the socket's mode widened to 0666", Duration::from_secs(10))
        .every(Duration::from_millis(100))
        .holds(|| {
            let mode = std::fs::symlink_metadata(&path).map_or(0, |m| m.mode() & 0o7777);
            if mode == 0o666 {
                return Ok(());
            }
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o666)).expect("chmod");
            Err(format!("mode {mode:04o}"))
        })
        .await;
    let impostor = as_nobody("nobody's offer", IMPOSTOR, &path);
    wait_output(&impostor, "offered", Duration::from_secs(10)).await;
    let refusal = format!(
        "Refusing to receive listening sockets through {}: the process at the other end runs as uid {NOBODY}, not as this process's uid 0",
        path.display()
    );
    wait_output(&new, &refusal, Duration::from_secs(5)).await;

    old.proc.signal("QUIT");
    exits(&mut old.proc, Duration::from_secs(20)).await;
    let c = client();
    let healthz = format!("http://{}/healthz", old.admin);
    new.wait_ready(|| http_ok(&c, &healthz))
        .await
        .expect("the new gateway serves with the old one's sockets");
    let r = get(&c, &old.url("/after-upgrade"), &[]).await;
    assert_eq!(r.status.as_u16(), 200, "{}", r.text());
}
