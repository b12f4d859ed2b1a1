//! One RC SEND between two network devices on loopback addresses: the program the README
//! shows (`tests/examples.rs` checks that the README's copy is this file's text between the
//! markers, and runs it).
//!
//! ```text
//! cargo run -p uroce-net --example rc_send
//! ```

// README:begin
use std::error::Error;
use std::time::{Duration, Instant};

use uroce_net::{NetConfig, NetDevice};
use uroce_verbs::{
    AccessFlags, Cq, MemBlock, QpCap, QpInitAttr, QpType, RcConnect, RecvWr, SendWr, Sge, WcStatus,
    WorkCompletion,
};

/// The next completion on `cq`, polling for at most two seconds.
fn wait(cq: &Cq) -> Result<WorkCompletion, Box<dyn Error>> {
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(2) {
        if let Some(wc) = cq.poll(1).pop() {
            return match wc.status {
                WcStatus::Success => Ok(wc),
                s => Err(format!("work request {} failed: {s:?}", wc.wr_id).into()),
            };
        }
    }
    Err("no completion within 2 s".into())
}

/// Runs the example; an error makes the process exit with status 1.
pub fn main() -> Result<(), Box<dyn Error>> {
    // Two devices, each on its own loopback address (UDP port 4791).
    let a = NetDevice::open(NetConfig::new("127.0.40.1".parse()?))?;
    let b = NetDevice::open(NetConfig::new("127.0.40.2".parse()?))?;
    let cap = QpCap {
        max_send_wr: 16,
        max_recv_wr: 16,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    };
    // On each side: a protection domain, a CQ, a registered buffer and an RC QP.
    let (pd_a, pd_b) = (a.context().alloc_pd()?, b.context().alloc_pd()?);
    let cq_a = a.context().create_cq(16, None, 0)?;
    let cq_b = b.context().create_cq(16, None, 0)?;
    let mr_a = pd_a.reg_mr(MemBlock::new(4096)?, AccessFlags::LOCAL_WRITE)?;
    let mr_b = pd_b.reg_mr(MemBlock::new(4096)?, AccessFlags::LOCAL_WRITE)?;
    let qp_a = pd_a.create_qp(&QpInitAttr::new(QpType::Rc, &cq_a, &cq_a, cap))?;
    let qp_b = pd_b.create_qp(&QpInitAttr::new(QpType::Rc, &cq_b, &cq_b, cap))?;

    // Connect the two QPs (RESET → INIT → RTR → RTS), each towards the other.
    qp_a.connect_rc(&RcConnect::new(b.local_addr().ip(), qp_b.qp_num()))?;
    qp_b.connect_rc(&RcConnect::new(a.local_addr().ip(), qp_a.qp_num()))?;

    // B posts a receive; A sends 11 bytes from its buffer.
    let sge = |mr: &uroce_verbs::Mr, len: u32| Sge {
        addr: mr.iova(),
        length: len,
        lkey: mr.lkey(),
    };
    qp_b.post_recv(RecvWr::new(1, vec![sge(&mr_b, 4096)]))?;
    mr_a.block().copy_in(0, b"hello, RDMA")?;
    qp_a.post_send(SendWr::send(2, vec![sge(&mr_a, 11)]))?;

    // Both sides complete; B's buffer holds the message.
    let sent = wait(&cq_a)?;
    let received = wait(&cq_b)?;
    let mut got = [0u8; 11];
    mr_b.block().copy_out(0, &mut got)?;
    if sent.wr_id != 2 || received.byte_len != 11 || &got != b"hello, RDMA" {
        return Err(format!("unexpected result: {got:?}").into());
    }
    println!("B received {:?}", String::from_utf8_lossy(&got));
    Ok(())
}
// README:end
