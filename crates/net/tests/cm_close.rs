//! The CM's MADs leave even when the program (or the device) goes right after the command
//! that produced them:
//! * a device whose last reference goes inside its own CM event sink (on the CM thread)
//!   still sends the REJ the sink issued just before; the CM thread's own final flush came
//!   after the progress thread had stopped, and the parallel RDMA-CM tests lost a DREQ so
//!   in about one run of three;
//! * a command's MAD is on QP1 when `with_agent` returns, not only once the CM thread has
//!   run: `rping`'s client disconnects and exits at once, and its DREQ used to go with the
//!   process about one run in ten, leaving the server waiting for ever.

use std::net::IpAddr;
use std::sync::mpsc::{channel, Sender};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use uroce_net::{CmEventSink, CmService, NetConfig, NetDevice};
use uroce_proto::cm::{CmEvent, ConnectParams};
use uroce_wire::cm::rdma_cm::{gid_of, PortSpace};
use uroce_wire::cm::{rej_reason, PathRepr};

const SERVICE: u64 = PortSpace::Tcp.service_id(7200);
/// A reason nothing else in the exchange would produce.
const REASON: u16 = rej_reason::CONSUMER_DEFINED;

/// The passive side: rejects the first REQ, then lets go of its device — the only
/// reference left — while the CM thread is still delivering the event.
struct DropsItself {
    dev: Mutex<Option<Arc<NetDevice>>>,
}

impl CmEventSink for DropsItself {
    fn cm_event(&self, service: &CmService, event: CmEvent) {
        if let CmEvent::ReqReceived { id, .. } = event {
            service.with_agent(|a, now| a.reject(now, id, REASON, b"bye").unwrap());
            let dev = self.dev.lock().unwrap().take();
            drop(dev);
        }
    }
}

/// The active side: forwards every event.
struct Forward(Mutex<Sender<CmEvent>>);

impl CmEventSink for Forward {
    fn cm_event(&self, _service: &CmService, event: CmEvent) {
        let _ = self.0.lock().unwrap().send(event);
    }
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn connect_params(from: IpAddr, to: IpAddr) -> ConnectParams {
    ConnectParams {
        remote: to,
        service_id: SERVICE,
        local_qpn: 0x11,
        starting_psn: 0x1000,
        qkey: 0,
        responder_resources: 1,
        initiator_depth: 1,
        transport_service_type: 0,
        extended_transport_type: 0,
        path: PathRepr {
            local_lid: 0xffff,
            remote_lid: 0xffff,
            local_gid: gid_of(from),
            remote_gid: gid_of(to),
            hop_limit: 64,
            local_ack_timeout: 14,
            ..PathRepr::default()
        },
        pkey: 0xffff,
        path_mtu: 3,
        retry_count: 7,
        rnr_retry_count: 7,
        // 4.096 µs × 2^14 ≈ 67 ms per try, 3 retries: Unreachable after about 0.3 s when
        // nothing answers.
        cm_response_timeout: 14,
        packet_life_time: 0,
        max_cm_retries: 3,
        srq: false,
        private_data: Vec::new(),
    }
}

#[test]
fn a_device_dropped_in_its_own_event_sink_still_sends_the_queued_mad() {
    let (a_ip, b_ip) = (ip("127.0.218.1"), ip("127.0.218.2"));
    let a = Arc::new(NetDevice::open(NetConfig::new(a_ip)).unwrap());
    let sink = Arc::new(DropsItself {
        dev: Mutex::new(None),
    });
    let a_cm = a.cm().unwrap().clone();
    a_cm.set_sink(Some(sink.clone()));
    a_cm.with_agent(|ag, _| ag.listen(SERVICE, None)).unwrap();
    *sink.dev.lock().unwrap() = Some(a);
    drop(a_cm);

    let b = NetDevice::open(NetConfig::new(b_ip)).unwrap();
    let (tx, rx) = channel();
    b.cm()
        .unwrap()
        .set_sink(Some(Arc::new(Forward(Mutex::new(tx)))));
    let p = connect_params(b_ip, a_ip);
    b.cm()
        .unwrap()
        .with_agent(|ag, now| ag.connect(now, &p))
        .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let got = loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        match rx.recv_timeout(left) {
            Ok(CmEvent::Rejected { reason, .. }) => break Ok(reason),
            Ok(CmEvent::Unreachable { .. }) => break Err("Unreachable: the REJ was lost"),
            Ok(_) => {}
            Err(_) => break Err("no event within 10 s"),
        }
    };
    assert_eq!(got, Ok(REASON));
    // The passive device really went (its sink held the last reference). The sink lets
    // go of it just after the REJ left, on the CM thread, which a loaded host may not
    // have run yet when the REJ is seen here: wait for it (bounded: 500 × 10 ms).
    let mut gone = false;
    for _ in 0..500 {
        gone = sink.dev.lock().unwrap().is_none();
        if gone {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(gone, "the sink let go of its device");
}

#[test]
fn a_command_s_mad_is_on_qp1_when_the_command_returns() {
    // Nobody needs to answer: the REQ only has to have been handed to QP1 (the CM thread,
    // woken by the command, has not necessarily run yet).
    let (a_ip, b_ip) = (ip("127.0.218.3"), ip("127.0.218.4"));
    let b = NetDevice::open(NetConfig::new(b_ip)).unwrap();
    let cm = b.cm().unwrap();
    // 4.096 µs × 2^20 ≈ 4.3 s before a retry could add to the count.
    let p = ConnectParams {
        cm_response_timeout: 20,
        ..connect_params(b_ip, a_ip)
    };
    for n in 1..=20u64 {
        cm.with_agent(|ag, now| ag.connect(now, &p)).unwrap();
        let c = cm.counters();
        assert_eq!(c.mads_sent + c.send_failures, n, "REQ {n}: {c:?}");
    }
    assert_eq!(cm.counters().send_failures, 0);
}
