//! # Steering a `SO_REUSEPORT` group by destination QP (building block)
//!
//! A host-wide device lets every process of a host (every *member*) bind its own UDP
//! socket to each device address, port 4791, with `SO_REUSEPORT`; the sockets of one
//! `address:4791` form a *reuseport group*, and one classic BPF program attached to the
//! group chooses, for every arriving datagram, the member socket that owns the
//! destination QP named in its BTH. This module has the pieces that need no registry:
//! the QPN layout that names an owner ([`QpnLayout`]), a model of the kernel's member
//! order ([`GroupOrder`]), the program generator ([`SteeringTable::program`]), and the
//! system calls ([`bind_member`], [`attach`], [`detach`]). [`crate::host`] keeps the
//! per-host registry (who holds which slot, the member order of every group). The device
//! runtime (`uroce-net`) uses both for a shared device (`NetConfig::shared`, opt-in).
//!
//! ## What the kernel does (Linux `net/core/sock_reuseport.c`, `net/core/filter.c`)
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
//!   §13.4) and no member's QPs. Everything in it goes to the *designated member*
//!   ([`SteeringTable::designated`], which the registry chooses: the live member with the
//!   lowest slot). Which process listens for a MAD's service ID cannot be read from the
//!   BTH, so the designated member must hand GSI MADs on to the other members; that is
//!   device-runtime work.
//! * **the top slot** (all ones) holds the multicast QPN 0xFFFFFF. Multicast datagrams
//!   arrive on group sockets, not on the unicast sockets steered here ([`crate::mcast`]),
//!   so a unicast datagram to it is malformed; it is reserved so that no member can own
//!   QPN 0xFFFFFF.
//!
//! ## Unknown slots: the designated member, not an out-of-range index
//! A datagram for a slot nobody holds (a QP of a member that left or was killed, a forged
//! QPN), a datagram shorter than a BTH, and one for slot 0 all go to the designated
//! member, by an explicit index. Returning an out-of-range index instead would hand them
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
//! Binding one member socket per device address with [`bind_member`] (and turning it into
//! a `RoceSocket`), allotting QPNs inside its slot, re-attaching when the registry's
//! generation changes, dropping and counting misdelivered datagrams, forwarding GSI MADs
//! from the designated member, and resolving an uncertain order with probes.

use std::io;
use std::net::{SocketAddr, UdpSocket};
use std::os::fd::AsFd;

use rustix::net::{sockopt, AddressFamily, SocketFlags, SocketType};

/// The BTH opcode of a steering probe (see the module docs): prefix 0xC0, unassigned by
/// IBA vol 1 §9.2.
pub const PROBE_OPCODE: u8 = 0xDF;

/// The shortest datagram steered by its QPN: a BTH (12 bytes); shorter ones go to the
/// designated member.
pub const MIN_STEERED_LEN: u32 = 12;

/// The multicast QPN (IBA vol 1 §10.5.2.3), in the reserved top slot.
pub const MULTICAST_QPN: u32 = 0xFF_FFFF;

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
const B: u16 = 0x10;
const ABS: u16 = 0x20;
const LEN: u16 = 0x80;
const ALU: u16 = 0x04;
const AND: u16 = 0x50;
const RSH: u16 = 0x70;
const JMP: u16 = 0x05;
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

/// The most slots one program routes: 11 fixed instructions, two per route.
pub const MAX_ROUTES: usize = (MAX_INSNS - 11) / 2;

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
}

