//! The access log's writer: lines are appended to a shared, bounded buffer without waiting,
//! and one writer thread takes the whole buffer every [`POLL_EVERY`] and writes it to the file
//! (or standard output) in one call. A slow disk or a stalled pipe blocks only the writer:
//! once [`AccessLog::start`]'s `buffer` lines wait, new ones are dropped and counted, so the
//! log never slows proxying.
//!
//! Nothing is allocated per line in steady state: a request formats its line into a buffer of
//! its thread, copies it into the shared one under a short lock, and the writer swaps the
//! shared buffer with a spare one. (A queue of one `String` per line cost more than the line:
//! a wake-up of the writer and a free on another thread's malloc arena for each.)
//!
//! Phase: the end of every request (`logging`), and the writer thread.

use std::cell::RefCell;
use std::fs::File;
use std::io::{self, Write};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;

/// The writer takes the waiting lines this often: a line reaches the file within about this.
pub const POLL_EVERY: Duration = Duration::from_millis(10);

/// The lines waiting for the writer.
#[derive(Default)]
struct Pending {
    bytes: Vec<u8>,
    lines: u64,
}

/// What the requests and the writer share.
struct Shared {
    pending: Mutex<Pending>,
    /// Lines that may wait at most.
    cap: u64,
    written: AtomicU64,
    dropped: AtomicU64,
    closed: AtomicBool,
}

/// The access log of a gateway.
pub struct AccessLog {
    shared: Arc<Shared>,
}

thread_local! {
    /// Where a request formats its line, reused by every request of the thread.
    static SCRATCH: RefCell<Vec<u8>> = RefCell::new(Vec::with_capacity(1024));
}

impl AccessLog {
    /// Open `path` for appending (standard output when `None`) and start the writer thread;
    /// at most `buffer` lines wait for it.
    pub fn start(path: Option<&Path>, buffer: usize) -> io::Result<AccessLog> {
        let file = match path {
            Some(p) => std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(p)?,
            None => {
                use std::os::fd::AsFd;
                File::from(io::stdout().as_fd().try_clone_to_owned()?)
            }
        };
        let shared = Arc::new(Shared {
            pending: Mutex::new(Pending::default()),
            cap: buffer as u64,
            written: AtomicU64::new(0),
            dropped: AtomicU64::new(0),
            closed: AtomicBool::new(false),
        });
        let s = shared.clone();
        std::thread::Builder::new()
            .name("tollgate access log".into())
            .spawn(move || write_lines(&s, file))?;
        Ok(AccessLog { shared })
    }

    /// Log one line: `format` writes it (with its newline) into a reused buffer, which is then
    /// queued without waiting, or dropped and counted when `buffer` lines already wait.
    pub fn log(&self, format: impl FnOnce(&mut Vec<u8>)) {
        SCRATCH.with_borrow_mut(|line| {
            line.clear();
            format(line);
            let mut p = self.shared.pending.lock();
            if p.lines >= self.shared.cap {
                drop(p);
                self.shared.dropped.fetch_add(1, Ordering::Relaxed);
                return;
            }
            p.bytes.extend_from_slice(line);
            p.lines += 1;
        });
    }

    /// Wait (at most `within`) until every line queued so far is written: before the process
    /// exits.
    pub fn flush(&self, within: std::time::Duration) {
        let deadline = std::time::Instant::now() + within;
        loop {
            let waiting = self.shared.pending.lock().lines;
            if waiting == 0 || std::time::Instant::now() >= deadline {
                // One more writer pass takes what it swapped out before we looked.
                std::thread::sleep(POLL_EVERY * 2);
                return;
            }
            std::thread::sleep(POLL_EVERY);
        }
    }

    /// Lines written so far.
    pub fn written(&self) -> u64 {
        self.shared.written.load(Ordering::Relaxed)
    }

    /// Lines dropped so far: the buffer was full, or a write failed.
    pub fn dropped(&self) -> u64 {
        self.shared.dropped.load(Ordering::Relaxed)
    }
}

impl Drop for AccessLog {
    fn drop(&mut self) {
        self.shared.closed.store(true, Ordering::Relaxed);
    }
}

/// The writer thread: every [`POLL_EVERY`], swap the waiting lines out and write them.
fn write_lines(shared: &Shared, mut file: File) {
    let mut spare = Vec::new();
    let mut warned = false;
    loop {
        std::thread::sleep(POLL_EVERY);
        let lines = {
            let mut p = shared.pending.lock();
            std::mem::swap(&mut p.bytes, &mut spare);
            std::mem::take(&mut p.lines)
        };
        if lines > 0 {
            match file.write_all(&spare) {
                Ok(()) => _ = shared.written.fetch_add(lines, Ordering::Relaxed),
                Err(e) => {
                    shared.dropped.fetch_add(lines, Ordering::Relaxed);
                    if !std::mem::replace(&mut warned, true) {
                        tracing::warn!("cannot write the access log: {e}");
                    }
                }
            }
            spare.clear();
        }
        if shared.closed.load(Ordering::Relaxed) {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_reach_the_file_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.log");
        let log = AccessLog::start(Some(&path), 1_000).unwrap();
        for i in 0..10 {
            log.log(|b| writeln!(b, "line {i}").unwrap());
        }
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while log.written() < 10 && std::time::Instant::now() < deadline {
            std::thread::sleep(POLL_EVERY);
        }
        let text = std::fs::read_to_string(&path).unwrap();
        assert_eq!(text.lines().count(), 10);
        assert!(text.starts_with("line 0\nline 1\n"));
        assert_eq!(log.dropped(), 0);
    }
}
