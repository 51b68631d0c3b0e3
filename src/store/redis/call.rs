//! One script call, built straight into the command the connection sends.
//!
//! `redis::ScriptInvocation` keeps every key and every argument in a vector of its own and
//! copies them into an `EVALSHA` command when invoked: about a dozen allocations for a
//! one-limit check. A [`Call`] writes its keys, then its arguments, straight into the one
//! command it sends (`loadtest/log/2026-11-25-peer-options-floor.md` and
//! `loadtest/log/2026-11-27-0000-redis-command-without-copies.md` have the measurements); a
//! check's keys are assembled
//! on the stack rather than as strings of their own ([`KeyName`]), and each thread reuses the
//! buffers of its last call's command.
//!
//! The script is sent by its SHA1; on `NOSCRIPT` it is loaded and that call retried once,
//! which is safe because `NOSCRIPT` means it did not run (what `ScriptInvocation` does too).

use std::cell::Cell;
use std::future::Future;

use redis::aio::{ConnectionLike, ConnectionManager};
use redis::cluster_async::ClusterConnection;
use redis::{
    Cmd, FromRedisValue, RedisResult, RedisWrite, Script, ServerErrorKind, ToRedisArgs, Value,
};

use super::RedisStore;
use crate::limit::Algorithm;
use crate::store::{Check, CounterKey};

/// One call of `script`: `EVALSHA sha numkeys key... arg...`, written as it is built.
pub(crate) struct Call<'a> {
    script: &'a Script,
    cmd: Cmd,
}

thread_local! {
    /// The command of this thread's last call, cleared with its buffers kept: the next call
    /// writes into it instead of allocating two buffers, and gives it back when dropped.
    static SPARE: Cell<Option<Cmd>> = const { Cell::new(None) };
}

/// A command of more arguments than this is not kept as the spare. Every argument is a number,
/// the script's hash, or a key made of config strings and a 32-digit hash, so this bounds the
/// spare's buffers too.
const SPARE_MAX_ARGS: usize = 64;

impl<'a> Call<'a> {
    /// A call of `script` with `keys` as `KEYS`; [`Call::arg`] appends to `ARGV`.
    pub fn new<K: KeyArg>(script: &'a Script, keys: impl ExactSizeIterator<Item = K>) -> Self {
        let mut cmd = SPARE
            .with(Cell::take)
            .unwrap_or_else(|| Cmd::with_capacity(16, 192));
        cmd.arg("EVALSHA").arg(script.get_hash()).arg(keys.len());
        for k in keys {
            k.write_key(&mut cmd);
        }
        Call { script, cmd }
    }

    pub fn arg(&mut self, arg: impl ToRedisArgs) -> &mut Self {
        self.cmd.arg(arg);
        self
    }

    /// Run the call; on `NOSCRIPT`, load the script and run it once more.
    pub async fn invoke<T: FromRedisValue>(&self, con: &mut impl Connection) -> RedisResult<T> {
        match self.query(con).await {
            Err(e) if e.kind() == redis::ErrorKind::Server(ServerErrorKind::NoScript) => {
                self.script.load_async(con).await?;
                self.query(con).await
            }
            result => result,
        }
    }

    /// What `Cmd::query_async` does, through [`Connection::send`].
    async fn query<T: FromRedisValue>(&self, con: &mut impl Connection) -> RedisResult<T> {
        let reply = con.send(&self.cmd).await?;
        Ok(redis::from_redis_value(reply.extract_error()?)?)
    }
}

/// A connection a call is sent on.
pub(crate) trait Connection: ConnectionLike {
    /// Send `cmd` and wait for its reply.
    fn send<'a>(&'a mut self, cmd: &'a Cmd)
        -> impl Future<Output = RedisResult<Value>> + Send + 'a;
}

impl Connection for ConnectionManager {
    /// The manager's own method, called directly: through `ConnectionLike` (what
    /// `Cmd::query_async` calls) each call's future is boxed, one allocation per call.
    fn send<'a>(
        &'a mut self,
        cmd: &'a Cmd,
    ) -> impl Future<Output = RedisResult<Value>> + Send + 'a {
        self.send_packed_command(cmd)
    }
}

