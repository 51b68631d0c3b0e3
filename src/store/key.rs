//! Counter keys. User-supplied parts (API keys, IPs, header values) are hashed with the limit
//! name into a fixed 16-byte key; they are never stored verbatim.

use std::collections::HashMap;
use std::fmt;
use std::hash::{BuildHasherDefault, Hasher};

use crate::limit::Algorithm;

/// A limit's counter for one caller: BLAKE3 of the limit name and the key parts, truncated to
/// 128 bits.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct CounterKey(pub [u8; 16]);

impl CounterKey {
    /// Build a key from the limit name and its parts. Each part is length-prefixed so that
    /// `("ab","c")` and `("a","bc")` differ.
    /// The bytes are gathered first and hashed in one call, which is the same digest as
    /// feeding them to BLAKE3's streaming hasher one by one (and about half its cost).
    pub fn new<'a>(limit: &str, parts: impl IntoIterator<Item = &'a [u8]>) -> Self {
        Self::remembered(None, limit, parts)
    }

    /// [`CounterKey::new`], looked up first in `memo` (a connection's keys) and kept there.
    /// The same bytes give the same key, so a remembered key is the one hashing would give.
    pub fn remembered<'a>(
        memo: Option<&KeyMemo>,
        limit: &str,
        parts: impl IntoIterator<Item = &'a [u8]>,
    ) -> Self {
        let mut input = Input::new();
        input.part(limit.as_bytes());
        for p in parts {
            input.part(p);
        }
        let bytes = input.bytes();
        let memo = memo.filter(|_| bytes.len() <= MEMO_INPUT);
        if let Some(key) = memo.and_then(|m| m.get(bytes)) {
            return key;
        }
        let mut out = [0u8; 16];
        out.copy_from_slice(&blake3::hash(bytes).as_bytes()[..16]);
        let key = CounterKey(out);
        if let Some(m) = memo {
            m.keep(bytes, key);
        }
        key
    }

    /// The key of this counter's state under algorithm `a`: the same shard (byte 0 is kept),
    /// another map slot for each algorithm. A limit whose algorithm a reload changes then
    /// starts afresh, and finds its old state again if changed back, as in Redis, whose keys
    /// name the algorithm. `sliding_window`, the default, keeps the key as it is.
    pub fn for_algorithm(self, a: Algorithm) -> Self {
        let mut k = self;
        k.0[15] ^= match a {
            Algorithm::SlidingWindow => 0,
            Algorithm::FixedWindow => 1,
            Algorithm::SlidingLog => 2,
            Algorithm::TokenBucket => 3,
            Algorithm::Gcra => 4,
        };
        k
    }

    /// Lower-case hex, 32 characters.
    pub fn hex(&self) -> String {
        let mut s = String::with_capacity(32);
        self.write_hex(&mut s);
        s
    }

    /// The key whose [`CounterKey::hex`] is `s`.
    pub fn from_hex(s: &str) -> Option<CounterKey> {
        let b = s.as_bytes();
        if b.len() != 32 {
            return None;
        }
        let digit = |c: u8| char::from(c).to_digit(16).map(|d| d as u8);
        let mut out = [0u8; 16];
        for (i, o) in out.iter_mut().enumerate() {
            *o = digit(b[2 * i])? << 4 | digit(b[2 * i + 1])?;
        }
        Some(CounterKey(out))
    }

    /// Append the lower-case hex of the key (32 characters) to `out`.
    pub fn write_hex(&self, out: &mut String) {
        // Appended once: a `push` per digit costs a capacity check and a UTF-8 encoding each
        // (500 instructions per key).
        out.push_str(std::str::from_utf8(&self.hex_digits()).expect("hex digits are ASCII"));
    }

    /// The lower-case hex of the key, 32 ASCII digits.
    pub fn hex_digits(&self) -> [u8; 32] {
        let mut hex = [0u8; 32];
        for (pair, b) in hex.chunks_exact_mut(2).zip(self.0) {
            pair.copy_from_slice(&HEX_PAIRS[usize::from(b)]);
        }
        hex
    }
}

/// The longest input a [`KeyMemo`] keeps: a limit name and an IP address, an API key's hash
/// or a short header value.
const MEMO_INPUT: usize = 64;

