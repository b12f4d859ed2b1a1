//! A shared device's membership of the host-wide device: joining the per-host registry
//! (`uroce_socket::host`), binding the member socket of its address's reuseport group,
//! keeping the group's steering program (`uroce_socket::steer`) current, and leaving.
//!
//! Every registry step runs under the registry's lock, and every step that changes the
//! kernel's member order (a bind, a close) happens while the lock is held, so the
//! registry's model of the order stays exact:
//! * **join** ([`HostMember::join`]): reap dead members, take a slot, bind the member
//!   socket (appended to the group), record the bind, attach the program for the new
//!   order through the new socket, commit;
//! * **check** ([`HostMember::maybe_check`], from the progress step, under the progress
//!   lock): every [`HOST_CHECK_EVERY`] the registry file is `stat`ed (it is replaced by a
//!   rename on every commit, so its inode and mtime change); when it changed, the lock is
//!   taken and the program attached again if the generation moved (another member's reap
//!   may have changed this group without being able to attach to it). Every
//!   [`HOST_REAP_EVERY`], and at once (at most every [`HOST_RECHECK_MIN`]) after a datagram
//!   for another member's slot arrived, dead members are reaped and the program attached;
//!   every time it holds the lock it also notes whether it is its group's designated
//!   member (which decides whether a CM MAD of another slot's ID is its own to handle);
//! * **listen** ([`HostMember::record_listeners`], from `CmService::with_agent` after a
//!   command changed the CM's listeners, on the thread that issued it): record the
//!   member's service IDs (`listen` / `unlisten`), attach the program with them, commit.
//!   This step does not take the progress lock: the thread may be the CM thread or an
//!   application thread inside a CM event sink, which must not wait for a progress step.
//!   It attaches through the progress thread's duplicate of the member socket's
//!   descriptor (the same socket, so the same group), taken under the registry lock and
//!   dropped before the commit releases it; [`HostMember::leave`] closes both
//!   descriptors under the registry lock, so the attach never reaches a closed or
//!   reused descriptor, and a record after the leave does nothing. Its lock order is
//!   the CM's record lock → registry lock → the duplicate's mutex, as the leave's is
//!   progress lock → registry lock → the duplicate's mutex: no cycle;
//! * **probe** (in the check, and [`HostMember::probe_received`] from the progress step):
//!   when several members died at once the registry may not know the kernel's order of
//!   the group (*uncertain*, no program attached from a guess). Every member that holds
//!   the lock in a check and finds its group uncertain without its own index found sends,
//!   after the commit, one probe per index (`steer::probe`, with the group's probe key
//!   from the registry) from the group's address; the kernel steers each to the socket at
//!   that index, whose member records `index → slot` ([`Locked::found`]); the record that
//!   completes the order makes the group certain again, and that member attaches the
//!   program at once (the others when they see the generation move). While the group is
//!   uncertain the check comes back every [`HOST_PROBE_EVERY`] (lost probes are sent
//!   again);
//! * **leave** ([`HostMember::leave`], when the device closes, under the progress lock):
//!   record the close, free the slot, attach the program for the order after the close
//!   (the last member moves into this socket's index), close the socket, commit. The
//!   registry's leave drops the member's CM listeners with its slot.
//!
//! Every program attached is recorded before the commit (`Locked::attached`): the registry
//! file shows, per group, the generation the kernel's program was made from and how many
//! programs of newer generations were attached (`HostState::attached`).

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::ops::RangeInclusive;
use std::os::fd::AsFd;
use std::os::unix::fs::MetadataExt as _;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use uroce_socket::fork::DupFd;
use uroce_socket::host::{host_dir, Locked, Registry, Resume};
use uroce_socket::steer::{self, QpnLayout};
use uroce_wire::opcode::op::UD_SEND_ONLY;
use uroce_wire::PacketRepr;

use super::lock;
use crate::error::NetError;
use crate::socket::{RoceSocket, SocketConfig};

/// How often the progress step looks at the registry file (one `stat`).
pub const HOST_CHECK_EVERY: Duration = Duration::from_millis(20);
/// How often a member reaps dead members on its own.
pub const HOST_REAP_EVERY: Duration = Duration::from_secs(1);
/// While its group's order is uncertain, a member checks (and probes) this often.
pub const HOST_PROBE_EVERY: Duration = Duration::from_millis(50);
/// A datagram for another member's slot makes the member reap and attach again, at most
/// this often.
pub const HOST_RECHECK_MIN: Duration = Duration::from_millis(2);

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// What identifies one version of the registry file: inode and modification time.
type FileId = Option<(u64, u64, i64, i64)>;