impl Connection for ClusterConnection {
    fn send<'a>(
        &'a mut self,
        cmd: &'a Cmd,
    ) -> impl Future<Output = RedisResult<Value>> + Send + 'a {
        self.req_packed_command(cmd)
    }
}

impl Drop for Call<'_> {
    fn drop(&mut self) {
        if self.cmd.args_iter().len() <= SPARE_MAX_ARGS {
            let mut cmd = std::mem::take(&mut self.cmd);
            cmd.clear();
            // During thread exit the spare is gone already; this command is then just dropped.
            let _ = SPARE.try_with(|spare| spare.set(Some(cmd)));
        }
    }
}

/// What can be one of a call's `KEYS`.
pub(crate) trait KeyArg {
    fn write_key(&self, cmd: &mut Cmd);
}

impl KeyArg for &str {
    fn write_key(&self, cmd: &mut Cmd) {
        cmd.arg(*self);
    }
}

/// A counter's key in Redis, `{<prefix>:<limit>:<hash>}:<suffix>`, as the pieces it is made
/// of: written straight into a command, it needs no `String` of its own (two allocations and
/// a copy fewer per checked limit).
pub(crate) struct KeyName<'a> {
    prefix: &'a str,
    limit: &'a str,
    key: &'a CounterKey,
    suffix: &'a str,
}

impl KeyName<'_> {
    /// The key's length in bytes: the pieces, `{`, two `:`, 32 hex digits and `}:`.
    fn len(&self) -> usize {
        self.prefix.len() + self.limit.len() + self.suffix.len() + 37
    }

    /// Write the key into `out`, which is [`KeyName::len`] bytes long.
    fn fill(&self, out: &mut [u8]) {
        let hex = self.key.hex_digits();
        let pieces: [&[u8]; 8] = [
            b"{",
            self.prefix.as_bytes(),
            b":",
            self.limit.as_bytes(),
            b":",
            &hex,
            b"}:",
            self.suffix.as_bytes(),
        ];
        let mut at = 0;
        for piece in pieces {
            out[at..at + piece.len()].copy_from_slice(piece);
            at += piece.len();
        }
    }

    /// The key as text.
    pub fn text(&self) -> String {
        let mut k = vec![0; self.len()];
        self.fill(&mut k);
        String::from_utf8(k).expect("a key is made of UTF-8 pieces")
    }
}

impl KeyArg for KeyName<'_> {
    /// Assembled on the stack and written as one argument (a longer key, with an unusually
    /// long prefix or limit name, on the heap).
    fn write_key(&self, cmd: &mut Cmd) {
        let len = self.len();
        let mut stack = [0u8; 192];
        match stack.get_mut(..len) {
            Some(buf) => {
                self.fill(buf);
                cmd.write_arg(buf);
            }
            None => cmd.write_arg(self.text().as_bytes()),
        }
    }
}

impl RedisStore {
    /// The base key of a check: one hash tag around the limit and caller, then the algorithm,
    /// so a limit whose algorithm a reload changes starts afresh instead of finding another
    /// algorithm's state (of another type or format) under its key.
    pub fn base_key(&self, c: &Check) -> String {
        self.base_key_name(c).text()
    }

    /// [`RedisStore::base_key`] as the pieces it is written from.
    pub(super) fn base_key_name<'a>(&'a self, c: &'a Check) -> KeyName<'a> {
        self.key_name(&c.name, &c.key, key_tag(c.quota.algorithm))
    }

    /// `{<prefix>:<limit>:<hash>}:<suffix>`, written in one allocation.
    pub(super) fn key(&self, limit: &str, key: &CounterKey, suffix: &str) -> String {
        self.key_name(limit, key, suffix).text()
    }

    fn key_name<'a>(&'a self, limit: &'a str, key: &'a CounterKey, suffix: &'a str) -> KeyName<'a> {
        let prefix = &self.prefix;
        KeyName {
            prefix,
            limit,
            key,
            suffix,
        }
    }
}

