//! # The per-host registry of a shared device (building block)
//!
//! Every process of a host that uses the host-wide device is a *member* ([`crate::steer`]
//! has the steering this serves): it holds a *slot*, the top bits of every QPN it allots
//! ([`QpnLayout`]), and binds one socket per device address to `address:4791` with
//! `SO_REUSEPORT`. The kernel numbers the sockets of each such group in join order, and
//! the classic BPF program on the group maps slots to those numbers, so somebody must
//! know, for every group, which slot's socket is at which index. That is this registry: a
//! small text file shared by the members of one user, changed only under an exclusive
//! `flock`, holding
//! * the **members**: slot, pid, the process's start time (field 22 of
//!   `/proc/<pid>/stat`, so that a reused pid is not taken for the member) and when it
//!   joined;
//! * the **freed slots** and when each was freed (see *Quarantine*);
//! * the **order of every group** (`address:port` → slot by index, [`GroupOrder`]) and
//!   whether it is *certain*;
//! * the **CM listeners**: which slot listens on which service ID, so that every group's
//!   program sends REQs and SIDR_REQs for it to that member (see *CM listeners*);
//! * a **generation**, bumped by every change, so that a member that sees a new one knows
//!   the program may have to be attached again;
//! * for every group, **the program attached**: the generation it was made from and how
//!   many programs members attached (see *Re-attaching*).
//!
//! ## Where it lives
//! `<dir>/host-registry-net<inode>-c<cookie>` (replaced atomically: written to a temporary file that
//! is renamed over it, so an unlocked reader, [`Registry::read`], always sees a whole one)
//! and the same name with `.lock` (the `flock`, released by the kernel when its holder
//! dies, so a killed member never leaves the registry locked). `<dir>` is
//! `UROCE_HOST_DIR` when set, else `/dev/shm/uroce-<uid>` when `/dev/shm` is a directory,
//! else `/tmp/uroce-<uid>` ([`host_dir`]); it is made with mode 0700 and must belong to the
//! user. One registry per user is also what the kernel allows: the members of a reuseport
//! group must have the same effective UID. The default depends on nothing of a process's
//! environment (not `TMPDIR`, not `XDG_RUNTIME_DIR`, which a login session has and a
//! cron job or a service does not): every process of the user on the host must find the
//! *same* registry, or two registries would each model one reuseport group and steer
//! each other's datagrams wrong.
//!
//! **Versions.** The file's first line names its format (`uroce-host 2`). A registry of
//! another format is refused ([`HostError::Corrupt`], saying it was written by another
//! version of uroce): two versions cannot model one reuseport group together. One whose
//! members are all gone (an upgrade after every program of the old version ended) is
//! discarded and replaced at the next commit.
//!
//! **Namespaces.** Reuseport groups belong to a network namespace, so the file's name
//! carries the inode of the process's (`/proc/self/ns/net`): processes of one user in two
//! network namespaces (`uroce run` can make one) keep two registries even in one
//! directory. It carries the namespace's cookie (`SO_NETNS_COOKIE`) too: the inode of a
//! destroyed namespace is reused by later ones, and a namespace made a moment after
//! another one died would otherwise inherit its registry, slots in quarantine included
//! (seen: the fourth of several back-to-back runs of rdma-core's suite, each in a
//! namespace of its own, found no free slot). Members are checked by pid, so all members of a registry must see the same
//! pids: the file records the PID namespace's inode, and a process of another one is
//! refused ([`HostError::PidNamespace`]) rather than reaping members it cannot see.
//!
//! ## The operations (all under the lock, [`Registry::lock`] → [`Locked`])
//! * [`Locked::join`]: allots a free slot to this process.
//! * [`Locked::joined_group`] / [`Locked::left_group`]: record that the member bound /
//!   closed its socket of a group *while holding the lock*, which is what keeps the model
//!   of the kernel's order exact (the kernel appends a bound socket; a closed one is
//!   replaced by the last).
//! * [`Locked::leave`]: frees the slot and removes it from every group, modelling the
//!   closes of its sockets, which the member makes before [`Locked::commit`].
//! * [`Locked::reap`]: removes the members whose process is gone (no `/proc/<pid>`, a
//!   zombie whose threads have all exited, or another start time). The kernel closed their
//!   sockets as they exited, unseen (a zombie leader whose other threads still exit has not
//!   yet, and is not reaped until they are gone), each moving the last member of a group
//!   into its index: when one member of a group died that is one known move, but when
//!   several did, the result may depend on the order of their closes
//!   ([`GroupOrder::after_unseen_closes`]); the group is then marked *uncertain* (its order
//!   is a guess, its key for probes drawn afresh, [`GroupState::key`]) until its members
//!   probe it: each member that receives the probe for index *k* records it
//!   ([`Locked::found`]), and the record that completes the order makes it certain again
//!   (or a member that learnt the whole order records it, [`Locked::set_order`]).
//! * [`Locked::listen`] / [`Locked::unlisten`]: a member's CM agent starts or stops
//!   listening on a service ID.
//! * [`Locked::commit`]: writes the registry if anything changed (with the next
//!   generation) and releases the lock; dropping a [`Locked`] discards its changes.
//! * [`Registry::read`] / [`Registry::list`]: a snapshot without the lock.
//!
//! ## Re-attaching
//! Whoever changes a group's order attaches the new program ([`Locked::table`] →
//! [`crate::steer::SteeringTable::program`] → [`crate::steer::attach`]) through one of its
//! own sockets of that group before it commits: a joiner after binding, a leaver before
//! closing, a reaper after reaping, a member that listens or stops listening after
//! recording it (the windows of misdelivery each leaves are in [`crate::steer`]). A member that receives a datagram for a slot not its own (the sign
//! of a stale program after a member was killed) should take the lock and reap.
//!
//! A member that attached a group's program tells the registry ([`Locked::attached`]);
//! the commit records, in [`HostState::attached`], the generation the program was made
//! from (the one it commits) and counts the program when that generation is newer than
//! the one recorded, so the count grows by one for each change of the group's order or
//! listeners that reached the kernel, not for every member attaching the same program
//! again. Recording it alone writes the file without a new generation (a new generation
//! would make every member attach again). So anyone can see from the file whether the
//! kernel has the program of the registry's latest generation, and how many re-attaches
//! the group has had (the test of a member killed mid-traffic reads both). An attach
//! recorded before a later change of the same lock is forgotten (its program lacks the
//! change).
//!
//! ## CM listeners
//! Each member runs its own CM agent; the steering program sends the MADs of a connection
//! to the member whose slot is in the communication ID (a member allots IDs from
//! [`QpnLayout::comm_ids`]), and a REQ or SIDR_REQ to the member listening on its service
//! ID, which only this registry knows ([`HostState::listeners`], at most
//! [`MAX_LISTENERS`]: a steering program holds no more). One member per service ID
//! ([`HostError::ServiceTaken`]): two processes of a host cannot listen on one service,
//! as two listeners on one port of one CM cannot.
//!
//! **A listener that exits while REQs arrive.** [`Locked::leave`] and [`Locked::reap`]
//! drop the listeners of the slots they free, and the generation moves, so members attach
//! a program without them: from then on REQs for those services go to the designated
//! member, whose CM has no listener for them and answers REJ "invalid service ID" (SIDR_REP
//! "unsupported"), as a lone process does once its listener is gone. Before that (a killed
//! listener not yet reaped), its REQs go to its old index, now another member's socket or,
//! past the end, one chosen by hash, which rejects them the same way. Connections the
//! listener had accepted are gone with its process; their MADs go to the designated
//! member too (their IDs' slot has no member), which drops them or answers a DREQ with a
//! DREP. A slot in quarantine keeps a reused slot from inheriting them.
//!
//! ## Quarantine and resuming
//! A peer of a member that is gone may still retransmit to its QPNs (and answer its
//! communication IDs) for a while, and a new member handed the same slot could allot the
//! same numbers to new QPs, which would then see the old connection's packets. A member
//! that leaves cleanly says where its numbering got to ([`Locked::leave_resumable`], a
//! [`Resume`]: the next QPN and communication ID it would have allotted), and the next
//! member of that slot carries on from there ([`Locked::join_resuming`]), as one process
//! destroying and creating QPs does: no number comes back before the slot's range has gone
//! round. Such a slot is free at once. A slot whose member was reaped (killed: nobody knows
//! how far it got) or left without a [`Resume`] comes back only after
//! [`Registry::quarantine`] (default [`DEFAULT_QUARANTINE`]). So a join takes a slot never
//! used, else a resumable one (freed longest ago first), else one out of quarantine (freed
//! longest ago first), and refuses ([`HostError::Full`]) when every free slot is still in
//! quarantine: with 254 slots that happens only to a host whose members are killed faster
//! than 254 a minute, whereas programs opening and closing devices in a loop (each a new
//! member) reuse resumable slots without limit.
//!
//! ## Not handled
//! A member socket inherited by a child (`fork` without `exec`; the sockets are
//! close-on-exec) outlives its member: the kernel closes it only with the last
//! descriptor, so the model would be wrong. The device runtime must not let a child keep
//! them. The device runtime's shared device (`uroce-net`, `NetConfig::shared`) joins when
//! it opens, binds and attaches, leaves when it closes, attaches again when the generation
//! moves, and reaps on misdelivery and every second; its CM agent allots communication
//! IDs from the slot's range, and the service IDs it listens on are recorded here
//! ([`Locked::listen`] / [`Locked::unlisten`], then attached) before the command returns.
//! It also probes an uncertain group (`uroce-net`'s `member.rs`).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::fs::File;
use std::io;
use std::net::SocketAddr;
use std::os::unix::fs::{DirBuilderExt as _, MetadataExt as _};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rustix::fs::{flock, FlockOperation};