fn file_id(registry: &Registry) -> FileId {
    let m = std::fs::metadata(registry.path()).ok()?;
    Some((m.dev(), m.ino(), m.mtime(), m.mtime_nsec()))
}

/// What the last check saw (only touched under the progress lock).
#[derive(Debug, Default)]
struct Seen {
    file: FileId,
    generation: u64,
    /// Nanoseconds (device clock) of the next reap, and of the last one a foreign
    /// datagram asked for.
    next_reap: u64,
    last_forced: u64,
}

/// One device's membership of the host-wide device (see the module documentation).
#[derive(Debug)]
pub(super) struct HostMember {
    registry: Registry,
    layout: QpnLayout,
    slot: u16,
    group: SocketAddr,
    /// Nanoseconds (device clock) of the next look at the registry file.
    next_check: AtomicU64,
    /// A datagram for another member's slot arrived since the last check.
    recheck: AtomicBool,
    /// Datagrams for another member's slot, dropped.
    pub(super) dropped_foreign: AtomicU64,
    /// Attaches of the steering program the kernel refused after the join.
    pub(super) attach_errors: AtomicU64,
    /// Probes sent to find this member's index in an uncertain group.
    pub(super) probes_sent: AtomicU64,
    /// Whether the member was its group's designated member when it last held the
    /// registry lock (the program sends it the CM MADs of IDs nobody owns).
    designated: AtomicBool,
    /// Times the registry refused a service ID the CM listens on (another member listens
    /// on it, or the host has as many listeners as a program holds).
    pub(super) listen_refused: AtomicU64,
    left: AtomicBool,
    /// Where the slot's last member got to, when it left cleanly (this member's numbering
    /// carries on there; see `uroce_socket::host`, *Quarantine and resuming*).
    resumed: Option<Resume>,
    /// The process that joined (a forked child's copy must not change the registry).
    owner: u32,
    seen: Mutex<Seen>,
}

/// Whether the member of `slot` is `group`'s designated member as `l` has it: the lowest
/// member slot of the group (`SteeringTable::from_order`).
fn designated_in(l: &Locked<'_>, group: SocketAddr, slot: u16) -> bool {
    let layout = l.state().layout;
    l.state().groups.get(&group).is_some_and(|g| {
        g.order
            .slots()
            .iter()
            .copied()
            .filter(|&s| layout.is_member_slot(s))
            .min()
            == Some(slot)
    })
}

/// Attaches the program for `group`'s order as the registry knows it through `sock` and
/// records it (`Locked::attached`: the commit notes the generation, and counts a newer
/// one); an uncertain order (several members died at once) attaches nothing: the program
/// stays as it was until a member probes the group (not done yet).
fn attach(l: &mut Locked<'_>, group: SocketAddr, sock: &impl AsFd) -> std::io::Result<()> {
    match l.table(group) {
        Some(t) => {
            steer::attach(sock, &t.program())?;
            l.attached(group);
            Ok(())
        }
        None => Ok(()),
    }
}

impl HostMember {
    /// Joins the registry in `dir` (default: `uroce_socket::host::host_dir`) and binds
    /// the member socket of `group`.
    ///
    /// # Errors
    /// Registry errors, the bind's, and the kernel refusing the steering program.
    pub(super) fn join(
        dir: Option<PathBuf>,
        group: SocketAddr,
        cfg: SocketConfig,
    ) -> Result<(HostMember, RoceSocket), NetError> {
        if group.port() == 0 {
            return Err(NetError::Device(
                "a shared device needs an explicit UDP port".to_owned(),
            ));
        }
        let layout = QpnLayout::default();
        let registry = Registry::open(dir.unwrap_or_else(host_dir), layout)?;
        let (slot, resumed, sock, generation, file, designated) = {
            let file = file_id(&registry);
            let mut l = registry.lock()?;
            l.reap();
            let (slot, resumed) = l.join_resuming()?;
            // On an error below the socket closes before the lock goes (reverse order of
            // declaration) and the uncommitted changes are discarded: nothing happened.
            let sock = RoceSocket::bind_member(group, cfg)?;
            l.joined_group(slot, group)?;
            attach(&mut l, group, &sock).map_err(|e| NetError::Steer { group, source: e })?;
            let designated = designated_in(&l, group, slot);
            let generation = l.commit()?;
            (slot, resumed, sock, generation, file, designated)
        };
        let member = HostMember {
            registry,
            layout,
            slot,
            group,
            next_check: AtomicU64::new(0),
            recheck: AtomicBool::new(false),
            dropped_foreign: AtomicU64::new(0),
            attach_errors: AtomicU64::new(0),
            probes_sent: AtomicU64::new(0),
            listen_refused: AtomicU64::new(0),
            designated: AtomicBool::new(designated),
            left: AtomicBool::new(false),
            resumed,
            owner: std::process::id(),
            seen: Mutex::new(Seen {
                file,
                generation,
                ..Seen::default()
            }),
        };
        Ok((member, sock))
    }

