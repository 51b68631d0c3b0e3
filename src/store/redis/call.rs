//! One script call, built straight into the command the connection sends.
//!
//! `redis::ScriptInvocation` keeps every key and every argument in a vector of its own and
//! copies them into an `EVALSHA` command when invoked: about a dozen allocations for a
//! one-limit check. A [`Call`] writes its keys, then its arguments, straight into the one
//! command it sends (`loadtest/RESULTS.md` has the measurement).
//!
//! The script is sent by its SHA1; on `NOSCRIPT` it is loaded and that call retried once,
//! which is safe because `NOSCRIPT` means it did not run (what `ScriptInvocation` does too).

use redis::aio::ConnectionLike;
use redis::{Cmd, FromRedisValue, RedisResult, Script, ServerErrorKind, ToRedisArgs};

/// One call of `script`: `EVALSHA sha numkeys key... arg...`, written as it is built.
pub(crate) struct Call<'a> {
    script: &'a Script,
    cmd: Cmd,
}

impl<'a> Call<'a> {
    /// A call of `script` with `keys` as `KEYS`; [`Call::arg`] appends to `ARGV`.
    pub fn new<'k>(script: &'a Script, keys: impl ExactSizeIterator<Item = &'k str>) -> Self {
        let mut cmd = Cmd::with_capacity(16, 192);
        cmd.arg("EVALSHA").arg(script.get_hash()).arg(keys.len());
        for k in keys {
            cmd.arg(k);
        }
        Call { script, cmd }
    }

    pub fn arg(&mut self, arg: impl ToRedisArgs) -> &mut Self {
        self.cmd.arg(arg);
        self
    }

    /// Run the call; on `NOSCRIPT`, load the script and run it once more.
    pub async fn invoke<T: FromRedisValue>(&self, con: &mut impl ConnectionLike) -> RedisResult<T> {
        match self.cmd.query_async(con).await {
            Err(e) if e.kind() == redis::ErrorKind::Server(ServerErrorKind::NoScript) => {
                self.script.load_async(con).await?;
                self.cmd.query_async(con).await
            }
            result => result,
        }
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
}
