//! Request-path normalization: the step NGINX and Envoy (`normalize_path`, `merge_slashes`)
//! take before routing, so that `/%6Cogin`, `//login` and `/x/../login` all meet the route
//! and the limits of `/login`.
//!
//! Phase: request_filter, before routing. Pure: it reads the path it is given and touches
//! nothing else (no headers, no config, no session). An already-normal path, the common case,
//! is returned borrowed, without allocating; otherwise one `String` of at most the input's
//! length (plus one byte) is built.
//!
//! The normal form of a path:
//!
//! * percent-escapes of unreserved characters (ALPHA / DIGIT / `-` / `.` / `_` / `~`,
//!   RFC 3986 §2.3) are decoded; every other escape stays encoded, with upper-case hex digits.
//!   `%2F` and `%5C` in particular stay encoded: decoding never creates a `/` (or `\`);
//! * repeated `/` are merged, before dot-segments are removed (as NGINX does), so `/a//..`
//!   is `/`;
//! * dot-segments are removed (RFC 3986 §5.2.4), including those that only appear after
//!   decoding (`/%2e%2E/`); `..` never climbs above the root. A trailing `.` or `..` leaves a
//!   trailing `/` (`/a/b/..` is `/a/`);
//! * anything else (other characters, raw non-ASCII) is kept as it is.
//!
//! Every `%2F` of the normal form was a `%2F` (or `%2f`) of the input; the only way one goes
//! missing is with a whole segment that a `..` removes (`/a%2Fb/../c` is `/c`).
//!
//! A `%` not followed by two hex digits is an error, and so is a path that starts with
//! neither `/` nor is exactly `*` (the caller checks that `*` comes with `OPTIONS`). The input
//! may carry a query: everything from the first `?` on is copied unchanged.

use std::borrow::Cow;

/// A path that cannot be normalized. The gateway answers `400`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PathError {
    #[error("the path must start with '/' (or be '*')")]
    NotAbsolute,
    #[error("invalid percent-escape at byte {at} of the path")]
    BadEscape { at: usize },
}

/// A normalized path and what was found on the way.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Normalized<'a> {
    /// Borrowed exactly when the input was already normal.
    path: Cow<'a, str>,
    escaped_slash: bool,
}

impl<'a> Normalized<'a> {
    /// The normal form (with the input's query, if it had one).
    pub fn as_str(&self) -> &str {
        &self.path
    }

    /// The normal form, borrowed from the input when it was already normal.
    pub fn into_cow(self) -> Cow<'a, str> {
        self.path
    }

    /// The input was already normal: the normal form is the input itself. A `reject` mode
    /// answers `400` to every path for which this is false.
    pub fn was_normal(&self) -> bool {
        matches!(self.path, Cow::Borrowed(_))
    }

    /// The path holds an escaped slash or backslash (`%2F`, `%2f`, `%5C`, `%5c`), for an
    /// `escaped_slashes: reject` mode. The normal form keeps them (upper-cased).
    pub fn has_escaped_slash(&self) -> bool {
        self.escaped_slash
    }
}

/// Normalize a request path (see the module docs for the normal form).
pub fn normalize(target: &str) -> Result<Normalized<'_>, PathError> {
    if target == "*" {
        return Ok(Normalized {
            path: Cow::Borrowed(target),
            escaped_slash: false,
        });
    }
    if !target.starts_with('/') {
        return Err(PathError::NotAbsolute);
    }
    let scan = scan(target)?;
    let (path, query) = target.split_at(scan.path_len);
    let path = if scan.normal {
        Cow::Borrowed(target)
    } else {
        let mut out = rebuild(path, query.len())?;
        out.push_str(query);
        Cow::Owned(out)
    };
    Ok(Normalized {
        path,
        escaped_slash: scan.escaped_slash,
    })
}

/// A host without its trailing dot (`api.example.com.` is `api.example.com`), for matching
/// against configured hosts. The port and letter case are left to the caller.
pub fn trim_host_dot(host: &str) -> &str {
    match host.strip_suffix('.') {
        Some(h) if !h.is_empty() => h,
        _ => host,
    }
}

/// What one pass over a path found.
struct Scan {
    normal: bool,
    escaped_slash: bool,
    /// Where the path ends: at the `?` of a query, or the end of the target.
    path_len: usize,
}

