//! The CM's parsers and agent, and the RDMA-CM private data, driven by fuzz inputs.

use std::net::{IpAddr, Ipv4Addr};

use uroce_proto::cm::{AcceptParams, AgentConfig, CmAgent, CmEvent, ConnId, ConnectParams};
use uroce_proto::time::Instant;
use uroce_wire::cm::rdma_cm::{gid_of, CmaHeader, PortSpace, HEADER_LEN};
use uroce_wire::cm::{CmMad, PathRepr};
use uroce_wire::mad::MAD_LEN;

use crate::input::Input;

/// The attribute IDs of the CM class (IBA 16.7.2), ClassPortInfo first.
const CM_ATTRS: [u16; 12] = [
    0x0001, 0x0010, 0x0011, 0x0012, 0x0013, 0x0014, 0x0015, 0x0016, 0x0017, 0x0018, 0x0019, 0x001a,
];

/// `CmMad::parse`; what parses re-emits to bytes that parse to the same MAD.
pub fn cm_mad(data: &[u8]) {
    if let Ok(m) = CmMad::parse(data) {
        let bytes = m.to_bytes();
        let again = CmMad::parse(&bytes).expect("an emitted MAD parses");
        assert_eq!(again.to_bytes(), bytes, "emit → parse → emit is stable");
    }
}

/// The RDMA-CM address header (the first bytes of a REQ's private data): what parses
/// re-emits identically.
pub fn rdma_cm_private_data(data: &[u8]) {
    if let Ok(h) = CmaHeader::parse(data) {
        let mut out = vec![0u8; HEADER_LEN];
        h.emit(&mut out).expect("a parsed header emits");
        assert_eq!(CmaHeader::parse(&out).ok(), Some(h));
    }
}

const SERVICE: u64 = PortSpace::Tcp.service_id(7471);
const LOCAL: IpAddr = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1));
const MAX_CONNECTIONS: usize = 64;

fn connect_params(to: IpAddr, qpn: u32) -> ConnectParams {
    ConnectParams {
        remote: to,
        service_id: SERVICE,
        local_qpn: qpn,
        starting_psn: 0x1000,
        qkey: 0,
        responder_resources: 4,
        initiator_depth: 4,
        transport_service_type: 0,
        extended_transport_type: 0,
        path: PathRepr {
            local_lid: 0xffff,
            remote_lid: 0xffff,
            local_gid: gid_of(LOCAL),
            remote_gid: gid_of(to),
            hop_limit: 64,
            local_ack_timeout: 14,
            ..PathRepr::default()
        },
        pkey: 0xffff,
        path_mtu: 3,
        retry_count: 7,
        rnr_retry_count: 7,
        cm_response_timeout: 16,
        packet_life_time: 0,
        max_cm_retries: 3,
        srq: false,
        private_data: Vec::new(),
    }
}

/// A CM agent listening on one service, fed MADs (arbitrary, or with a valid CM header
/// and attribute) from three peers, timers and application commands. Every MAD it sends
/// parses; it never holds more connections than its limit; its deadline is never before
/// the time it was last given.
pub fn cm_agent(data: &[u8]) {
    let mut input = Input(data);
    let mut agent = CmAgent::new(AgentConfig {
        max_connections: MAX_CONNECTIONS,
        max_pending_per_listener: 8,
        max_unestablished_per_peer: 4,
        ..AgentConfig::default()
    });
    let _ = agent.listen(SERVICE, None);
    let peers = [
        IpAddr::V4(Ipv4Addr::new(10, 0, 0, 2)),
        IpAddr::V4(Ipv4Addr::new(10, 0, 0, 3)),
        "fd00::4".parse().unwrap_or(LOCAL),
    ];
    let mut now = Instant::ZERO;
    let mut ids: Vec<ConnId> = Vec::new();
    // Bounded: every command consumes at least one byte.
    while !input.is_empty() {
        match input.u8() % 8 {
            0..=3 => {
                let patch = input.u8();
                let mut mad = [0u8; MAD_LEN];
                let body = input.bytes(MAD_LEN);
                mad[..body.len()].copy_from_slice(body);
                if patch & 1 != 0 {
                    // Base version 1, the CM class, class version 2 (IBA 13.4.2, 16.7).
                    mad[0..3].copy_from_slice(&[1, 7, 2]);
                    let attr = CM_ATTRS[usize::from(patch >> 1) % CM_ATTRS.len()];
                    mad[16..18].copy_from_slice(&attr.to_be_bytes());
                }
                let from = peers[usize::from(patch >> 5) % peers.len()];
                agent.handle_mad(now, from, &mad);
            }
            4 => {
                let d = u64::from(input.u32()) << (input.u8() % 16);
                now = Instant::from_nanos(now.as_nanos().saturating_add(d));
                if agent.poll_timeout().is_some_and(|t| t <= now) {
                    agent.handle_timeout(now);
                }
            }
            5 => {
                let to = peers[usize::from(input.u8()) % peers.len()];
                if let Ok(id) = agent.connect(now, &connect_params(to, u32::from(input.u16()))) {
                    ids.push(id);
                }
            }
            6 => {
                let Some(&id) = ids.get(usize::from(input.u8()) % ids.len().max(1)) else {
                    continue;
                };
                let _ = match input.u8() % 5 {
                    0 => agent.accept(
                        now,
                        id,
                        &AcceptParams {
                            local_qpn: 0x77,
                            starting_psn: 0x2000,
                            qkey: 0,
                            responder_resources: 4,
                            initiator_depth: 4,
                            target_ack_delay: 15,
                            rnr_retry_count: 7,
                            srq: false,
                            private_data: Vec::new(),
                        },
                    ),
                    1 => agent.reject(now, id, 28, &[]),
                    2 => agent.establish(now, id),
                    3 => agent.delay(now, id, input.u8()),
                    _ => agent.disconnect(now, id, &[]),
                };
            }
            _ => {}
        }
        while let Some((_, mad)) = agent.poll_transmit() {
            CmMad::parse(&mad).expect("the agent sends MADs that parse");
        }
        while let Some(ev) = agent.poll_event() {
            match ev {
                CmEvent::ReqReceived { id, .. } | CmEvent::RepReceived { id, .. } => ids.push(id),
                _ => {}
            }
        }
        ids.retain(|id| agent.state(*id).is_some());
        assert!(agent.connections() <= MAX_CONNECTIONS);
    }
}
