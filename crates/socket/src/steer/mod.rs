//! # Steering a `SO_REUSEPORT` group by destination QP or XRC SRQ (building block)
//!
//! A host-wide device lets every process of a host (every *member*) bind its own UDP
//! socket to each device address, port 4791, with `SO_REUSEPORT`; the sockets of one
//! `address:4791` form a *reuseport group*, and one classic BPF program attached to the
//! group chooses, for every arriving datagram, the member socket that owns the
//! destination QP named in its BTH (for an XRC request the XRC SRQ named in its XRCETH,
//! see *XRC requests*), or for a CM MAD to QP1 the member that owns its
//! connection or listens on its service (see *QP1*). This module has the pieces that need
//! no registry: the QPN and communication-ID layout that names an owner ([`QpnLayout`]),
//! a model of the kernel's member
//! order ([`GroupOrder`]), the program generator ([`SteeringTable::program`]), and the
//! system calls ([`bind_member`], [`attach`], [`detach`]). [`crate::host`] keeps the
//! per-host registry (who holds which slot, the member order of every group, who listens
//! on which CM service). The device runtime (`uroce-net`) uses both for a shared device
//! (`NetConfig::shared`, opt-in), CM included: its CM agent allots communication IDs
//! from its slot and records its listeners in the registry (see [`crate::host`]).
//!
//! ## What the kernel does (Linux's reuseport and socket-filter code)
//! * A reuseport program for UDP sees the datagram **from its UDP payload**: the kernel
//!   pulls the UDP header before running it, so offset 0 is the BTH opcode, bytes 5–7 are
//!   the destination QP (IBA vol 1 §9.2), and `len` is the payload length.
//! * Its return value is an **index into the group's member array**, which is in join
//!   (bind) order; when a member closes, the *last* member moves into its place (an
//!   O(1) removal, exactly [`Vec::swap_remove`]).
//! * An index out of range (`>=` the number of members) falls back to the hash
//!   selection the group makes without a program: the datagram is delivered to *some*
//!   member, never dropped. A stale program (one computed for more members than are
//!   left) therefore misdelivers rather than drops.
//! * A classic BPF load beyond the end of the packet ends the program with return value
//!   0: a short datagram would go to member 0. The generated program checks the length
//!   first.
//! * The program belongs to the group, not to the socket that attached it: it survives
//!   that socket's close, and **any member may replace it** (`SO_ATTACH_REUSEPORT_CBPF`
//!   again). A socket that attaches a program *before* it is bound starts a group of its
//!   own, whose program is discarded when the bind joins it to an existing group, so
//!   members attach after binding.
//! * A bind to port 0 with `SO_REUSEPORT` may be given the port of an existing group of
//!   the same user on the same address (the kernel counts it as free for the new
//!   socket), so members bind the port explicitly (4791; tests: the first member's).
//! * Members must have the same effective UID (the kernel refuses the bind with
//!   `EADDRINUSE` otherwise) and must not `connect()` (a connected UDP socket leaves the
//!   selection); uroce sockets are never connected (the ICRC contract, [`crate::socket`]).
//!
//! ## The QPN layout ([`QpnLayout`])
//! The top [`QpnLayout::slot_bits`] bits of the 24-bit QPN name the member's *slot*
//! (1 ..= [`QpnLayout::max_slot`]), the rest is the slot-local number, which the member
//! allots as it likes. With the default 8 bits a host has up to 254 members of 65 536 QP
//! numbers each. Two slots are reserved:
//! * **slot 0** holds QP0 (SMI, unused on RoCE) and QP1 (GSI: the CM's MADs, IBA vol 1
//!   §13.4) and no member's QPs. QP0 goes to the *designated member*
//!   ([`SteeringTable::designated`], which the registry chooses: the live member with the
//!   lowest slot); QP1 is steered by what its MAD says (next section).
//! * **the top slot** (all ones) holds the multicast QPN 0xFFFFFF. Multicast datagrams
//!   arrive on group sockets, not on the unicast sockets steered here ([`crate::mcast`]),
//!   so a unicast datagram to it is malformed; it is reserved so that no member can own
//!   QPN 0xFFFFFF.
//!
//! ## XRC requests: by the XRC SRQ number
//! An XRC request (opcodes 0xA0–0xAC, 0xB3–0xB7: every XRC opcode that carries an
//! XRCETH, IBA vol 1 Annex A14) names, besides its destination (the XRC target QP), the
//! XRC SRQ that takes its receive WQE, in the XRCETH right after the BTH (UDP payload
//! bytes 13–15). The SRQs of one XRC domain belong to different processes, each of
//! which consumes its SRQ's WQEs and fills its CQ, so the request must reach the process
//! owning the SRQ, whichever process created the target QP: the program steers XRC
//! requests by the slot of their XRC SRQ number ([`is_xrc_request`]), and a member allots
//! its SRQ numbers from its slot as it allots QPNs ([`QpnLayout::qpn`]). An XRC request
//! shorter than BTH + XRCETH ([`MIN_XRC_STEERED_LEN`]) goes to the designated member, an
//! SRQ number of the top slot or a slot without a member likewise. An SRQ number of
//! **slot 0** is no member's: the request goes by its destination QP, as every datagram
//! did before, which is what a member whose SRQ numbers are not its slot's (they start
//! at 1, as a lone process's) needs: its XRC target QPs and SRQs are in one process, and
//! requests reach it by the target QP. XRC
//! responses (0xAD–0xB2: read responses, ACK, atomic ACK) carry no XRCETH and go by their
//! destination QP, the initiator's, like every other datagram.
//!
//! ## QP1: CM MADs by communication ID or service ID
//! Every process runs its own CM agent, so a MAD to QP1 must reach the process whose
//! connection or listener it concerns; the program reads that from the MAD itself, in the
//! kernel, and nothing is forwarded between members. A datagram to QP1 is a UD SEND only:
//! BTH (12 bytes), DETH (8), then the 256-byte MAD, whose common header (24 bytes: the
//! management class at byte 1, the attribute ID at 16–17; IBA vol 1 §13.4.2) is followed
//! by the CM message (IBA vol 1 §12.6), at UDP payload offset [`CM_BODY_OFFSET`] (44).
//! * **Communication IDs are allotted per member like QPNs**: the top
//!   [`QpnLayout::slot_bits`] bits of the 32-bit ID are the member's slot
//!   ([`QpnLayout::comm_ids`]; with the default layout, slot 3 allots 0x0300_0000 ..=
//!   0x03FF_FFFF), and each member's CM agent allots only from its range
//!   (`uroce_proto::cm::AgentConfig::id_range`).
//! * **MRA, REJ, REP, RTU, DREQ, DREP, LAP and APR** answer or continue a connection this
//!   host started or accepted: their RemoteCommID (CM offset 4) is *our* ID, and they go
//!   to the member of its slot. **SIDR_REP** likewise by its RequestID (CM offset 0),
//!   which the requester chose.
//! * **REQ and SIDR_REQ** start something: they go to the member listening on their
//!   ServiceID (CM offset 8 in both, two 32-bit loads), from the table of listeners
//!   compiled into the program ([`SteeringTable::listen`]; the registry keeps it,
//!   [`crate::host`]). A service nobody listens on goes to the designated member, whose CM
//!   answers REJ "invalid service ID" or SIDR_REP "unsupported" as a lone process does. A
//!   retransmitted REQ goes to the same listener, which matches it to the connection it
//!   made.
//! * **Anything else** to QP1 (ClassPortInfo, an unknown attribute, another management
//!   class, a datagram shorter than BTH + DETH + MAD ([`MIN_MAD_DATAGRAM_LEN`]), one that
//!   is not a UD SEND only) and to QP0 goes to the designated member; so does an ID of a
//!   slot without a member (its process left or was killed: the designated member's CM
//!   drops the MAD as unmatched, or answers a DREQ with a DREP).
//!
//! **A listener that exits while REQs arrive.** Until the program is replaced, REQs for
//! its service go to its index, now another member's socket (the last member moved into
//! it) or, past the end, a member chosen by hash: that member's CM has no listener for the
//! service and answers REJ "invalid service ID" (a lone process that stops listening does
//! the same). Once the listener has left or been reaped and the program re-attached
//! without it, REQs for the service go to the designated member, which rejects them the
//! same way. A requester that retries later reaches whichever member listens then.
//!
//! ## Unknown slots: the designated member, not an out-of-range index
//! A datagram for a slot nobody holds (a QP of a member that left or was killed, a forged
//! QPN), a datagram shorter than a BTH, one to QP0 and one to QP1 that the CM branch does
//! not steer all go to the designated member, by an explicit index. Returning an out-of-range index instead would hand them
//! to a member chosen by hash, spreading them over the host; one fixed receiver makes
//! them deterministic and countable in one place (it drops them, as IBA says for a
//! packet to a QP that does not exist, and counts them). The program falls back to hash
//! selection only while it is stale.
//!
//! ## Probes
//! A datagram whose first byte is [`PROBE_OPCODE`] (from the opcode prefix 0xC0, which
//! IBA assigns to no transport) is steered to the member index in its bytes 4–7 (big
//! endian), whatever the table says ([`probe`] builds one). A member sends probes to its
//! own `address:4791` to learn the kernel's order when the registry's model of it is
//! uncertain ([`GroupOrder`] after several members died at once): the member that
//! receives the probe for index *k* is at index *k*.
//!
//! ## A re-attach
//! When the member order changes the program must change with it; in between, datagrams
//! of the moved member are misdelivered, dropped and counted by the member that gets
//! them, and RC retransmits them. The windows, with the registry lock held for each step:
//! * **join**: the new member binds (it is appended at the end) and attaches the program
//!   that includes it. Until then its slot is unknown to the program; it owns no QPs yet.
//! * **leave**: the leaving member attaches the program for the order *after* its close
//!   (the last member moved into its index), then closes. Between the two system calls,
//!   datagrams of the last member still go to the leaving socket; datagrams queued on the
//!   leaving socket are lost with it.
//! * **a killed member**: the kernel closes its sockets when the process exits (before
//!   it becomes a zombie), moving the last member into its index; until some member reaps
//!   it in the registry ([`crate::host`]) and attaches the new program, datagrams of the
//!   moved member go to the dead index (now the last-but-one's or out of range: hash).
//!   A member that receives a datagram for a slot not its own should therefore reap.
//!
//! ## Left for the device runtime
//! (`uroce-net`'s shared device does all of it; it finds misdelivered CM
//! MADs with [`QpnLayout::cm_answer_slot`].) Binding one member socket per device
//! address with [`bind_member`] (and turning it into a `RoceSocket`), allotting QPNs and
//! communication IDs inside its slot ([`QpnLayout::qpn`], [`QpnLayout::comm_ids`] as the
//! CM agent's ID range), recording its CM listeners in the registry (`Locked::listen` /
//! `Locked::unlisten` in [`crate::host`]) and re-attaching then, re-attaching when the
//! registry's generation changes, dropping and counting misdelivered datagrams
//! ([`SteeringTable::index_for_datagram`] tells which), and resolving an uncertain order
//! with probes.