use crate::steer::{GroupOrder, QpnLayout, SteeringTable, MAX_LISTENERS, MAX_ROUTES};

/// Environment variable that chooses the registry's directory.
pub const HOST_DIR_ENV: &str = "UROCE_HOST_DIR";

/// The start of the registry file's name: `host-registry-net<inode>-c<cookie>`, the
/// inode and the cookie being those of the network namespace (see the module
/// documentation); the lock file adds `.lock`.
pub const REGISTRY_FILE: &str = "host-registry";

/// How long a freed slot is not handed out again by default.
pub const DEFAULT_QUARANTINE: Duration = Duration::from_secs(60);

/// The first line of the registry file: its format (2: with `resume`, `probing` and
/// `found` lines, which format 1 readers refuse).
const MAGIC: &str = "uroce-host 2";

/// Where the registry lives (see the module documentation).
pub fn host_dir() -> PathBuf {
    if let Some(d) = std::env::var_os(HOST_DIR_ENV).filter(|d| !d.is_empty()) {
        return PathBuf::from(d);
    }
    let shm = Path::new("/dev/shm");
    let base = if shm.is_dir() { shm } else { Path::new("/tmp") };
    base.join(format!("uroce-{}", own_uid()))
}

/// This process's user (the owner of `/proc/self`, as `uroce_net::stats` reads it).
fn own_uid() -> u32 {
    std::fs::metadata("/proc/self").map_or(0, |m| m.uid())
}