/// The counter keys a connection's requests were given lately, with the bytes each was hashed
/// from. A keep-alive connection's requests mostly come from one caller, so their keys
/// (BLAKE3 of the limit name and the caller's parts, about 1,000 instructions each) are
/// hashed once per connection rather than once per request; a request whose bytes are not
/// here (another caller behind a proxy, a longer key) is hashed as before. Four entries,
/// replaced in turn.
#[derive(Default)]
pub struct KeyMemo(parking_lot::Mutex<Memo>);

impl fmt::Debug for KeyMemo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kept = self.0.lock().entries.iter().flatten().count();
        f.debug_struct("KeyMemo").field("kept", &kept).finish()
    }
}

#[derive(Default)]
struct Memo {
    entries: [Option<Remembered>; 4],
    next: usize,
}

struct Remembered {
    len: usize,
    input: [u8; MEMO_INPUT],
    key: CounterKey,
}

impl KeyMemo {
    fn get(&self, input: &[u8]) -> Option<CounterKey> {
        let memo = self.0.lock();
        memo.entries
            .iter()
            .flatten()
            .find(|e| e.input[..e.len] == *input)
            .map(|e| e.key)
    }

    fn keep(&self, input: &[u8], key: CounterKey) {
        let mut copy = [0u8; MEMO_INPUT];
        copy[..input.len()].copy_from_slice(input);
        let mut memo = self.0.lock();
        let slot = memo.next;
        memo.entries[slot] = Some(Remembered {
            len: input.len(),
            input: copy,
            key,
        });
        memo.next = (slot + 1) % memo.entries.len();
    }
}

/// The bytes a key is hashed from, gathered on the stack while they fit; a longer input (a
/// long header value) moves to the heap. Plain copies into an array: a `SmallVec` cost some
/// 200 instructions more per key in its capacity checks.
struct Input {
    stack: [u8; 256],
    len: usize,
    heap: Vec<u8>,
}

impl Input {
    fn new() -> Self {
        Input {
            stack: [0; 256],
            len: 0,
            heap: Vec::new(),
        }
    }

    /// Append `p`, after its length (4 bytes, little-endian).
    fn part(&mut self, p: &[u8]) {
        let prefix = (p.len() as u32).to_le_bytes();
        let (start, end) = (self.len, self.len + 4 + p.len());
        if self.heap.is_empty() && end <= self.stack.len() {
            self.stack[start..start + 4].copy_from_slice(&prefix);
            self.stack[start + 4..end].copy_from_slice(p);
            self.len = end;
            return;
        }
        if self.heap.is_empty() {
            self.heap.extend_from_slice(&self.stack[..start]);
        }
        self.heap.extend_from_slice(&prefix);
        self.heap.extend_from_slice(p);
    }

    fn bytes(&self) -> &[u8] {
        if self.heap.is_empty() {
            &self.stack[..self.len]
        } else {
            &self.heap
        }
    }
}

/// The two lower-case hex digits of every byte: one look-up per byte.
const HEX_PAIRS: [[u8; 2]; 256] = {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut t = [[0u8; 2]; 256];
    let mut b = 0;
    while b < 256 {
        t[b] = [DIGITS[b >> 4], DIGITS[b & 15]];
        b += 1;
    }
    t
};

impl fmt::Debug for CounterKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CounterKey({})", self.hex())
    }
}

/// Keys are already uniformly distributed hashes: their last 8 bytes are the hash (the first
/// byte picks a shard in the memory stores).
#[derive(Default)]
pub struct KeyHasher(u64);

impl Hasher for KeyHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 << 8) | b as u64;
        }
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

impl std::hash::Hash for CounterKey {
    fn hash<H: Hasher>(&self, state: &mut H) {
        state.write_u64(u64::from_le_bytes(
            self.0[8..16].try_into().expect("8 bytes"),
        ));
    }
}

