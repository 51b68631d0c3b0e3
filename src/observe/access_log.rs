//! The access log's writer: lines are appended to a shared, bounded buffer without waiting,
//! and one writer thread takes the whole buffer every [`POLL_EVERY`] and writes it to the file
//! (or standard output) in one call. A writer that finds nothing waiting sleeps until the next
//! line comes (a gateway whose log is off, or idle, is not woken 100 times a second). A slow disk or a stalled pipe blocks only the writer:
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
    /// The writer found nothing on its last pass and sleeps until a line wakes it.
    asleep: bool,
}

/// What the requests and the writer share.
struct Shared {
    pending: Mutex<Pending>,
    /// Lines that may wait at most.
    cap: u64,
    written: AtomicU64,
    dropped: AtomicU64,
    closed: AtomicBool,
    /// The writer's passes over the buffer.
    passes: AtomicU64,
}

/// The access log of a gateway.
pub struct AccessLog {
    shared: Arc<Shared>,
    writer: std::thread::Thread,
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
            passes: AtomicU64::new(0),
        });
        let s = shared.clone();
        let writer = std::thread::Builder::new()
            .name("tollgate access log".into())
            .spawn(move || write_lines(&s, file))?
            .thread()
            .clone();
        Ok(AccessLog { shared, writer })
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
            let wake = std::mem::take(&mut p.asleep);
            drop(p);
            if wake {
                self.writer.unpark();
            }
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
        self.writer.unpark();
    }
}

/// The writer thread: every [`POLL_EVERY`], swap the waiting lines out and write them; when
/// there were none, sleep until [`AccessLog::log`] (or the log's drop) wakes it.
fn write_lines(shared: &Shared, mut file: File) {
    let mut spare = Vec::new();
    let mut warned = false;
    loop {
        std::thread::sleep(POLL_EVERY);
        shared.passes.fetch_add(1, Ordering::Relaxed);
        let lines = {
            let mut p = shared.pending.lock();
            std::mem::swap(&mut p.bytes, &mut spare);
            let lines = std::mem::take(&mut p.lines);
            // Under the lock: a line queued after this wakes the writer (an unpark before the
            // park below makes the park return at once).
            p.asleep = lines == 0;
            lines
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
        if lines == 0 {
            std::thread::park();
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

    /// With nothing to write the writer sleeps (at most the pass in progress while it is
    /// watched), and the next line wakes it and still reaches the file.
    #[test]
    fn an_idle_writer_sleeps_until_a_line_comes() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.log");
        let log = AccessLog::start(Some(&path), 1_000).unwrap();
        std::thread::sleep(POLL_EVERY * 5);
        let passes = log.shared.passes.load(Ordering::Relaxed);
        std::thread::sleep(POLL_EVERY * 20);
        let idle_passes = log.shared.passes.load(Ordering::Relaxed) - passes;
        assert!(
            idle_passes <= 1,
            "{idle_passes} passes over 20 idle intervals"
        );
        log.log(|b| writeln!(b, "after a sleep").unwrap());
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while log.written() < 1 && std::time::Instant::now() < deadline {
            std::thread::sleep(POLL_EVERY);
        }
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "after a sleep\n");
    }
}
