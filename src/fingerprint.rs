//! How an API key is named wherever it must be named (the access log, `GET /top`, the quota
//! admin API): `fp:` and the first 8 hex digits of a keyed BLAKE3 hash of the key; and how
//! counters and the quota store name it: [`KeyHash`], BLAKE3 of the key.
//! A fingerprint tells keys apart without containing any character of the key, and 32 bits of
//! a hash cannot be turned back into a key of any real length.
//!
//! The hash is keyed (BLAKE3's key-derivation mode with a fixed context), so the fingerprint
//! is the same on every gateway and across restarts, and differs from the counter-key hashes
//! that live in Redis.
//!
//! Phase: any. It imports nothing of the crate, so every module may use it.

use std::fmt;

/// BLAKE3's key-derivation context for fingerprints; changing it renames every key.
const CONTEXT: &str = "tollgate 2026-11 api key fingerprint v1";

/// Hex digits of a fingerprint.
pub const LEN: usize = 8;

/// The fingerprint of one API key: 8 lowercase hex digits, shown as `fp:1a2b3c4d`.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Fingerprint([u8; PREFIX.len() + LEN]);

const PREFIX: &str = "fp:";

/// The fingerprint of `api_key`. No allocation.
pub fn fingerprint(api_key: &str) -> Fingerprint {
    static KEY: std::sync::OnceLock<[u8; 32]> = std::sync::OnceLock::new();
    let key = KEY.get_or_init(|| blake3::derive_key(CONTEXT, b""));
    let hash = blake3::keyed_hash(key, api_key.as_bytes());
    let mut out = [0u8; PREFIX.len() + LEN];
    out[..PREFIX.len()].copy_from_slice(PREFIX.as_bytes());
    const HEX: &[u8; 16] = b"0123456789abcdef";
    for (i, b) in hash.as_bytes()[..LEN / 2].iter().enumerate() {
        out[PREFIX.len() + 2 * i] = HEX[usize::from(b >> 4)];
        out[PREFIX.len() + 2 * i + 1] = HEX[usize::from(b & 0xf)];
    }
    Fingerprint(out)
}

impl Fingerprint {
    /// `fp:` and the 8 hex digits.
    pub fn as_str(&self) -> &str {
        std::str::from_utf8(&self.0).expect("ASCII")
    }

    /// The 8 hex digits, without the `fp:` prefix.
    pub fn hex(&self) -> &str {
        &self.as_str()[PREFIX.len()..]
    }

    /// Parse 8 hex digits (as the quota admin API's `fp:<fingerprint>` names them).
    pub fn parse(hex: &str) -> Option<Fingerprint> {
        let b = hex.as_bytes();
        let ok = b.len() == LEN && b.iter().all(|c| matches!(c, b'0'..=b'9' | b'a'..=b'f'));
        ok.then(|| {
            let mut out = [0u8; PREFIX.len() + LEN];
            out[..PREFIX.len()].copy_from_slice(PREFIX.as_bytes());
            out[PREFIX.len()..].copy_from_slice(b);
            Fingerprint(out)
        })
    }
}

impl fmt::Display for Fingerprint {
    /// `fp:1a2b3c4d`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl fmt::Debug for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// BLAKE3 of an API key: how counters and the quota store name a key. Counter keys hash it (not
/// the key), so the admin API can find a key's counters from the hash the quota store keeps.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct KeyHash(pub [u8; 32]);

impl KeyHash {
    /// No allocation.
    pub fn of(api_key: &str) -> KeyHash {
        KeyHash(*blake3::hash(api_key.as_bytes()).as_bytes())
    }

    pub fn hex(&self) -> String {
        blake3::Hash::from(self.0).to_hex().to_string()
    }

    pub fn from_hex(s: &str) -> Option<KeyHash> {
        blake3::Hash::from_hex(s)
            .ok()
            .map(|h| KeyHash(*h.as_bytes()))
    }
}

impl fmt::Debug for KeyHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "KeyHash({}…)", &self.hex()[..8])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stable_short_and_free_of_the_key() {
        let a = fingerprint("demo-free");
        assert_eq!(a, fingerprint("demo-free"));
        assert_ne!(a, fingerprint("demo-pro"));
        assert_eq!(a.hex().len(), LEN);
        assert!(a.to_string().starts_with("fp:"));
        assert_eq!(Fingerprint::parse(a.hex()), Some(a));
        assert_eq!(Fingerprint::parse("xyz"), None);
        let key = "sk_live_0123456789abcdef";
        assert!(!fingerprint(key).to_string().contains(key));
    }
}
