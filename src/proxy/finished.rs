//! The futures of tollgate's filters that finish their work when called (all but
//! `upstream_peer`, and `request_filter` where it waits): ready at once, and of no size when
//! they succeed, so the box `ProxyHttp`'s methods put them in (it is an `async_trait`)
//! allocates nothing. An `async fn`'s future holds its arguments, an allocation per call.
//! `request_filter`'s future, where it waits (for Redis, or to write the gateway's own answer),
//! is made in its box ([`pinned_in_place`]).
//!
//! Phase: every request, five times.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use futures_util::future::BoxFuture;
use pingora_error::Result;

/// A future ready at once with what `F` returns. `F` is a closure that captures nothing, so
/// the future has no size.
pub(super) struct Immediate<F>(pub(super) F);

impl<T, F: Fn() -> T + Unpin> Future for Immediate<F> {
    type Output = T;

    fn poll(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<T> {
        Poll::Ready((self.0)())
    }
}

/// A filter's finished work as the future its method returns: of no size when it succeeded.
pub(super) fn finished(result: Result<()>) -> BoxFuture<'static, Result<()>> {
    match result {
        Ok(()) => Box::pin(Immediate(|| Ok(()))),
        Err(e) => Box::pin(std::future::ready(Err(e))),
    }
}

/// `make()`'s value in a new pinned box, made in place: the box is allocated first, where
/// `Box::pin(make())` (what `async_trait` writes) makes the value on the stack, a future at its
/// type's full size (its largest state's), and copies it into the box.
pub(super) fn pinned_in_place<T>(make: impl FnOnce() -> T) -> Pin<Box<T>> {
    Box::into_pin(Box::write(Box::new_uninit(), make()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use pingora_error::{Error, ErrorType};

    /// A filter that succeeded answers through a future of no size (its box allocates
    /// nothing); one that failed hands its error on.
    #[tokio::test]
    async fn a_finished_filter_answers_at_once_and_allocates_only_to_fail() {
        let ok = finished(Ok(()));
        assert_eq!(std::mem::size_of_val(&*ok), 0);
        assert!(ok.await.is_ok());
        let failed = finished(Error::e_explain(ErrorType::HTTPStatus(413), "too large"));
        assert_eq!(
            failed.await.unwrap_err().etype(),
            &ErrorType::HTTPStatus(413)
        );
        let nothing = Box::pin(Immediate(|| ()));
        assert_eq!(std::mem::size_of_val(&*nothing), 0);
        nothing.await;
    }

    /// A future made in its box runs as it would have in `Box::pin`'s, to the same answer,
    /// after waiting; the value made is the one boxed.
    #[tokio::test]
    async fn a_future_made_in_its_box_runs_as_it_would_have() {
        let (tx, rx) = tokio::sync::oneshot::channel::<u64>();
        let waits = pinned_in_place(|| async move { rx.await.expect("sent") * 3 });
        tx.send(14).expect("receiver alive");
        assert_eq!(waits.await, 42);
        let mut made = pinned_in_place(|| [7u8; 4096]);
        assert!(made.iter().all(|&b| b == 7));
        made.as_mut().get_mut()[4095] = 1;
        assert_eq!((made[0], made[4095]), (7, 1));
    }
}
