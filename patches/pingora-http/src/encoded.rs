// Copyright 2026 Cloudflare, Inc.
//
// Licensed under the Apache License, Version 2.0 (the "License");
// you may not use this file except in compliance with the License.
// You may obtain a copy of the License at
//
// http://www.apache.org/licenses/LICENSE-2.0
//
// Unless required by applicable law or agreed to in writing, software
// distributed under the License is distributed on an "AS IS" BASIS,
// WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
// See the License for the specific language governing permissions and
// limitations under the License.

//! Response header lines encoded once, written as they are.

use http::header::{HeaderMap, HeaderName, HeaderValue};

/// Header lines in their HTTP/1 wire form, `name: value\r\n` each, for the headers a proxy
/// adds to a response on its way out and does not look up again: rate-limit quotas, timings,
/// trace ids.
///
/// Adding a header to a [crate::ResponseHeader]'s map hashes its name, probes the map and
/// moves the entry in, and when the response keeps header case does all of it again in the
/// case map: some 300 instructions a header. A line here costs the copy of its bytes.
///
/// The price is that these headers are not in the map. [crate::ResponseHeader::headers],
/// `remove_header`, `insert_header` and the header iterators do not see them. HTTP/1 writes
/// them after the map's headers, in the order they were added;
/// [crate::ResponseHeader::as_owned_parts] (how HTTP/2 sends a response) and the conversion
/// into [http::response::Parts] append them to the map they return. A header that must
/// replace one the upstream sent is removed from the map by the caller first.
///
/// Every line is valid by construction: a name is a [HeaderName], and a value is made of
/// [HeaderValue]s and decimal numbers, so no line can hold a CR, an LF or a NUL of its own.
///
/// ```
/// use http::header::{HeaderName, HeaderValue};
/// use pingora_http::ResponseHeader;
///
/// const RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");
/// let mut resp = ResponseHeader::build(200, None).unwrap();
/// let lines = resp.encoded_headers_mut();
/// lines
///     .line(&RATELIMIT)
///     .value(&HeaderValue::from_static("\"default\";r="))
///     .number(9)
///     .value(&HeaderValue::from_static(";t="))
///     .number(1);
/// lines.push_number(&HeaderName::from_static("x-ratelimit-remaining"), 9);
///
/// let mut wire = vec![];
/// resp.header_to_h1_wire(&mut wire);
/// assert_eq!(wire, b"ratelimit: \"default\";r=9;t=1\r\nx-ratelimit-remaining: 9\r\n");
/// assert!(resp.headers.get("ratelimit").is_none());
/// assert_eq!(resp.as_owned_parts().headers["ratelimit"], "\"default\";r=9;t=1");
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EncodedHeaders {
    buf: Vec<u8>,
}

impl EncodedHeaders {
    /// No lines, and nothing allocated.
    pub fn new() -> Self {
        Self::default()
    }

    /// Room for `additional` more bytes of lines (a line is its name, its value and 4 bytes).
    pub fn reserve(&mut self, additional: usize) {
        self.buf.reserve(additional);
    }

    /// Whether there are no lines.
    pub fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }

    /// The lines as they go on the wire.
    pub fn as_bytes(&self) -> &[u8] {
        &self.buf
    }

    /// Start the line of header `name`. Its value is what is then added to the returned
    /// [EncodedLine], piece after piece; the line ends when that is dropped.
    pub fn line(&mut self, name: &HeaderName) -> EncodedLine<'_> {
        self.buf.extend_from_slice(name.as_str().as_bytes());
        self.buf.extend_from_slice(b": ");
        EncodedLine { buf: &mut self.buf }
    }

    /// Add the line `name: value`.
    pub fn push(&mut self, name: &HeaderName, value: &HeaderValue) {
        self.line(name).value(value);
    }

    /// Add the line `name: n`, `n` in decimal.
    pub fn push_number(&mut self, name: &HeaderName, n: u64) {
        self.line(name).number(n);
    }

    /// Add every line of `other` after these: lines built once (say, with a configuration)
    /// and added to many responses, one copy each time.
    pub fn extend(&mut self, other: &EncodedHeaders) {
        self.buf.extend_from_slice(&other.buf);
    }

    /// Each line's name and value, in order.
    pub fn iter(&self) -> impl Iterator<Item = (&[u8], &[u8])> + '_ {
        // Neither a name nor a value holds a CR or an LF, and a name holds no `:`.
        self.buf
            .split(|b| *b == b'\n')
            .filter(|line| !line.is_empty())
            .filter_map(|line| {
                let line = line.strip_suffix(b"\r")?;
                let colon = line.iter().position(|b| *b == b':')?;
                Some((&line[..colon], line.get(colon + 2..).unwrap_or_default()))
            })
    }

    /// Append every line to `map`, after the headers it has.
    pub(crate) fn append_to(&self, map: &mut HeaderMap) {
        for (name, value) in self.iter() {
            // Valid by construction, so neither can fail.
            if let (Ok(name), Ok(value)) =
                (HeaderName::from_bytes(name), HeaderValue::from_bytes(value))
            {
                map.append(name, value);
            }
        }
    }
}

