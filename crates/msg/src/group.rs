//! Ordered group messaging over message endpoints, in the spirit of the totem single-ring
//! protocol: the members form a logical ring and pass a token; only the token holder
//! sends, numbering its messages from the sequence number the token carries, so every
//! member delivers every message in one agreed total order (by sequence number, each as
//! soon as all lower ones are there).
//!
//! Membership: a member that sees no token for [`GroupConfig::token_timeout`] (the holder
//! died, or its QP to the next member failed) starts a *gather* for a higher ring number:
//! it sends JOIN (ring, its highest contiguous sequence number) to every member it can
//! still reach, and every member that hears a higher ring joins it. After
//! [`GroupConfig::gather_time`] the lowest member that joined commits the new ring: the
//! members that joined, each one's contiguous sequence number, and the highest of them.
//! The member holding the most sends the others what they lack up to that point;
//! messages above it (received by some, deliverable by none) are discarded everywhere and
//! their origins send them again; the committer starts the new token there. Sends to a
//! member that cannot take them (failed QP, or no credit for
//! [`GroupConfig::send_timeout`]) also start a gather.
//!
//! Limitations (this is an example): one ring (no merging of partitions), a member that
//! dies during a gather costs one more gather round, and message bodies are kept in
//! memory for the whole run.

use std::collections::{BTreeMap, VecDeque};
use std::fs::File;
use std::io::{BufWriter, Write};
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use uroce_net::{NetConfig, NetDevice};

use crate::{
    Endpoint, Message, MsgConfig, MsgError, PeerInfo, PendingEndpoint, SendError, SendPool,
};

const DATA: u8 = 1;
const TOKEN: u8 = 2;
const JOIN: u8 = 3;
const COMMIT: u8 = 4;

/// How a member runs.
#[derive(Debug, Clone)]
pub struct GroupConfig {
    /// This member's id (1-based; its address is `base` + id).
    pub id: u8,
    /// All member ids of the initial group.
    pub members: Vec<u8>,
    /// The first three octets of the members' addresses (`127.0.9.` → 127.0.9.id).
    pub base: String,
    /// Directory for the connection-info exchange and the delivery logs.
    pub dir: PathBuf,
    /// Messages this member originates.
    pub messages: u32,
    /// Time between two originated messages.
    pub pace: Duration,
    /// No token for this long: start a gather.
    pub token_timeout: Duration,
    /// How long a gather collects JOINs.
    pub gather_time: Duration,
    /// How long a send may wait for a credit before the peer is suspected.
    pub send_timeout: Duration,
    /// Exit after this long without a delivery once all own messages are delivered.
    pub quiet: Duration,
    /// Bound on the whole run.
    pub max_run: Duration,
}

impl GroupConfig {
    /// Defaults for member `id` of `members`.
    pub fn new(id: u8, members: Vec<u8>, base: &str, dir: &Path) -> GroupConfig {
        GroupConfig {
            id,
            members,
            base: base.to_owned(),
            dir: dir.to_owned(),
            messages: 100,
            pace: Duration::from_millis(3),
            token_timeout: Duration::from_millis(300),
            gather_time: Duration::from_millis(150),
            send_timeout: Duration::from_millis(200),
            quiet: Duration::from_millis(1500),
            max_run: Duration::from_secs(40),
        }
    }

    fn addr(&self, id: u8) -> Result<IpAddr, String> {
        format!("{}{id}", self.base)
            .parse()
            .map_err(|e| format!("address {}{id}: {e}", self.base))
    }
}

/// The delivery log of member `id` in `dir`: one line `seq origin msg_id` per delivery.
pub fn log_path(dir: &Path, id: u8) -> PathBuf {
    dir.join(format!("deliver.{id}"))
}

fn info_path(dir: &Path, id: u8) -> PathBuf {
    dir.join(format!("info.{id}"))
}

struct Stored {
    origin: u8,
    msg_id: u32,
    body: Vec<u8>,
}

enum Mode {
    Operational,
    Gather {
        ring: u32,
        since: Instant,
        joins: BTreeMap<u8, u64>,
    },
}