use std::collections::BTreeMap;
use std::io;
use std::net::{SocketAddr, UdpSocket};
use std::ops::RangeInclusive;
use std::os::fd::AsFd;

use rustix::net::{sockopt, AddressFamily, SocketFlags, SocketType};
use uroce_wire::mad::{self, cm_attr};
use uroce_wire::opcode::op::UD_SEND_ONLY;
use uroce_wire::{bth, deth, xrceth};

/// The BTH opcode of a steering probe (see the module docs): prefix 0xC0, unassigned by
/// IBA vol 1 §9.2.
pub const PROBE_OPCODE: u8 = 0xDF;

/// The shortest datagram steered by its QPN: a BTH (12 bytes); shorter ones go to the
/// designated member.
pub const MIN_STEERED_LEN: u32 = 12;

/// The multicast QPN (IBA vol 1 §10.5.2.3), in the reserved top slot.
pub const MULTICAST_QPN: u32 = 0xFF_FFFF;

/// Where the MAD starts in a datagram to QP1: after the BTH and the DETH (a MAD travels
/// in a UD SEND only, IBA vol 1 §13.5.1.1 and §9.2).
pub const MAD_OFFSET: u32 = (bth::LEN + deth::LEN) as u32;

/// Where the CM message starts: after the MAD common header (IBA vol 1 §13.4.2).
pub const CM_BODY_OFFSET: u32 = MAD_OFFSET + mad::LEN as u32;