/// Why a registry operation failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum HostError {
    /// A file or directory of the registry could not be used.
    #[error("host registry {path}: {source}")]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// What the OS said.
        source: io::Error,
    },
    /// The registry file does not parse.
    #[error("host registry {path}, line {line}: {why}")]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// The line (1-based).
        line: usize,
        /// What is wrong.
        why: String,
    },
    /// The registry's directory belongs to another user.
    #[error("host registry directory {path} belongs to uid {owner}, not {uid}")]
    NotOurs {
        /// The directory.
        path: PathBuf,
        /// Its owner.
        owner: u32,
        /// This process's user.
        uid: u32,
    },
    /// The registry was made for another QPN layout.
    #[error("host registry uses {file} slot bits, this process {ours}")]
    Layout {
        /// The registry's.
        file: u8,
        /// This process's.
        ours: u8,
    },
    /// No slot is free (or only slots still in quarantine).
    #[error("no free member slot ({members} members, {quarantined} slots in quarantine)")]
    Full {
        /// Members now.
        members: usize,
        /// Free slots not yet out of quarantine.
        quarantined: usize,
    },
    /// The registry's members live in another PID namespace, whose pids this process
    /// cannot check.
    #[error("host registry of PID namespace {file}, this process is in {ours}")]
    PidNamespace {
        /// The registry's.
        file: u64,
        /// This process's.
        ours: u64,
    },
    /// The slot has no member.
    #[error("slot {slot} has no member")]
    NotMember {
        /// The slot.
        slot: u16,
    },
    /// Another member listens on the service ID.
    #[error("service ID {service:#x} already has a listener (slot {slot})")]
    ServiceTaken {
        /// The service ID.
        service: u64,
        /// The slot of the member listening on it.
        slot: u16,
    },
    /// The host already has [`MAX_LISTENERS`] listeners, as many as a steering program
    /// holds.
    #[error("the host already has {MAX_LISTENERS} CM listeners")]
    TooManyListeners,
    /// This process's own `/proc/self/stat` could not be read.
    #[error("cannot read the start time of process {pid}")]
    NoStartTime {
        /// The process.
        pid: u32,
    },
}

/// One member of the host's device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Member {
    /// Its slot: the top bits of its QPNs.
    pub slot: u16,
    /// Its process.
    pub pid: u32,
    /// The process's start time (clock ticks after boot, `/proc/<pid>/stat` field 22).
    pub start_time: u64,
    /// When it joined (milliseconds since the Unix epoch).
    pub joined_ms: u64,
}

impl Member {
    /// Whether its process still runs: `/proc/<pid>/stat` exists, has the member's start
    /// time, and is not a zombie left alone (a zombie whose last thread has exited has
    /// closed its descriptors, sockets included; a zombie thread-group leader whose other
    /// threads still exit has not, and counts as alive until they are gone).
    pub fn is_alive(&self) -> bool {
        // A zombie leader may still have threads exiting, which share its descriptor table:
        // its sockets close with the last of them, so it is dead only when it is alone.
        matches!(proc_stat_threads(self.pid), Some((state, start, threads))
            if start == self.start_time && (!matches!(state, 'Z' | 'X') || threads > 1))
    }
}

/// Where a member that left cleanly got to in its slot's numbering: the next member of
/// the slot starts there (see *Quarantine and resuming* in the module documentation).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Resume {
    /// The next QPN it would have allotted (its QPN table's cursor).
    pub qpn: u32,
    /// The next communication ID its CM would have allotted (0: it never ran a CM and
    /// knows none).
    pub comm_id: u32,
}

/// The order of one group's member sockets as the registry knows it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct GroupState {
    /// Slot by socket index.
    pub order: GroupOrder,
    /// False when several members died at once and the order is a guess (see the
    /// module documentation).
    pub certain: bool,
    /// An uncertain group: the key its probes must carry, drawn afresh whenever its order
    /// moves (a probe sent before may name an index that has moved since), and known only
    /// to the user's processes (a datagram from elsewhere cannot pose as a probe).
    pub key: u64,
    /// An uncertain group: the indices members found by probing (index → slot), until
    /// every member's is known and the order is certain again ([`Locked::found`]).
    pub found: BTreeMap<u32, u16>,
}

impl GroupState {
    fn certain(order: GroupOrder) -> GroupState {
        GroupState {
            order,
            certain: true,
            key: 0,
            found: BTreeMap::new(),
        }
    }

    /// An uncertain group whose every index was found becomes certain with the order
    /// found (`true`).
    fn resolve(&mut self) -> bool {
        let n = self.order.len();
        let complete = !self.certain
            && self.found.len() == n
            && self
                .found
                .keys()
                .copied()
                .eq(0..u32::try_from(n).unwrap_or(u32::MAX));
        if complete {
            *self = GroupState::certain(GroupOrder::from_slots(
                self.found.values().copied().collect(),
            ));
        }
        complete
    }

    /// The order of an uncertain group moved (a close, a reap): what probes found before
    /// may name other sockets now, and their key is void.
    fn moved(&mut self) {
        if !self.certain {
            self.key = probe_key();
            self.found.clear();
        }
    }
}