struct Member {
    cfg: GroupConfig,
    pool: SendPool,
    peers: BTreeMap<u8, Endpoint>,
    ring: u32,
    ring_members: Vec<u8>,
    floor: u64,
    mode: Mode,
    store: BTreeMap<u64, Stored>,
    delivered: u64,
    /// Own messages not yet numbered (msg_id, body).
    pending: VecDeque<(u32, Vec<u8>)>,
    /// Own messages numbered but above the last commit floor (may be discarded).
    token: Option<(u64, Instant)>,
    last_token: Instant,
    last_delivery: Instant,
    log: BufWriter<File>,
    gathers: u32,
}

fn put_u32(v: &mut Vec<u8>, x: u32) {
    v.extend_from_slice(&x.to_le_bytes());
}
fn put_u64(v: &mut Vec<u8>, x: u64) {
    v.extend_from_slice(&x.to_le_bytes());
}

struct Reader<'a>(&'a [u8]);
impl Reader<'_> {
    fn u8(&mut self) -> Option<u8> {
        let (&b, rest) = self.0.split_first()?;
        self.0 = rest;
        Some(b)
    }
    fn u32(&mut self) -> Option<u32> {
        let (h, rest) = self.0.split_first_chunk::<4>()?;
        self.0 = rest;
        Some(u32::from_le_bytes(*h))
    }
    fn u64(&mut self) -> Option<u64> {
        let (h, rest) = self.0.split_first_chunk::<8>()?;
        self.0 = rest;
        Some(u64::from_le_bytes(*h))
    }
}

/// Runs member `cfg.id` to the end: connects to every other member through the files in
/// `cfg.dir`, originates its messages, delivers everything in the agreed order into its
/// log, and returns the number of messages delivered.
///
/// # Errors
/// A description of what failed (device, connection set-up, log file).
pub fn run_member(cfg: GroupConfig) -> Result<u64, String> {
    let me = cfg.id;
    let dev = NetDevice::open(NetConfig::new(cfg.addr(me)?)).map_err(|e| e.to_string())?;
    let ctx = dev.context();
    let pd = ctx.alloc_pd().map_err(|e| e.to_string())?;
    let pool = SendPool::new(&pd, 256, 512).map_err(|e| e.to_string())?;
    let mcfg = MsgConfig {
        recv_bufs: 64,
        recv_buf_size: 512,
        timeout: 10,
        retry_cnt: 7,
        ..MsgConfig::default()
    };
    let mut pending = BTreeMap::new();
    let mut info = String::new();
    for &j in cfg.members.iter().filter(|&&j| j != me) {
        let p = PendingEndpoint::new(ctx, &pd, &pool, &mcfg).map_err(|e| e.to_string())?;
        let i = p.info();
        info.push_str(&format!(
            "{j} {} {} {} {}\n",
            i.qpn, i.recv_window, i.mailbox_addr, i.mailbox_rkey
        ));
        pending.insert(j, p);
    }
    let tmp = cfg.dir.join(format!(".info.{me}"));
    std::fs::write(&tmp, info).map_err(|e| e.to_string())?;
    std::fs::rename(&tmp, info_path(&cfg.dir, me)).map_err(|e| e.to_string())?;
    let mut peers = BTreeMap::new();
    let deadline = Instant::now() + Duration::from_secs(20);
    for (j, p) in pending {
        let text = loop {
            if let Ok(t) = std::fs::read_to_string(info_path(&cfg.dir, j)) {
                break t;
            }
            if Instant::now() > deadline {
                return Err(format!("member {j} never published its connection info"));
            }
            std::thread::sleep(Duration::from_millis(10));
        };
        let line = text
            .lines()
            .find(|l| l.split(' ').next() == Some(&me.to_string()))
            .ok_or(format!("member {j} has no endpoint for {me}"))?;
        let f: Vec<u64> = line.split(' ').filter_map(|x| x.parse().ok()).collect();
        let [_, qpn, win, addr, rkey] = f[..] else {
            return Err(format!("bad info line {line:?}"));
        };
        let peer = PeerInfo {
            qpn: qpn as u32,
            recv_window: win as u32,
            mailbox_addr: addr,
            mailbox_rkey: rkey as u32,
        };
        let ep = p
            .connect(cfg.addr(j)?, peer, &mcfg)
            .map_err(|e| e.to_string())?;
        peers.insert(j, ep);
    }
    let log = BufWriter::new(File::create(log_path(&cfg.dir, me)).map_err(|e| e.to_string())?);
    let now = Instant::now();
    let ring_members = cfg.members.clone();
    let first = ring_members.iter().copied().min().unwrap_or(me);
    let mut m = Member {
        pool,
        peers,
        ring: 1,
        ring_members,
        floor: 0,
        mode: Mode::Operational,
        store: BTreeMap::new(),
        delivered: 0,
        pending: VecDeque::new(),
        token: (first == me).then_some((0, now)),
        last_token: now,
        last_delivery: now,
        log,
        gathers: 0,
        cfg,
    };
    let r = m.run();
    let _ = m.log.flush();
    for (_, ep) in std::mem::take(&mut m.peers) {
        ep.close();
    }
    drop(dev);
    r
}