/// The shortest datagram to QP1 steered by its CM message: BTH, DETH and a whole MAD
/// (shorter ones, which no CM parses, go to the designated member).
pub const MIN_MAD_DATAGRAM_LEN: u32 = MAD_OFFSET + mad::MAD_LEN as u32;

/// Where the XRCETH starts in an XRC request: right after the BTH (IBA vol 1 Annex A14).
pub const XRCETH_AT: u32 = bth::LEN as u32;

/// The shortest XRC request steered by its XRC SRQ number: a BTH and an XRCETH (shorter
/// ones go to the designated member).
pub const MIN_XRC_STEERED_LEN: u32 = XRCETH_AT + xrceth::LEN as u32;

// The XRC opcodes that carry an XRCETH (IBA vol 1 Annex A14): SEND, RDMA WRITE and RDMA
// READ requests 0xA0-0xAC, the atomics 0xB3-0xB4, SEND with invalidate 0xB6-0xB7 (0xB5,
// unassigned, is steered with them: its receiver drops it either way). The responses
// between (0xAD-0xB2) carry none and go by their destination QP, the initiator.
const XRC_REQUESTS_FIRST: u8 = 0xA0;
const XRC_REQUESTS_LAST: u8 = 0xAC;
const XRC_ATOMICS_FIRST: u8 = 0xB3;
const XRC_ATOMICS_LAST: u8 = 0xB7;

/// Whether a datagram of BTH opcode `opcode` is steered by the XRC SRQ number of its
/// XRCETH rather than its destination QP: the XRC requests (see the module docs).
pub const fn is_xrc_request(opcode: u8) -> bool {
    (opcode >= XRC_REQUESTS_FIRST && opcode <= XRC_REQUESTS_LAST)
        || (opcode >= XRC_ATOMICS_FIRST && opcode <= XRC_ATOMICS_LAST)
}

/// The most listened service IDs one program steers ([`SteeringTable::listen`]); the
/// registry refuses more (`crate::host::HostError::TooManyListeners`), and a table with
/// more is cut to its lowest service IDs, the others' REQs going to the designated member.
pub const MAX_LISTENERS: usize = 256;

// Offsets in the UDP payload of the fields the QP1 branch reads.
const MGMT_CLASS_AT: u32 = MAD_OFFSET + 1;
const ATTR_ID_AT: u32 = MAD_OFFSET + 16;
/// RemoteCommID of MRA, REJ, REP, RTU, DREQ, DREP, LAP and APR (IBA vol 1 Tables
/// 107-115); RequestID of SIDR_REP (Table 120).
const REMOTE_COMM_ID_AT: u32 = CM_BODY_OFFSET + 4;
const SIDR_REQUEST_ID_AT: u32 = CM_BODY_OFFSET;
/// ServiceID of REQ (Table 106) and SIDR_REQ (Table 119), both at CM offset 8.
const SERVICE_ID_AT: u32 = CM_BODY_OFFSET + 8;

/// How a 24-bit QPN names its owner: the top `slot_bits` bits are the member's slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct QpnLayout {
    slot_bits: u8,
}

impl Default for QpnLayout {
    /// 8 slot bits: 254 members of 65 536 QP numbers each.
    fn default() -> QpnLayout {
        QpnLayout { slot_bits: 8 }
    }
}

impl QpnLayout {
    /// A layout with `slot_bits` slot bits (2 ..= 12), `None` otherwise.
    pub const fn new(slot_bits: u8) -> Option<QpnLayout> {
        if slot_bits >= 2 && slot_bits <= 12 {
            Some(QpnLayout { slot_bits })
        } else {
            None
        }
    }

    /// The number of slot bits.
    pub const fn slot_bits(self) -> u8 {
        self.slot_bits
    }

    /// Bits of the slot-local number.
    pub const fn local_bits(self) -> u8 {
        24 - self.slot_bits
    }

    /// The highest slot a member can hold (the top slot is reserved for the multicast
    /// QPN, slot 0 for QP0 and QP1).
    pub const fn max_slot(self) -> u16 {
        (1 << self.slot_bits) - 2
    }

    /// The highest slot-local number.
    pub const fn max_local(self) -> u32 {
        (1 << self.local_bits()) - 1
    }