impl SteeringTable {
    /// A table that sends everything to member index `designated`.
    pub fn new(layout: QpnLayout, designated: u32) -> SteeringTable {
        SteeringTable {
            layout,
            designated,
            routes: Vec::new(),
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

    /// The index a datagram for `qpn` should reach.
    pub fn index_for(&self, qpn: u32) -> u32 {
        let slot = self.layout.slot_of(qpn);
        self.routes
            .binary_search_by_key(&slot, |r| r.0)
            .map_or(self.designated, |i| self.routes[i].1)
    }

    /// The classic BPF program that steers like [`SteeringTable::index_for`]:
    ///
    /// ```text
    ///   ld   len                 ; payload length
    ///   jge  #12, +1, +0         ; at least a BTH?
    ///   ret  #designated
    ///   ldb  [0]                 ; opcode
    ///   jeq  #PROBE_OPCODE, +0, +2
    ///   ld   [4]                 ; a probe: bytes 4-7 are the index
    ///   ret  a
    ///   ld   [4]                 ; bytes 4-7: reserved byte, then the destination QP
    ///   and  #0xffffff
    ///   rsh  #local_bits         ; a = slot
    ///   jeq  #slot_1, +0, +1     ; one pair per routed slot
    ///   ret  #index_1
    ///   ...
    ///   ret  #designated
    /// ```
    ///
    /// Every jump is short (the kernel's offsets are 8 bits). The program has 11
    /// instructions plus two per route, so at most [`MAX_ROUTES`] routes fit the kernel's
    /// [`MAX_INSNS`]; a table with more (only possible with 12 slot bits) is cut to the
    /// routes of its lowest slots, and the registry never allots a slot above
    /// [`MAX_ROUTES`]. The compare chain costs two instructions per member before the
    /// last member's; a host has few members.
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
            stmt(LD | W | ABS, 4),
            stmt(ALU | AND | K, 0xFF_FFFF),
            stmt(ALU | RSH | K, u32::from(self.layout.local_bits())),
        ];
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
mod tests {
    use super::*;

    /// A classic BPF evaluator for the instructions the generator emits, with the
    /// kernel's semantics for them (loads beyond the packet end the program with 0).
    fn run(program: &[Insn], payload: &[u8]) -> u32 {
        let mut a: u32 = 0;
        let mut pc = 0usize;
        // Programs only jump forward, so each instruction runs at most once.
        for _ in 0..=program.len() {
            let Some(i) = program.get(pc) else {
                panic!("fell off the program at {pc}");
            };
            pc += 1;
            match i.code {
                c if c == LD | W | LEN => a = payload.len() as u32,
                c if c == LD | B | ABS => match payload.get(i.k as usize) {
                    Some(&b) => a = u32::from(b),
                    None => return 0,
                },
                c if c == LD | W | ABS => {
                    let k = i.k as usize;
                    match payload.get(k..k + 4) {
                        Some(w) => a = u32::from_be_bytes(w.try_into().unwrap()),
                        None => return 0,
                    }
                }
                c if c == ALU | AND | K => a &= i.k,
                c if c == ALU | RSH | K => a >>= i.k,
                c if c == JMP | JEQ | K || c == JMP | JGE | K => {
                    let taken = if c == JMP | JEQ | K {
                        a == i.k
                    } else {
                        a >= i.k
                    };
                    pc += usize::from(if taken { i.jt } else { i.jf });
                }
                c if c == RET | K => return i.k,
                c if c == RET | RET_A => return a,
                c => panic!("unexpected opcode {c:#x}"),
            }
        }
        panic!("program did not return");
    }

    fn bth_to(qpn: u32) -> [u8; 12] {
        let mut b = [0u8; 12];
        b[0] = 0x04; // RC SEND only
        b[5..8].copy_from_slice(&qpn.to_be_bytes()[1..]);
        b
    }

    #[test]
    fn layout_splits_and_reserves() {
        let l = QpnLayout::default();
        assert_eq!((l.slot_bits(), l.local_bits(), l.max_slot()), (8, 16, 254));
        assert_eq!(l.qpn(3, 0x1234), Some(0x03_1234));
        assert_eq!(l.slot_of(0x03_1234), 3);
        assert_eq!(l.local_of(0x03_1234), 0x1234);
        assert_eq!(l.qpn(0, 1), None, "slot 0 holds QP0/QP1");
        assert_eq!(l.qpn(255, 0), None, "the top slot holds the multicast QPN");
        assert_eq!(l.qpn(1, 0x1_0000), None);
        assert_eq!(l.slot_of(MULTICAST_QPN), 255);
        assert!(!l.is_member_slot(l.slot_of(MULTICAST_QPN)));
        let l4 = QpnLayout::new(4).unwrap();
        assert_eq!((l4.max_slot(), l4.max_local()), (14, 0xF_FFFF));
        assert_eq!(l4.qpn(14, 7), Some(0xE0_0007));
        assert!(QpnLayout::new(1).is_none() && QpnLayout::new(13).is_none());
    }

    #[test]
    fn group_order_models_swap_with_last() {
        let mut o = GroupOrder::from_slots(vec![1, 2, 3, 4]);
        assert!(o.left(2));
        assert_eq!(o.slots(), &[1, 4, 3]);
        o.joined(5);
        assert_eq!(o.index_of(5), Some(3));
        assert!(!o.left(9));
        assert!(o.left(5), "the last leaves: nothing moves");
        assert_eq!(o.slots(), &[1, 4, 3]);
    }

    #[test]
    fn unseen_closes_are_resolved_only_when_their_order_does_not_matter() {
        let o = GroupOrder::from_slots(vec![1, 2, 3, 4]);
        assert_eq!(
            o.after_unseen_closes(&[2]),
            Some(GroupOrder::from_slots(vec![1, 4, 3]))
        );
        // 2 and 3 dying: either order leaves [1, 4].
        assert_eq!(
            o.after_unseen_closes(&[3, 2]),
            Some(GroupOrder::from_slots(vec![1, 4]))
        );
        // 1 and 2: [4, 3] or [3, 4].
        assert_eq!(o.after_unseen_closes(&[1, 2]), None);
        assert_eq!(o.after_unseen_closes(&[]), Some(o.clone()));
        assert_eq!(o.after_unseen_closes(&[9]), Some(o.clone()));
        // All of them: empty whatever the order.
        assert_eq!(
            o.after_unseen_closes(&[1, 2, 3, 4]),
            Some(GroupOrder::default())
        );
        let big = GroupOrder::from_slots((1..=10).collect());
        assert_eq!(big.after_unseen_closes(&[1, 2, 3, 4, 5, 6, 7]), None);
    }

    #[test]
    fn program_steers_each_slot_to_its_index() {
        let l = QpnLayout::default();
        let order = GroupOrder::from_slots(vec![7, 2, 200, 5]);
        let t = SteeringTable::from_order(l, &order).unwrap();
        assert_eq!(t.designated(), 1, "slot 2, the lowest, is at index 1");
        let p = t.program();
        assert!(p.len() <= MAX_INSNS);
        for (i, &slot) in order.slots().iter().enumerate() {
            for local in [0, 1, 0x7FFF, l.max_local()] {
                let qpn = l.qpn(slot, local).unwrap();
                assert_eq!(run(&p, &bth_to(qpn)), i as u32, "qpn {qpn:#x}");
                assert_eq!(t.index_for(qpn), i as u32);
                // A longer packet (payload, ICRC) steers the same.
                let mut long = bth_to(qpn).to_vec();
                long.extend_from_slice(&[0xAB; 40]);
                assert_eq!(run(&p, &long), i as u32);
            }
        }
        // QP0, QP1, unknown slots, the multicast QPN: the designated member.
        for qpn in [
            0,
            1,
            l.qpn(3, 9).unwrap(),
            l.qpn(254, 0).unwrap(),
            MULTICAST_QPN,
        ] {
            assert_eq!(run(&p, &bth_to(qpn)), 1, "qpn {qpn:#x}");
            assert_eq!(t.index_for(qpn), 1);
        }
        // The reserved byte 4 does not disturb the QPN.
        let mut b = bth_to(l.qpn(200, 3).unwrap());
        b[4] = 0xFF;
        assert_eq!(run(&p, &b), 2);
        // Short datagrams: designated, not the kernel's 0 for an out-of-range load.
        for n in 0..12 {
            assert_eq!(run(&p, &bth_to(l.qpn(7, 1).unwrap())[..n]), 1, "len {n}");
        }
        // Probes go where they say.
        for k in [0, 3, 17, u32::MAX] {
            assert_eq!(run(&p, &probe(k, 99)), k);
            assert_eq!(parse_probe(&probe(k, 99)), Some((k, 99)));
        }
        assert_eq!(parse_probe(&bth_to(1)), None);
    }

    #[test]
    fn program_for_other_layouts_and_sizes() {
        let l = QpnLayout::new(4).unwrap();
        let mut t = SteeringTable::new(l, 0);
        t.route(14, 3);
        t.route(1, 2);
        t.route(0, 9); // ignored: slot 0 is designated
        t.route(15, 9); // ignored: reserved
        let p = t.program();
        assert_eq!(run(&p, &bth_to(l.qpn(14, 0xF_FFFF).unwrap())), 3);
        assert_eq!(run(&p, &bth_to(l.qpn(1, 5).unwrap())), 2);
        assert_eq!(run(&p, &bth_to(1)), 0);
        assert_eq!(run(&p, &bth_to(MULTICAST_QPN)), 0);
        // Every member slot of the default layout routed: still within the kernel's
        // limit, every slot right.
        let l = QpnLayout::default();
        let order = GroupOrder::from_slots((1..=l.max_slot()).rev().collect());
        let t = SteeringTable::from_order(l, &order).unwrap();
        let p = t.program();
        assert!(p.len() <= MAX_INSNS, "{}", p.len());
        for slot in 1..=l.max_slot() {
            let qpn = l.qpn(slot, 42).unwrap();
            assert_eq!(run(&p, &bth_to(qpn)), order.index_of(slot).unwrap());
        }
        // The largest layout is cut to the kernel's limit.
        let l = QpnLayout::new(12).unwrap();
        let order = GroupOrder::from_slots((1..=l.max_slot()).collect());
        let p = SteeringTable::from_order(l, &order).unwrap().program();
        assert_eq!(p.len(), MAX_INSNS - 1);
        let top = l.qpn(MAX_ROUTES as u16, 1).unwrap();
        assert_eq!(run(&p, &bth_to(top)), MAX_ROUTES as u32 - 1);
        let cut = l.qpn(MAX_ROUTES as u16 + 1, 1).unwrap();
        assert_eq!(run(&p, &bth_to(cut)), 0, "cut: designated");
        assert!(SteeringTable::from_order(l, &GroupOrder::default()).is_none());
    }
}