/// One line of [EncodedHeaders] being written: its value is the pieces added to it, one after
/// another. The line ends (its CRLF is written) when this is dropped.
pub struct EncodedLine<'a> {
    buf: &'a mut Vec<u8>,
}

impl EncodedLine<'_> {
    /// Add `v` to the value.
    pub fn value(&mut self, v: &HeaderValue) -> &mut Self {
        self.buf.extend_from_slice(v.as_bytes());
        self
    }

    /// Add `n` in decimal to the value.
    pub fn number(&mut self, n: u64) -> &mut Self {
        self.buf
            .extend_from_slice(itoa::Buffer::new().format(n).as_bytes());
        self
    }
}

impl Drop for EncodedLine<'_> {
    fn drop(&mut self) {
        self.buf.extend_from_slice(b"\r\n");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: HeaderName = HeaderName::from_static("x-a");
    const B: HeaderName = HeaderName::from_static("x-b");

    #[test]
    fn lines_are_written_in_order_each_ended() {
        let mut lines = EncodedHeaders::new();
        assert!(lines.is_empty());
        lines.push(&A, &HeaderValue::from_static("one"));
        lines
            .line(&B)
            .value(&HeaderValue::from_static("\"q\";r="))
            .number(0)
            .value(&HeaderValue::from_static(";t="))
            .number(u64::MAX);
        lines.line(&A);
        lines.push_number(&http::header::RETRY_AFTER, 10);
        assert_eq!(
            lines.as_bytes(),
            b"x-a: one\r\nx-b: \"q\";r=0;t=18446744073709551615\r\nx-a: \r\nretry-after: 10\r\n"
        );
        let parsed: Vec<_> = lines.iter().collect();
        assert_eq!(
            parsed,
            [
                (&b"x-a"[..], &b"one"[..]),
                (b"x-b", b"\"q\";r=0;t=18446744073709551615"),
                (b"x-a", b""),
                (b"retry-after", b"10"),
            ]
        );
    }

    #[test]
    fn lines_built_once_are_added_whole_in_order() {
        let mut built = EncodedHeaders::new();
        built.push_number(&A, 1);
        built.push_number(&B, 2);
        let mut lines = EncodedHeaders::new();
        lines.push_number(&B, 0);
        lines.extend(&built);
        lines.extend(&EncodedHeaders::new());
        lines.extend(&built);
        assert_eq!(
            lines.as_bytes(),
            b"x-b: 0\r\nx-a: 1\r\nx-b: 2\r\nx-a: 1\r\nx-b: 2\r\n"
        );
        assert_eq!(built.as_bytes(), b"x-a: 1\r\nx-b: 2\r\n");
    }

    #[test]
    fn appended_to_a_map_after_its_headers_and_beside_same_names() {
        let mut lines = EncodedHeaders::new();
        lines.push_number(&A, 1);
        lines.push_number(&B, 2);
        lines.push_number(&A, 3);
        let mut map = HeaderMap::new();
        map.insert(A, HeaderValue::from_static("0"));
        lines.append_to(&mut map);
        let a: Vec<_> = map.get_all(&A).iter().collect();
        assert_eq!(a, ["0", "1", "3"]);
        assert_eq!(map[&B], "2");
        assert_eq!(map.len(), 4);
    }
}
