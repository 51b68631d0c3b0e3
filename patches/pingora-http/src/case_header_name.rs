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

use crate::*;
use bytes::Bytes;
use http::header;

#[derive(Debug, Clone)]
pub struct CaseHeaderName(Bytes);

impl CaseHeaderName {
    pub fn new(name: String) -> Self {
        CaseHeaderName(name.into())
    }
}

impl CaseHeaderName {
    pub fn as_slice(&self) -> &[u8] {
        &self.0
    }

    pub fn from_slice(buf: &[u8]) -> Self {
        CaseHeaderName(Bytes::copy_from_slice(buf))
    }
}

/// A trait that converts into case-sensitive header names.
pub trait IntoCaseHeaderName {
    fn into_case_header_name(self) -> CaseHeaderName;

    /// The name as written (its case) and as a [HeaderName].
    ///
    /// The default parses the [HeaderName] from the case-sensitive bytes; types that already
    /// hold a [HeaderName] return it instead of copying it out and parsing it back.
    fn into_case_and_header_name(self) -> Result<(CaseHeaderName, HeaderName)>
    where
        Self: Sized,
    {
        let case_header_name = self.into_case_header_name();
        let header_name = HeaderName::try_from(case_header_name.as_slice())
            .or_err(InvalidHTTPHeader, "invalid header name")?;
        Ok((case_header_name, header_name))
    }

    /// The name as a [HeaderName] alone, for a head that keeps no case map.
    ///
    /// The default is [Self::into_case_and_header_name] without its case bytes; types that
    /// hold a [HeaderName] return it without building case bytes that would be dropped.
    fn into_header_name(self) -> Result<HeaderName>
    where
        Self: Sized,
    {
        self.into_case_and_header_name().map(|(_, name)| name)
    }
}

/// A header name known when the program is built, written as given.
///
/// Adding it to a header costs no parsing and no allocation: both the name and its case are
/// static. Header names given as `&'static str` are parsed (and, unless they are standard
/// names, copied) on every insert.
///
/// ```
/// use pingora_http::{ResponseHeader, StaticHeaderName};
/// const RATELIMIT: StaticHeaderName = StaticHeaderName::from_static("ratelimit");
/// let mut resp = ResponseHeader::build(200, None).unwrap();
/// resp.insert_header(&RATELIMIT, "\"default\";r=9;t=1").unwrap();
/// assert_eq!(resp.headers["ratelimit"], "\"default\";r=9;t=1");
/// ```
#[derive(Debug, Clone)]
pub struct StaticHeaderName {
    case: &'static str,
    name: HeaderName,
}

impl StaticHeaderName {
    /// `name` must be a valid header name in lowercase ([HeaderName::from_static] panics
    /// otherwise, at compile time in a `const`).
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

impl IntoCaseHeaderName for &StaticHeaderName {
    fn into_case_header_name(self) -> CaseHeaderName {
        CaseHeaderName(Bytes::from_static(self.case.as_bytes()))
    }

    fn into_case_and_header_name(self) -> Result<(CaseHeaderName, HeaderName)> {
        Ok((self.into_case_header_name(), self.name.clone()))
    }

    fn into_header_name(self) -> Result<HeaderName> {
        Ok(self.name.clone())
    }
}

impl IntoCaseHeaderName for CaseHeaderName {
    fn into_case_header_name(self) -> CaseHeaderName {
        self
    }
}

impl IntoCaseHeaderName for String {
    fn into_case_header_name(self) -> CaseHeaderName {
        CaseHeaderName(self.into())
    }
}

impl IntoCaseHeaderName for &'static str {
    fn into_case_header_name(self) -> CaseHeaderName {
        CaseHeaderName(self.into())
    }
}

impl IntoCaseHeaderName for HeaderName {
    fn into_case_header_name(self) -> CaseHeaderName {
        CaseHeaderName(titled_header_name(&self))
    }

    fn into_case_and_header_name(self) -> Result<(CaseHeaderName, HeaderName)> {
        Ok((CaseHeaderName(titled_header_name(&self)), self))
    }