    /// The slot of `qpn` (its top bits; bits above 24 ignored).
    pub const fn slot_of(self, qpn: u32) -> u16 {
        ((qpn & 0xFF_FFFF) >> self.local_bits()) as u16
    }

    /// The slot-local part of `qpn`.
    pub const fn local_of(self, qpn: u32) -> u32 {
        qpn & self.max_local()
    }

    /// The QPN of local number `local` in `slot`; `None` when `slot` is not a member slot
    /// (0 or above [`QpnLayout::max_slot`]) or `local` does not fit.
    pub const fn qpn(self, slot: u16, local: u32) -> Option<u32> {
        if slot == 0 || slot > self.max_slot() || local > self.max_local() {
            None
        } else {
            Some(((slot as u32) << self.local_bits()) | local)
        }
    }

    /// Whether `slot` is one a member can hold.
    pub const fn is_member_slot(self, slot: u16) -> bool {
        slot >= 1 && slot <= self.max_slot()
    }

    /// How far a 32-bit communication ID is shifted right to leave its slot (its top
    /// [`QpnLayout::slot_bits`] bits, as in a QPN).
    pub const fn comm_id_shift(self) -> u8 {
        32 - self.slot_bits
    }

    /// The slot of communication ID `id`: its top [`QpnLayout::slot_bits`] bits.
    pub const fn comm_slot_of(self, id: u32) -> u16 {
        (id >> self.comm_id_shift()) as u16
    }

    /// The slot of the communication ID by which the steering program sends the CM MAD
    /// `mad` (the 256-byte MAD of a UD SEND only to QP1, from its common header) to a
    /// member: the RemoteCommID of MRA, REJ, REP, RTU, DREQ, DREP, LAP and APR, the
    /// RequestID of SIDR_REP; `None` for every other MAD (REQ and SIDR_REQ, steered by
    /// service ID; other attributes and classes; a short MAD), which the program does not
    /// steer by ID. A member that receives a MAD whose slot here is another member slot
    /// got it from a stale program ([`SteeringTable::index_for_datagram`] decides alike).
    pub fn cm_answer_slot(self, mad: &[u8]) -> Option<u16> {
        let at = |off: u32| (off - MAD_OFFSET) as usize;
        if mad.len() < mad::MAD_LEN || mad.get(at(MGMT_CLASS_AT)) != Some(&mad::MGMT_CLASS_CM) {
            return None;
        }
        let attr = u16::from_be_bytes([*mad.get(at(ATTR_ID_AT))?, *mad.get(at(ATTR_ID_AT) + 1)?]);
        let id_at = match attr {
            // Inside MRA..=APR too: by service ID.
            cm_attr::REQ | cm_attr::SIDR_REQ => return None,
            cm_attr::SIDR_REP => at(SIDR_REQUEST_ID_AT),
            cm_attr::MRA..=cm_attr::APR => at(REMOTE_COMM_ID_AT),
            _ => return None,
        };
        let id: [u8; 4] = mad.get(id_at..id_at + 4)?.try_into().ok()?;
        Some(self.comm_slot_of(u32::from_be_bytes(id)))
    }

    /// The communication IDs the member of `slot` allots (every ID whose top bits are the
    /// slot; none is 0); `None` when `slot` is not a member slot. The CM agent of a
    /// member takes them as its ID range (`uroce_proto::cm::AgentConfig::id_range`).
    pub const fn comm_ids(self, slot: u16) -> Option<RangeInclusive<u32>> {
        if !self.is_member_slot(slot) {
            return None;
        }
        let shift = self.comm_id_shift();
        let first = (slot as u32) << shift;
        Some(first..=first | (u32::MAX >> self.slot_bits))
    }
}

/// One classic BPF instruction (`struct sock_filter` of `linux/filter.h`), in a form the
/// crate's tests can evaluate; [`attach`] hands it to the kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Insn {
    /// Operation (`BPF_LD | BPF_W | BPF_ABS`, …).
    pub code: u16,
    /// Instructions to skip when a conditional jump is taken.
    pub jt: u8,
    /// Instructions to skip when it is not.
    pub jf: u8,
    /// The constant operand.
    pub k: u32,
}

// The opcodes the generator uses (linux/bpf_common.h), as u16 like `Insn::code`.
const LD: u16 = 0x00;
const W: u16 = 0x00;
const H: u16 = 0x08;
const B: u16 = 0x10;
const ABS: u16 = 0x20;
const LEN: u16 = 0x80;
const ALU: u16 = 0x04;
const AND: u16 = 0x50;
const RSH: u16 = 0x70;
const JMP: u16 = 0x05;
const JA: u16 = 0x00;
const JEQ: u16 = 0x10;
const JGE: u16 = 0x30;
const K: u16 = 0x00;
const RET: u16 = 0x06;
const RET_A: u16 = 0x10;

const fn stmt(code: u16, k: u32) -> Insn {
    Insn {
        code,
        jt: 0,
        jf: 0,
        k,
    }
}

const fn jump(code: u16, k: u32, jt: u8, jf: u8) -> Insn {
    Insn { code, jt, jf, k }
}

/// The kernel's limit on the length of a classic BPF program (`BPF_MAXINSNS`).
pub const MAX_INSNS: usize = 4096;

/// The instructions of a program without routes and listeners
/// ([`SteeringTable::program`]).
pub const FIXED_INSNS: usize = 51;

/// Instructions per listened service ID.
const LISTENER_INSNS: usize = 5;

