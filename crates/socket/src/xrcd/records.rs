//! Target QP records (building block; nothing uses it yet): a file of fixed-size records
//! (in the registry's directory, so on `/dev/shm`: shared memory), read and written with
//! positional I/O (`pread`/`pwrite`, which keeps this crate free of `unsafe` outside its
//! system-call wrappers; a shared mapping could replace it) by every process that uses
//! it, each record guarded by an OFD byte-range lock (`fcntl(F_OFD_SETLKW)`, released by
//! the kernel when the last descriptor of its open file description closes, so when its
//! holder dies). It is where the responder state of a target QP shared by the processes
//! of an XRC domain is to live (docs/ARCHITECTURE.md, "XRC domains": one record per target
//! QP, loaded into a local engine and stored back under the lock for each request).
//!
//! A record: a header of 16 bytes — a sequence word (8 bytes, odd while a store is under
//! way), the payload's length (4) and a magic word (4; 0 for an empty record) — and up to
//! [`PAYLOAD`] bytes of payload, all little-endian. A store makes the sequence odd, writes
//! payload, length and magic, then makes it even again (three writes, in that order); a
//! holder killed in between leaves it odd, which the next holder sees
//! ([`RecordError::Torn`]) instead of reading a half-written record.
//!
//! OFD locks belong to an open file description, not to a thread: two threads locking the
//! same record through one [`Records`] would not exclude each other. [`Records::lock`]
//! therefore takes `&mut self` (one record locked at a time per [`Records`]); threads that
//! must hold records at once open the file each.

use std::fs::File;
use std::io;
use std::os::fd::AsFd;
use std::os::unix::fs::FileExt as _;
use std::path::Path;

/// Bytes per record, header included.
pub const RECORD_SIZE: usize = 512;
/// Header bytes: sequence (8), length (4), magic (4).
const HEADER: usize = 16;
/// The most payload a record holds.
pub const PAYLOAD: usize = RECORD_SIZE - HEADER;
/// The magic word of a record that holds something.
const MAGIC: u32 = 0x5852_4331; // "XRC1"

/// Errors of the record file.
#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    /// A system call failed.
    #[error("target QP records: {0}")]
    Io(#[from] io::Error),
    /// No such record (the file has fewer).
    #[error("no record {index} (the file has {count})")]
    Index {
        /// The index asked for.
        index: usize,
        /// How many records the file has.
        count: usize,
    },
    /// A store was cut short (its holder died): the record's content is unknown.
    #[error("record {0} was left half-written")]
    Torn(usize),
    /// A payload larger than [`PAYLOAD`], or a record claiming one.
    #[error("payload of {0} bytes does not fit a record")]
    TooLong(usize),
}

/// The record file (see the module docs).
#[derive(Debug)]
pub struct Records {
    file: File,
    count: usize,
}

impl Records {
    /// Opens (creating it when needed, mode 0600) the file at `path` with room for at
    /// least `count` records (a shorter file is extended with empty records; a longer one
    /// is used whole).
    ///
    /// # Errors
    /// [`RecordError::Io`].
    pub fn open(path: &Path, count: usize) -> Result<Records, RecordError> {
        let file = crate::files::open_private(path)?;
        let want = (count.max(1) * RECORD_SIZE) as u64;
        if file.metadata()?.len() < want {
            // Extending with zeros: empty records (two processes doing it at once both
            // set the same length or more).
            file.set_len(want)?;
        }
        let len = file.metadata()?.len();
        let count = usize::try_from(len / RECORD_SIZE as u64)
            .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
        Ok(Records { file, count })
    }

    /// How many records the file holds.
    pub fn count(&self) -> usize {
        self.count
    }