/// The registry's contents.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostState {
    /// The QPN layout every member uses.
    pub layout: QpnLayout,
    /// The inode of the members' PID namespace (`/proc/self/ns/pid`; 0 if unknown).
    pub pid_ns: u64,
    /// Bumped by every committed change.
    pub generation: u64,
    /// The members, by slot.
    pub members: BTreeMap<u16, Member>,
    /// Freed slots and when (milliseconds since the Unix epoch).
    pub freed: BTreeMap<u16, u64>,
    /// Freed slots whose member left cleanly, and where it got to: free at once, the next
    /// member resumes there.
    pub resume: BTreeMap<u16, Resume>,
    /// Every group (`address:port`) that has member sockets.
    pub groups: BTreeMap<SocketAddr, GroupState>,
    /// The CM listeners: service ID → the slot of the member listening on it (at most
    /// [`MAX_LISTENERS`]).
    pub listeners: BTreeMap<u64, u16>,
    /// The program last attached to each group (only groups that have member sockets and
    /// a program a member recorded, [`Locked::attached`]).
    pub attached: BTreeMap<SocketAddr, Attached>,
}

/// The steering program attached to one group, as its members recorded it (see
/// *Re-attaching* in the module documentation).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Attached {
    /// The generation of the registry the newest program was made from: the program
    /// steers by the group's order and the listeners of that generation.
    pub generation: u64,
    /// How many programs members attached to the group, each of a newer generation than
    /// the one before (a member attaching a program of the recorded generation again is
    /// not counted).
    pub count: u64,
}

impl HostState {
    fn empty(layout: QpnLayout, pid_ns: u64) -> HostState {
        HostState {
            layout,
            pid_ns,
            generation: 0,
            members: BTreeMap::new(),
            freed: BTreeMap::new(),
            resume: BTreeMap::new(),
            groups: BTreeMap::new(),
            listeners: BTreeMap::new(),
            attached: BTreeMap::new(),
        }
    }

    /// The registry file's text.
    pub fn to_text(&self) -> String {
        let mut t = String::new();
        let _ = writeln!(t, "{MAGIC}");
        let _ = writeln!(t, "slot-bits {}", self.layout.slot_bits());
        let _ = writeln!(t, "pid-ns {}", self.pid_ns);
        let _ = writeln!(t, "generation {}", self.generation);
        for m in self.members.values() {
            let _ = writeln!(
                t,
                "member {} {} {} {}",
                m.slot, m.pid, m.start_time, m.joined_ms
            );
        }
        for (slot, at) in &self.freed {
            let _ = writeln!(t, "freed {slot} {at}");
        }
        for (slot, r) in &self.resume {
            let _ = writeln!(t, "resume {slot} {} {}", r.qpn, r.comm_id);
        }
        for (addr, g) in &self.groups {
            let _ = write!(
                t,
                "group {addr} {}",
                if g.certain { "certain" } else { "uncertain" }
            );
            for s in g.order.slots() {
                let _ = write!(t, " {s}");
            }
            t.push('\n');
            if !g.certain {
                let _ = writeln!(t, "probing {addr} {}", g.key);
                for (index, slot) in &g.found {
                    let _ = writeln!(t, "found {addr} {index} {slot}");
                }
            }
        }
        for (service, slot) in &self.listeners {
            let _ = writeln!(t, "listen {service:#018x} {slot}");
        }
        for (addr, a) in &self.attached {
            let _ = writeln!(t, "attached {addr} {} {}", a.generation, a.count);
        }
        t
    }

