//! The files of the user's host directory (the registry, the XRC domains file, the
//! target QP records): opened without truncating for locks and records, replaced whole
//! for text, so that a reader without the lock sees an old file or a new one, never a
//! part of one.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::Path;

/// Opens the file at `path` for reading and writing, creating it (mode 0600) when needed
/// and never truncating it: a lock file, or a file of records (the files of the user's
/// host directory).
pub(crate) fn open_private(path: &Path) -> io::Result<File> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .open(path)
}

/// Replaces the file at `path` with `text` at once: written to `tmp` (mode 0600),
/// synced, renamed over it, so that a reader without the lock sees the old file or the
/// new one, never a part.
pub(crate) fn replace_file(path: &Path, tmp: &Path, text: &str) -> io::Result<()> {
    let mut f = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(tmp)?;
    io::Write::write_all(&mut f, text.as_bytes())?;
    f.sync_data()?;
    std::fs::rename(tmp, path)
}