/// The most slots one program routes: [`FIXED_INSNS`] fixed instructions, five for each
/// of at most [`MAX_LISTENERS`] listeners, two per route, within [`MAX_INSNS`]: 1382.
pub const MAX_ROUTES: usize = (MAX_INSNS - FIXED_INSNS - LISTENER_INSNS * MAX_LISTENERS) / 2;

const _: () = assert!(FIXED_INSNS + 2 * MAX_ROUTES + LISTENER_INSNS * MAX_LISTENERS <= MAX_INSNS);

/// The member order of one reuseport group as the kernel keeps it: `order[i]` is the
/// slot of the member socket at index `i` (see the module docs). Maintained by whoever
/// binds or closes a member socket while holding the registry lock ([`crate::host`]).
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct GroupOrder {
    order: Vec<u16>,
}

impl GroupOrder {
    /// An order with these slots at indexes 0, 1, ….
    pub fn from_slots(order: Vec<u16>) -> GroupOrder {
        GroupOrder { order }
    }

    /// The slots by index.
    pub fn slots(&self) -> &[u16] {
        &self.order
    }

    /// Number of member sockets.
    pub fn len(&self) -> usize {
        self.order.len()
    }

    /// No member socket.
    pub fn is_empty(&self) -> bool {
        self.order.is_empty()
    }

    /// A socket of `slot` was bound: it is the new last member.
    pub fn joined(&mut self, slot: u16) {
        self.order.push(slot);
    }

    /// The socket of `slot` was closed: the last member moves into its index. False if
    /// `slot` had no socket here.
    pub fn left(&mut self, slot: u16) -> bool {
        match self.order.iter().position(|&s| s == slot) {
            Some(i) => {
                self.order.swap_remove(i);
                true
            }
            None => false,
        }
    }

    /// The index of `slot`'s socket.
    pub fn index_of(&self, slot: u16) -> Option<u32> {
        self.order
            .iter()
            .position(|&s| s == slot)
            .and_then(|i| u32::try_from(i).ok())
    }

    /// The order after the sockets of `dead` were all closed in an order nobody saw (the
    /// kernel closes a killed process's sockets as it exits): `Some` if every order of
    /// their closes leads to the same result, `None` if the result depends on it (then
    /// only probes tell; e.g. with `[a, b, c, d]`, closing `a` then `b` leaves `[d, c]`,
    /// `b` then `a` leaves `[c, d]`). Slots in `dead` without a socket here are ignored;
    /// more than 6 dying at once is answered `None` without trying the 720 orders.
    pub fn after_unseen_closes(&self, dead: &[u16]) -> Option<GroupOrder> {
        let mut dead: Vec<u16> = dead
            .iter()
            .copied()
            .filter(|s| self.order.contains(s))
            .collect();
        dead.sort_unstable();
        dead.dedup();
        if dead.len() > 6 {
            return None;
        }
        let mut result: Option<GroupOrder> = None;
        let mut same = true;
        for_each_permutation(&mut dead, &mut |perm| {
            let mut o = self.clone();
            for &s in perm {
                o.left(s);
            }
            match &result {
                None => result = Some(o),
                Some(r) => same &= *r == o,
            }
        });
        if same {
            result.or_else(|| Some(self.clone()))
        } else {
            None
        }
    }
}

/// Calls `f` with every permutation of `items` (Heap's algorithm, iterative; `items` has
/// at most 6 elements here, so at most 720 calls).
fn for_each_permutation(items: &mut [u16], f: &mut dyn FnMut(&[u16])) {
    let n = items.len();
    let mut c = vec![0usize; n];
    f(items);
    let mut i = 0;
    while i < n {
        if c[i] < i {
            if i % 2 == 0 {
                items.swap(0, i);
            } else {
                items.swap(c[i], i);
            }
            f(items);
            c[i] += 1;
            i = 0;
        } else {
            c[i] = 0;
            i += 1;
        }
    }
}

/// Which member index each slot's datagrams go to: the input of the program generator.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct SteeringTable {
    layout: QpnLayout,
    designated: u32,
    /// (slot, index), ascending by slot, member slots only.
    routes: Vec<(u16, u32)>,
    /// Service ID -> the slot of the member listening on it.
    listeners: BTreeMap<u64, u16>,
}

impl SteeringTable {
    /// A table that sends everything to member index `designated`.
    pub fn new(layout: QpnLayout, designated: u32) -> SteeringTable {
        SteeringTable {
            layout,
            designated,
            routes: Vec::new(),
            listeners: BTreeMap::new(),
        }
    }

    /// The table for a group whose members are in `order` (slot by index): each member
    /// slot to its index, and slot 0, unknown slots and short datagrams to the index of
    /// the lowest member slot. `None` for an empty group.
    pub fn from_order(layout: QpnLayout, order: &GroupOrder) -> Option<SteeringTable> {
        let designated = order
            .slots()
            .iter()
            .copied()
            .filter(|&s| layout.is_member_slot(s))
            .min()
            .and_then(|s| order.index_of(s))?;
        let mut t = SteeringTable::new(layout, designated);
        for (i, &slot) in order.slots().iter().enumerate() {
            if let Ok(i) = u32::try_from(i) {
                t.route(slot, i);
            }
        }
        Some(t)
    }

    /// Sends `slot`'s datagrams to member index `index` (ignored for slot 0 and the
    /// reserved top slot, which always go to the designated member).
    pub fn route(&mut self, slot: u16, index: u32) {
        if !self.layout.is_member_slot(slot) {
            return;
        }
        match self.routes.binary_search_by_key(&slot, |r| r.0) {
            Ok(i) => self.routes[i].1 = index,
            Err(i) => self.routes.insert(i, (slot, index)),
        }
    }

    /// The layout.
    pub fn layout(&self) -> QpnLayout {
        self.layout
    }