    /// Whether this is a forked child's copy of its parent's member (whose registry state
    /// is the parent's to change; see `uroce_socket::fork`).
    fn forked(&self) -> bool {
        std::process::id() != self.owner
    }

    /// The member's slot.
    pub(super) fn slot(&self) -> u16 {
        self.slot
    }

    /// The QP numbers of the member's slot.
    pub(super) fn qpn_range(&self) -> RangeInclusive<u32> {
        let first = self.layout.qpn(self.slot, 0).unwrap_or(0);
        let last = self
            .layout
            .qpn(self.slot, self.layout.max_local())
            .unwrap_or(0);
        first..=last
    }

    /// The first QPN the member's context tries: where the slot's last member stopped,
    /// if it left cleanly.
    pub(super) fn qpn_start(&self) -> Option<u32> {
        self.resumed.map(|r| r.qpn)
    }

    /// The first communication ID the member's CM tries: where the slot's last member's
    /// CM stopped, if it had one and left cleanly.
    pub(super) fn comm_id_start(&self) -> Option<u32> {
        self.resumed.map(|r| r.comm_id).filter(|&id| id != 0)
    }

    /// Where this member's numbering got to, for its leave: `next_qpn` (its context's
    /// cursor) and `next_comm_id` (its CM's, `None` when it never ran one: then the one it
    /// resumed at, if any).
    pub(super) fn resume(&self, next_qpn: u32, next_comm_id: Option<u32>) -> Resume {
        Resume {
            qpn: next_qpn,
            comm_id: next_comm_id.or(self.comm_id_start()).unwrap_or(0),
        }
    }

    /// The XRC domains file of this member's device (`crate::xrc`): beside the registry,
    /// named after the registry file (so one per network namespace, as the registry) and
    /// the device's address (so one per device, as the kernel keeps XRC domains per
    /// device): `<registry file>-xrc-<address>`.
    pub(super) fn xrc_domains(&self) -> uroce_socket::xrcd::Domains {
        let registry = self.registry.path();
        let base = registry
            .file_name()
            .map_or_else(|| "host-registry".into(), |n| n.to_string_lossy());
        uroce_socket::xrcd::Domains::named(
            self.registry.dir(),
            format!("{base}-xrc-{}", self.group.ip()),
            self.layout,
        )
    }

    /// SRQ numbers of slot 0 (from 1): XRC requests naming them are steered by their
    /// target QP (see `NetConfig::xrc_srq_slots`).
    pub(super) fn slot0_srqn_range(&self) -> RangeInclusive<u32> {
        1..=self.layout.max_local()
    }

    /// The number a datagram is steered by: an XRC request's XRC SRQ number (`srqn`,
    /// from its XRCETH) unless it is of slot 0, else the destination QP `qpn`.
    pub(super) fn steered_by(&self, qpn: u32, srqn: Option<u32>) -> u32 {
        srqn.filter(|&n| self.layout.slot_of(n) != 0).unwrap_or(qpn)
    }

    /// The communication IDs the member's CM allots (its slot's, see
    /// `uroce_socket::steer`).
    pub(super) fn comm_ids(&self) -> Option<uroce_proto::cm::IdRange> {
        self.layout
            .comm_ids(self.slot)
            .and_then(uroce_proto::cm::IdRange::from_range)
    }