    /// Parses [`HostState::to_text`]; `Err((line, why))`.
    pub fn parse(text: &str) -> Result<HostState, (usize, String)> {
        let mut lines = text.lines().enumerate().map(|(i, l)| (i + 1, l));
        match lines.next() {
            Some((_, MAGIC)) => {}
            Some((_, other)) if other.starts_with("uroce-host ") => {
                return Err((
                    1,
                    format!(
                        "{other:?} was written by another version of uroce (this one reads \
                         {MAGIC:?}): the processes of a user on one host must all run one \
                         version, or each version its own UROCE_HOST_DIR"
                    ),
                ))
            }
            _ => return Err((1, format!("expected {MAGIC:?}"))),
        }
        let mut state = HostState::empty(QpnLayout::default(), 0);
        for (n, line) in lines {
            let bad = |why: &str| (n, format!("{why}: {line:?}"));
            let mut words = line.split_whitespace();
            let num = |w: Option<&str>| -> Result<u64, (usize, String)> {
                w.and_then(|w| w.parse().ok())
                    .ok_or_else(|| bad("a number expected"))
            };
            let slot = |w: Option<&str>| -> Result<u16, (usize, String)> {
                w.and_then(|w| w.parse().ok())
                    .ok_or_else(|| bad("a slot expected"))
            };
            match words.next() {
                None => continue,
                Some("slot-bits") => {
                    let bits = u8::try_from(num(words.next())?).ok();
                    state.layout = bits
                        .and_then(QpnLayout::new)
                        .ok_or_else(|| bad("slot bits out of range"))?;
                }
                Some("generation") => state.generation = num(words.next())?,
                Some("pid-ns") => state.pid_ns = num(words.next())?,
                Some("member") => {
                    let m = Member {
                        slot: slot(words.next())?,
                        pid: u32::try_from(num(words.next())?).map_err(|_| bad("pid"))?,
                        start_time: num(words.next())?,
                        joined_ms: num(words.next())?,
                    };
                    state.members.insert(m.slot, m);
                }
                Some("freed") => {
                    let s = slot(words.next())?;
                    state.freed.insert(s, num(words.next())?);
                }
                Some("resume") => {
                    let s = slot(words.next())?;
                    let mut n32 = || u32::try_from(num(words.next())?).map_err(|_| bad("u32"));
                    let r = Resume {
                        qpn: n32()?,
                        comm_id: n32()?,
                    };
                    state.resume.insert(s, r);
                }
                Some("listen") => {
                    let service = words
                        .next()
                        .and_then(|w| w.strip_prefix("0x"))
                        .and_then(|w| u64::from_str_radix(w, 16).ok())
                        .ok_or_else(|| bad("a service ID (0x…) expected"))?;
                    let s = slot(words.next())?;
                    state.listeners.insert(service, s);
                }
                Some("attached") => {
                    let addr: SocketAddr = words
                        .next()
                        .and_then(|w| w.parse().ok())
                        .ok_or_else(|| bad("an address expected"))?;
                    let a = Attached {
                        generation: num(words.next())?,
                        count: num(words.next())?,
                    };
                    state.attached.insert(addr, a);
                }
                Some("group") => {
                    let addr: SocketAddr = words
                        .next()
                        .and_then(|w| w.parse().ok())
                        .ok_or_else(|| bad("an address expected"))?;
                    let certain = match words.next() {
                        Some("certain") => true,
                        Some("uncertain") => false,
                        _ => return Err(bad("certain or uncertain expected")),
                    };
                    let order = words
                        .by_ref()
                        .map(|w| w.parse::<u16>().map_err(|_| bad("a slot expected")))
                        .collect::<Result<Vec<_>, _>>()?;
                    let mut g = GroupState::certain(GroupOrder::from_slots(order));
                    g.certain = certain;
                    state.groups.insert(addr, g);
                }
                Some(kind @ ("probing" | "found")) => {
                    let addr: SocketAddr = words
                        .next()
                        .and_then(|w| w.parse().ok())
                        .ok_or_else(|| bad("an address expected"))?;
                    let first = num(words.next())?;
                    let g = state
                        .groups
                        .get_mut(&addr)
                        .filter(|g| !g.certain)
                        .ok_or_else(|| bad("not after its uncertain group"))?;
                    if kind == "probing" {
                        g.key = first;
                    } else {
                        let index = u32::try_from(first).map_err(|_| bad("an index expected"))?;
                        g.found.insert(index, slot(words.next())?);
                    }
                }
                Some(_) => return Err(bad("unknown line")),
            }
            if words.next().is_some() {
                return Err(bad("trailing words"));
            }
        }
        Ok(state)
    }
}

/// Whether `text` is a registry of another format (another version of uroce) none of
/// whose members runs: its `member <slot> <pid> <start time> …` lines (the same in every
/// format so far) name no live process.
fn other_version_abandoned(text: &str) -> bool {
    let mut lines = text.lines();
    let other = lines
        .next()
        .is_some_and(|l| l.starts_with("uroce-host ") && l != MAGIC);
    other
        && !lines.any(|l| {
            let mut w = l.split_whitespace();
            let (Some("member"), Some(_), Some(pid), Some(start)) =
                (w.next(), w.next(), w.next(), w.next())
            else {
                return false;
            };
            match (pid.parse::<u32>(), start.parse::<u64>()) {
                (Ok(pid), Ok(start)) => proc_stat(pid).is_some_and(|(_, s)| s == start),
                // Unreadable: taken for alive (the file is then refused, not replaced).
                _ => true,
            }
        })
}

/// A fresh key for an uncertain group's probes ([`GroupState::key`]): from the standard
/// library's randomly seeded hasher (seeded by the operating system), mixed with the
/// time; never 0.
fn probe_key() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(now_ms());
    h.write_u32(std::process::id());
    h.finish() | 1
}

/// The state character and start time (field 22) of `/proc/<pid>/stat`.
pub(crate) fn proc_stat(pid: u32) -> Option<(char, u64)> {
    proc_stat_threads(pid).map(|(state, start, _)| (state, start))
}

/// State, start time and thread count (field 20) of process `pid`.
fn proc_stat_threads(pid: u32) -> Option<(char, u64, u64)> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) is in parentheses and may contain anything, so the
    // fields are counted from the last ')': index 0 is field 3 (the state).
    let rest = text.get(text.rfind(')')? + 1..)?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let state = fields.first()?.chars().next()?;
    let threads = fields.get(20 - 3)?.parse().ok()?;
    let start = fields.get(22 - 3)?.parse().ok()?;
    Some((state, start, threads))
}

/// The inode of this process's namespace of `kind` (`net`, `pid`), 0 if unknown.
fn ns_inode(kind: &str) -> u64 {
    std::fs::metadata(format!("/proc/self/ns/{kind}")).map_or(0, |m| m.ino())
}

/// Milliseconds since the Unix epoch.
fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// The registry of one directory (see the module documentation).
#[derive(Debug, Clone)]
pub struct Registry {
    dir: PathBuf,
    layout: QpnLayout,
    quarantine: Duration,
    net_ns: u64,
    /// The network namespace's cookie (`SO_NETNS_COOKIE`), where the kernel has it.
    net_cookie: Option<u64>,
    pid_ns: u64,
}

impl Registry {
    /// The registry in [`host_dir`].
    ///
    /// # Errors
    /// As [`Registry::open`].
    pub fn open_default(layout: QpnLayout) -> Result<Registry, HostError> {
        Registry::open(host_dir(), layout)
    }