impl Member {
    fn run(&mut self) -> Result<u64, String> {
        let start = Instant::now();
        let mut next_msg = start;
        let mut made = 0u32;
        loop {
            let now = Instant::now();
            if now - start > self.cfg.max_run {
                return Err(format!("member {} ran past its bound", self.cfg.id));
            }
            while made < self.cfg.messages && now >= next_msg {
                let body = format!("m{} #{made} from {}", self.cfg.id, self.cfg.id).into_bytes();
                self.pending.push_back((made, body));
                made += 1;
                next_msg += self.cfg.pace;
            }
            let mut busy = self.receive_all();
            busy |= self.step_token();
            self.step_timers();
            if made == self.cfg.messages
                && self.pending.is_empty()
                && self.own_all_delivered()
                && now - self.last_delivery > self.cfg.quiet
            {
                return Ok(self.delivered);
            }
            if !busy {
                std::thread::sleep(Duration::from_micros(200));
            }
        }
    }

    fn own_all_delivered(&self) -> bool {
        let own = self
            .store
            .range(..=self.delivered)
            .filter(|(_, s)| s.origin == self.cfg.id)
            .count();
        own as u32 == self.cfg.messages
    }

    /// Sends `bytes` to member `j`; false if it cannot take them (suspect).
    fn send_to(&self, j: u8, bytes: &[u8]) -> bool {
        let Some(ep) = self.peers.get(&j) else {
            return false;
        };
        let Ok(mut buf) = self.pool.alloc(Some(self.cfg.send_timeout)) else {
            return false;
        };
        if buf.copy_from(bytes).is_err() {
            return false;
        }
        match ep.send(buf, Some(self.cfg.send_timeout)) {
            Ok(()) => true,
            Err(SendError { .. }) => false,
        }
    }

    fn others(&self) -> Vec<u8> {
        self.ring_members
            .iter()
            .copied()
            .filter(|&j| j != self.cfg.id)
            .collect()
    }

    fn receive_all(&mut self) -> bool {
        let mut got = Vec::new();
        for (&j, ep) in &self.peers {
            for _ in 0..64 {
                match ep.try_recv() {
                    Ok(mut msg) => {
                        if let Ok(v) = msg_bytes(&mut msg) {
                            got.push((j, v));
                        }
                    }
                    Err(MsgError::WouldBlock) => break,
                    Err(_) => break,
                }
            }
        }
        let busy = !got.is_empty();
        for (from, v) in got {
            self.handle(from, &v);
        }
        busy
    }

