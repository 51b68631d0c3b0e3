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
/// adds latency without limiting throughput. Its tasks are aborted when it drops.
pub struct LatencyProxy {
    addr: SocketAddr,
    delay_ms: Arc<AtomicU64>,
    task: tokio::task::JoinHandle<()>,
}

impl LatencyProxy {
    pub async fn start(target: SocketAddr) -> LatencyProxy {
        let listener = tokio::net::TcpListener::bind(loopback(0))
            .await
            .expect("bind the proxy on 127.0.0.1:0");
        let addr = listener.local_addr().expect("proxy addr");
        let delay_ms = Arc::new(AtomicU64::new(0));
        let task = tokio::spawn({
            let delay_ms = delay_ms.clone();
            async move {
                // Dropped (so every connection task aborted) when this task is aborted.
                let mut conns = JoinSet::new();
                while let Ok((inbound, _)) = listener.accept().await {
                    conns.spawn(relay(inbound, target, delay_ms.clone()));
                    while conns.try_join_next().is_some() {}
                }
            }
        });
        LatencyProxy {
            addr,
            delay_ms,
            task,
        }
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

/// Connect to `target` (within 5 s, else drop `inbound`) and pump both ways, delayed.
async fn relay(inbound: tokio::net::TcpStream, target: SocketAddr, delay_ms: Arc<AtomicU64>) {
    let connect = tokio::net::TcpStream::connect(target);
    let Ok(Ok(outbound)) = tokio::time::timeout(Duration::from_secs(5), connect).await else {
        return;
    };
    let _ = inbound.set_nodelay(true);
    let _ = outbound.set_nodelay(true);
    let (ir, iw) = inbound.into_split();
    let (or, ow) = outbound.into_split();
    tokio::join!(pump(ir, ow, delay_ms.clone()), pump(or, iw, delay_ms));
}

/// Copy `r` to `w`, each chunk held back until `delay` after it was read.
async fn pump(mut r: OwnedReadHalf, mut w: OwnedWriteHalf, delay_ms: Arc<AtomicU64>) {
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(tokio::time::Instant, Vec<u8>)>();
    let reader = async move {
        let mut buf = vec![0u8; 16 * 1024];
        loop {
            match r.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    let due = tokio::time::Instant::now()
                        + Duration::from_millis(delay_ms.load(Ordering::SeqCst));
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
            if w.write_all(&chunk).await.is_err() {
                break;
            }
        }
        let _ = w.shutdown().await;
    };
    tokio::join!(reader, writer);
}