    /// Locks record `index` (waiting for its holder in another open file description).
    ///
    /// # Errors
    /// [`RecordError::Index`], [`RecordError::Io`].
    pub fn lock(&mut self, index: usize) -> Result<RecordGuard<'_>, RecordError> {
        self.lock_with(index, true)?
            .ok_or_else(|| io::Error::from(io::ErrorKind::WouldBlock).into())
    }

    /// [`Records::lock`] without waiting: `None` while another open file description
    /// holds the record.
    ///
    /// # Errors
    /// [`RecordError::Index`], [`RecordError::Io`].
    pub fn try_lock(&mut self, index: usize) -> Result<Option<RecordGuard<'_>>, RecordError> {
        self.lock_with(index, false)
    }

    fn lock_with(
        &mut self,
        index: usize,
        wait: bool,
    ) -> Result<Option<RecordGuard<'_>>, RecordError> {
        if index >= self.count {
            return Err(RecordError::Index {
                index,
                count: self.count,
            });
        }
        loop {
            match crate::sys::ofd_lock(
                self.file.as_fd(),
                Self::offset(index),
                RECORD_SIZE as u64,
                true,
                wait,
            ) {
                Ok(()) => {
                    return Ok(Some(RecordGuard {
                        records: self,
                        index,
                    }))
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e)
                    if !wait && matches!(e.raw_os_error(), Some(libc::EAGAIN | libc::EACCES)) =>
                {
                    return Ok(None)
                }
                Err(e) => return Err(e.into()),
            }
        }
    }

    fn offset(index: usize) -> u64 {
        (index * RECORD_SIZE) as u64
    }
}

/// One record, locked; unlocked on drop.
#[derive(Debug)]
pub struct RecordGuard<'r> {
    records: &'r mut Records,
    index: usize,
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut w = [0; 8];
    w.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(w)
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    let mut w = [0; 4];
    w.copy_from_slice(&b[at..at + 4]);
    u32::from_le_bytes(w)
}

impl RecordGuard<'_> {
    /// The record's index.
    pub fn index(&self) -> usize {
        self.index
    }

    fn base(&self) -> u64 {
        Records::offset(self.index)
    }

    /// The record's payload, `None` when it is empty.
    ///
    /// # Errors
    /// [`RecordError::Torn`] (a store was cut short), [`RecordError::TooLong`] (the
    /// record is corrupt), [`RecordError::Io`].
    pub fn load(&mut self) -> Result<Option<Vec<u8>>, RecordError> {
        let mut r = [0u8; RECORD_SIZE];
        self.records.file.read_exact_at(&mut r, self.base())?;
        if u64_at(&r, 0) % 2 == 1 {
            return Err(RecordError::Torn(self.index));
        }
        if u32_at(&r, 12) != MAGIC {
            return Ok(None);
        }
        let len = u32_at(&r, 8) as usize;
        if len > PAYLOAD {
            return Err(RecordError::TooLong(len));
        }
        Ok(Some(r[HEADER..HEADER + len].to_vec()))
    }

    /// Stores `payload` (see the module docs for the order of the writes).
    ///
    /// # Errors
    /// [`RecordError::TooLong`], [`RecordError::Io`].
    pub fn store(&mut self, payload: &[u8]) -> Result<(), RecordError> {
        if payload.len() > PAYLOAD {
            return Err(RecordError::TooLong(payload.len()));
        }
        self.write(Some(payload), true)
    }

    /// Empties the record (also repairs a torn one).
    ///
    /// # Errors
    /// [`RecordError::Io`].
    pub fn clear(&mut self) -> Result<(), RecordError> {
        self.write(None, true)
    }

    /// The store: sequence odd, content, then (when `finish`) even again, each its own
    /// write, so that a holder killed in between leaves the sequence odd.
    fn write(&mut self, payload: Option<&[u8]>, finish: bool) -> Result<(), RecordError> {
        let base = self.base();
        let f = &self.records.file;
        let mut seq = [0u8; 8];
        f.read_exact_at(&mut seq, base)?;
        let odd = u64::from_le_bytes(seq) | 1;
        f.write_all_at(&odd.to_le_bytes(), base)?;
        let mut rest = [0u8; RECORD_SIZE - 8];
        if let Some(p) = payload {
            rest[..4].copy_from_slice(&(p.len() as u32).to_le_bytes());
            rest[4..8].copy_from_slice(&MAGIC.to_le_bytes());
            rest[8..8 + p.len()].copy_from_slice(p);
        }
        f.write_all_at(&rest, base + 8)?;
        if finish {
            f.write_all_at(&odd.wrapping_add(1).to_le_bytes(), base)?;
        }
        Ok(())
    }

    /// Test hook: a store cut short after its content (the holder "dies" there).
    #[cfg(test)]
    pub(super) fn store_torn(&mut self, payload: &[u8]) {
        self.write(Some(payload), false).unwrap();
    }
}

