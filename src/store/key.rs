//! Counter keys. User-supplied parts (API keys, IPs, header values) are hashed with the limit
//! name into a fixed 16-byte key; they are never stored verbatim.

use std::collections::HashMap;
use std::fmt;
use std::hash::{BuildHasherDefault, Hasher};

/// A limit's counter for one caller: BLAKE3 of the limit name and the key parts, truncated to
/// 128 bits.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct CounterKey(pub [u8; 16]);

impl CounterKey {
    /// Build a key from the limit name and its parts. Each part is length-prefixed so that
    /// `("ab","c")` and `("a","bc")` differ.
    pub fn new<'a>(limit: &str, parts: impl IntoIterator<Item = &'a [u8]>) -> Self {
        let mut h = blake3::Hasher::new();
        h.update(&(limit.len() as u32).to_le_bytes());
        h.update(limit.as_bytes());
        for p in parts {
            h.update(&(p.len() as u32).to_le_bytes());
            h.update(p);
        }
        let mut out = [0u8; 16];
        out.copy_from_slice(&h.finalize().as_bytes()[..16]);
        CounterKey(out)
    }

    /// Lower-case hex, 32 characters.
    pub fn hex(&self) -> String {
        let mut s = String::with_capacity(32);
        for b in self.0 {
            use fmt::Write;
            let _ = write!(s, "{b:02x}");
        }
        s
    }
}

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
}