/// Find where the path of `target` (which starts with `/`) ends, check every escape in it and
/// decide, without allocating, whether it is already normal: exactly when [`rebuild`] would
/// return it unchanged. One pass; the query (after a `?`) is not looked at.
fn scan(target: &str) -> Result<Scan, PathError> {
    let b = target.as_bytes();
    let mut scan = Scan {
        normal: true,
        escaped_slash: false,
        path_len: b.len(),
    };
    let mut seg_start = 1;
    let mut i = 1;
    while i <= b.len() {
        let end = i == b.len() || b[i] == b'?';
        if end || b[i] == b'/' {
            let seg = &b[seg_start..i];
            // An empty segment is only normal at the end (a trailing slash).
            if (seg.is_empty() && !end) || seg == b"." || seg == b".." {
                scan.normal = false;
            }
            if end {
                scan.path_len = i;
                break;
            }
            seg_start = i + 1;
            i += 1;
        } else if b[i] == b'%' {
            let byte = escape_at(b, i)?;
            if is_unreserved(byte) || b[i + 1..i + 3].iter().any(u8::is_ascii_lowercase) {
                scan.normal = false;
            }
            scan.escaped_slash |= byte == b'/' || byte == b'\\';
            i += 3;
        } else {
            i += 1;
        }
    }
    Ok(scan)
}

/// Build the normal form of `path` (which starts with `/` and has no query), with room for
/// `extra` more bytes.
fn rebuild(path: &str, extra: usize) -> Result<String, PathError> {
    let mut out = String::with_capacity(path.len() + 1 + extra);
    out.push('/');
    // `out` ends with '/' between segments; the last segment kept takes it off again.
    let mut ends_in_segment = false;
    let mut offset = 1;
    for seg in path[1..].split('/') {
        let mark = out.len();
        push_segment(&mut out, seg, offset)?;
        offset += seg.len() + 1;
        match &out[mark..] {
            "" | "." => {
                out.truncate(mark);
                ends_in_segment = false;
            }
            ".." => {
                out.truncate(mark);
                pop_segment(&mut out);
                ends_in_segment = false;
            }
            _ => {
                out.push('/');
                ends_in_segment = true;
            }
        }
    }
    if ends_in_segment {
        out.pop();
    }
    Ok(out)
}

/// Append one segment with unreserved escapes decoded and the others upper-cased. `offset`
/// is where the segment starts in the path, for error positions.
fn push_segment(out: &mut String, seg: &str, offset: usize) -> Result<(), PathError> {
    let b = seg.as_bytes();
    let mut run = 0;
    let mut i = 0;
    while i < b.len() {
        if b[i] != b'%' {
            i += 1;
            continue;
        }
        // '%' is ASCII, so these slices fall on character boundaries.
        out.push_str(&seg[run..i]);
        let byte = escape_at(b, i).map_err(|_| PathError::BadEscape { at: offset + i })?;
        if is_unreserved(byte) {
            out.push(char::from(byte));
        } else {
            out.push('%');
            out.push(char::from(HEX[usize::from(byte >> 4)]));
            out.push(char::from(HEX[usize::from(byte & 0xf)]));
        }
        i += 3;
        run = i;
    }
    out.push_str(&seg[run..]);
    Ok(())
}

/// Drop the last segment of `out`, which ends with '/'; at the root there is none to drop.
fn pop_segment(out: &mut String) {
    let body = &out[..out.len() - 1];
    if let Some(slash) = body.rfind('/') {
        out.truncate(slash + 1);
    }
}

const HEX: &[u8; 16] = b"0123456789ABCDEF";

/// The byte escaped by the `%` at `b[i]`.
fn escape_at(b: &[u8], i: usize) -> Result<u8, PathError> {
    let digit = |j: usize| {
        b.get(j)
            .copied()
            .and_then(hex_value)
            .ok_or(PathError::BadEscape { at: i })
    };
    Ok((digit(i + 1)? << 4) | digit(i + 2)?)
}

fn hex_value(d: u8) -> Option<u8> {
    match d {
        b'0'..=b'9' => Some(d - b'0'),
        b'a'..=b'f' => Some(d - b'a' + 10),
        b'A'..=b'F' => Some(d - b'A' + 10),
        _ => None,
    }
}

