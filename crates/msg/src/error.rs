//! Errors of the messaging layer.

use uroce_verbs::WcStatus;

/// Why a messaging operation failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MsgError {
    /// The operation would have to wait (no free send buffer, no credit from the peer,
    /// no message received yet) and was asked not to.
    #[error("the operation would block")]
    WouldBlock,
    /// The wait ran past its timeout.
    #[error("timed out")]
    Timeout,
    /// The connection failed: a work completion came back with this status (the QP is in
    /// ERR; every buffer it held has come back).
    #[error("the connection failed: {0:?}")]
    Failed(WcStatus),
    /// The endpoint was closed.
    #[error("the endpoint is closed")]
    Closed,
    /// The message is longer than the endpoint can ever carry (pool buffers times the
    /// credits a fragmented message may use).
    #[error("a {len}-byte message exceeds the largest message, {max} bytes")]
    TooLong {
        /// The message length.
        len: usize,
        /// The largest message the endpoint carries.
        max: usize,
    },
    /// The buffer belongs to another pool than the endpoint's.
    #[error("the buffer belongs to another send pool")]
    ForeignBuffer,
    /// The peer broke the protocol (a message without immediate data, or an unknown kind).
    #[error("protocol violation by the peer: {0}")]
    Protocol(&'static str),
    /// A verbs call failed.
    #[error("verbs: {0}")]
    Verbs(String),
}

impl MsgError {
    pub(crate) fn verbs(e: impl std::fmt::Display) -> MsgError {
        MsgError::Verbs(e.to_string())
    }
}

/// A failed send: the error and the buffer, handed back unchanged (a buffer is never lost
/// because a post failed).
#[derive(Debug)]
pub struct SendError {
    /// Why the send failed ([`MsgError::WouldBlock`] for back-pressure).
    pub error: MsgError,
    /// The buffer that was to be sent; `None` only when the QP refused the post (it had
    /// failed), in which case the buffer is back in its pool.
    pub buf: Option<crate::SendBuf>,
}

impl std::fmt::Display for SendError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Display::fmt(&self.error, f)
    }
}

impl std::error::Error for SendError {}
