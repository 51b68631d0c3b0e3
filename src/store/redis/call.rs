//! One script call, built straight into the command the connection sends.
//!
//! `redis::ScriptInvocation` keeps every key and every argument in a vector of its own and
//! copies them into an `EVALSHA` command when invoked: about a dozen allocations for a
//! one-limit check. A [`Call`] borrows its keys and writes its arguments into one buffer, and
//! the command is written once (`loadtest/RESULTS.md` has the measurement).
//!
//! The script is sent by its SHA1; on `NOSCRIPT` it is loaded and that call retried once,
//! which is safe because `NOSCRIPT` means it did not run (what `ScriptInvocation` does too).

use redis::aio::ConnectionLike;
use redis::{Arg, Cmd, FromRedisValue, RedisResult, Script, ServerErrorKind, ToRedisArgs};
use smallvec::SmallVec;

/// The keys and arguments of one call of `script`; the keys are `KEYS`, the arguments `ARGV`,
/// each in the order added, whatever the order of the `key` and `arg` calls.
pub(crate) struct Call<'a> {
    script: &'a Script,
    keys: SmallVec<[&'a str; 4]>,
    /// The arguments only, as the command's own buffer holds them.
    args: Cmd,
}

impl<'a> Call<'a> {
    pub fn new(script: &'a Script) -> Self {
        Call {
            script,
            keys: SmallVec::new(),
            args: Cmd::with_capacity(16, 128),
        }
    }

    pub fn key(&mut self, key: &'a str) -> &mut Self {
        self.keys.push(key);
        self
    }

    pub fn arg(&mut self, arg: impl ToRedisArgs) -> &mut Self {
        self.args.arg(arg);
        self
    }

    /// `EVALSHA sha numkeys key... arg...`.
    fn command(&self) -> Cmd {
        let sha = self.script.get_hash();
        let keys_len: usize = self.keys.iter().map(|k| k.len()).sum();
        let args = self.args.args_iter();
        let args_len: usize = args
            .clone()
            .map(|a| match a {
                Arg::Simple(b) => b.len(),
                _ => 0,
            })
            .sum();
        let mut cmd = Cmd::with_capacity(
            3 + self.keys.len() + args.len(),
            7 + sha.len() + 4 + keys_len + args_len,
        );
        cmd.arg("EVALSHA").arg(sha).arg(self.keys.len());
        for k in &self.keys {
            cmd.arg(*k);
        }
        // Every argument is `Simple`: a cursor (`Arg::Cursor`) is only for `SCAN`-like commands.
        for a in args {
            if let Arg::Simple(b) = a {
                cmd.arg(b);
            }
        }
        cmd
    }

    /// Run the call; on `NOSCRIPT`, load the script and run it once more.
    pub async fn invoke<T: FromRedisValue>(&self, con: &mut impl ConnectionLike) -> RedisResult<T> {
        let cmd = self.command();
        match cmd.query_async(con).await {
            Err(e) if e.kind() == redis::ErrorKind::Server(ServerErrorKind::NoScript) => {
                self.script.load_async(con).await?;
                cmd.query_async(con).await
            }
            result => result,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Keys and arguments added interleaved (as the store adds them) go out as `KEYS`, then
    /// `ARGV`, each in the order added.
    #[test]
    fn the_command_is_evalsha_with_keys_then_arguments() {
        let script = Script::new("return 1");
        let mut call = Call::new(&script);
        call.arg("")
            .key("{p:l:k}:sw")
            .arg(1u8)
            .arg(100u64)
            .key("{p:l:k}:fw")
            .arg(-1i64);
        let mine = call.command().get_packed_command();
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
}
