//! [`TestSrq`]: a shared receive queue over a deque.

use std::collections::VecDeque;

use crate::engine::SharedRecvQueue;
use crate::wr::RecvWr;

/// A shared receive queue: receive WRs that SRQ-attached QPs take in posting order.
#[derive(Debug, Clone, Default)]
pub struct TestSrq {
    queue: VecDeque<RecvWr>,
}

impl TestSrq {
    /// Appends a receive WR.
    pub fn post(&mut self, wr: RecvWr) {
        self.queue.push_back(wr);
    }

    /// Takes the oldest receive WR.
    pub fn take(&mut self) -> Option<RecvWr> {
        self.queue.pop_front()
    }

    /// Receive WRs waiting.
    pub fn len(&self) -> usize {
        self.queue.len()
    }

    /// True when none is waiting.
    pub fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }
}

impl SharedRecvQueue for TestSrq {
    fn take(&mut self) -> Option<RecvWr> {
        TestSrq::take(self)
    }
}
