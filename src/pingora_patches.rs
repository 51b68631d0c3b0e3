//! The one place tollgate calls what its patched Pingora adds (`patches/`, applied by
//! `[patch.crates-io]` in Cargo.toml): header lines encoded once, static header names, a head's
//! header reservation and raw length, dropping header case, and no timing of I/O waits. Every
//! other module calls these through here, so that tollgate also builds on stock Pingora 0.9.1,
//! which is how the whole patch set is measured against stock in one paired run.
//!
//! The default build calls the patched APIs themselves: type re-exports and `#[inline]`
//! one-line functions, the same calls the code made before this module. With the feature
//! `stock-pingora` each is built from stock Pingora's own API instead, at its stock cost (a
//! rate-limit header goes through the header map): the same headers with the same values, in
//! the same order among themselves. What a client can tell apart: on stock Pingora header names
//! keep their case whatever `server.preserve_header_case` says (stock has no switch to drop
//! it), and a header Pingora adds to the map after the response filter goes out after the
//! rate-limit headers rather than before them. The feature alone does not make a stock build,
//! since `[patch.crates-io]` applies whatever the features: `scripts/stock-build.sh` builds
//! one (patches/README.md, "Building against stock Pingora").
//!
//! Phase: any. Startup (server and peer options, process settings) and per request (the
//! rate-limit header lines, the forwarding headers, the head's size). It imports nothing of the
//! crate, so every module may use it.

use http::HeaderValue;
use pingora_core::apps::HttpServerOptions;
use pingora_core::protocols::http::v1::server::HttpSession;
use pingora_core::upstreams::peer::PeerOptions;
use pingora_error::Result;
use pingora_http::{RequestHeader, ResponseHeader};

#[cfg(not(feature = "stock-pingora"))]
pub use pingora_http::{EncodedHeaders, StaticHeaderName};
#[cfg(feature = "stock-pingora")]
pub use stock::{EncodedHeaders, Lines, StaticHeaderName};

/// What [`with_lines`] hands its closure: a response's encoded header lines.
#[cfg(not(feature = "stock-pingora"))]
pub type Lines = EncodedHeaders;

/// Run `f` on the encoded header lines of `resp`, which go out after the headers of its map
/// ([`EncodedHeaders`]). Stock: `f` adds each header to the map instead, after those it holds.
#[inline]
pub fn with_lines<R>(resp: &mut ResponseHeader, f: impl FnOnce(&mut Lines) -> R) -> R {
    #[cfg(not(feature = "stock-pingora"))]
    return f(resp.encoded_headers_mut());
    #[cfg(feature = "stock-pingora")]
    return f(&mut Lines::new(resp));
}

/// Room for `additional` more headers in `req`'s maps. Stock: nothing (they grow as needed).
#[inline]
pub fn reserve_headers(req: &mut RequestHeader, additional: usize) {
    #[cfg(not(feature = "stock-pingora"))]
    req.reserve(additional);
    #[cfg(feature = "stock-pingora")]
    let _ = (req, additional);
}

/// Set header `name` of `req` to `value` (replacing any it has): the name's case and parsed
/// form are built with the program. Stock: the name is parsed on each call.
#[inline]
pub fn insert_header(
    req: &mut RequestHeader,
    name: &'static StaticHeaderName,
    value: impl TryInto<HeaderValue>,
) -> Result<()> {
    #[cfg(not(feature = "stock-pingora"))]
    return req.insert_header(name, value);
    #[cfg(feature = "stock-pingora")]
    return req.insert_header(name.as_str(), value);
}

/// The size of an HTTP/1 request's head as received, in bytes. Stock: the length of a copy
/// of the buffer's handle (`get_headers_raw_bytes`, one atomic count up and down).
#[inline]
pub fn headers_raw_len(h: &HttpSession) -> usize {
    #[cfg(not(feature = "stock-pingora"))]
    return h.headers_raw_len();
    #[cfg(feature = "stock-pingora")]
    return h.get_headers_raw_bytes().len();
}

/// Whether request heads read by a server with `options` keep their header names' case.
/// Stock: they always do.
#[inline]
pub fn server_header_case(options: &mut HttpServerOptions, preserve: bool) {
    #[cfg(not(feature = "stock-pingora"))]
    {
        options.discard_h1_header_case = !preserve;
    }
    #[cfg(feature = "stock-pingora")]
    let _ = (options, preserve);
}

/// Whether response heads read from a peer with `options` keep their header names' case.
/// Stock: they always do.
#[inline]
pub fn peer_header_case(options: &mut PeerOptions, preserve: bool) {
    #[cfg(not(feature = "stock-pingora"))]
    {
        options.discard_h1_header_case = !preserve;
    }
    #[cfg(feature = "stock-pingora")]
    let _ = (options, preserve);
}

