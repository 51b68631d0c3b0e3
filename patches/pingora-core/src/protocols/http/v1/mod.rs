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

//! HTTP/1.x implementation

pub(crate) mod body;
pub mod client;
pub mod common;
pub(crate) mod header;
pub mod server;

/// Test utilities shared across HTTP/1.x unit tests
#[cfg(test)]
pub(crate) mod test_util {
    use std::pin::Pin;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use std::task::{Context, Poll};
    use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
    use tokio_test::io::Mock;

    /// A wrapper around [`Mock`] that counts flush calls.
    ///
    /// `tokio_test::io::Mock`'s `poll_flush` always returns `Ready(Ok(()))`,
    /// so we can't detect flush calls via mock alone. This wrapper counts them.
    #[derive(Debug)]
    pub(crate) struct FlushTrackingMock {
        inner: Mock,
        flush_count: Arc<AtomicUsize>,
    }

    impl FlushTrackingMock {
        pub(crate) fn new(mock: Mock) -> (Self, Arc<AtomicUsize>) {
            let flush_count = Arc::new(AtomicUsize::new(0));
            (
                FlushTrackingMock {
                    inner: mock,
                    flush_count: flush_count.clone(),
                },
                flush_count,
            )
        }

        pub(crate) fn flush_count(counter: &Arc<AtomicUsize>) -> usize {
            counter.load(Ordering::Relaxed)
        }
    }

    impl AsyncRead for FlushTrackingMock {
        fn poll_read(
            self: Pin<&mut Self>,
            cx: &mut Context<'_>,
            buf: &mut ReadBuf<'_>,
        ) -> Poll<std::io::Result<()>> {
            Pin::new(&mut self.get_mut().inner).poll_read(cx, buf)
        }
    }

    impl AsyncWrite for FlushTrackingMock {
        fn poll_write(
            self: Pin<&mut Self>,
            cx: &mut Context<'_>,
            buf: &[u8],
        ) -> Poll<std::io::Result<usize>> {
            Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
        }

        fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
            let this = self.get_mut();
            let result = Pin::new(&mut this.inner).poll_flush(cx);
            if let Poll::Ready(Ok(())) = &result {
                this.flush_count.fetch_add(1, Ordering::Relaxed);
            }
            result
        }

        fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
            Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
        }
    }

    // Implement IO-required traits so FlushTrackingMock can be used as Box<dyn IO>
    // in HttpSession tests (server.rs).
    use crate::protocols::{
        raw_connect::ProxyDigest, GetProxyDigest, GetSocketDigest, GetTimingDigest, Peek, Shutdown,
        SocketDigest, Ssl, TimingDigest, UniqueID, UniqueIDType,
    };

    #[async_trait::async_trait]
    impl Shutdown for FlushTrackingMock {
        async fn shutdown(&mut self) -> () {}
    }
    impl UniqueID for FlushTrackingMock {
        fn id(&self) -> UniqueIDType {
            0
        }
    }
    impl Ssl for FlushTrackingMock {}
    impl GetTimingDigest for FlushTrackingMock {
        fn get_timing_digest(&self) -> Vec<Option<TimingDigest>> {
            vec![]
        }
    }
    impl GetProxyDigest for FlushTrackingMock {
        fn get_proxy_digest(&self) -> Option<Arc<ProxyDigest>> {
            None
        }
    }
    impl GetSocketDigest for FlushTrackingMock {
        fn get_socket_digest(&self) -> Option<Arc<SocketDigest>> {
            None
        }
    }
    impl Peek for FlushTrackingMock {}
}

#[cfg(test)]
mod tests {
    use super::common::MAX_HEADERS;
    use tokio_test::io::Builder;

    /// A head: `first_line` (with its CRLF), `count` headers `x-h{i}: v{i}`, the blank line.
    fn head_with_headers(first_line: &[u8], count: usize) -> Vec<u8> {
        let mut head = first_line.to_vec();
        for i in 0..count {
            head.extend_from_slice(format!("x-h{i}: v{i}\r\n").as_bytes());
        }
        head.extend_from_slice(b"\r\n");
        head
    }

    /// `headers` are the `count` of [`head_with_headers`]: their number, the first and the last.
    fn assert_numbered_headers(headers: &http::HeaderMap, count: usize) {
        assert_eq!(headers.len(), count);
        assert_eq!(headers["x-h0"], "v0");
        let last = count - 1;
        assert_eq!(headers[format!("x-h{last}").as_str()], format!("v{last}"));
    }

    /// Both heads are parsed into uninitialized headers: a request and a response of
    /// `MAX_HEADERS` headers are read whole, and one more header is refused.
    #[tokio::test]
    async fn heads_with_the_most_headers_and_one_more() {
        for (count, ok) in [(MAX_HEADERS, true), (MAX_HEADERS + 1, false)] {
            let request = head_with_headers(b"GET / HTTP/1.1\r\n", count);
            let mut server =
                super::server::HttpSession::new(Box::new(Builder::new().read(&request).build()));
            let read = server.read_request().await;
            assert_eq!(read.is_ok(), ok, "a request of {count} headers");
            let response = head_with_headers(b"HTTP/1.1 200 OK\r\n", count);
            let mut client =
                super::client::HttpSession::new(Box::new(Builder::new().read(&response).build()));
            let read = client.read_response().await;
            assert_eq!(read.is_ok(), ok, "a response of {count} headers");
            if ok {
                assert_numbered_headers(&server.req_header().headers, count);
                assert_numbered_headers(&client.resp_header().unwrap().headers, count);
            }
        }
    }
}
