//! # XRC domains across processes: the domains file
//!
//! An XRC domain opened on a file (`ibv_open_xrcd` with a file descriptor) is one domain
//! for every process of the host that opens the same file: a target (XRC_RECV) QP created
//! in one process delivers into the XRC SRQs of the others, survives its creator's exit,
//! and is destroyed with the domain's last reference (IBA vol 1 Annex A14; the verbs
//! `ibv_open_xrcd`). This module keeps what the processes of a domain must agree on about
//! its *lifetime* and its *target QP numbers*, in one small text file next to the host
//! registry ([`crate::host`]; a shared device has its own, [`Domains::named`]), changed
//! only under an exclusive `flock` (released by the kernel when its holder dies):
//! * the **domains**, each named by the device and inode of its file ([`DomainId`], what
//!   `fstat` gives; the path does not matter, as for the kernel's domains);
//! * each domain's **references**: pid, the process's start time (so that a reused pid is
//!   not taken for a holder) and how many opens that process holds ([`Reference`]);
//! * each domain's **target QPs**, by number;
//! * the **cursor** of the host-wide target QP numbers.
//!
//! ## Target QP numbers
//! A target QP belongs to its domain, not to the process (member slot) that created it:
//! its number must stay valid after that process exits, while the slot may pass to a new
//! process whose QPs would collide with it. So target QPs are numbered host-wide, from the
//! reserved top slot of the QPN layout ([`crate::steer::QpnLayout`], the slot of the
//! multicast QPN 0xFFFFFF, which no member holds), never 0xFFFFFF itself, by a forward
//! cursor over every domain's numbers ([`LockedDomains::create_target_qp`]): a number is
//! never given twice while a domain holds it, and a freed one comes back only after the
//! cursor went round. The steering does not need these numbers: an XRC request is steered
//! by the XRC SRQ it names (see [`crate::steer`], *XRC requests*).
//!
//! ## Lifetime
//! * [`LockedDomains::open_ref`]: this process holds one more reference (creating the
//!   domain if the file had none: `O_CREAT` is the caller's check).
//! * [`LockedDomains::close_ref`]: one fewer; the last reference of the last process
//!   destroys the domain: [`Closed::destroyed`] lists its target QPs, which the caller
//!   destroys (the domain and its numbers are gone from the file).
//! * [`LockedDomains::reap`]: references of processes that are gone (no `/proc/<pid>`, a
//!   zombie, another start time) are dropped, and a domain left without any is destroyed
//!   the same way: a target QP survives its creator, and the domain dies with its last
//!   holder even when that one was killed.
//! * [`LockedDomains::commit`] writes the file (replaced by a rename: an unlocked
//!   [`Domains::read`] sees a whole one).
//!
//! `uroce_net::xrc` uses it for the domains a shared device opens on a file. The state each
//! process's responder needs for a target QP (its PSNs and attributes) is not kept here;
//! see docs/ARCHITECTURE.md, "XRC domains".

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::fs::File;
use std::io;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};

use rustix::fs::{flock, FlockOperation};

use crate::host::Member;
use crate::steer::{QpnLayout, MULTICAST_QPN};

/// The file's name in the registry directory, by default ([`Domains::named`] gives
/// another: a shared device's is its registry's and address's).
pub const DOMAINS_FILE: &str = "xrc-domains";

const MAGIC: &str = "uroce-xrc 1";

/// Errors of the domains file.
#[derive(Debug, thiserror::Error)]
pub enum XrcdError {
    /// A file could not be used.
    #[error("XRC domains file {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// What the OS said.
        source: io::Error,
    },
    /// The file does not parse.
    #[error("XRC domains file {path}, line {line}: {why}")]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// The line (1-based).
        line: usize,
        /// What is wrong.
        why: String,
    },
    /// This process's own start time could not be read.
    #[error("cannot read the start time of process {pid}")]
    NoStartTime {
        /// The process.
        pid: u32,
    },
    /// The domain has no reference of this process (or does not exist).
    #[error("XRC domain {0} has no reference of this process")]
    NotHeld(DomainId),
    /// Every target QP number is taken.
    #[error("no free XRC target QP number")]
    Full,
}

/// A domain: the device and inode of the file it was opened on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct DomainId {
    /// `st_dev`.
    pub dev: u64,
    /// `st_ino`.
    pub ino: u64,
}

impl DomainId {
    /// The domain of the open file `file` (`fstat`).
    ///
    /// # Errors
    /// What `fstat` says.
    pub fn of_file(file: &impl AsFd) -> io::Result<DomainId> {
        let st = rustix::fs::fstat(file)?;
        Ok(DomainId {
            dev: st.st_dev,
            ino: st.st_ino,
        })
    }
}

