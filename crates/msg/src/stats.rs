//! Payload-copy instrumentation: every place where the messaging layer copies message
//! bytes (the convenience paths [`crate::SendBuf::copy_from`], [`crate::Endpoint::send_bytes`],
//! [`crate::Message::to_vec`]) counts here. The zero-copy paths (filling a [`crate::SendBuf`]
//! in place, reading a [`crate::RecvBuf`] in place) count nothing, which the benchmark
//! shows. The copies the transport itself makes (payload into and out of UDP datagrams)
//! are not the messaging layer's and are not counted.

use std::sync::atomic::{AtomicU64, Ordering};

static COPIES: AtomicU64 = AtomicU64::new(0);
static BYTES: AtomicU64 = AtomicU64::new(0);

pub(crate) fn count_copy(len: usize) {
    COPIES.fetch_add(1, Ordering::Relaxed);
    BYTES.fetch_add(len as u64, Ordering::Relaxed);
}

/// Payload copies made by the messaging layer in this process so far.
pub fn payload_copies() -> u64 {
    COPIES.load(Ordering::Relaxed)
}

/// Payload bytes copied by the messaging layer in this process so far.
pub fn payload_bytes_copied() -> u64 {
    BYTES.load(Ordering::Relaxed)
}
