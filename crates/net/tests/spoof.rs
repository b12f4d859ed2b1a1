//! A spoofed RDMA WRITE over real loopback sockets: two devices with connected RC QPs,
//! and a plain UDP socket on a third loopback address that sends a sealed RDMA WRITE with
//! the right destination QP, the next expected PSN and a valid R_Key. The target QP must
//! drop it (counted per QP and per device in `dropped_bad_address`), send nothing back,
//! leave memory untouched, and then execute its real peer's WRITE at that very PSN.
//! (IPv6 and IPv4-mapped addresses: `uroce_proto::engine`'s tests of `Arrival::on_path`.)

#[path = "support/pair.rs"]
mod pair;

use std::net::{IpAddr, UdpSocket};
use std::time::{Duration, Instant};

use pair::{connect, wait, ConnectOpts, Side, SideConfig};
use uroce_net::seal_for;
use uroce_verbs::WcStatus;
use uroce_wire::opcode::op;
use uroce_wire::{bth, reth, PacketRepr, Psn};

const LIMIT: Duration = Duration::from_secs(10);

fn spoofed_write_is_dropped(a_addr: &str, b_addr: &str, spoofer: &str) {
    let (a, b) = (
        Side::open(&SideConfig::new(a_addr, "uroce0")),
        Side::open(&SideConfig::new(b_addr, "uroce1")),
    );
    let o = ConnectOpts::default();
    connect(&a, &b, &o);
    b.mr.block().fill(0, 64, 0).expect("fill");

    let evil = UdpSocket::bind((spoofer.parse::<IpAddr>().expect("addr"), 0)).expect("bind");
    evil.set_read_timeout(Some(Duration::from_millis(300)))
        .expect("timeout");
    let data = [0xee_u8; 32];
    let pkt = PacketRepr {
        reth: Some(reth::Repr {
            va: b.va(0),
            rkey: b.mr.rkey(),
            dma_len: data.len() as u32,
        }),
        ..PacketRepr::new(
            bth::Repr {
                opcode: op::RC_RDMA_WRITE_ONLY,
                solicited: false,
                mig_req: false,
                pad_cnt: 0,
                pkey: 0xffff,
                fecn: false,
                becn: false,
                dest_qp: b.qp.qp_num(),
                ack_req: true,
                // The PSN B expects next: A has sent nothing yet.
                psn: Psn::new(o.start_psn),
            },
            &data,
        )
    };
    let mut bytes = vec![0u8; pkt.buffer_len()];
    pkt.emit(&mut bytes).expect("emit");
    let to = b.dev.local_addr();
    seal_for(evil.local_addr().expect("addr"), to, &mut bytes).expect("seal");
    evil.send_to(&bytes, to).expect("send");

    // B drops it, counted on the QP and the device (bounded wait: B's progress thread).
    let start = Instant::now();
    while b
        .dev
        .qp_counters(b.qp.qp_num())
        .map_or(0, |c| c.transport.dropped_bad_address)
        == 0
    {
        assert!(
            start.elapsed() < LIMIT,
            "the spoofed packet was not counted"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    let mut buf = [0u8; 2048];
    assert!(
        evil.recv_from(&mut buf).is_err(),
        "B answered the spoofer (an ACK or NAK)"
    );
    assert_eq!(
        b.mr.block().to_vec().expect("read")[..32],
        [0u8; 32],
        "the spoofed WRITE landed"
    );
    let c = b.dev.counters().transport;
    assert_eq!((c.dropped_bad_address, c.packets_received), (1, 1));

    // A's WRITE at the same PSN is executed.
    a.mr.block().fill(0, 32, 0x5a).expect("fill");
    a.qp.post_send(a.write_wr(&b, 7, 32)).expect("post");
    let wc = wait(&a.send_cq, 1, LIMIT, "A's WRITE");
    assert_eq!(wc[0].status, WcStatus::Success);
    assert_eq!(b.mr.block().to_vec().expect("read")[..32], [0x5a; 32]);
    a.close();
    b.close();
}

#[test]
fn a_spoofed_write_with_the_right_qpn_and_psn_is_dropped() {
    spoofed_write_is_dropped("127.0.49.1", "127.0.49.2", "127.0.49.66");
}
