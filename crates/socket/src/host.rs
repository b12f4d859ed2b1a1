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
//!   is a guess) until a member probes it and records the order it found
//!   ([`Locked::set_order`]).
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
//! ## Quarantine
//! A slot comes back only after [`Registry::quarantine`] (default
//! [`DEFAULT_QUARANTINE`]): a peer of a killed member may still retransmit to its QPNs for
//! a while, and a new member handed the same slot could allot the same numbers to new QPs,
//! which would then see the old connection's packets. So [`Locked::join`] takes a slot
//! never used, else the one freed longest ago, and refuses ([`HostError::Full`]) when every
//! free slot was freed less than the quarantine ago. With 254 slots that happens only to a
//! host that starts and stops members faster than 254 a minute.
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
//! Probing an uncertain group is not done by it yet.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::fs::{File, OpenOptions};
use std::io;
use std::net::SocketAddr;
use std::os::unix::fs::{DirBuilderExt as _, MetadataExt as _, OpenOptionsExt as _};
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

/// The first line of the registry file.
const MAGIC: &str = "uroce-host 1";

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

/// The order of one group's member sockets as the registry knows it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct GroupState {
    /// Slot by socket index.
    pub order: GroupOrder,
    /// False when several members died at once and the order is a guess (see the
    /// module documentation).
    pub certain: bool,
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
                    state.groups.insert(
                        addr,
                        GroupState {
                            order: GroupOrder::from_slots(order),
                            certain,
                        },
                    );
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