    /// Records that the member's CM listens on exactly `services` (see the module
    /// documentation), attaching the program with them; `dup` is the progress thread's
    /// duplicate of the member socket's descriptor. Returns the services the registry
    /// refused, `None` when it could not be read or written (the caller tries again
    /// later). A service another member listens on is not recorded
    /// ([`uroce_socket::host::HostError::ServiceTaken`]; counted in `listen_refused`): its
    /// REQs keep going to that member.
    pub(super) fn record_listeners(
        &self,
        services: &BTreeSet<u64>,
        dup: &Mutex<Option<Arc<DupFd>>>,
    ) -> Option<BTreeSet<u64>> {
        if self.left.load(Ordering::SeqCst) || self.forked() {
            return Some(BTreeSet::new());
        }
        let Ok(mut l) = self.registry.lock() else {
            return None;
        };
        // Under the registry lock: a leave that set the flag has not taken it yet, or is
        // over (and dropped the listeners).
        if self.left.load(Ordering::SeqCst) {
            return Some(BTreeSet::new());
        }
        let mine: Vec<u64> = l
            .state()
            .listeners
            .iter()
            .filter(|&(_, &s)| s == self.slot)
            .map(|(&service, _)| service)
            .collect();
        for service in mine {
            if !services.contains(&service) {
                l.unlisten(self.slot, service);
            }
        }
        let mut refused = BTreeSet::new();
        for &service in services {
            if l.listen(self.slot, service).is_err() {
                self.listen_refused.fetch_add(1, Ordering::Relaxed);
                refused.insert(service);
            }
        }
        self.designated
            .store(designated_in(&l, self.group, self.slot), Ordering::Relaxed);
        let fd = lock(dup).clone();
        if let Some(fd) = &fd {
            if attach(&mut l, self.group, fd.as_ref()).is_err() {
                self.attach_errors.fetch_add(1, Ordering::Relaxed);
            }
        }
        // The duplicate goes before the lock: a leave waiting for the lock closes the
        // last descriptor of the socket.
        drop(fd);
        l.commit().ok().map(|_| refused)
    }

    /// Whether a datagram for `qpn` (the number it is steered by, `steered_by`) is for a
    /// member slot not this device's: another
    /// member's (a stale program delivered it here) or one nobody holds (the program
    /// sends those to the designated member; the member may have died unreaped). Slot 0
    /// (QP0, QP1) and the reserved top slot are no member's: they are handled (or dropped
    /// as unknown) by the designated member as usual.
    pub(super) fn is_foreign(&self, qpn: u32) -> bool {
        let s = self.layout.slot_of(qpn);
        s != self.slot && self.layout.is_member_slot(s)
    }

    /// Whether `packet`, to QP1, is a CM MAD the program sent here by a stale order: one
    /// that answers or continues a connection (`QpnLayout::cm_answer_slot`) of a
    /// communication ID not of this member's slot. The designated member keeps every
    /// such MAD (the program sends it the IDs nobody owns; its CM drops them as unmatched
    /// or answers a DREQ with a DREP); a REQ and anything not steered by ID are kept.
    pub(super) fn is_foreign_mad(&self, packet: &PacketRepr<'_>) -> bool {
        !self.designated.load(Ordering::Relaxed)
            && packet.bth.opcode == UD_SEND_ONLY
            && self
                .layout
                .cm_answer_slot(packet.payload)
                .is_some_and(|s| s != self.slot)
    }

    /// Counts a dropped foreign datagram and asks for a reap at the next check.
    pub(super) fn foreign(&self) {
        self.dropped_foreign.fetch_add(1, Ordering::Relaxed);
        self.recheck.store(true, Ordering::Relaxed);
    }