    fn handle(&mut self, _from: u8, v: &[u8]) {
        let mut r = Reader(v);
        match r.u8() {
            Some(DATA) => {
                let (Some(ring), Some(seq), Some(origin), Some(msg_id)) =
                    (r.u32(), r.u64(), r.u8(), r.u32())
                else {
                    return;
                };
                if ring == self.ring || seq <= self.floor {
                    self.store.entry(seq).or_insert(Stored {
                        origin,
                        msg_id,
                        body: r.0.to_vec(),
                    });
                    self.deliver();
                }
            }
            Some(TOKEN) => {
                let (Some(ring), Some(seq)) = (r.u32(), r.u64()) else {
                    return;
                };
                if ring == self.ring && matches!(self.mode, Mode::Operational) {
                    self.token = Some((seq, Instant::now()));
                    self.last_token = Instant::now();
                }
            }
            Some(JOIN) => {
                let (Some(ring), Some(from), Some(contig)) = (r.u32(), r.u8(), r.u64()) else {
                    return;
                };
                let current = match &self.mode {
                    Mode::Gather { ring, .. } => *ring,
                    Mode::Operational => self.ring,
                };
                if ring > current {
                    self.enter_gather(ring);
                }
                if let Mode::Gather { ring: g, joins, .. } = &mut self.mode {
                    if *g == ring {
                        joins.insert(from, contig);
                    }
                }
            }
            Some(COMMIT) => {
                let (Some(ring), Some(n)) = (r.u32(), r.u8()) else {
                    return;
                };
                let mut list = Vec::new();
                for _ in 0..n {
                    let (Some(id), Some(c)) = (r.u8(), r.u64()) else {
                        return;
                    };
                    list.push((id, c));
                }
                self.apply_commit(ring, &list);
            }
            _ => {}
        }
    }

    /// Delivers every message whose predecessors are all here.
    fn deliver(&mut self) {
        while let Some(s) = self.store.get(&(self.delivered + 1)) {
            self.delivered += 1;
            let _ = writeln!(self.log, "{} {} {}", self.delivered, s.origin, s.msg_id);
            self.last_delivery = Instant::now();
        }
    }

    fn step_token(&mut self) -> bool {
        let Some((mut seq, since)) = self.token else {
            return false;
        };
        if !matches!(self.mode, Mode::Operational) {
            self.token = None;
            return false;
        }
        // Idle ring: hold the token a moment instead of spinning it.
        if self.pending.is_empty() && since.elapsed() < Duration::from_millis(2) {
            return false;
        }
        let others = self.others();
        let mut sent_ok = true;
        for _ in 0..8 {
            let Some((msg_id, body)) = self.pending.pop_front() else {
                break;
            };
            seq += 1;
            let mut v = vec![DATA];
            put_u32(&mut v, self.ring);
            put_u64(&mut v, seq);
            v.push(self.cfg.id);
            put_u32(&mut v, msg_id);
            v.extend_from_slice(&body);
            for &j in &others {
                sent_ok &= self.send_to(j, &v);
            }
            self.store.insert(
                seq,
                Stored {
                    origin: self.cfg.id,
                    msg_id,
                    body,
                },
            );
        }
        self.deliver();
        self.token = None;
        let next = self.next_member();
        let mut t = vec![TOKEN];
        put_u32(&mut t, self.ring);
        put_u64(&mut t, seq);
        if next == self.cfg.id {
            self.token = Some((seq, Instant::now()));
        } else {
            sent_ok &= self.send_to(next, &t);
        }
        self.last_token = Instant::now();
        if !sent_ok {
            self.enter_gather(self.ring + 1);
        }
        true
    }

    fn next_member(&self) -> u8 {
        let me = self.cfg.id;
        self.ring_members
            .iter()
            .copied()
            .find(|&j| j > me)
            .or_else(|| self.ring_members.iter().copied().min())
            .unwrap_or(me)
    }

    fn contig(&self) -> u64 {
        let mut c = self.delivered;
        while self.store.contains_key(&(c + 1)) {
            c += 1;
        }
        c
    }

    fn enter_gather(&mut self, ring: u32) {
        self.gathers += 1;
        self.token = None;
        let contig = self.contig();
        let mut joins = BTreeMap::new();
        joins.insert(self.cfg.id, contig);
        self.mode = Mode::Gather {
            ring,
            since: Instant::now(),
            joins,
        };
        let mut v = vec![JOIN];
        put_u32(&mut v, ring);
        v.push(self.cfg.id);
        put_u64(&mut v, contig);
        // Everyone of the initial group whose connection still works.
        let all: Vec<u8> = self.peers.keys().copied().collect();
        for j in all {
            if self.peers.get(&j).is_some_and(Endpoint::is_up) {
                self.send_to(j, &v);
            }
        }
    }