    /// The registry in `dir` (made, mode 0700, if missing) for members using `layout`.
    ///
    /// # Errors
    /// [`HostError::Io`] if the directory cannot be made or read, [`HostError::NotOurs`]
    /// if it belongs to another user.
    pub fn open(dir: impl Into<PathBuf>, layout: QpnLayout) -> Result<Registry, HostError> {
        let dir = dir.into();
        let io_err = |source| HostError::Io {
            path: dir.clone(),
            source,
        };
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&dir)
            .map_err(io_err)?;
        let owner = std::fs::metadata(&dir).map_err(io_err)?.uid();
        let uid = own_uid();
        if owner != uid {
            return Err(HostError::NotOurs {
                path: dir,
                owner,
                uid,
            });
        }
        Ok(Registry {
            dir,
            layout,
            quarantine: DEFAULT_QUARANTINE,
            net_ns: ns_inode("net"),
            net_cookie: crate::sys::netns_cookie(),
            pid_ns: ns_inode("pid"),
        })
    }

    /// `host-registry-net<inode>` and, where the kernel has one, `-c<cookie>` of the
    /// network namespace: a namespace made after another was destroyed may get its inode,
    /// but never its cookie, so it never inherits the old one's registry (whose slots may
    /// still be in quarantine).
    fn file_name(&self) -> String {
        match self.net_cookie {
            Some(c) => format!("{REGISTRY_FILE}-net{}-c{c}", self.net_ns),
            None => format!("{REGISTRY_FILE}-net{}", self.net_ns),
        }
    }

    /// The same registry with another quarantine for freed slots.
    pub fn with_quarantine(mut self, quarantine: Duration) -> Registry {
        self.quarantine = quarantine;
        self
    }

    /// How long a freed slot is not handed out again.
    pub fn quarantine(&self) -> Duration {
        self.quarantine
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The registry file (its name carries the network namespace).
    pub fn path(&self) -> PathBuf {
        self.dir.join(self.file_name())
    }

    /// Takes the registry's lock (waiting for it) and reads the registry.
    ///
    /// # Errors
    /// [`HostError::Io`], [`HostError::Corrupt`], [`HostError::Layout`].
    pub fn lock(&self) -> Result<Locked<'_>, HostError> {
        let path = self.path().with_extension("lock");
        let file = crate::files::open_private(&path).map_err(|source| HostError::Io {
            path: path.clone(),
            source,
        })?;
        flock(&file, FlockOperation::LockExclusive).map_err(|e| HostError::Io {
            path,
            source: e.into(),
        })?;
        let state = self.read()?;
        Ok(Locked {
            registry: self,
            _lock: file,
            state,
            changed: false,
            attached_now: BTreeSet::new(),
        })
    }

    /// The registry as last committed, read without the lock (empty when there is none
    /// yet).
    ///
    /// # Errors
    /// [`HostError::Io`], [`HostError::Corrupt`], [`HostError::Layout`].
    pub fn read(&self) -> Result<HostState, HostError> {
        let path = self.path();
        let text = match std::fs::read_to_string(&path) {
            Ok(t) => t,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                return Ok(HostState::empty(self.layout, self.pid_ns))
            }
            Err(source) => return Err(HostError::Io { path, source }),
        };
        if other_version_abandoned(&text) {
            // Left by another version of uroce whose members are all gone: nothing in it
            // steers anybody any more; the next commit replaces it.
            return Ok(HostState::empty(self.layout, self.pid_ns));
        }
        let state = HostState::parse(&text).map_err(|(line, why)| HostError::Corrupt {
            path,
            line,
            why,
        })?;
        if state.layout != self.layout {
            return Err(HostError::Layout {
                file: state.layout.slot_bits(),
                ours: self.layout.slot_bits(),
            });
        }
        if state.pid_ns != self.pid_ns {
            return Err(HostError::PidNamespace {
                file: state.pid_ns,
                ours: self.pid_ns,
            });
        }
        Ok(state)
    }

    /// The members as last committed (without the lock), by slot.
    ///
    /// # Errors
    /// As [`Registry::read`].
    pub fn list(&self) -> Result<Vec<Member>, HostError> {
        Ok(self.read()?.members.into_values().collect())
    }
}

/// The registry, locked: changes are made here and written by [`Locked::commit`]; the
/// lock is released when this is committed or dropped.
#[derive(Debug)]
pub struct Locked<'r> {
    registry: &'r Registry,
    _lock: File,
    state: HostState,
    changed: bool,
    /// Groups whose program was attached since the last change ([`Locked::attached`]).
    attached_now: BTreeSet<SocketAddr>,
}

