//! # uroce-msg: zero-copy messaging over verbs
//!
//! A layer above `uroce-verbs` / `uroce-net` (`wire` → `proto` → `verbs` → `net` →
//! **`msg`**) for cluster software that sends messages over RC queue pairs with pre-posted
//! receive buffers and a pool of registered send buffers — without the classic bug of a
//! receive buffer handed to the send pool or a send buffer reposted as a receive.
//!
//! ## Ownership rules, enforced by type
//!
//! * A send buffer is a [`SendBuf`], taken from a [`SendPool`], filled in place through
//!   [`SendBuf::bytes_mut`] (an ordinary `&mut [u8]` over registered memory), and *moved*
//!   into [`Endpoint::try_send`] / [`Endpoint::send`] / [`Endpoint::send_async`]. The
//!   endpoint keeps it until its send completion (success or flush), then puts it back on
//!   the pool's free list. While it is in flight the application has no value to touch
//!   or post again.
//! * A received message is a [`Message`] of [`RecvBuf`]s, read in place
//!   ([`RecvBuf::bytes`]); dropping it posts the buffers again on their endpoint's
//!   receive queue.
//! * `SendBuf` and `RecvBuf` are distinct types with no conversion: the only functions
//!   that accept a `SendBuf` are the sends and [`SendPool::give_back`]; the only way back
//!   to a receive queue is dropping a `RecvBuf` (or [`Endpoint::release`], which takes a
//!   `Message`). `tests/ui/` holds the programs that must not compile.
//! * Registered memory outlives every use: each buffer is its own memory region; a send
//!   buffer's region lives in its slot (free list, `SendBuf` or in-flight table), a
//!   receive buffer's in the endpoint's shared state, which every `RecvBuf` keeps alive.
//!   Closing an endpoint moves its QP to ERR, waits for every posted buffer to come back
//!   as a flushed completion, and destroys the QP before anything is deregistered.
//!
//! ## Flow control
//!
//! Credits (see [`endpoint`]): the receiver advertises its posted receives in the
//! immediate data of every message and in credit updates (8-byte RDMA WRITEs into the
//! sender's mailbox, which consume no receive); a sender without
//! credit gets [`MsgError::WouldBlock`] from `try_send`, waits in `send`, or is woken by
//! the endpoint's notifier thread in `send_async`. A full pool is the same back-pressure
//! one step earlier ([`SendPool::try_alloc`] / [`SendPool::alloc`] /
//! [`SendPool::alloc_async`]).
//!
//! ## Threading
//!
//! An [`Endpoint`] is `Send + Sync`; all its state is behind one mutex. Each endpoint has
//! one notifier thread blocked on its completion channel (armed only while someone
//! waits), which processes completions when nobody polls and wakes blocked calls and
//! futures ([`block_on`] runs one without an
//! executor). Calls from the application also process completions (busy polling).
#![forbid(unsafe_code)]

pub mod endpoint;
pub mod error;
pub mod group;
pub mod pool;
pub mod stats;

pub use endpoint::{
    Endpoint, Message, MsgConfig, PeerInfo, PendingEndpoint, RecvBuf, RecvBytes, RecvFuture,
    RecvStats, SendFuture,
};
pub use error::{MsgError, SendError};
pub use pool::{AllocFuture, PoolStats, SendBuf, SendBytes, SendPool};

use std::future::Future;
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};

struct ThreadWaker(std::thread::Thread);

impl Wake for ThreadWaker {
    fn wake(self: Arc<Self>) {
        self.0.unpark();
    }
}

/// Runs a future to completion on the current thread (parking between polls); enough for
/// the futures of this crate without an async runtime.
pub fn block_on<F: Future>(fut: F) -> F::Output {
    let mut fut = std::pin::pin!(fut);
    let waker = Waker::from(Arc::new(ThreadWaker(std::thread::current())));
    let mut cx = Context::from_waker(&waker);
    loop {
        if let Poll::Ready(v) = fut.as_mut().poll(&mut cx) {
            return v;
        }
        // Bounded park: a lost unpark costs at most this long.
        std::thread::park_timeout(std::time::Duration::from_millis(50));
    }
}