    fn step_timers(&mut self) {
        match &self.mode {
            Mode::Operational => {
                if self.token.is_none() && self.last_token.elapsed() > self.cfg.token_timeout {
                    self.enter_gather(self.ring + 1);
                }
            }
            Mode::Gather { ring, since, joins } => {
                let (ring, joins) = (*ring, joins.clone());
                if since.elapsed() < self.cfg.gather_time {
                    return;
                }
                let rep = joins.keys().copied().min().unwrap_or(self.cfg.id);
                if rep == self.cfg.id {
                    let mut v = vec![COMMIT];
                    put_u32(&mut v, ring);
                    v.push(joins.len() as u8);
                    for (&id, &c) in &joins {
                        v.push(id);
                        put_u64(&mut v, c);
                    }
                    for &j in joins.keys().filter(|&&j| j != self.cfg.id) {
                        self.send_to(j, &v);
                    }
                    let list: Vec<(u8, u64)> = joins.into_iter().collect();
                    self.apply_commit(ring, &list);
                } else if since.elapsed() > self.cfg.gather_time + self.cfg.token_timeout {
                    // The committer did not commit: try again with a higher ring.
                    self.enter_gather(ring + 1);
                }
            }
        }
    }

    fn apply_commit(&mut self, ring: u32, list: &[(u8, u64)]) {
        let current = match &self.mode {
            Mode::Gather { ring, .. } => *ring,
            Mode::Operational => self.ring,
        };
        if ring < current || (ring == self.ring && matches!(self.mode, Mode::Operational)) {
            return;
        }
        if !list.iter().any(|&(id, _)| id == self.cfg.id) {
            return;
        }
        let max = list.iter().map(|&(_, c)| c).max().unwrap_or(0);
        let holder = list
            .iter()
            .filter(|&&(_, c)| c == max)
            .map(|&(id, _)| id)
            .min()
            .unwrap_or(self.cfg.id);
        // Messages above the agreed point: delivered by nobody, discarded everywhere;
        // own ones are sent again in the new ring.
        let above: Vec<u64> = self.store.range(max + 1..).map(|(&s, _)| s).collect();
        let mut again = Vec::new();
        for s in above {
            if let Some(st) = self.store.remove(&s) {
                if st.origin == self.cfg.id {
                    again.push((st.msg_id, st.body));
                }
            }
        }
        for m in again.into_iter().rev() {
            self.pending.push_front(m);
        }
        self.ring = ring;
        self.ring_members = list.iter().map(|&(id, _)| id).collect();
        self.floor = max;
        self.mode = Mode::Operational;
        self.last_token = Instant::now();
        if holder == self.cfg.id {
            for &(j, c) in list.iter().filter(|&&(j, _)| j != self.cfg.id) {
                for s in c + 1..=max {
                    if let Some(st) = self.store.get(&s) {
                        let mut v = vec![DATA];
                        put_u32(&mut v, ring);
                        put_u64(&mut v, s);
                        v.push(st.origin);
                        put_u32(&mut v, st.msg_id);
                        v.extend_from_slice(&st.body);
                        self.send_to(j, &v);
                    }
                }
            }
        }
        let rep = list.iter().map(|&(id, _)| id).min().unwrap_or(self.cfg.id);
        if rep == self.cfg.id {
            self.token = Some((max, Instant::now() - Duration::from_millis(5)));
        }
        eprintln!(
            "member {}: ring {ring} committed with members {:?} at seq {max}",
            self.cfg.id, self.ring_members
        );
    }
}

fn msg_bytes(msg: &mut Message) -> Result<Vec<u8>, MsgError> {
    if let Some(v) = msg.with_bytes(<[u8]>::to_vec)? {
        return Ok(v);
    }
    msg.to_vec()
}