impl Locked<'_> {
    /// The registry as read, with the changes made so far.
    pub fn state(&self) -> &HostState {
        &self.state
    }

    /// Allots a free slot to this process (see *Quarantine* in the module documentation).
    /// Slots of dead members are not free until reaped: a joiner reaps first (and
    /// attaches the programs the reap changed).
    ///
    /// # Errors
    /// [`HostError::Full`], [`HostError::NoStartTime`].
    pub fn join(&mut self) -> Result<u16, HostError> {
        self.join_resuming().map(|(slot, _)| slot)
    }

    /// [`Locked::join`], and where the slot's last member got to when it left cleanly:
    /// the new member's numbering starts there (see *Quarantine and resuming* in the
    /// module documentation).
    ///
    /// # Errors
    /// As [`Locked::join`].
    pub fn join_resuming(&mut self) -> Result<(u16, Option<Resume>), HostError> {
        let pid = std::process::id();
        let (_, start_time) = proc_stat(pid).ok_or(HostError::NoStartTime { pid })?;
        self.join_as(pid, start_time)
    }

    /// Allots a free slot to the process `pid` started at `start_time`.
    fn join_as(&mut self, pid: u32, start_time: u64) -> Result<(u16, Option<Resume>), HostError> {
        let now = now_ms();
        let quarantine = u64::try_from(self.registry.quarantine.as_millis()).unwrap_or(u64::MAX);
        let top = self.state.layout.max_slot().min(MAX_ROUTES as u16);
        let free = (1..=top).filter(|s| !self.state.members.contains_key(s));
        // Never used (freed at 0) first, then resumable ones, then those out of
        // quarantine; the longest free first, the lowest slot among equals.
        let pick = free
            .map(|s| {
                let at = self.state.freed.get(&s).copied().unwrap_or(0);
                let rank = match (at, self.state.resume.contains_key(&s)) {
                    (0, _) => 0,
                    (_, true) => 1,
                    _ => 2,
                };
                (rank, at, s)
            })
            .min()
            .filter(|&(rank, at, _)| rank < 2 || now.saturating_sub(at) >= quarantine);
        let Some((_, _, slot)) = pick else {
            let quarantined = self
                .state
                .freed
                .iter()
                .filter(|(s, _)| !self.state.members.contains_key(s))
                .filter(|(s, _)| !self.state.resume.contains_key(s))
                .filter(|(_, &at)| now.saturating_sub(at) < quarantine)
                .count();
            return Err(HostError::Full {
                members: self.state.members.len(),
                quarantined,
            });
        };
        self.state.freed.remove(&slot);
        let resume = self.state.resume.remove(&slot);
        self.state.members.insert(
            slot,
            Member {
                slot,
                pid,
                start_time,
                joined_ms: now,
            },
        );
        self.touch();
        Ok((slot, resume))
    }

    /// Frees `slot`, removes its sockets from every group (the member closes them
    /// before committing) and drops its CM listeners (their REQs go to the designated
    /// member from the next program on).
    ///
    /// # Errors
    /// [`HostError::NotMember`].
    pub fn leave(&mut self, slot: u16) -> Result<Member, HostError> {
        self.leave_as(slot, None)
    }

    /// [`Locked::leave`] of a member that says where its numbering got to: its slot is
    /// free at once for a member that resumes there (see *Quarantine and resuming* in the
    /// module documentation). A QPN outside the slot's range is not recorded (the slot
    /// then goes into quarantine).
    ///
    /// # Errors
    /// [`HostError::NotMember`].
    pub fn leave_resumable(&mut self, slot: u16, resume: Resume) -> Result<Member, HostError> {
        self.leave_as(slot, Some(resume))
    }

    fn leave_as(&mut self, slot: u16, resume: Option<Resume>) -> Result<Member, HostError> {
        let m = self
            .state
            .members
            .remove(&slot)
            .ok_or(HostError::NotMember { slot })?;
        self.free(&[slot]);
        let layout = self.state.layout;
        if let Some(r) = resume.filter(|r| layout.slot_of(r.qpn) == slot) {
            self.state.resume.insert(slot, r);
        }
        for g in self.state.groups.values_mut() {
            g.order.left(slot);
        }
        self.state.groups.retain(|_, g| !g.order.is_empty());
        Ok(m)
    }

    /// Marks `slots` freed now and drops their listeners.
    fn free(&mut self, slots: &[u16]) {
        let now = now_ms();
        for &s in slots {
            self.state.freed.insert(s, now);
            self.state.resume.remove(&s);
        }
        self.state.listeners.retain(|_, s| !slots.contains(s));
        self.touch();
    }

    /// Records that the member of `slot` listens on `service` (its CM agent accepts REQs
    /// and SIDR_REQs for it): the steering programs attached from now on send them to it.
    /// The member attaches the new program of each of its groups before it commits.
    /// Listening again on a service it already has changes nothing.
    ///
    /// # Errors
    /// [`HostError::NotMember`], [`HostError::ServiceTaken`] when another member listens on
    /// it, [`HostError::TooManyListeners`] when the host has [`MAX_LISTENERS`].
    pub fn listen(&mut self, slot: u16, service: u64) -> Result<(), HostError> {
        if !self.state.members.contains_key(&slot) {
            return Err(HostError::NotMember { slot });
        }
        match self.state.listeners.get(&service) {
            Some(&s) if s == slot => return Ok(()),
            Some(&s) => return Err(HostError::ServiceTaken { service, slot: s }),
            None => {}
        }
        if self.state.listeners.len() >= MAX_LISTENERS {
            return Err(HostError::TooManyListeners);
        }
        self.state.listeners.insert(service, slot);
        self.touch();
        Ok(())
    }

    /// Records that the member of `slot` no longer listens on `service`: from the next
    /// program on, its REQs go to the designated member, which rejects them. False if
    /// `slot` did not listen on it.
    pub fn unlisten(&mut self, slot: u16, service: u64) -> bool {
        if self.state.listeners.get(&service) != Some(&slot) {
            return false;
        }
        self.state.listeners.remove(&service);
        self.touch();
        true
    }

    /// Records that the member of `slot` bound a socket to the group `addr` while holding
    /// the lock: it is the group's new last member.
    ///
    /// # Errors
    /// [`HostError::NotMember`].
    pub fn joined_group(&mut self, slot: u16, addr: SocketAddr) -> Result<u32, HostError> {
        if !self.state.members.contains_key(&slot) {
            return Err(HostError::NotMember { slot });
        }
        let g = self
            .state
            .groups
            .entry(addr)
            .or_insert_with(|| GroupState::certain(GroupOrder::default()));
        g.order.joined(slot);
        let index = u32::try_from(g.order.len() - 1).unwrap_or(u32::MAX);
        // A bind appends: nobody moves, and the joiner's index is known.
        if !g.certain {
            g.found.insert(index, slot);
            g.resolve();
        }
        self.touch();
        Ok(index)
    }

    /// Records that the member of `slot` closed its socket of the group `addr` while
    /// holding the lock (the last member moved into its index). False if it had none.
    pub fn left_group(&mut self, slot: u16, addr: SocketAddr) -> bool {
        let Some(g) = self.state.groups.get_mut(&addr) else {
            return false;
        };
        let left = g.order.left(slot);
        g.moved();
        if g.order.is_empty() {
            self.state.groups.remove(&addr);
        }
        if left {
            self.touch();
        }
        left
    }

    /// Removes the members whose process is gone and returns them; their sockets were
    /// closed by the kernel, unseen, and each group's order is updated as far as that can
    /// be known (see the module documentation). Their CM listeners are dropped.
    pub fn reap(&mut self) -> Vec<Member> {
        let dead: Vec<Member> = self
            .state
            .members
            .values()
            .filter(|m| !m.is_alive())
            .copied()
            .collect();
        if dead.is_empty() {
            return dead;
        }
        let slots: Vec<u16> = dead.iter().map(|m| m.slot).collect();
        for s in &slots {
            self.state.members.remove(s);
        }
        self.free(&slots);
        for g in self.state.groups.values_mut() {
            if !slots.iter().any(|s| g.order.slots().contains(s)) {
                continue;
            }
            match g.order.after_unseen_closes(&slots) {
                Some(order) => g.order = order,
                None => {
                    // A guess (closes in slot order) until the members probe the group.
                    for &s in &slots {
                        g.order.left(s);
                    }
                    g.certain = false;
                }
            }
            g.moved();
        }
        self.state.groups.retain(|_, g| !g.order.is_empty());
        dead
    }

    /// Records the order of `addr`'s group as a member found it by probing: certain again.
    pub fn set_order(&mut self, addr: SocketAddr, order: GroupOrder) {
        if order.is_empty() {
            self.state.groups.remove(&addr);
        } else {
            self.state.groups.insert(addr, GroupState::certain(order));
        }
        self.touch();
    }

    /// Records that the member of `slot` received a probe with `key` for index `index` of
    /// `addr`'s group (so its socket is at that index). Ignored (`false`) when the group is
    /// certain, the slot is not in it, or `key` is not the group's ([`GroupState::key`]:
    /// a probe sent before the order last moved, or not by a member). A slot or index
    /// found again replaces what was found before. When every member's index is known,
    /// the order is certain again (`true`): the caller attaches the program before it
    /// commits.
    pub fn found(&mut self, addr: SocketAddr, index: u32, slot: u16, key: u64) -> bool {
        let Some(g) = self.state.groups.get_mut(&addr) else {
            return false;
        };
        if g.certain || key != g.key || !g.order.slots().contains(&slot) {
            return false;
        }
        if g.found.get(&index) == Some(&slot) {
            return false;
        }
        g.found.retain(|&i, &mut s| i != index && s != slot);
        g.found.insert(index, slot);
        let complete = g.resolve();
        self.touch();
        complete
    }

    /// Marks a change: the commit writes a new generation, and the attaches recorded so
    /// far are forgotten (their programs lack the change).
    fn touch(&mut self) {
        self.changed = true;
        self.attached_now.clear();
    }

    /// Records that the member attached the program of `addr`'s group as [`Locked::table`]
    /// gives it now; [`Locked::commit`] notes it in [`HostState::attached`] (see
    /// *Re-attaching* in the module documentation). A change after this call makes the
    /// commit forget it.
    pub fn attached(&mut self, addr: SocketAddr) {
        self.attached_now.insert(addr);
    }

    /// The steering table of `addr`'s group, with the host's CM listeners; `None` when
    /// the group has no member socket or its order is uncertain.
    pub fn table(&self, addr: SocketAddr) -> Option<SteeringTable> {
        let g = self.state.groups.get(&addr).filter(|g| g.certain)?;
        let mut t = SteeringTable::from_order(self.state.layout, &g.order)?;
        for (&service, &slot) in &self.state.listeners {
            t.listen(service, slot);
        }
        Some(t)
    }

    /// Writes the registry if anything changed, with the next generation, and releases
    /// the lock. Returns the generation. The programs recorded as attached
    /// ([`Locked::attached`]) are noted with the generation written; when they are all
    /// that changed, the file is written with the same generation.
    ///
    /// # Errors
    /// [`HostError::Io`] if the file cannot be written (the registry stays as it was).
    pub fn commit(mut self) -> Result<u64, HostError> {
        let generation = self.state.generation + u64::from(self.changed);
        let mut noted = false;
        for addr in std::mem::take(&mut self.attached_now) {
            if !self.state.groups.contains_key(&addr) {
                continue;
            }
            let a = self.state.attached.entry(addr).or_default();
            if a.count == 0 || a.generation < generation {
                a.generation = generation;
                a.count += 1;
                noted = true;
            }
        }
        // A group without member sockets has no program.
        let groups = &self.state.groups;
        let before = self.state.attached.len();
        self.state
            .attached
            .retain(|addr, _| groups.contains_key(addr));
        noted |= self.state.attached.len() != before;
        if !self.changed && !noted {
            return Ok(self.state.generation);
        }
        self.state.generation = generation;
        let path = self.registry.path();
        crate::files::replace_file(&path, &path.with_extension("tmp"), &self.state.to_text())
            .map_err(|source| HostError::Io { path, source })?;
        Ok(self.state.generation)
    }
}

#[cfg(test)]
mod tests;