/// The suffix of an algorithm's keys.
pub(super) fn key_tag(a: Algorithm) -> &'static str {
    match a {
        Algorithm::SlidingWindow => "sw",
        Algorithm::FixedWindow => "fw",
        Algorithm::SlidingLog => "log",
        Algorithm::TokenBucket => "tb",
        Algorithm::Gcra => "gcra",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The keys go out as `KEYS`, then the arguments as `ARGV`, each in the order given.
    #[test]
    fn the_command_is_evalsha_with_keys_then_arguments() {
        let script = Script::new("return 1");
        let mut call = Call::new(&script, ["{p:l:k}:sw", "{p:l:k}:fw"].into_iter());
        call.arg("").arg(1u8).arg(100u64).arg(-1i64);
        let mine = call.cmd.get_packed_command();
        let sha = script.get_hash();
        let expected = redis::cmd("EVALSHA")
            .arg(sha)
            .arg(2)
            .arg("{p:l:k}:sw")
            .arg("{p:l:k}:fw")
            .arg("")
            .arg(1)
            .arg(100)
            .arg(-1)
            .get_packed_command();
        assert_eq!(
            String::from_utf8_lossy(&mine),
            String::from_utf8_lossy(&expected)
        );
    }

    /// A call after another on the same thread writes into the first one's command, and
    /// sends only its own keys and arguments.
    #[test]
    fn a_reused_command_carries_nothing_of_the_last_call() {
        let script = Script::new("return 1");
        let mut first = Call::new(&script, ["{p:l:k}:sw", "{p:l:k}:fw"].into_iter());
        first.arg("").arg(1u8).arg(100u64);
        drop(first);
        assert!(SPARE.with(|s| {
            let spare = s.take();
            let kept = spare.as_ref().is_some_and(|c| c.args_iter().len() == 0);
            s.set(spare);
            kept
        }));
        let mut second = Call::new(&script, ["{p:m:k}:tb"].into_iter());
        second.arg(7u8);
        let expected = redis::cmd("EVALSHA")
            .arg(script.get_hash())
            .arg(1)
            .arg("{p:m:k}:tb")
            .arg(7)
            .get_packed_command();
        assert_eq!(second.cmd.get_packed_command(), expected);
        assert!(
            SPARE.with(|s| s.take()).is_none(),
            "the second call holds it"
        );
    }

    /// A command of many arguments is not kept as the spare: the spare's buffers stay small.
    #[test]
    fn a_command_of_more_than_the_most_arguments_is_not_kept() {
        let script = Script::new("return 1");
        let keys: Vec<String> = (0..SPARE_MAX_ARGS).map(|i| format!("k{i}")).collect();
        drop(Call::new(&script, keys.iter().map(String::as_str)));
        assert!(SPARE.with(|s| s.take()).is_none());
        drop(Call::new(&script, keys[..8].iter().map(String::as_str)));
        assert!(SPARE.with(|s| s.take()).is_some());
    }

    /// `name` written into a command sends the same bytes as its `text` written whole.
    fn assert_same_command(name: KeyName<'_>, text: &str) {
        let script = Script::new("return 1");
        let pieces = Call::new(&script, [name].into_iter());
        let whole = Call::new(&script, [text].into_iter());
        assert_eq!(
            pieces.cmd.get_packed_command(),
            whole.cmd.get_packed_command()
        );
    }

    /// A key too long for the stack buffer (a long limit name) is written whole from the heap.
    #[test]
    fn a_long_key_is_written_whole() {
        let key = CounterKey::new("l", [&b"caller"[..]]);
        let limit = "a-limit-with-a-long-name-".repeat(8);
        let name = KeyName {
            prefix: "tollgate",
            limit: &limit,
            key: &key,
            suffix: "gcra",
        };
        assert!(name.len() > 192);
        let text = name.text();
        assert_eq!(text, format!("{{tollgate:{limit}:{}}}:gcra", key.hex()));
        assert_same_command(name, &text);
    }

    /// A key written in pieces straight into a command is the key's text, byte for byte.
    #[test]
    fn a_key_written_in_pieces_is_its_text() {
        let key = CounterKey::new("per-ip", [&b"10.0.0.1"[..]]);
        let name = KeyName {
            prefix: "tg",
            limit: "per-ip",
            key: &key,
            suffix: "sw",
        };
        let text = name.text();
        assert_eq!(text, format!("{{tg:per-ip:{}}}:sw", key.hex()));
        assert_same_command(name, &text);
    }
}