/// A map keyed by counter keys, without rehashing them.
pub type KeyMap<V> = HashMap<CounterKey, V, BuildHasherDefault<KeyHasher>>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_are_length_prefixed() {
        let a = CounterKey::new("l", [&b"ab"[..], b"c"]);
        let b = CounterKey::new("l", [&b"a"[..], b"bc"]);
        assert_ne!(a, b);
        assert_ne!(a, CounterKey::new("m", [&b"ab"[..], b"c"]));
        assert_eq!(a, CounterKey::new("l", [&b"ab"[..], b"c"]));
        assert_eq!(a.hex().len(), 32);
    }

    /// Keys name counters in Redis and in usage reports, so they must not change: the one-shot
    /// hash is the streaming hash of the same length-prefixed bytes, short and long.
    #[test]
    fn keys_are_the_streaming_blake3_of_the_length_prefixed_parts() {
        let streaming = |limit: &str, parts: &[&[u8]]| {
            let mut h = blake3::Hasher::new();
            h.update(&(limit.len() as u32).to_le_bytes());
            h.update(limit.as_bytes());
            for p in parts {
                h.update(&(p.len() as u32).to_le_bytes());
                h.update(p);
            }
            h.finalize().as_bytes()[..16].to_vec()
        };
        let long = vec![7u8; 5000];
        // With the name `e` (4 + 1 bytes) and a part's 4-byte prefix, 247 bytes fill the
        // 256 gathered on the stack exactly; 248 spill, as does a second part after them.
        let (fill, spill) = (vec![1u8; 247], vec![2u8; 248]);
        let cases: [(&str, Vec<&[u8]>); 8] = [
            ("per-ip", vec![&[127, 0, 0, 1][..]]),
            ("none", vec![]),
            ("h", vec![&b"tenant"[..], &b"GET"[..]]),
            ("long", vec![&long[..], &b"x"[..]]),
            ("e", vec![&fill[..]]),
            ("e", vec![&spill[..]]),
            ("e", vec![&fill[..], &b""[..], &b"y"[..]]),
            ("e", vec![&b"x"[..], &long[..], &fill[..]]),
        ];
        for (limit, parts) in cases {
            let k = CounterKey::new(limit, parts.iter().copied());
            assert_eq!(k.0.to_vec(), streaming(limit, &parts), "{limit}");
        }
        assert_eq!(
            CounterKey::new("l", [&b"caller"[..]]).hex(),
            "c9bb424bf5a81eec94a9edf4dce290d7"
        );
    }

    #[test]
    fn a_remembered_key_is_the_hashed_one_and_the_memo_keeps_four_short_inputs() {
        let memo = KeyMemo::default();
        let kept = |m: &KeyMemo| m.0.lock().entries.iter().flatten().count();
        let ip = |last: u8| [10, 0, 0, last];
        for round in 0..2 {
            for last in 1..=6u8 {
                let parts = [&ip(last)[..], &b"GET"[..]];
                let key = CounterKey::remembered(Some(&memo), "per-ip", parts);
                assert_eq!(key, CounterKey::new("per-ip", parts), "{round} {last}");
            }
        }
        // Six callers through four entries: the last four are there, in turn.
        assert_eq!(kept(&memo), 4);
        let entry_of = |last: u8| {
            let parts = [&ip(last)[..], &b"GET"[..]];
            let mut input = Input::new();
            input.part(b"per-ip");
            parts.iter().for_each(|p| input.part(p));
            memo.get(input.bytes())
        };
        assert!(entry_of(2).is_none());
        assert_eq!(
            entry_of(6),
            Some(CounterKey::new("per-ip", [&ip(6)[..], &b"GET"[..]]))
        );
        // An input past 64 bytes is hashed, not kept.
        let long = [7u8; 60];
        let key = CounterKey::remembered(Some(&memo), "per-ip", [&long[..]]);
        assert_eq!(key, CounterKey::new("per-ip", [&long[..]]));
        assert_eq!(kept(&memo), 4);
        assert!(entry_of(6).is_some(), "the long input took no entry");
    }

    /// Every byte value as its two lower-case hex digits, and back.
    #[test]
    fn hex_has_two_digits_per_byte_for_every_byte() {
        for b in 0..=255u8 {
            let mut bytes = [0u8; 16];
            bytes[usize::from(b % 16)] = b;
            let key = CounterKey(bytes);
            let expected: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
            assert_eq!(key.hex(), expected);
            assert_eq!(CounterKey::from_hex(&expected), Some(key));
        }
    }

    #[test]
    fn each_algorithm_has_its_own_key_in_the_same_shard() {
        let k = CounterKey::new("l", [&b"caller"[..]]);
        let keys: Vec<CounterKey> = Algorithm::ALL.map(|a| k.for_algorithm(a)).to_vec();
        assert_eq!(keys[0], k, "sliding_window keeps the key");
        for (i, a) in keys.iter().enumerate() {
            assert_eq!(a.0[0], k.0[0], "same shard");
            for b in &keys[i + 1..] {
                assert_ne!(a, b);
            }
        }
    }
}