    /// The index that gets slot 0 (QP0, QP1), unknown slots and short datagrams.
    pub fn designated(&self) -> u32 {
        self.designated
    }

    /// The index a datagram for `qpn` should reach (for QP1, see
    /// [`SteeringTable::index_for_datagram`]).
    pub fn index_for(&self, qpn: u32) -> u32 {
        self.index_of_slot(self.layout.slot_of(qpn))
    }

    /// The index of `slot`'s member; the designated member's for a slot without a route.
    pub fn index_of_slot(&self, slot: u16) -> u32 {
        self.route_of(slot).unwrap_or(self.designated)
    }

    /// The index of `slot`'s member among the routes the program holds (the lowest
    /// [`MAX_ROUTES`]).
    fn route_of(&self, slot: u16) -> Option<u32> {
        let routes = self.routes.get(..MAX_ROUTES).unwrap_or(&self.routes);
        routes
            .binary_search_by_key(&slot, |r| r.0)
            .ok()
            .map(|i| routes[i].1)
    }

    /// Sends REQs and SIDR_REQs for `service_id` to the member of `slot` (replacing
    /// another listener of it). Without a route for `slot` they still go to the designated
    /// member. Ignored for a slot no member can hold.
    pub fn listen(&mut self, service_id: u64, slot: u16) {
        if self.layout.is_member_slot(slot) {
            self.listeners.insert(service_id, slot);
        }
    }

    /// REQs and SIDR_REQs for `service_id` go to the designated member again.
    pub fn unlisten(&mut self, service_id: u64) {
        self.listeners.remove(&service_id);
    }

    /// The listened service IDs and the slot of each, ascending by service ID.
    pub fn listeners(&self) -> &BTreeMap<u64, u16> {
        &self.listeners
    }