impl std::fmt::Display for DomainId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:x}:{}", self.dev, self.ino)
    }
}

/// A process holding references to a domain.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Reference {
    /// Its process.
    pub pid: u32,
    /// The process's start time (`/proc/<pid>/stat` field 22).
    pub start_time: u64,
    /// How many opens of the domain it holds (at least 1).
    pub count: u32,
}

impl Reference {
    /// Whether its process still runs (as [`Member::is_alive`] decides).
    pub fn is_alive(&self) -> bool {
        Member {
            slot: 0,
            pid: self.pid,
            start_time: self.start_time,
            joined_ms: 0,
        }
        .is_alive()
    }
}

/// One domain's shared state.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Domain {
    /// The processes holding it, one entry each.
    pub refs: Vec<Reference>,
    /// Its target QPs, ascending.
    pub target_qps: Vec<u32>,
}

/// The whole file.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DomainsState {
    /// Every domain some process holds.
    pub domains: BTreeMap<DomainId, Domain>,
    /// The next target QP number to try (0: the first of the range).
    pub cursor: u32,
}

impl DomainsState {
    /// The file's text.
    pub fn to_text(&self) -> String {
        let mut s = format!("{MAGIC}\ncursor {}\n", self.cursor);
        for (id, d) in &self.domains {
            let _ = writeln!(s, "domain {} {}", id.dev, id.ino);
            for r in &d.refs {
                let _ = writeln!(s, "ref {} {} {}", r.pid, r.start_time, r.count);
            }
            for q in &d.target_qps {
                let _ = writeln!(s, "qp {q}");
            }
        }
        s
    }

    /// Parses the file's text; the error has the line (1-based) and what is wrong.
    pub fn parse(text: &str) -> Result<DomainsState, (usize, String)> {
        let mut st = DomainsState::default();
        let mut lines = text.lines().enumerate();
        match lines.next() {
            Some((_, MAGIC)) => {}
            _ => return Err((1, format!("not starting with {MAGIC:?}"))),
        }
        let mut current: Option<DomainId> = None;
        for (i, line) in lines {
            let n = i + 1;
            let f: Vec<&str> = line.split_whitespace().collect();
            let num = |k: usize| -> Result<u64, (usize, String)> {
                f.get(k)
                    .and_then(|v| v.parse().ok())
                    .ok_or_else(|| (n, format!("bad field {k}: {line:?}")))
            };
            let to_u32 =
                |v: u64| u32::try_from(v).map_err(|_| (n, format!("out of range: {line:?}")));
            match f.first().copied() {
                Some("cursor") if f.len() == 2 => st.cursor = to_u32(num(1)?)?,
                Some("domain") if f.len() == 3 => {
                    let id = DomainId {
                        dev: num(1)?,
                        ino: num(2)?,
                    };
                    if st.domains.insert(id, Domain::default()).is_some() {
                        return Err((n, format!("domain {id} twice")));
                    }
                    current = Some(id);
                }
                Some("ref") if f.len() == 4 => {
                    let d = current
                        .and_then(|id| st.domains.get_mut(&id))
                        .ok_or_else(|| (n, "ref before any domain".to_owned()))?;
                    let r = Reference {
                        pid: to_u32(num(1)?)?,
                        start_time: num(2)?,
                        count: to_u32(num(3)?)?,
                    };
                    if r.count == 0 || d.refs.iter().any(|o| o.pid == r.pid) {
                        return Err((n, format!("bad reference {line:?}")));
                    }
                    d.refs.push(r);
                }
                Some("qp") if f.len() == 2 => {
                    let q = to_u32(num(1)?)?;
                    let d = current
                        .and_then(|id| st.domains.get_mut(&id))
                        .ok_or_else(|| (n, "qp before any domain".to_owned()))?;
                    d.target_qps.push(q);
                }
                _ => return Err((n, format!("unknown line {line:?}"))),
            }
        }
        for d in st.domains.values_mut() {
            d.target_qps.sort_unstable();
        }
        Ok(st)
    }

    /// Whether some domain holds target QP `qpn`.
    pub fn holds(&self, qpn: u32) -> bool {
        self.domains
            .values()
            .any(|d| d.target_qps.binary_search(&qpn).is_ok())
    }
}

/// The target QP numbers of `layout`: the reserved top slot, less the multicast QPN.
pub fn target_qpns(layout: QpnLayout) -> std::ops::RangeInclusive<u32> {
    let top = u32::from(layout.max_slot()) + 1;
    let first = top << layout.local_bits();
    first..=MULTICAST_QPN - 1
}

/// The domains file of one user (see the module docs).
#[derive(Debug, Clone)]
pub struct Domains {
    dir: PathBuf,
    name: String,
    layout: QpnLayout,
}