/// Checks the delivery logs in `dir`: every member in `survivors` delivered the same
/// sequence (sequence numbers 1, 2, … with the same origin and message id), every member
/// in `killed` delivered a prefix of it, and the survivors delivered each of their own
/// `messages` exactly once. Returns the number of messages delivered.
///
/// # Errors
/// What differs.
pub fn verify_logs(
    dir: &Path,
    survivors: &[u8],
    killed: &[u8],
    messages: u32,
) -> Result<usize, String> {
    let read = |id: u8| -> Result<Vec<String>, String> {
        std::fs::read_to_string(log_path(dir, id))
            .map(|t| t.lines().map(str::to_owned).collect())
            .map_err(|e| format!("log of member {id}: {e}"))
    };
    let first = survivors.first().ok_or("no survivors")?;
    let reference = read(*first)?;
    for (i, line) in reference.iter().enumerate() {
        if line.split(' ').next() != Some(&(i + 1).to_string()) {
            return Err(format!("member {first}: line {} is {line:?}", i + 1));
        }
    }
    for &s in survivors {
        let log = read(s)?;
        if log != reference {
            let at = log.iter().zip(&reference).position(|(a, b)| a != b);
            return Err(format!(
                "member {s} delivered {} messages, member {first} {}; first difference at {at:?}",
                log.len(),
                reference.len()
            ));
        }
    }
    for &k in killed {
        let log = read(k)?;
        if log.len() > reference.len() || reference[..log.len()] != log[..] {
            return Err(format!("killed member {k}'s deliveries are not a prefix"));
        }
    }
    for &s in survivors {
        let mut ids: Vec<u32> = reference
            .iter()
            .filter_map(|l| {
                let f: Vec<&str> = l.split(' ').collect();
                (f.get(1) == Some(&s.to_string().as_str()))
                    .then(|| f.get(2).and_then(|x| x.parse().ok()))
                    .flatten()
            })
            .collect();
        ids.sort_unstable();
        if ids != (0..messages).collect::<Vec<_>>() {
            return Err(format!(
                "member {s}'s messages were not each delivered once ({} deliveries)",
                ids.len()
            ));
        }
    }
    let mut seen = std::collections::BTreeSet::new();
    for l in &reference {
        let key: Vec<&str> = l.split(' ').skip(1).collect();
        if !seen.insert(key) {
            return Err(format!("{l:?} delivers a message a second time"));
        }
    }
    Ok(reference.len())
}

/// Runs one process per member (`command(id)` builds each), kills member `kill` after
/// `kill_after` if asked, and waits (bounded by `limit`) for the others to exit.
/// Returns the killed members.
///
/// # Errors
/// A member that could not start, exited unsuccessfully, or ran past `limit`.
pub fn run_processes(
    ids: &[u8],
    command: impl Fn(u8) -> std::process::Command,
    kill: Option<u8>,
    kill_after: Duration,
    limit: Duration,
) -> Result<Vec<u8>, String> {
    let mut running = Vec::new();
    for &i in ids {
        let child = command(i)
            .spawn()
            .map_err(|e| format!("spawn member {i}: {e}"))?;
        running.push((i, child));
    }
    let start = Instant::now();
    let mut killed = Vec::new();
    let mut failed = Vec::new();
    while !running.is_empty() {
        if let Some(k) = kill {
            if killed.is_empty() && start.elapsed() >= kill_after {
                if let Some((_, c)) = running.iter_mut().find(|(i, _)| *i == k) {
                    let _ = c.kill();
                    eprintln!("group: killed member {k} after {:?}", start.elapsed());
                }
                killed.push(k);
            }
        }
        let mut still = Vec::new();
        for (i, mut c) in running {
            match c.try_wait() {
                Ok(Some(st)) => {
                    if !st.success() && !killed.contains(&i) {
                        failed.push(i);
                    }
                }
                Ok(None) if start.elapsed() > limit => {
                    let _ = c.kill();
                    let _ = c.wait();
                    failed.push(i);
                }
                _ => still.push((i, c)),
            }
        }
        running = still;
        std::thread::sleep(Duration::from_millis(10));
    }
    if failed.is_empty() {
        Ok(killed)
    } else {
        Err(format!("members {failed:?} failed"))
    }
}