    /// The listeners the program steers: at most [`MAX_LISTENERS`], the lowest service
    /// IDs, each with the index of its member (listeners without a route left out).
    fn listener_routes(&self) -> impl Iterator<Item = (u64, u32)> + '_ {
        self.listeners
            .iter()
            .take(MAX_LISTENERS)
            .filter_map(|(&service, &slot)| Some((service, self.route_of(slot)?)))
    }

    /// The index the program gives the datagram whose UDP payload is `payload` (the
    /// same decision, written plainly; see [`SteeringTable::program`]). A member that
    /// receives a datagram for which this is not its own index got it from a stale
    /// program.
    pub fn index_for_datagram(&self, payload: &[u8]) -> u32 {
        let d = self.designated;
        let u8_at = |at: u32| payload.get(at as usize).copied();
        let u32_at = |at: u32| {
            let at = at as usize;
            payload
                .get(at..at + 4)
                .and_then(|b| b.try_into().ok())
                .map(u32::from_be_bytes)
        };
        let Some(word) = u32_at(4).filter(|_| payload.len() >= MIN_STEERED_LEN as usize) else {
            return d;
        };
        if payload.first() == Some(&PROBE_OPCODE) {
            return word;
        }
        if payload.first().copied().is_some_and(is_xrc_request) {
            let Some(srqn) = u32_at(XRCETH_AT) else {
                return d;
            };
            let slot = self.layout.slot_of(srqn & 0xFF_FFFF);
            if slot != 0 {
                return self.index_of_slot(slot);
            }
        }
        let qpn = word & 0xFF_FFFF;
        let slot = self.layout.slot_of(qpn);
        if slot != 0 {
            return self.index_of_slot(slot);
        }
        if qpn != mad::GSI_QPN
            || payload.len() < MIN_MAD_DATAGRAM_LEN as usize
            || payload.first() != Some(&UD_SEND_ONLY)
            || u8_at(MGMT_CLASS_AT) != Some(mad::MGMT_CLASS_CM)
        {
            return d;
        }
        let (Some(hi), Some(lo)) = (u8_at(ATTR_ID_AT), u8_at(ATTR_ID_AT + 1)) else {
            return d;
        };
        let id_slot = |at: u32| u32_at(at).map(|id| self.layout.comm_slot_of(id));
        match u16::from_be_bytes([hi, lo]) {
            cm_attr::REQ | cm_attr::SIDR_REQ => {
                let (Some(hi), Some(lo)) = (u32_at(SERVICE_ID_AT), u32_at(SERVICE_ID_AT + 4))
                else {
                    return d;
                };
                let service = u64::from(hi) << 32 | u64::from(lo);
                self.listener_routes()
                    .find(|&(s, _)| s == service)
                    .map_or(d, |(_, index)| index)
            }
            cm_attr::SIDR_REP => id_slot(SIDR_REQUEST_ID_AT).map_or(d, |s| self.index_of_slot(s)),
            cm_attr::MRA..=cm_attr::APR => {
                id_slot(REMOTE_COMM_ID_AT).map_or(d, |s| self.index_of_slot(s))
            }
            _ => d,
        }
    }

    /// The classic BPF program that steers like [`SteeringTable::index_for_datagram`]:
    ///
    /// ```text
    ///   ld   len                 ; payload length
    ///   jge  #12, +1, +0         ; at least a BTH?
    ///   ret  #designated
    ///   ldb  [0]                 ; opcode
    ///   jeq  #PROBE_OPCODE, +0, +2
    ///   ld   [4]                 ; a probe: bytes 4-7 are the index
    ///   ret  a
    ///   jge  #0xA0, +0, qpn      ; an XRC request (0xA0-0xAC, 0xB3-0xB7)?
    ///   jge  #0xB8, qpn, +0
    ///   jge  #0xB3, +1, +0
    ///   jge  #0xAD, qpn, +0      ; 0xAD-0xB2: XRC responses, by QPN
    ///   ld   len                 ; a whole XRCETH after the BTH?
    ///   jge  #16, +1, +0
    ///   ret  #designated
    ///   ld   [12]                ; XRCETH: reserved byte, then the XRC SRQ number
    ///   and  #0xffffff
    ///   rsh  #local_bits         ; a = the SRQ's slot
    ///   jeq  #0, qpn, +0         ; slot 0: not a member's numbering, by QPN
    ///   ja   routes
    /// qpn:
    ///   ld   [4]                 ; bytes 4-7: reserved byte, then the destination QP
    ///   and  #0xffffff
    ///   rsh  #local_bits         ; a = slot
    ///   jeq  #0, +1, +0          ; slot 0: QP0 or QP1
    ///   ja   routes
    ///   ld   [4]                 ; QP0 or QP1?
    ///   and  #0xffffff
    ///   jeq  #1, +1, +0
    ///   ret  #designated         ; QP0 (unused on RoCE)
    ///   ld   len                 ; a whole MAD after BTH and DETH?
    ///   jge  #276, +1, +0
    ///   ret  #designated
    ///   ldb  [0]                 ; in a UD SEND only?
    ///   jeq  #0x64, +1, +0
    ///   ret  #designated
    ///   ldb  [21]                ; management class CM?
    ///   jeq  #0x07, +1, +0
    ///   ret  #designated
    ///   ldh  [36]                ; attribute ID
    ///   jeq  #REQ, req, +0
    ///   jeq  #SIDR_REQ, req, +0
    ///   jeq  #SIDR_REP, sidr_rep, +0
    ///   jge  #APR+1, +1, +0      ; above APR: designated
    ///   jge  #MRA, +1, +0        ; MRA ..= APR (less SIDR): by RemoteCommID
    ///   ret  #designated         ; ClassPortInfo, anything else
    ///   ld   [48]                ; RemoteCommID (CM offset 4)
    ///   ja   +1
    /// sidr_rep:
    ///   ld   [44]                ; RequestID (CM offset 0)
    ///   rsh  #comm_id_shift      ; a = the ID's slot
    ///   ja   routes
    /// req:
    ///   ld   [52]                ; ServiceID, high word (CM offset 8)
    ///   jeq  #service_1_hi, +0, +3  ; one group of five per listener
    ///   ld   [56]                ; low word
    ///   jeq  #service_1_lo, +0, +1
    ///   ret  #index_1
    ///   ...
    ///   ret  #designated         ; nobody listens
    /// routes:
    ///   jeq  #slot_1, +0, +1     ; one pair per routed slot
    ///   ret  #index_1
    ///   ...
    ///   ret  #designated
    /// ```
    ///
    /// Conditional jumps are short (the kernel's offsets are 8 bits); the three into the
    /// route chain are `ja`, whose offset is 32 bits. The program has [`FIXED_INSNS`]
    /// instructions, five per listener and two per route, so at most [`MAX_LISTENERS`]
    /// listeners (the lowest service IDs) and [`MAX_ROUTES`] routes (the lowest slots)
    /// fit the kernel's [`MAX_INSNS`] together; the registry never allots a slot above
    /// [`MAX_ROUTES`] nor records more listeners. The compare chains cost two
    /// instructions per member and five per listener before the one that matches; a
    /// host has few of both.
    pub fn program(&self) -> Vec<Insn> {
        let d = self.designated;
        let mut p = vec![
            stmt(LD | W | LEN, 0),
            jump(JMP | JGE | K, MIN_STEERED_LEN, 1, 0),
            stmt(RET | K, d),
            stmt(LD | B | ABS, 0),
            jump(JMP | JEQ | K, u32::from(PROBE_OPCODE), 0, 2),
            stmt(LD | W | ABS, 4),
            stmt(RET | RET_A, 0),
            // a = the opcode: an XRC request goes by the SRQ its XRCETH names.
            jump(JMP | JGE | K, u32::from(XRC_REQUESTS_FIRST), 0, 11),
            jump(JMP | JGE | K, u32::from(XRC_ATOMICS_LAST) + 1, 10, 0),
            jump(JMP | JGE | K, u32::from(XRC_ATOMICS_FIRST), 1, 0),
            jump(JMP | JGE | K, u32::from(XRC_REQUESTS_LAST) + 1, 8, 0),
            stmt(LD | W | LEN, 0),
            jump(JMP | JGE | K, MIN_XRC_STEERED_LEN, 1, 0),
            stmt(RET | K, d),
            stmt(LD | W | ABS, XRCETH_AT),
            stmt(ALU | AND | K, 0xFF_FFFF),
            stmt(ALU | RSH | K, u32::from(self.layout.local_bits())),
            // An SRQ number of slot 0 is not a member's: by the destination QP.
            jump(JMP | JEQ | K, 0, 1, 0),
        ];
        let to_routes_from_srqn = p.len();
        p.push(stmt(JMP | JA, 0));
        p.extend_from_slice(&[
            stmt(LD | W | ABS, 4),
            stmt(ALU | AND | K, 0xFF_FFFF),
            stmt(ALU | RSH | K, u32::from(self.layout.local_bits())),
            jump(JMP | JEQ | K, 0, 1, 0),
        ]);
        let to_routes_from_qpn = p.len();
        p.push(stmt(JMP | JA, 0));
        p.extend_from_slice(&[
            stmt(LD | W | ABS, 4),
            stmt(ALU | AND | K, 0xFF_FFFF),
            jump(JMP | JEQ | K, mad::GSI_QPN, 1, 0),
            stmt(RET | K, d),
            stmt(LD | W | LEN, 0),
            jump(JMP | JGE | K, MIN_MAD_DATAGRAM_LEN, 1, 0),
            stmt(RET | K, d),
            stmt(LD | B | ABS, 0),
            jump(JMP | JEQ | K, u32::from(UD_SEND_ONLY), 1, 0),
            stmt(RET | K, d),
            stmt(LD | B | ABS, MGMT_CLASS_AT),
            jump(JMP | JEQ | K, u32::from(mad::MGMT_CLASS_CM), 1, 0),
            stmt(RET | K, d),
            stmt(LD | H | ABS, ATTR_ID_AT),
            // The dispatch on the attribute ID: its instruction 11 is `req`, 8 `sidr_rep`.
            jump(JMP | JEQ | K, u32::from(cm_attr::REQ), 10, 0),
            jump(JMP | JEQ | K, u32::from(cm_attr::SIDR_REQ), 9, 0),
            jump(JMP | JEQ | K, u32::from(cm_attr::SIDR_REP), 5, 0),
            jump(JMP | JGE | K, u32::from(cm_attr::APR) + 1, 1, 0),
            jump(JMP | JGE | K, u32::from(cm_attr::MRA), 1, 0),
            stmt(RET | K, d),
            stmt(LD | W | ABS, REMOTE_COMM_ID_AT),
            stmt(JMP | JA, 1),
            stmt(LD | W | ABS, SIDR_REQUEST_ID_AT),
            stmt(ALU | RSH | K, u32::from(self.layout.comm_id_shift())),
        ]);
        let to_routes_from_id = p.len();
        p.push(stmt(JMP | JA, 0));
        for (service, index) in self.listener_routes() {
            p.extend_from_slice(&[
                stmt(LD | W | ABS, SERVICE_ID_AT),
                jump(JMP | JEQ | K, (service >> 32) as u32, 0, 3),
                stmt(LD | W | ABS, SERVICE_ID_AT + 4),
                jump(JMP | JEQ | K, service as u32, 0, 1),
                stmt(RET | K, index),
            ]);
        }
        p.push(stmt(RET | K, d));
        let routes = p.len();
        for at in [to_routes_from_srqn, to_routes_from_qpn, to_routes_from_id] {
            // Forward, and shorter than the program: fits.
            p[at].k = u32::try_from(routes - at - 1).unwrap_or(0);
        }
        for &(slot, index) in self.routes.iter().take(MAX_ROUTES) {
            p.push(jump(JMP | JEQ | K, u32::from(slot), 0, 1));
            p.push(stmt(RET | K, index));
        }
        p.push(stmt(RET | K, d));
        p
    }
}

