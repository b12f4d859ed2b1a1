//! UD between three network devices on loopback addresses: one UD QP on A sends a
//! datagram to B and one to C through two address handles; each receiver reads the 40-byte
//! GRH area in front of the payload, makes an address handle from its completion
//! (`AhAttr::from_wc`) and answers the sender's QP; A checks both answers.
//!
//! ```text
//! cargo run -p uroce-net --example ud_datagrams
//! ```

use std::error::Error;
use std::net::IpAddr;
use std::time::{Duration, Instant};

use uroce_net::{NetConfig, NetDevice};
use uroce_verbs::{
    AccessFlags, AhAttr, Cq, MemBlock, Mr, Pd, Qp, QpCap, QpInitAttr, QpType, RecvWr, SendWr, Sge,
    UdDest, WcStatus, WorkCompletion,
};

/// The Q_Key all three QPs use.
const QKEY: u32 = 0x1111_2222;
/// The GRH area in front of every UD receive.
const GRH: usize = 40;

/// A received datagram: its completion, GRH area and payload.
type Datagram = (WorkCompletion, [u8; GRH], Vec<u8>);

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

/// One device with a UD QP, its CQ and a 4 KiB buffer: bytes 0..2048 receive, the rest
/// sends. (Fields drop in declaration order: the QP first, the device last.)
struct Node {
    qp: Qp,
    mr: Mr,
    cq: Cq,
    pd: Pd,
    dev: NetDevice,
}

impl Node {
    fn open(addr: &str) -> Result<Node, Box<dyn Error>> {
        let dev = NetDevice::open(NetConfig::new(addr.parse()?))?;
        let pd = dev.context().alloc_pd()?;
        let cq = dev.context().create_cq(16, None, 0)?;
        let mr = pd.reg_mr(MemBlock::new(4096)?, AccessFlags::LOCAL_WRITE)?;
        let cap = QpCap {
            max_send_wr: 8,
            max_recv_wr: 8,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        };
        let qp = pd.create_qp(&QpInitAttr::new(QpType::Ud, &cq, &cq, cap))?;
        // RESET → INIT (Q_Key, P_Key index 0) → RTR → RTS: no peer, every send names one.
        qp.activate_ud(QKEY)?;
        Ok(Node {
            qp,
            mr,
            cq,
            pd,
            dev,
        })
    }

    fn ip(&self) -> IpAddr {
        self.dev.local_addr().ip()
    }

    /// Posts a receive for up to 1024 bytes of payload (plus the GRH area) at `slot`.
    fn post_recv(&self, slot: u64) -> Result<(), Box<dyn Error>> {
        let sge = Sge {
            addr: self.mr.iova() + slot * 1024,
            length: (GRH + 1024) as u32,
            lkey: self.mr.lkey(),
        };
        Ok(self.qp.post_recv(RecvWr::new(slot, vec![sge]))?)
    }

    /// Sends `payload` to QP `qpn` through the address handle made from `ah_attr`.
    fn send(&self, ah_attr: &AhAttr, qpn: u32, payload: &[u8]) -> Result<(), Box<dyn Error>> {
        let ah = self.pd.create_ah(ah_attr)?;
        self.mr.block().copy_in(2048, payload)?;
        let mut wr = SendWr::send(
            100,
            vec![Sge {
                addr: self.mr.iova() + 2048,
                length: payload.len() as u32,
                lkey: self.mr.lkey(),
            }],
        );
        wr.ud = Some(UdDest {
            ah: ah.reference(),
            remote_qpn: qpn,
            remote_qkey: QKEY,
        });
        self.qp.post_send(wr)?;
        wait(&self.cq)?;
        Ok(())
    }

    /// Waits for a datagram: its completion, GRH area and payload (in the slot its
    /// receive named).
    fn receive(&self) -> Result<Datagram, Box<dyn Error>> {
        let wc = wait(&self.cq)?;
        let slot = wc.wr_id;
        let len = (wc.byte_len as usize)
            .checked_sub(GRH)
            .ok_or("a datagram shorter than its GRH area")?;
        let mut grh = [0u8; GRH];
        let mut payload = vec![0u8; len];
        self.mr.block().copy_out(slot as usize * 1024, &mut grh)?;
        self.mr
            .block()
            .copy_out(slot as usize * 1024 + GRH, &mut payload)?;
        Ok((wc, grh, payload))
    }
}

/// Runs the example; an error makes the process exit with status 1.
pub fn main() -> Result<(), Box<dyn Error>> {
    let a = Node::open("127.0.42.1")?;
    let peers = [Node::open("127.0.42.2")?, Node::open("127.0.42.3")?];
    for p in &peers {
        p.post_recv(0)?;
    }
    a.post_recv(0)?;
    a.post_recv(1)?;

    // One QP, two destinations: an address handle for each peer.
    for (i, p) in peers.iter().enumerate() {
        let msg = format!("hello peer {i}");
        a.send(&AhAttr::to_ip(p.ip()), p.qp.qp_num(), msg.as_bytes())?;
    }

    // Each peer reads the sender's address out of the GRH area and answers it.
    for (i, p) in peers.iter().enumerate() {
        let (wc, grh, payload) = p.receive()?;
        if payload != format!("hello peer {i}").as_bytes() || wc.src_qp != a.qp.qp_num() {
            return Err(format!("peer {i} received {payload:?} from QP {}", wc.src_qp).into());
        }
        let reply = AhAttr::from_wc(p.dev.device(), &grh, &wc)?;
        if reply.dest_ip() != a.ip() {
            return Err(format!("peer {i} would answer {}", reply.dest_ip()).into());
        }
        p.send(
            &reply,
            wc.src_qp,
            format!("answer from {}", p.ip()).as_bytes(),
        )?;
    }

    // A gets both answers, each from the address its GRH area names.
    let mut from = Vec::new();
    for _ in 0..2 {
        let (wc, grh, payload) = a.receive()?;
        let sender = AhAttr::from_wc(a.dev.device(), &grh, &wc)?.dest_ip();
        if payload != format!("answer from {sender}").as_bytes() {
            return Err(format!("A received {payload:?} from {sender}").into());
        }
        from.push(sender);
    }
    from.sort();
    if from != [peers[0].ip(), peers[1].ip()] {
        return Err(format!("answers came from {from:?}").into());
    }
    println!(
        "UD: one QP reached {} and {}; both answered",
        from[0], from[1]
    );
    Ok(())
}