    /// The check of the progress step (see the module documentation); `now` in
    /// nanoseconds of the device clock. Cheap when not due.
    pub(super) fn maybe_check(&self, sock: &RoceSocket, now: u64) {
        let recheck = self.recheck.load(Ordering::Relaxed);
        if !recheck && now < self.next_check.load(Ordering::Relaxed) {
            return;
        }
        if self.left.load(Ordering::Relaxed) || self.forked() {
            return;
        }
        let mut seen = lock(&self.seen);
        let forced = recheck && now >= seen.last_forced.saturating_add(nanos(HOST_RECHECK_MIN));
        if recheck && !forced && now < self.next_check.load(Ordering::Relaxed) {
            return;
        }
        self.next_check.store(
            now.saturating_add(nanos(HOST_CHECK_EVERY)),
            Ordering::Relaxed,
        );
        if forced {
            self.recheck.store(false, Ordering::Relaxed);
            seen.last_forced = now;
        }
        let reap = forced || now >= seen.next_reap;
        // Read before the lock: a commit after this read is seen by the next check.
        let file = file_id(&self.registry);
        if !reap && file == seen.file {
            return;
        }
        if reap {
            seen.next_reap = now.saturating_add(nanos(HOST_REAP_EVERY));
        }
        let Ok(mut l) = self.registry.lock() else {
            return;
        };
        let reaped = reap && !l.reap().is_empty();
        self.designated
            .store(designated_in(&l, self.group, self.slot), Ordering::Relaxed);
        if (reaped || forced || l.state().generation != seen.generation)
            && attach(&mut l, self.group, sock).is_err()
        {
            self.attach_errors.fetch_add(1, Ordering::Relaxed);
        }
        // An uncertain order: probe for this member's index (after the commit), and come
        // back soon.
        let probe = l
            .state()
            .groups
            .get(&self.group)
            .filter(|g| !g.certain && !g.found.values().any(|&s| s == self.slot))
            .map(|g| (g.order.len(), g.key));
        if probe.is_some() {
            seen.next_reap = now.saturating_add(nanos(HOST_PROBE_EVERY));
        }
        if let Ok(g) = l.commit() {
            seen.generation = g;
            seen.file = file;
        }
        drop(seen);
        if let Some((members, key)) = probe {
            self.send_probes(members, key);
        }
    }

    /// Sends one probe with `key` for each of the group's `members` indices, from the
    /// group's address (a socket of its own on an ephemeral port: members only take
    /// probes from their own address). Best effort: a probe lost is sent again at the
    /// next check.
    fn send_probes(&self, members: usize, key: u64) {
        let Ok(s) = std::net::UdpSocket::bind(SocketAddr::new(self.group.ip(), 0)) else {
            return;
        };
        for index in 0..u32::try_from(members).unwrap_or(0) {
            let _ = s.send_to(&steer::probe(index, key), self.group);
        }
        self.probes_sent
            .fetch_add(members as u64, Ordering::Relaxed);
    }

    /// A probe for `index` with `key` reached this member's socket (`sock`), so that is
    /// its index in the group: recorded in the registry; when that completes the group's
    /// order, the program is attached through `sock` before the commit. From the progress
    /// step.
    pub(super) fn probe_received(&self, index: u32, key: u64, sock: &RoceSocket) {
        if self.left.load(Ordering::Relaxed) || self.forked() {
            return;
        }
        let Ok(mut l) = self.registry.lock() else {
            return;
        };
        if l.found(self.group, index, self.slot, key) && attach(&mut l, self.group, sock).is_err() {
            self.attach_errors.fetch_add(1, Ordering::Relaxed);
        }
        let _ = l.commit();
    }

    /// Leaves the host-wide device (see the module documentation): `sock` (the member
    /// socket) and `dup` (the progress thread's duplicate of its descriptor) are closed
    /// while the registry is locked; `resume`: where the member's numbering got to (the
    /// slot's next member carries on there; `None`: the slot goes into quarantine). Only
    /// the first call does anything; the caller holds the progress lock.
    pub(super) fn leave(
        &self,
        sock: &mut Option<RoceSocket>,
        dup: &Mutex<Option<Arc<DupFd>>>,
        resume: Option<Resume>,
    ) {
        if self.left.swap(true, Ordering::SeqCst) {
            return;
        }
        let close = |sock: &mut Option<RoceSocket>| {
            *sock = None;
            lock(dup).take();
        };
        if self.forked() {
            // A forked child's copy of its parent's device: its descriptors were pointed
            // at /dev/null after the fork (`uroce_socket::fork`); the member is the
            // parent's, which records its own leave.
            close(sock);
            return;
        }
        let Ok(mut l) = self.registry.lock() else {
            close(sock);
            return;
        };
        l.left_group(self.slot, self.group);
        let _ = match resume {
            Some(r) => l.leave_resumable(self.slot, r),
            None => l.leave(self.slot),
        };
        if let Some(s) = sock.as_ref() {
            // The order after this socket's close: the last member in its index.
            let _ = attach(&mut l, self.group, s);
        }
        close(sock);
        let _ = l.commit();
    }
}