    fn into_header_name(self) -> Result<HeaderName> {
        Ok(self)
    }
}

impl IntoCaseHeaderName for &HeaderName {
    fn into_case_header_name(self) -> CaseHeaderName {
        CaseHeaderName(titled_header_name(self))
    }

    fn into_case_and_header_name(self) -> Result<(CaseHeaderName, HeaderName)> {
        Ok((CaseHeaderName(titled_header_name(self)), self.clone()))
    }

    fn into_header_name(self) -> Result<HeaderName> {
        Ok(self.clone())
    }
}

impl IntoCaseHeaderName for Bytes {
    fn into_case_header_name(self) -> CaseHeaderName {
        CaseHeaderName(self)
    }
}

fn titled_header_name(header_name: &HeaderName) -> Bytes {
    titled_header_name_str(header_name).map_or_else(
        || Bytes::copy_from_slice(header_name.as_str().as_bytes()),
        |s| Bytes::from_static(s.as_bytes()),
    )
}

pub(crate) fn titled_header_name_str(header_name: &HeaderName) -> Option<&'static str> {
    Some(match *header_name {
        header::ACCEPT_RANGES => "Accept-Ranges",
        header::AGE => "Age",
        header::CACHE_CONTROL => "Cache-Control",
        header::CONNECTION => "Connection",
        header::CONTENT_TYPE => "Content-Type",
        header::CONTENT_ENCODING => "Content-Encoding",
        header::CONTENT_LENGTH => "Content-Length",
        header::DATE => "Date",
        header::TRANSFER_ENCODING => "Transfer-Encoding",
        header::HOST => "Host",
        header::SERVER => "Server",
        header::SET_COOKIE => "Set-Cookie",
        // TODO: add more const header here to map to their titled case
        // TODO: automatically upper case the first letter?
        _ => {
            return None;
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_case_header_name() {
        assert_eq!("FoO".into_case_header_name().as_slice(), b"FoO");
        assert_eq!("FoO".to_string().into_case_header_name().as_slice(), b"FoO");
        assert_eq!(header::SERVER.into_case_header_name().as_slice(), b"Server");
    }

    #[test]
    fn test_case_and_header_name() {
        let (case, name) = "X-FoO".into_case_and_header_name().unwrap();
        assert_eq!((case.as_slice(), name.as_str()), (&b"X-FoO"[..], "x-foo"));
        assert!("bad name".into_case_and_header_name().is_err());

        let (case, name) = header::SERVER.into_case_and_header_name().unwrap();
        assert_eq!((case.as_slice(), name), (&b"Server"[..], header::SERVER));
        let custom = HeaderName::from_static("x-custom");
        let (case, name) = (&custom).into_case_and_header_name().unwrap();
        assert_eq!((case.as_slice(), name), (&b"x-custom"[..], custom));

        const RL: StaticHeaderName = StaticHeaderName::from_static("ratelimit-policy");
        let (case, name) = (&RL).into_case_and_header_name().unwrap();
        assert_eq!(
            (case.as_slice(), name.as_str()),
            (&b"ratelimit-policy"[..], "ratelimit-policy")
        );
        assert_eq!(RL.as_header_name(), "ratelimit-policy");
    }

    #[test]
    fn test_header_name_alone() {
        // The same name as `into_case_and_header_name` gives, without its case bytes.
        assert_eq!("X-FoO".into_header_name().unwrap(), "x-foo");
        assert_eq!("X-FoO".to_string().into_header_name().unwrap(), "x-foo");
        assert!("bad name".into_header_name().is_err());
        assert_eq!(header::SERVER.into_header_name().unwrap(), header::SERVER);
        let custom = HeaderName::from_static("x-custom");
        assert_eq!((&custom).into_header_name().unwrap(), custom);
        const RL: StaticHeaderName = StaticHeaderName::from_static("ratelimit");
        assert_eq!((&RL).into_header_name().unwrap(), "ratelimit");
    }
}
