//! Faults made for real: signals to a process by PID (`SIGSTOP` for a blackhole, `SIGCONT`,
//! `SIGHUP`; `kill -9` is dropping a [`Proc`](super::Proc)), latency injected by a small TCP
//! proxy (there is no toxiproxy and no `tc netem` on these machines), and a wall clock moved
//! by libfaketime.

use std::net::SocketAddr;
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::task::JoinSet;

use super::process::loopback;

/// Send `sig` (`STOP`, `CONT`, `HUP`, ...) to process `pid` with `kill -<sig> <pid>`.
pub fn signal(pid: u32, sig: &str) {
    let status = Command::new("kill")
        .args([format!("-{sig}"), pid.to_string()])
        .status()
        .expect("run kill");
    assert!(status.success(), "kill -{sig} {pid} failed");
}

/// The environment that runs a process under libfaketime with `offset` (e.g. `+10m`). The
/// library is preloaded directly (not through the `faketime` wrapper, which forks: killing the
/// wrapper by PID would leave the process running). Only the wall clock moves; timers keep
/// their monotonic clock. A missing libfaketime fails, naming what to install.
pub fn faketime_env(offset: &str) -> Vec<(&'static str, &str)> {
    const INSTALL: &str = "libfaketime is needed for the clock-skew test: `apt-get install -y faketime` (or run scripts/setup.sh)";
    let found = Command::new("faketime")
        .args(["-f", "+0", "true"])
        .status()
        .unwrap_or_else(|e| panic!("cannot run faketime: {e}. {INSTALL}"));
    assert!(found.success(), "`faketime -f +0 true` failed. {INSTALL}");
    let candidates = [
        "/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1",
        "/usr/lib/aarch64-linux-gnu/faketime/libfaketimeMT.so.1",
        "/usr/lib/faketime/libfaketimeMT.so.1",
        "/usr/local/lib/faketime/libfaketimeMT.so.1",
        "/usr/lib64/faketime/libfaketimeMT.so.1",
    ];
    let lib = candidates
        .iter()
        .find(|p| std::path::Path::new(p).exists())
        .unwrap_or_else(|| panic!("libfaketimeMT.so.1 not found in {candidates:?}. {INSTALL}"));
    vec![
        ("LD_PRELOAD", *lib),
        ("FAKETIME", offset),
        ("FAKETIME_DONT_FAKE_MONOTONIC", "1"),
    ]
}

/// A TCP proxy on loopback in front of `target` that delays every chunk, in both directions,
/// by a delay that can change at run time (zero at first). Chunks keep their order; the delay
/// adds latency without limiting throughput. [`LatencyProxy::stall_existing`] stops the
/// connections open at that moment for good (nothing more is relayed on them, neither is
/// closed), while later ones are relayed as before. Its tasks are aborted when it drops.
pub struct LatencyProxy {
    addr: SocketAddr,
    delay_ms: Arc<AtomicU64>,
    /// Connections are numbered from 0 as accepted; those numbered below this are stalled.
    stalled_below: Arc<AtomicU64>,
    accepted: Arc<AtomicU64>,
    task: tokio::task::JoinHandle<()>,
}

impl LatencyProxy {
    pub async fn start(target: SocketAddr) -> LatencyProxy {
        let listener = tokio::net::TcpListener::bind(loopback(0))
            .await
            .expect("bind the proxy on 127.0.0.1:0");
        let addr = listener.local_addr().expect("proxy addr");
        let delay_ms = Arc::new(AtomicU64::new(0));
        let stalled_below = Arc::new(AtomicU64::new(0));
        let accepted = Arc::new(AtomicU64::new(0));
        let task = tokio::spawn({
            let (delay_ms, stalled_below, accepted) =
                (delay_ms.clone(), stalled_below.clone(), accepted.clone());
            async move {
                // Dropped (so every connection task aborted) when this task is aborted.
                let mut conns = JoinSet::new();
                while let Ok((inbound, _)) = listener.accept().await {
                    let id = accepted.fetch_add(1, Ordering::SeqCst);
                    let link = Link {
                        id,
                        delay_ms: delay_ms.clone(),
                        stalled_below: stalled_below.clone(),
                    };
                    conns.spawn(relay(inbound, target, link));
                    while conns.try_join_next().is_some() {}
                }
            }
        });
        LatencyProxy {
            addr,
            delay_ms,
            stalled_below,
            accepted,
            task,
        }
    }

    /// Stop relaying on every connection accepted so far, in both directions, without closing
    /// them: a peer whose replies stopped. Later connections are relayed as before.
    pub fn stall_existing(&self) {
        let accepted = self.accepted.load(Ordering::SeqCst);
        self.stalled_below.store(accepted, Ordering::SeqCst);
    }

    /// Connections accepted so far.
    pub fn accepted(&self) -> u64 {
        self.accepted.load(Ordering::SeqCst)
    }

    /// Where clients connect.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn set_delay(&self, d: Duration) {
        self.delay_ms.store(d.as_millis() as u64, Ordering::SeqCst);
    }
}

impl Drop for LatencyProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// One relayed connection: its number, and the proxy's settings.
#[derive(Clone)]
struct Link {
    id: u64,
    delay_ms: Arc<AtomicU64>,
    stalled_below: Arc<AtomicU64>,
}

impl Link {
    fn stalled(&self) -> bool {
        self.id < self.stalled_below.load(Ordering::SeqCst)
    }
}

/// Connect to `target` (within 5 s, else drop `inbound`) and pump both ways, delayed.
async fn relay(inbound: tokio::net::TcpStream, target: SocketAddr, link: Link) {
    let connect = tokio::net::TcpStream::connect(target);
    let Ok(Ok(outbound)) = tokio::time::timeout(Duration::from_secs(5), connect).await else {
        return;
    };
    let _ = inbound.set_nodelay(true);
    let _ = outbound.set_nodelay(true);
    let (ir, iw) = inbound.into_split();
    let (or, ow) = outbound.into_split();
    tokio::join!(pump(ir, ow, link.clone()), pump(or, iw, link));
}

/// Copy `r` to `w`, each chunk held back until the delay after it was read; once the link is
/// stalled, what is read is dropped and nothing more is written.
async fn pump(mut r: OwnedReadHalf, mut w: OwnedWriteHalf, link: Link) {
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(tokio::time::Instant, Vec<u8>)>();
    let read_link = link.clone();
    let reader = async move {
        let mut buf = vec![0u8; 16 * 1024];
        loop {
            match r.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(_) if read_link.stalled() => {}
                Ok(n) => {
                    let due = tokio::time::Instant::now()
                        + Duration::from_millis(read_link.delay_ms.load(Ordering::SeqCst));
                    if tx.send((due, buf[..n].to_vec())).is_err() {
                        break;
                    }
                }
            }
        }
        // Dropping `tx` ends the writer once it has written what is queued.
    };
    let writer = async move {
        while let Some((due, chunk)) = rx.recv().await {
            tokio::time::sleep_until(due).await;
            if link.stalled() {
                // Held open, silent, until the proxy drops.
                std::future::pending::<()>().await;
            }
            if w.write_all(&chunk).await.is_err() {
                break;
            }
        }
        let _ = w.shutdown().await;
    };
    tokio::join!(reader, writer);
}