/// A probe datagram's payload for member index `index` (see the module docs): opcode
/// [`PROBE_OPCODE`], the index in bytes 4–7, `nonce` in bytes 8–15.
pub fn probe(index: u32, nonce: u64) -> [u8; 16] {
    let mut b = [0u8; 16];
    b[0] = PROBE_OPCODE;
    b[4..8].copy_from_slice(&index.to_be_bytes());
    b[8..16].copy_from_slice(&nonce.to_be_bytes());
    b
}

/// The (index, nonce) of a probe datagram, `None` for anything else.
pub fn parse_probe(payload: &[u8]) -> Option<(u32, u64)> {
    if payload.len() != 16 || payload.first() != Some(&PROBE_OPCODE) {
        return None;
    }
    let index = u32::from_be_bytes(payload.get(4..8)?.try_into().ok()?);
    let nonce = u64::from_be_bytes(payload.get(8..16)?.try_into().ok()?);
    Some((index, nonce))
}

/// A UDP socket bound to `addr` with `SO_REUSEPORT` (and close-on-exec), joining the
/// reuseport group of `addr` as its last member. Not connected, blocking (the caller
/// sets what it needs).
///
/// # Errors
/// Socket creation, option and bind errors (`EADDRINUSE` when a socket without
/// `SO_REUSEPORT`, or one of another effective UID, holds `addr`).
pub fn bind_member(addr: SocketAddr) -> io::Result<UdpSocket> {
    let family = if addr.is_ipv4() {
        AddressFamily::INET
    } else {
        AddressFamily::INET6
    };
    let fd = rustix::net::socket_with(family, SocketType::DGRAM, SocketFlags::CLOEXEC, None)?;
    sockopt::set_socket_reuseport(&fd, true)?;
    rustix::net::bind(&fd, &addr)?;
    Ok(UdpSocket::from(fd))
}

/// Attaches `program` to the reuseport group of `socket` (`SO_ATTACH_REUSEPORT_CBPF`,
/// Linux 4.5+), replacing the group's program. The socket must be bound already (see
/// the module docs).
///
/// # Errors
/// `EINVAL` for an empty program or one longer than [`MAX_INSNS`], or one the kernel's
/// checker refuses; `ENOPROTOOPT` on a kernel without the option.
pub fn attach(socket: &impl AsFd, program: &[Insn]) -> io::Result<()> {
    crate::sys::attach_reuseport_cbpf(socket.as_fd(), program)
}

/// Removes the program from the reuseport group of `socket`
/// (`SO_DETACH_REUSEPORT_BPF`, Linux 5.3+): back to hash selection.
///
/// # Errors
/// `ENOENT` when the group has no program; the option errors.
pub fn detach(socket: &impl AsFd) -> io::Result<()> {
    crate::sys::set_int_option(
        socket.as_fd(),
        libc::SOL_SOCKET,
        libc::SO_DETACH_REUSEPORT_BPF,
        0,
    )
}

#[cfg(test)]
mod tests;
