//! UC between two network devices on loopback addresses: a SEND into a posted receive,
//! then an RDMA WRITE with immediate into the peer's buffer, whose immediate value
//! completes a receive there. UC has no acknowledgements: a send completes when its last
//! packet has left.
//!
//! ```text
//! cargo run -p uroce-net --example uc_write
//! ```

use std::error::Error;
use std::time::{Duration, Instant};

use uroce_net::{NetConfig, NetDevice};
use uroce_verbs::{
    AccessFlags, Cq, MemBlock, Mr, QpCap, QpInitAttr, QpType, RdmaInfo, RecvWr, SendFlags,
    SendOpcode, SendWr, Sge, UcConnect, WcFlags, WcOpcode, WcStatus, WorkCompletion,
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

fn sge(mr: &Mr, offset: u64, len: u32) -> Sge {
    Sge {
        addr: mr.iova() + offset,
        length: len,
        lkey: mr.lkey(),
    }
}

/// Runs the example; an error makes the process exit with status 1.
pub fn main() -> Result<(), Box<dyn Error>> {
    let a = NetDevice::open(NetConfig::new("127.0.41.1".parse()?))?;
    let b = NetDevice::open(NetConfig::new("127.0.41.2".parse()?))?;
    let cap = QpCap {
        max_send_wr: 16,
        max_recv_wr: 16,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    };
    let (pd_a, pd_b) = (a.context().alloc_pd()?, b.context().alloc_pd()?);
    let cq_a = a.context().create_cq(16, None, 0)?;
    let cq_b = b.context().create_cq(16, None, 0)?;
    let mr_a = pd_a.reg_mr(MemBlock::new(8192)?, AccessFlags::LOCAL_WRITE)?;
    // B's buffer accepts remote writes.
    let mr_b = pd_b.reg_mr(
        MemBlock::new(8192)?,
        AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE,
    )?;
    let qp_a = pd_a.create_qp(&QpInitAttr::new(QpType::Uc, &cq_a, &cq_a, cap))?;
    let qp_b = pd_b.create_qp(&QpInitAttr::new(QpType::Uc, &cq_b, &cq_b, cap))?;

    // RESET → INIT → RTR → RTS towards each other (remote writes allowed by default).
    qp_a.connect_uc(&UcConnect::new(b.local_addr().ip(), qp_b.qp_num()))?;
    qp_b.connect_uc(&UcConnect::new(a.local_addr().ip(), qp_a.qp_num()))?;

    // 1. SEND 3000 bytes (three packets at path MTU 1024) into a posted receive.
    let message: Vec<u8> = (0..3000u32).map(|i| (i % 251) as u8).collect();
    mr_a.block().copy_in(0, &message)?;
    qp_b.post_recv(RecvWr::new(10, vec![sge(&mr_b, 0, 4096)]))?;
    qp_a.post_send(SendWr::send(1, vec![sge(&mr_a, 0, 3000)]))?;
    let sent = wait(&cq_a)?;
    let recv = wait(&cq_b)?;
    let mut got = vec![0u8; message.len()];
    mr_b.block().copy_out(0, &mut got)?;
    if sent.opcode != WcOpcode::Send || recv.byte_len != 3000 || got != message {
        return Err("the SEND did not arrive intact".into());
    }

    // 2. RDMA WRITE with immediate: 2000 bytes into B's buffer at offset 4096; the
    //    immediate value consumes a receive on B and tells it the data is there.
    let data: Vec<u8> = (0..2000u32).map(|i| (i % 13) as u8 + 100).collect();
    mr_a.block().copy_in(4096, &data)?;
    qp_b.post_recv(RecvWr::new(11, Vec::new()))?;
    qp_a.post_send(SendWr {
        wr_id: 2,
        opcode: SendOpcode::RdmaWriteWithImm,
        flags: SendFlags::SIGNALED,
        sg_list: vec![sge(&mr_a, 4096, 2000)].into(),
        imm_data: 0xC0FFEE,
        rdma: RdmaInfo {
            remote_addr: mr_b.iova() + 4096,
            rkey: mr_b.rkey(),
        },
        ..SendWr::default()
    })?;
    let sent = wait(&cq_a)?;
    let recv = wait(&cq_b)?;
    let mut got = vec![0u8; data.len()];
    mr_b.block().copy_out(4096, &mut got)?;
    if sent.opcode != WcOpcode::RdmaWrite
        || recv.opcode != WcOpcode::RecvRdmaWithImm
        || !recv.wc_flags.contains(WcFlags::WITH_IMM)
        || recv.imm_data != 0xC0FFEE
        || recv.wr_id != 11
        || got != data
    {
        return Err(format!("unexpected WRITE_WITH_IMM result: {recv:?}").into());
    }
    println!("UC: SEND of 3000 bytes and WRITE_WITH_IMM of 2000 bytes (imm 0xc0ffee) arrived");
    Ok(())
}