/// RFC 3986 §2.3: ALPHA / DIGIT / "-" / "." / "_" / "~".
fn is_unreserved(c: u8) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, b'-' | b'.' | b'_' | b'~')
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// (input, normal form); the input is normal exactly when both are equal.
    const CASES: &[(&str, &str)] = &[
        ("/", "/"),
        ("/login", "/login"),
        ("//login", "/login"),
        ("///login//", "/login/"),
        ("/./login", "/login"),
        ("/x/../login", "/login"),
        ("/%6Cogin", "/login"),
        ("/%6cogin", "/login"),
        ("/a/%2F/b", "/a/%2F/b"),
        ("/a%2fb", "/a%2Fb"),
        ("/a%5cb", "/a%5Cb"),
        ("/..", "/"),
        ("/.", "/"),
        ("/../../x", "/x"),
        ("/a/b/..", "/a/"),
        ("/a/b/../", "/a/"),
        ("/a/./b/.", "/a/b/"),
        ("/a/", "/a/"),
        ("/a//..", "/"),
        ("/%2e%2E", "/"),
        ("/a/%2e%2E/b", "/b"),
        ("/a/.%2e/b", "/b"),
        ("/a/%2E/b", "/a/b"),
        ("/a%2eb", "/a.b"),
        ("/...", "/..."),
        ("/a/..b/c.", "/a/..b/c."),
        ("/%41%7a%30%2D%2e%5F%7E", "/Az0-._~"),
        ("/%c3%A9t%C3%a9", "/%C3%A9t%C3%A9"),
        ("/%C3%A9t%C3%A9", "/%C3%A9t%C3%A9"),
        ("/%e2%82%ac/%F0%9F%98%80", "/%E2%82%AC/%F0%9F%98%80"),
        ("/caf\u{e9}//x", "/caf\u{e9}/x"),
        ("/%25", "/%25"),
        ("/%2541", "/%2541"),
        ("/%3a%40", "/%3A%40"),
        ("/a%2F..%2Fb/../c", "/c"),
        ("/a?x=//y/../z", "/a?x=//y/../z"),
        ("//a/./b?q=%6c", "/a/b?q=%6c"),
        ("*", "*"),
    ];

    #[test]
    fn table() {
        for &(input, want) in CASES {
            let n = normalize(input).unwrap_or_else(|e| panic!("{input}: {e}"));
            assert_eq!(n.as_str(), want, "{input}");
            assert_eq!(n.was_normal(), input == want, "{input}");
        }
    }

    #[test]
    fn escaped_slashes_are_reported_in_either_case() {
        for p in ["/a%2Fb", "/a%2fb", "/a%5Cb", "/a%5cb", "/%2F/..", "/x/%2f"] {
            assert!(normalize(p).unwrap().has_escaped_slash(), "{p}");
        }
        for p in ["/a/b", "/%25%32%46", "/%2e", "/a\\b", "*"] {
            assert!(!normalize(p).unwrap().has_escaped_slash(), "{p}");
        }
    }

    #[test]
    fn errors() {
        use PathError::{BadEscape, NotAbsolute};
        for (input, want) in [
            ("", NotAbsolute),
            ("login", NotAbsolute),
            ("*x", NotAbsolute),
            ("?a", NotAbsolute),
            ("/%zz", BadEscape { at: 1 }),
            ("/a/%4", BadEscape { at: 3 }),
            ("/%", BadEscape { at: 1 }),
            ("/a%g0", BadEscape { at: 2 }),
            ("//a/%2e/%4", BadEscape { at: 8 }),
        ] {
            assert_eq!(normalize(input), Err(want), "{input:?}");
        }
        // The query is not the path's business.
        assert!(normalize("/a?%zz").unwrap().was_normal());
    }

    #[test]
    fn a_normal_path_is_borrowed() {
        let input = String::from("/api/v1/orders/%C3%A9");
        let n = normalize(&input).unwrap();
        assert!(matches!(n.into_cow(), Cow::Borrowed(p) if std::ptr::eq(p, input.as_str())));
    }

    #[test]
    fn host_trailing_dot() {
        assert_eq!(trim_host_dot("api.example.com."), "api.example.com");
        assert_eq!(trim_host_dot("api.example.com"), "api.example.com");
        assert_eq!(trim_host_dot("API.Example.com."), "API.Example.com");
        assert_eq!(trim_host_dot("."), ".");
        assert_eq!(trim_host_dot(""), "");
    }

    /// Paths built from pieces that exercise every rule.
    fn arb_path() -> impl Strategy<Value = String> {
        let piece = prop_oneof![
            4 => Just("/"),
            2 => Just("."),
            1 => Just(".."),
            2 => prop::sample::select(vec!["a", "b", "-", "~", "_", "\u{e9}", "\\"]),
            2 => prop::sample::select(vec!["%2e", "%2E", "%41", "%6c", "%7e", "%5f", "%2d"]),
            2 => prop::sample::select(vec!["%2F", "%2f", "%5C", "%5c"]),
            1 => prop::sample::select(vec!["%25", "%3a", "%C3", "%a9", "%00", "%ff", "%20"]),
        ];
        prop::collection::vec(piece, 0..24).prop_map(|v| format!("/{}", v.concat()))
    }

    /// Like [`arb_path`] without dots: no segment can be `..`, so no segment holding a `%2F`
    /// is ever removed.
    fn arb_dotless_path() -> impl Strategy<Value = String> {
        arb_path().prop_map(|p| p.replace(['.'], "").replace("%2e", "").replace("%2E", ""))
    }

    fn escaped_slashes(s: &str) -> usize {
        s.to_ascii_uppercase().matches("%2F").count()
    }

    fn has_escaped_slash_or_backslash(s: &str) -> bool {
        let s = s.to_ascii_uppercase();
        s.contains("%2F") || s.contains("%5C")
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2048))]

        /// Normalizing twice is normalizing once, and a normal form is normal.
        #[test]
        fn prop_idempotent(p in arb_path()) {
            let once = normalize(&p).unwrap();
            let twice = normalize(once.as_str()).unwrap();
            prop_assert_eq!(twice.as_str(), once.as_str());
            prop_assert!(twice.was_normal());
        }

        /// The output has no empty or dot segment left, and only canonical escapes.
        #[test]
        fn prop_no_dot_segments_nor_double_slashes(p in arb_path()) {
            let n = normalize(&p).unwrap();
            let out = n.as_str();
            prop_assert!(out.starts_with('/'));
            for bad in ["//", "/./", "/../"] {
                prop_assert!(!out.contains(bad), "{:?} -> {:?}", p, out);
            }
            prop_assert!(!out.ends_with("/.") && !out.ends_with("/.."), "{:?} -> {:?}", p, out);
            for esc in out.split('%').skip(1) {
                let hex = &esc[..2];
                prop_assert_eq!(hex, hex.to_ascii_uppercase());
                let byte = u8::from_str_radix(hex, 16).unwrap();
                prop_assert!(!is_unreserved(byte), "{:?} -> {:?}", p, out);
            }
        }

        /// Decoding never creates a `/`: no more slashes out than in, no more `%2F`; and when
        /// no `..` can drop a segment, exactly as many `%2F` as in the input.
        #[test]
        fn prop_escaped_slashes_are_kept(p in arb_path(), q in arb_dotless_path()) {
            let out = normalize(&p).unwrap();
            prop_assert_eq!(out.has_escaped_slash(), has_escaped_slash_or_backslash(&p));
            prop_assert!(out.as_str().matches('/').count() <= p.matches('/').count());
            prop_assert!(escaped_slashes(out.as_str()) <= escaped_slashes(&p));
            let out = normalize(&q).unwrap();
            prop_assert_eq!(escaped_slashes(out.as_str()), escaped_slashes(&q), "{:?} -> {:?}", q, out.as_str());
        }

        /// `was_normal` (one scan) agrees with the rebuilt form: a normal input comes back
        /// unchanged and borrowed, any other comes back changed.
        #[test]
        fn prop_normal_iff_unchanged(p in arb_path()) {
            let n = normalize(&p).unwrap();
            let rebuilt = rebuild(&p, 0).unwrap();
            prop_assert_eq!(n.as_str(), rebuilt.as_str());
            prop_assert_eq!(n.was_normal(), rebuilt == p, "{:?} -> {:?}", p, rebuilt);
        }

        /// Any string: an error or a normal form, never a panic.
        #[test]
        fn prop_any_input(p in "/?\\PC{0,40}") {
            if let Ok(n) = normalize(&p) {
                let again = normalize(n.as_str()).unwrap();
                prop_assert_eq!(again.as_str(), n.as_str());
            }
        }
    }
}