impl Domains {
    /// The file in `dir` (the host registry's directory: [`crate::host::host_dir`]),
    /// target QPNs from `layout`'s top slot. The directory must exist.
    pub fn new(dir: impl Into<PathBuf>, layout: QpnLayout) -> Domains {
        Domains::named(dir, DOMAINS_FILE, layout)
    }

    /// [`Domains::new`] with the file named `name` (its lock and temporary file are
    /// `<name>.lock` and `<name>.tmp`).
    pub fn named(dir: impl Into<PathBuf>, name: impl Into<String>, layout: QpnLayout) -> Domains {
        Domains {
            dir: dir.into(),
            name: name.into(),
            layout,
        }
    }

    /// The file's path.
    pub fn path(&self) -> PathBuf {
        self.dir.join(&self.name)
    }

    /// A file beside it: its name with `suffix` appended (not `with_extension`, which
    /// would cut a name ending in an IPv4 address).
    fn beside(&self, suffix: &str) -> PathBuf {
        self.dir.join(format!("{}{suffix}", self.name))
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The file as last committed (empty when there is none), read without the lock.
    ///
    /// # Errors
    /// [`XrcdError::Io`], [`XrcdError::Corrupt`].
    pub fn read(&self) -> Result<DomainsState, XrcdError> {
        let path = self.path();
        match std::fs::read_to_string(&path) {
            Ok(text) => DomainsState::parse(&text).map_err(|(line, why)| XrcdError::Corrupt {
                path,
                line,
                why,
            }),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(DomainsState::default()),
            Err(source) => Err(XrcdError::Io { path, source }),
        }
    }

    /// Takes the file's lock (waiting for it) and reads it.
    ///
    /// # Errors
    /// [`XrcdError::Io`], [`XrcdError::Corrupt`], [`XrcdError::NoStartTime`].
    pub fn lock(&self) -> Result<LockedDomains<'_>, XrcdError> {
        let pid = std::process::id();
        let start_time = crate::host::proc_stat(pid)
            .map(|(_, start)| start)
            .ok_or(XrcdError::NoStartTime { pid })?;
        self.lock_as(pid, start_time)
    }

    /// [`Domains::lock`] acting for process `pid` started at `start_time` (tests model
    /// several processes with threads).
    #[doc(hidden)]
    pub fn lock_as(&self, pid: u32, start_time: u64) -> Result<LockedDomains<'_>, XrcdError> {
        let path = self.beside(".lock");
        let io_err = |source| XrcdError::Io {
            path: path.clone(),
            source,
        };
        let file = crate::files::open_private(&path).map_err(io_err)?;
        flock(&file, FlockOperation::LockExclusive).map_err(|e| io_err(e.into()))?;
        let state = self.read()?;
        Ok(LockedDomains {
            domains: self,
            _lock: file,
            state,
            changed: false,
            pid,
            start_time,
        })
    }
}

/// What closing a reference did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Closed {
    /// Whether this process still holds the domain.
    pub still_held: bool,
    /// The domain's target QPs when this was its last reference (the domain is gone):
    /// the caller destroys them.
    pub destroyed: Vec<u32>,
}

/// What a reap did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Reaped {
    /// The references dropped, with their domain.
    pub dead: Vec<(DomainId, Reference)>,
    /// The domains left without references, each with its target QPs (destroyed).
    pub destroyed: Vec<(DomainId, Vec<u32>)>,
}

/// The file, locked: the operations (see the module docs). Nothing is written until
/// [`LockedDomains::commit`]; dropping it discards the changes.
#[derive(Debug)]
pub struct LockedDomains<'d> {
    domains: &'d Domains,
    _lock: File,
    state: DomainsState,
    changed: bool,
    pid: u32,
    start_time: u64,
}