/// The state character and start time (field 22) of `/proc/<pid>/stat`.
fn proc_stat(pid: u32) -> Option<(char, u64)> {
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
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(&path)
            .map_err(|source| HostError::Io {
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
        let pid = std::process::id();
        let (_, start_time) = proc_stat(pid).ok_or(HostError::NoStartTime { pid })?;
        self.join_as(pid, start_time)
    }

    /// Allots a free slot to the process `pid` started at `start_time`.
    fn join_as(&mut self, pid: u32, start_time: u64) -> Result<u16, HostError> {
        let now = now_ms();
        let quarantine = u64::try_from(self.registry.quarantine.as_millis()).unwrap_or(u64::MAX);
        let top = self.state.layout.max_slot().min(MAX_ROUTES as u16);
        let free = (1..=top).filter(|s| !self.state.members.contains_key(s));
        // Never used (freed at 0) first, then the longest free; lowest slot among equals.
        let pick = free
            .map(|s| (self.state.freed.get(&s).copied().unwrap_or(0), s))
            .min()
            .filter(|&(at, _)| at == 0 || now.saturating_sub(at) >= quarantine);
        let Some((_, slot)) = pick else {
            let quarantined = self
                .state
                .freed
                .iter()
                .filter(|(s, _)| !self.state.members.contains_key(s))
                .filter(|(_, &at)| now.saturating_sub(at) < quarantine)
                .count();
            return Err(HostError::Full {
                members: self.state.members.len(),
                quarantined,
            });
        };
        self.state.freed.remove(&slot);
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
        Ok(slot)
    }

    /// Frees `slot`, removes its sockets from every group (the member closes them
    /// before committing) and drops its CM listeners (their REQs go to the designated
    /// member from the next program on).
    ///
    /// # Errors
    /// [`HostError::NotMember`].
    pub fn leave(&mut self, slot: u16) -> Result<Member, HostError> {
        let m = self
            .state
            .members
            .remove(&slot)
            .ok_or(HostError::NotMember { slot })?;
        self.free(&[slot]);
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
        let g = self.state.groups.entry(addr).or_insert(GroupState {
            order: GroupOrder::default(),
            certain: true,
        });
        g.order.joined(slot);
        let index = u32::try_from(g.order.len() - 1).unwrap_or(u32::MAX);
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
            match g.order.after_unseen_closes(&slots) {
                Some(order) => g.order = order,
                None => {
                    // A guess (closes in slot order) until a member probes the group.
                    for &s in &slots {
                        g.order.left(s);
                    }
                    g.certain = false;
                }
            }
        }
        self.state.groups.retain(|_, g| !g.order.is_empty());
        dead
    }

    /// Records the order of `addr`'s group as a member found it by probing: certain again.
    pub fn set_order(&mut self, addr: SocketAddr, order: GroupOrder) {
        if order.is_empty() {
            self.state.groups.remove(&addr);
        } else {
            self.state.groups.insert(
                addr,
                GroupState {
                    order,
                    certain: true,
                },
            );
        }
        self.touch();
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
        let tmp = path.with_extension("tmp");
        let write = || -> io::Result<()> {
            let mut f = OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .mode(0o600)
                .open(&tmp)?;
            io::Write::write_all(&mut f, self.state.to_text().as_bytes())?;
            f.sync_data()?;
            std::fs::rename(&tmp, &path)
        };
        write().map_err(|source| HostError::Io { path, source })?;
        Ok(self.state.generation)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{IpAddr, Ipv4Addr};

    fn scratch(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("uroce-host-unit-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    #[test]
    fn proc_stat_reads_this_process() {
        let (state, start) = proc_stat(std::process::id()).expect("own stat");
        assert!(state == 'R' || state == 'S', "{state}");
        assert!(start > 0);
        let (_, start2, threads) = proc_stat_threads(std::process::id()).expect("own stat");
        assert_eq!(start2, start);
        let tasks = std::fs::read_dir("/proc/self/task").expect("tasks").count() as u64;
        assert!(
            threads >= 1 && threads.abs_diff(tasks) <= 2,
            "{threads} vs {tasks}"
        );
        assert_eq!(proc_stat(u32::MAX), None);
    }

    #[test]
    fn text_round_trips_and_bad_text_is_refused() {
        let mut s = HostState::empty(QpnLayout::new(6).unwrap(), 4026531836);
        s.generation = 9;
        s.members.insert(
            3,
            Member {
                slot: 3,
                pid: 77,
                start_time: 123,
                joined_ms: 5,
            },
        );
        s.freed.insert(4, 99);
        s.groups.insert(
            "[::1]:4791".parse().unwrap(),
            GroupState {
                order: GroupOrder::from_slots(vec![3, 1]),
                certain: false,
            },
        );
        s.listeners.insert(0x0000_0000_0106_1C06, 3);
        s.listeners.insert(u64::MAX, 1);
        s.attached.insert(
            "[::1]:4791".parse().unwrap(),
            Attached {
                generation: 8,
                count: 3,
            },
        );
        let t = s.to_text();
        assert!(t.contains("listen 0x0000000001061c06 3\n"), "{t}");
        assert!(t.contains("attached [::1]:4791 8 3\n"), "{t}");
        assert_eq!(HostState::parse(&t), Ok(s));
        for bad in [
            "",
            "uroce-host 2\n",
            "uroce-host 1\nmember 1 2\n",
            "uroce-host 1\nslot-bits 20\n",
            "uroce-host 1\ngroup 1.2.3.4 certain 1\n",
            "uroce-host 1\ngroup 1.2.3.4:1 maybe 1\n",
            "uroce-host 1\ngeneration 1 2\n",
            "uroce-host 1\nwhat 1\n",
            "uroce-host 1\nlisten 12 1\n",
            "uroce-host 1\nlisten 0x1\n",
            "uroce-host 1\nlisten 0xg 1\n",
            "uroce-host 1\nlisten 0x1 1 2\n",
            "uroce-host 1\nattached 1.2.3.4:1 1\n",
            "uroce-host 1\nattached 1.2.3.4 1 1\n",
            "uroce-host 1\nattached 1.2.3.4:1 1 1 1\n",
        ] {
            assert!(HostState::parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn join_prefers_unused_slots_and_honours_the_quarantine() {
        let dir = scratch("quarantine");
        let layout = QpnLayout::new(2).unwrap(); // slots 1 and 2
        let reg = Registry::open(&dir, layout).unwrap();
        let mut l = reg.lock().unwrap();
        assert_eq!(l.join().unwrap(), 1);
        l.leave(1).unwrap();
        // Slot 2 was never used: it comes before the just-freed 1.
        assert_eq!(l.join().unwrap(), 2);
        // Only slot 1 is free, and in quarantine.
        assert!(matches!(
            l.join(),
            Err(HostError::Full {
                members: 1,
                quarantined: 1
            })
        ));
        assert_eq!(l.commit().unwrap(), 1);
        // Without quarantine it comes back.
        let reg0 = Registry::open(&dir, layout)
            .unwrap()
            .with_quarantine(Duration::ZERO);
        let mut l = reg0.lock().unwrap();
        assert_eq!(l.join().unwrap(), 1);
        assert!(matches!(l.join(), Err(HostError::Full { .. })));
        drop(l); // discarded
        assert_eq!(reg.list().unwrap().len(), 1);
        // Another layout is refused.
        let other = Registry::open(&dir, QpnLayout::default()).unwrap();
        assert!(matches!(other.lock(), Err(HostError::Layout { .. })));
        // So is another PID namespace.
        let mut foreign = Registry::open(&dir, layout).unwrap();
        foreign.pid_ns ^= 1;
        assert!(matches!(
            foreign.lock(),
            Err(HostError::PidNamespace { .. })
        ));
        // The file is named after the network namespace.
        let name = reg
            .path()
            .file_name()
            .unwrap()
            .to_string_lossy()
            .into_owned();
        let cookie = crate::sys::netns_cookie().expect("SO_NETNS_COOKIE (Linux 5.14+)");
        assert_eq!(
            name,
            format!("host-registry-net{}-c{cookie}", ns_inode("net"))
        );
        assert!(ns_inode("net") != 0 && ns_inode("pid") != 0);
        assert_eq!(reg.read().unwrap().pid_ns, ns_inode("pid"));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn attaches_are_counted_once_per_generation_without_a_new_one() {
        let dir = scratch("attached");
        let reg = Registry::open(&dir, QpnLayout::default()).unwrap();
        let a: SocketAddr = (IpAddr::V4(Ipv4Addr::new(127, 0, 77, 9)), 4791).into();
        let attached = |generation, count| Attached { generation, count };
        let ino = || std::fs::metadata(reg.path()).unwrap().ino();
        // A joiner attaches: the program of the generation it commits, counted.
        let mut l = reg.lock().unwrap();
        let s1 = l.join().unwrap();
        l.joined_group(s1, a).unwrap();
        l.attached(a);
        assert_eq!(l.commit().unwrap(), 1);
        assert_eq!(reg.read().unwrap().attached[&a], attached(1, 1));
        // Another member attaching the same program again: not counted, file untouched.
        let file = ino();
        let mut l = reg.lock().unwrap();
        l.attached(a);
        assert_eq!(l.commit().unwrap(), 1);
        assert_eq!(ino(), file);
        assert_eq!(reg.read().unwrap().attached[&a], attached(1, 1));
        // A change nobody attached (a reaper without a socket in the group): the record
        // stays behind the generation until a member attaches; that attach is written
        // without a new generation (which would make every member attach again).
        let mut l = reg.lock().unwrap();
        let s2 = l.join().unwrap();
        l.joined_group(s2, a).unwrap();
        assert_eq!(l.commit().unwrap(), 2);
        assert_eq!(reg.read().unwrap().attached[&a], attached(1, 1));
        let file = ino();
        let mut l = reg.lock().unwrap();
        l.attached(a);
        assert_eq!(l.commit().unwrap(), 2);
        assert_ne!(ino(), file);
        let state = reg.read().unwrap();
        assert_eq!((state.generation, state.attached[&a]), (2, attached(2, 2)));
        // An attach before a later change of the same lock is forgotten.
        let mut l = reg.lock().unwrap();
        l.attached(a);
        assert!(l.left_group(s2, a));
        l.leave(s2).unwrap();
        assert_eq!(l.commit().unwrap(), 3);
        assert_eq!(reg.read().unwrap().attached[&a], attached(2, 2));
        // Discarded changes note nothing.
        let mut l = reg.lock().unwrap();
        l.attached(a);
        drop(l);
        assert_eq!(reg.read().unwrap().attached[&a], attached(2, 2));
        // A group without sockets gets no record, and a group's record goes with its
        // last socket.
        let none: SocketAddr = (IpAddr::V4(Ipv4Addr::new(127, 0, 77, 10)), 4791).into();
        let mut l = reg.lock().unwrap();
        l.attached(none);
        assert_eq!(l.commit().unwrap(), 3);
        assert!(!reg.read().unwrap().attached.contains_key(&none));
        let mut l = reg.lock().unwrap();
        assert!(l.left_group(s1, a));
        l.attached(a);
        l.leave(s1).unwrap();
        assert_eq!(l.commit().unwrap(), 4);
        assert!(reg.read().unwrap().attached.is_empty());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn groups_follow_binds_closes_and_leaves() {
        let dir = scratch("groups");
        let reg = Registry::open(&dir, QpnLayout::default()).unwrap();
        let a: SocketAddr = (IpAddr::V4(Ipv4Addr::new(127, 0, 77, 3)), 4791).into();
        let b: SocketAddr = "[::1]:4791".parse().unwrap();
        let mut l = reg.lock().unwrap();
        let slots: Vec<u16> = (0..4).map(|_| l.join().unwrap()).collect();
        assert_eq!(slots, [1, 2, 3, 4]);
        for &s in &slots {
            assert_eq!(l.joined_group(s, a).unwrap(), u32::from(s) - 1);
        }
        l.joined_group(3, b).unwrap();
        l.joined_group(1, b).unwrap();
        assert!(matches!(
            l.joined_group(9, a),
            Err(HostError::NotMember { slot: 9 })
        ));
        assert!(l.left_group(2, a));
        assert!(!l.left_group(2, a));
        assert_eq!(l.state().groups[&a].order.slots(), &[1, 4, 3]);
        l.leave(1).unwrap();
        assert_eq!(l.state().groups[&a].order.slots(), &[3, 4]);
        assert_eq!(l.state().groups[&b].order.slots(), &[3]);
        let t = l.table(a).unwrap();
        assert_eq!(t.designated(), 0);
        assert_eq!(t.index_for(QpnLayout::default().qpn(4, 1).unwrap()), 1);
        let g = l.commit().unwrap();
        // What was committed is what the next holder reads.
        let l = reg.lock().unwrap();
        assert_eq!(l.state().generation, g);
        assert_eq!(l.state().groups[&a].order.slots(), &[3, 4]);
        // Nothing changed: the generation stays.
        assert_eq!(l.commit().unwrap(), g);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn reaping_members_that_died_together_may_leave_a_group_uncertain() {
        let dir = scratch("reap");
        let reg = Registry::open(&dir, QpnLayout::default()).unwrap();
        let a: SocketAddr = "127.0.77.4:4791".parse().unwrap();
        let b: SocketAddr = "127.0.77.5:4791".parse().unwrap();
        let mut l = reg.lock().unwrap();
        let me = l.join().unwrap();
        // Two members of a process that is gone (pid beyond pid_max).
        let dead1 = l.join_as(u32::MAX - 1, 1).unwrap();
        let dead2 = l.join_as(u32::MAX - 2, 1).unwrap();
        // a: [dead1, dead2, me]: either order of their closes leaves [me].
        // b: [dead1, me, dead2]: dead1 first -> [dead2, me] -> [me]; dead2 first ->
        //    [dead1, me] -> [me]. Both certain.
        for s in [dead1, dead2, me] {
            l.joined_group(s, a).unwrap();
        }
        for s in [dead1, me, dead2] {
            l.joined_group(s, b).unwrap();
        }
        let reaped = l.reap();
        assert_eq!(reaped.len(), 2);
        assert_eq!(l.state().members.len(), 1);
        for g in [a, b] {
            assert!(l.state().groups[&g].certain);
            assert_eq!(l.state().groups[&g].order.slots(), &[me]);
        }
        // Now a real ambiguity: [x, y, me, me2] with x and y dying.
        let x = l.join_as(u32::MAX - 3, 1).unwrap();
        let y = l.join_as(u32::MAX - 4, 1).unwrap();
        let me2 = l.join().unwrap();
        let c: SocketAddr = "127.0.77.6:4791".parse().unwrap();
        for s in [x, y, me, me2] {
            l.joined_group(s, c).unwrap();
        }
        assert_eq!(l.reap().len(), 2);
        assert!(!l.state().groups[&c].certain);
        assert!(l.table(c).is_none(), "no program from a guess");
        l.set_order(c, GroupOrder::from_slots(vec![me2, me]));
        assert_eq!(
            l.table(c)
                .unwrap()
                .index_for(QpnLayout::default().qpn(me, 0).unwrap()),
            1
        );
        assert!(l.state().freed.contains_key(&x));
        l.commit().unwrap();
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A REQ for `service` to QP1 (BTH, DETH, MAD), as the steering program sees it.
    fn req_for(service: u64) -> Vec<u8> {
        use crate::steer::{MAD_OFFSET, MIN_MAD_DATAGRAM_LEN};
        use uroce_wire::cm::Req;
        use uroce_wire::mad::{self, cm_attr};
        let mut d = vec![0u8; MIN_MAD_DATAGRAM_LEN as usize];
        d[0] = uroce_wire::opcode::op::UD_SEND_ONLY;
        d[7] = 1;
        let m = &mut d[MAD_OFFSET as usize..];
        let mut h = mad::Header::new_unchecked(&mut m[..mad::LEN]);
        h.set_mgmt_class(mad::MGMT_CLASS_CM);
        h.set_attribute_id(cm_attr::REQ);
        Req::new_unchecked(&mut m[mad::LEN..]).set_service_id(service);
        d
    }

    #[test]
    fn listeners_are_recorded_and_go_with_their_member() {
        const SVC: u64 = 0x0000_0000_0106_1C06;
        const SVC2: u64 = 0x0000_0000_0106_1C07;
        let dir = scratch("listen");
        let reg = Registry::open(&dir, QpnLayout::default()).unwrap();
        let a: SocketAddr = "127.0.83.20:4791".parse().unwrap();
        let mut l = reg.lock().unwrap();
        let me = l.join().unwrap();
        let other = l.join().unwrap();
        let dead = l.join_as(u32::MAX - 5, 1).unwrap();
        for s in [me, other, dead] {
            l.joined_group(s, a).unwrap();
        }
        l.listen(dead, SVC).unwrap();
        l.listen(dead, SVC).unwrap(); // again: nothing changes
        l.listen(other, SVC2).unwrap();
        assert!(matches!(
            l.listen(me, SVC),
            Err(HostError::ServiceTaken { service: SVC, slot }) if slot == dead
        ));
        assert!(matches!(
            l.listen(99, 5),
            Err(HostError::NotMember { slot: 99 })
        ));
        let t = l.table(a).unwrap();
        assert_eq!(
            t.index_for_datagram(&req_for(SVC)),
            2,
            "the listener's index"
        );
        assert_eq!(t.index_for_datagram(&req_for(SVC2)), 1);
        assert_eq!(t.index_for_datagram(&req_for(7)), 0, "nobody: designated");
        let g1 = l.commit().unwrap();
        assert_eq!(reg.read().unwrap().listeners.len(), 2);

        // The listener of SVC is killed while REQs arrive: once reaped, its listener is
        // gone, the generation moves, and the next program sends its REQs to the
        // designated member (index 0, which rejects them).
        let mut l = reg.lock().unwrap();
        assert_eq!(l.reap().len(), 1);
        assert_eq!(l.state().listeners.get(&SVC), None);
        let t = l.table(a).unwrap();
        assert_eq!(t.index_for_datagram(&req_for(SVC)), 0);
        assert_eq!(t.index_for_datagram(&req_for(SVC2)), 1);
        let g2 = l.commit().unwrap();
        assert!(g2 > g1);

        // Unlisten: only by its member; leave drops the rest.
        let mut l = reg.lock().unwrap();
        assert!(!l.unlisten(me, SVC2));
        assert!(l.unlisten(other, SVC2));
        assert!(!l.unlisten(other, SVC2));
        l.listen(other, SVC).unwrap();
        l.leave(other).unwrap();
        assert!(l.state().listeners.is_empty());
        let t = l.table(a).unwrap();
        assert_eq!(t.index_for_datagram(&req_for(SVC)), 0);
        assert!(l.commit().unwrap() > g2);

        // At most MAX_LISTENERS.
        let mut l = reg.lock().unwrap();
        for i in 0..MAX_LISTENERS as u64 {
            l.listen(me, 0x1000 + i).unwrap();
        }
        assert!(matches!(l.listen(me, 1), Err(HostError::TooManyListeners)));
        l.listen(me, 0x1000).unwrap(); // one it has: fine
        drop(l);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