impl Drop for RecordGuard<'_> {
    fn drop(&mut self) {
        let _ = crate::sys::ofd_lock(
            self.records.file.as_fd(),
            self.base(),
            RECORD_SIZE as u64,
            false,
            false,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> std::path::PathBuf {
        let d =
            std::env::temp_dir().join(format!("uroce-records-ut-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    /// Stores are seen through another open (another open file description, as another
    /// process's): empty, stored, too long, out of range.
    #[test]
    fn stores_are_shared_between_opens() {
        let dir = scratch("shared");
        let path = dir.join("qps");
        let mut a = Records::open(&path, 4).unwrap();
        let mut b = Records::open(&path, 2).unwrap();
        assert_eq!((a.count(), b.count()), (4, 4));
        assert!(a.lock(3).unwrap().load().unwrap().is_none());
        a.lock(3).unwrap().store(b"epsn 42").unwrap();
        assert_eq!(
            b.lock(3).unwrap().load().unwrap().as_deref(),
            Some(&b"epsn 42"[..])
        );
        // A shorter store leaves nothing of the longer one.
        b.lock(3).unwrap().store(b"e").unwrap();
        assert_eq!(
            a.lock(3).unwrap().load().unwrap().as_deref(),
            Some(&b"e"[..])
        );
        let full = vec![7u8; PAYLOAD];
        a.lock(0).unwrap().store(&full).unwrap();
        assert_eq!(b.lock(0).unwrap().load().unwrap(), Some(full));
        assert!(matches!(
            a.lock(0).unwrap().store(&[0; PAYLOAD + 1]),
            Err(RecordError::TooLong(_))
        ));
        assert!(matches!(
            a.lock(4),
            Err(RecordError::Index { index: 4, count: 4 })
        ));
        a.lock(3).unwrap().clear().unwrap();
        assert!(b.lock(3).unwrap().load().unwrap().is_none());
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A record locked through one open excludes the other open from that record only,
    /// until the guard drops; a waiting lock gets it then.
    #[test]
    fn a_record_lock_excludes_other_opens() {
        let dir = scratch("lock");
        let path = dir.join("qps");
        let mut a = Records::open(&path, 2).unwrap();
        let mut b = Records::open(&path, 2).unwrap();
        let g = a.lock(0).unwrap();
        assert!(b.try_lock(0).unwrap().is_none());
        assert!(b.try_lock(1).unwrap().is_some());
        let (tx, rx) = std::sync::mpsc::channel();
        let waiter = std::thread::spawn(move || {
            let mut g = b.lock(0).unwrap();
            tx.send(()).unwrap();
            g.load().unwrap()
        });
        assert!(rx
            .recv_timeout(std::time::Duration::from_millis(100))
            .is_err());
        let mut g = g;
        g.store(b"mine").unwrap();
        drop(g);
        rx.recv_timeout(std::time::Duration::from_secs(10))
            .expect("the waiter got the lock");
        assert_eq!(waiter.join().unwrap().as_deref(), Some(&b"mine"[..]));
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A holder that dies: its lock goes with its last descriptor (the kernel releases
    /// OFD locks on close), and a store it cut short is seen as torn until cleared.
    #[test]
    fn a_dead_holder_releases_its_lock_and_a_torn_store_is_seen() {
        let dir = scratch("dead");
        let path = dir.join("qps");
        let mut a = Records::open(&path, 1).unwrap();
        let mut b = Records::open(&path, 1).unwrap();
        b.lock(0).unwrap().store(b"before").unwrap();
        let mut g = a.lock(0).unwrap();
        g.store_torn(b"half");
        std::mem::forget(g);
        assert!(b.try_lock(0).unwrap().is_none());
        drop(a);
        let mut g = b
            .try_lock(0)
            .unwrap()
            .expect("released with the descriptor");
        assert!(matches!(g.load(), Err(RecordError::Torn(0))));
        g.clear().unwrap();
        assert!(g.load().unwrap().is_none());
        g.store(b"after").unwrap();
        assert_eq!(g.load().unwrap().as_deref(), Some(&b"after"[..]));
        drop(g);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