impl LockedDomains<'_> {
    /// The state read under the lock, with the changes made since.
    pub fn state(&self) -> &DomainsState {
        &self.state
    }

    /// This process opens `id` once more (the domain is created when nobody held it).
    /// Returns whether the domain existed before.
    pub fn open_ref(&mut self, id: DomainId) -> bool {
        self.changed = true;
        let existed = self.state.domains.contains_key(&id);
        let d = self.state.domains.entry(id).or_default();
        let (pid, start_time) = (self.pid, self.start_time);
        match d.refs.iter_mut().find(|r| r.pid == pid) {
            Some(r) if r.start_time == start_time => r.count = r.count.saturating_add(1),
            Some(r) => {
                // A process of a reused pid that died unreaped: its references are gone.
                *r = Reference {
                    pid,
                    start_time,
                    count: 1,
                }
            }
            None => d.refs.push(Reference {
                pid,
                start_time,
                count: 1,
            }),
        }
        existed
    }

    /// This process's references to `id` (0 when none).
    pub fn held(&self, id: DomainId) -> u32 {
        self.state
            .domains
            .get(&id)
            .and_then(|d| {
                d.refs
                    .iter()
                    .find(|r| r.pid == self.pid && r.start_time == self.start_time)
            })
            .map_or(0, |r| r.count)
    }

    /// This process closes one reference to `id`; the domain's last reference destroys
    /// it (see [`Closed`]).
    ///
    /// # Errors
    /// [`XrcdError::NotHeld`] when this process holds none.
    pub fn close_ref(&mut self, id: DomainId) -> Result<Closed, XrcdError> {
        let (pid, start_time) = (self.pid, self.start_time);
        let d = self
            .state
            .domains
            .get_mut(&id)
            .ok_or(XrcdError::NotHeld(id))?;
        let i = d
            .refs
            .iter()
            .position(|r| r.pid == pid && r.start_time == start_time)
            .ok_or(XrcdError::NotHeld(id))?;
        self.changed = true;
        d.refs[i].count = d.refs[i].count.saturating_sub(1);
        let still_held = d.refs[i].count > 0;
        if !still_held {
            d.refs.swap_remove(i);
        }
        let mut closed = Closed {
            still_held,
            destroyed: Vec::new(),
        };
        if d.refs.is_empty() {
            closed.destroyed = self
                .state
                .domains
                .remove(&id)
                .map(|d| d.target_qps)
                .unwrap_or_default();
        }
        Ok(closed)
    }

    /// Gives domain `id`, which this process holds, a new target QP number (host-wide,
    /// see the module docs).
    ///
    /// # Errors
    /// [`XrcdError::NotHeld`], [`XrcdError::Full`].
    pub fn create_target_qp(&mut self, id: DomainId) -> Result<u32, XrcdError> {
        if self.held(id) == 0 {
            return Err(XrcdError::NotHeld(id));
        }
        let range = target_qpns(self.domains.layout);
        let (first, last) = (*range.start(), *range.end());
        let span = last - first + 1;
        let start = if range.contains(&self.state.cursor) {
            self.state.cursor
        } else {
            first
        };
        for k in 0..span {
            let q = first + (start - first + k) % span;
            if !self.state.holds(q) {
                self.state.cursor = if q == last { first } else { q + 1 };
                let d = self
                    .state
                    .domains
                    .get_mut(&id)
                    .ok_or(XrcdError::NotHeld(id))?;
                let at = d.target_qps.binary_search(&q).unwrap_or_else(|e| e);
                d.target_qps.insert(at, q);
                self.changed = true;
                return Ok(q);
            }
        }
        Err(XrcdError::Full)
    }

    /// Removes target QP `qpn` from domain `id` (its last handle destroyed it); whether
    /// the domain had it.
    pub fn destroy_target_qp(&mut self, id: DomainId, qpn: u32) -> bool {
        let Some(d) = self.state.domains.get_mut(&id) else {
            return false;
        };
        match d.target_qps.binary_search(&qpn) {
            Ok(i) => {
                d.target_qps.remove(i);
                self.changed = true;
                true
            }
            Err(_) => false,
        }
    }

    /// Drops the references of processes that are gone, and destroys the domains left
    /// without any (see [`Reaped`]).
    pub fn reap(&mut self) -> Reaped {
        self.reap_with(|r| r.is_alive())
    }

    /// [`LockedDomains::reap`] with `alive` deciding which processes run (tests).
    #[doc(hidden)]
    pub fn reap_with(&mut self, mut alive: impl FnMut(&Reference) -> bool) -> Reaped {
        let mut out = Reaped::default();
        for (&id, d) in &mut self.state.domains {
            d.refs.retain(|r| {
                let keep = alive(r);
                if !keep {
                    out.dead.push((id, *r));
                }
                keep
            });
        }
        let empty: Vec<DomainId> = self
            .state
            .domains
            .iter()
            .filter(|(_, d)| d.refs.is_empty())
            .map(|(&id, _)| id)
            .collect();
        for id in empty {
            if let Some(d) = self.state.domains.remove(&id) {
                out.destroyed.push((id, d.target_qps));
            }
        }
        self.changed |= !out.dead.is_empty() || !out.destroyed.is_empty();
        out
    }

    /// Writes the changes (nothing when there were none) and releases the lock.
    ///
    /// # Errors
    /// [`XrcdError::Io`].
    pub fn commit(self) -> Result<(), XrcdError> {
        if !self.changed {
            return Ok(());
        }
        let path = self.domains.path();
        crate::files::replace_file(&path, &self.domains.beside(".tmp"), &self.state.to_text())
            .map_err(|source| XrcdError::Io { path, source })
    }
}

pub mod records;

#[cfg(test)]
mod tests;