/// Streams stop timing their reads' and writes' waits (Pingora pull request 30,
/// `patches/README.md`), for the whole process. Stock: nothing (they keep timing them).
#[inline]
pub fn no_pending_time_accounting() {
    #[cfg(not(feature = "stock-pingora"))]
    pingora_core::protocols::l4::stream::set_pending_time_accounting(false);
}

/// The stock forms, built from stock Pingora's API alone: what tollgate's code would be
/// without the patches.
#[cfg(feature = "stock-pingora")]
mod stock {
    use bytes::Bytes;
    use http::HeaderName;

    use super::{HeaderValue, ResponseHeader};

    /// Header lines built once (with the config) and added to many responses: each header
    /// both as its wire line and as its name and value, which go into a response's map.
    #[derive(Debug, Clone, Default, PartialEq, Eq)]
    pub struct EncodedHeaders {
        wire: Vec<u8>,
        headers: Vec<(HeaderName, HeaderValue)>,
    }

    impl EncodedHeaders {
        pub fn new() -> Self {
            Self::default()
        }

        /// The lines as they go on the wire.
        pub fn as_bytes(&self) -> &[u8] {
            &self.wire
        }

        pub fn push(&mut self, name: &HeaderName, value: &HeaderValue) {
            for piece in [name.as_str().as_bytes(), b": ", value.as_bytes(), b"\r\n"] {
                self.wire.extend_from_slice(piece);
            }
            self.headers.push((name.clone(), value.clone()));
        }

        pub fn push_number(&mut self, name: &HeaderName, n: u64) {
            self.push(name, &HeaderValue::from(n));
        }
    }

    /// A response's headers being added, in order, after those its map holds.
    pub struct Lines<'a> {
        resp: &'a mut ResponseHeader,
    }

    impl<'a> Lines<'a> {
        pub(super) fn new(resp: &'a mut ResponseHeader) -> Self {
            Lines { resp }
        }

        /// Nothing: the map grows as needed.
        pub fn reserve(&mut self, _additional: usize) {}

        pub fn extend(&mut self, other: &EncodedHeaders) {
            for (name, value) in &other.headers {
                self.push(name, value);
            }
        }

        pub fn push(&mut self, name: &HeaderName, value: &HeaderValue) {
            append(self.resp, name, value.clone());
        }

        pub fn push_number(&mut self, name: &HeaderName, n: u64) {
            append(self.resp, name, HeaderValue::from(n));
        }

        /// Start the header `name`, its value the pieces then added; added when dropped.
        pub fn line<'b>(&'b mut self, name: &'b HeaderName) -> Line<'b> {
            Line {
                resp: self.resp,
                name,
                value: Vec::with_capacity(32),
            }
        }
    }

    /// Append a header, its name in lowercase as the patched lines write it.
    fn append(resp: &mut ResponseHeader, name: &HeaderName, value: HeaderValue) {
        // Cannot fail: the name is valid and the map far from its size limit.
        let _ = resp.append_header(name.as_str().to_owned(), value);
    }

    /// One header's value being written, piece after piece.
    pub struct Line<'a> {
        resp: &'a mut ResponseHeader,
        name: &'a HeaderName,
        value: Vec<u8>,
    }

    impl Line<'_> {
        pub fn value(&mut self, v: &HeaderValue) -> &mut Self {
            self.value.extend_from_slice(v.as_bytes());
            self
        }

        pub fn number(&mut self, n: u64) -> &mut Self {
            self.value
                .extend_from_slice(itoa::Buffer::new().format(n).as_bytes());
            self
        }
    }

    impl Drop for Line<'_> {
        fn drop(&mut self) {
            // Header values and digits make a valid value.
            let value = Bytes::from(std::mem::take(&mut self.value));
            if let Ok(value) = HeaderValue::from_maybe_shared(value) {
                append(self.resp, self.name, value);
            }
        }
    }

    /// A header name known when the program is built, written as given.
    #[derive(Debug, Clone)]
    pub struct StaticHeaderName {
        case: &'static str,
        name: HeaderName,
    }

    impl StaticHeaderName {
        pub const fn from_static(name: &'static str) -> Self {
            StaticHeaderName {
                case: name,
                name: HeaderName::from_static(name),
            }
        }

        pub fn as_header_name(&self) -> &HeaderName {
            &self.name
        }
    }

    impl StaticHeaderName {
        /// The name as written, which stock Pingora takes without parsing its case.
        pub(super) fn as_str(&self) -> &'static str {
            self.case
        }
    }
}
