//! The pool's journal: every acknowledged transaction is appended before the answer, so a
//! crash (even `kill -9`) loses none of them.
//!
//! Format: a sequence of records `[len: u32 BE][crc32 of payload: u32 BE][payload]`. The payload
//! is the raw EIP-2718 transaction. Replay reads records until the end or the first incomplete
//! or corrupt one (a write torn by a crash), truncates there, and returns the rest. Compaction
//! rewrites the file with the transactions still pooled, via a temporary file and a rename.
//!
//! A failed append (a full disk) is cut off again at once, so the records appended after it
//! follow the last good one; were it left torn in the middle of the file, replay would stop
//! there and lose every later record. When even that fails, appends are refused until a
//! compaction rewrites the file.

use std::fs::{File, OpenOptions};
use std::io::{BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};

/// When appended records reach the disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sync {
    /// fsync after every append: an acknowledged transaction survives a power loss.
    Always,
    /// Left to the OS: survives a process crash (`kill -9`), not a power loss.
    Os,
}

/// An open journal.
pub struct Journal {
    path: PathBuf,
    file: BufWriter<File>,
    sync: Sync,
    /// Length of the file up to the last good record.
    len: u64,
    /// A failed append could not be cut off: the file's end is torn.
    torn: bool,
    /// Test hook: the next append writes this many bytes of its records, then fails.
    #[cfg(test)]
    pub(crate) fail_after: Option<usize>,
    /// `<path>.lock`, locked while the journal is open: two processes appending to one
    /// journal would corrupt it, so the second one is refused at start.
    _lock: File,
}

/// Records larger than this are corrupt by definition (transactions are capped far below).
const MAX_RECORD: u32 = 4 << 20;

impl Journal {
    /// Opens (creating if needed) the journal at `path`, replays it, and returns the journal
    /// ready for appends together with the transactions it held.
    pub fn open(path: &Path, sync: Sync) -> std::io::Result<(Journal, Vec<Vec<u8>>)> {
        let lock = OpenOptions::new().create(true).truncate(false).write(true).open(path.with_extension("lock"))?;
        lock.try_lock().map_err(|_| std::io::Error::other("the journal is in use by another process"))?;
        let (records, good_len) = match File::open(path) {
            Ok(file) => read_records(file)?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => (Vec::new(), 0),
            Err(e) => return Err(e),
        };
        let file = OpenOptions::new().create(true).append(true).open(path)?;
        if file.metadata()?.len() != good_len {
            // Drop a torn tail so new records follow the last good one.
            file.set_len(good_len)?;
        }
        let journal = Journal {
            path: path.to_owned(),
            file: BufWriter::new(file),
            sync,
            len: good_len,
            torn: false,
            #[cfg(test)]
            fail_after: None,
            _lock: lock,
        };
        Ok((journal, records))
    }

    /// Appends one transaction; returns once it is as durable as the sync policy says.
    pub fn append(&mut self, raw: &[u8]) -> std::io::Result<()> {
        self.append_many(std::iter::once(raw))
    }

    /// Appends several transactions with one flush (and one fsync): the batched writer's path.
    pub fn append_many<'a>(&mut self, raws: impl IntoIterator<Item = &'a [u8]>) -> std::io::Result<()> {
        if self.torn {
            return Err(std::io::Error::other("the journal's end is torn by an earlier failed write"));
        }
        let mut added = 0u64;
        let written = self.write_records(raws, &mut added);
        match written {
            Ok(()) => {
                self.len += added;
                Ok(())
            }
            Err(e) => {
                self.cut_back();
                Err(e)
            }
        }
    }

    fn write_records<'a>(&mut self, raws: impl IntoIterator<Item = &'a [u8]>, added: &mut u64) -> std::io::Result<()> {
        #[cfg(test)]
        if let Some(n) = self.fail_after.take() {
            let mut bytes = Vec::new();
            for raw in raws {
                write_record(&mut bytes, raw)?;
            }
            self.file.write_all(&bytes[..n.min(bytes.len())])?;
            self.file.flush()?;
            return Err(std::io::Error::other("injected journal failure"));
        }
        for raw in raws {
            *added += write_record(&mut self.file, raw)?;
        }
        self.file.flush()?;
        if self.sync == Sync::Always {
            self.file.get_ref().sync_data()?;
        }
        Ok(())
    }

    /// After a failed append: drops what is still buffered and cuts the file back to its last
    /// good record (appends go to the end, so the next one follows it).
    fn cut_back(&mut self) {
        let reopened = OpenOptions::new().append(true).open(&self.path);
        let cut = reopened.and_then(|file| {
            file.set_len(self.len)?;
            Ok(file)
        });
        match cut {
            Ok(file) => {
                // The old writer's buffer holds the failed records: forget them unwritten.
                let old = std::mem::replace(&mut self.file, BufWriter::new(file));
                let _ = old.into_parts();
            }
            Err(e) => {
                tracing::error!(error = %e, "mempool journal cannot be cut back after a failed write");
                self.torn = true;
            }
        }
    }

    /// Rewrites the journal with just `live` (the transactions still pooled).
    pub fn compact<'a>(&mut self, live: impl IntoIterator<Item = &'a [u8]>) -> std::io::Result<()> {
        let tmp = self.path.with_extension("compacting");
        {
            let mut out = BufWriter::new(File::create(&tmp)?);
            for raw in live {
                write_record(&mut out, raw)?;
            }
            out.flush()?;
            out.get_ref().sync_all()?;
        }
        std::fs::rename(&tmp, &self.path)?;
        if let Some(dir) = self.path.parent() {
            // Make the rename itself durable.
            if let Ok(dir) = File::open(dir) {
                let _ = dir.sync_all();
            }
        }
        let file = OpenOptions::new().append(true).open(&self.path)?;
        self.len = file.metadata()?.len();
        let old = std::mem::replace(&mut self.file, BufWriter::new(file));
        let _ = old.into_parts();
        self.torn = false;
        Ok(())
    }
}

/// Writes one record (`[len][crc32][payload]`); returns its length in bytes.
fn write_record(out: &mut impl Write, raw: &[u8]) -> std::io::Result<u64> {
    let len = u32::try_from(raw.len()).map_err(|_| std::io::Error::other("record too large"))?;
    out.write_all(&len.to_be_bytes())?;
    out.write_all(&crc32fast::hash(raw).to_be_bytes())?;
    out.write_all(raw)?;
    Ok(8 + u64::from(len))
}

/// Reads records up to the first torn or corrupt one; returns them and the length they span.
fn read_records(file: File) -> std::io::Result<(Vec<Vec<u8>>, u64)> {
    let mut reader = BufReader::new(file);
    let mut records = Vec::new();
    let mut good = 0u64;
    loop {
        let mut header = [0u8; 8];
        if !read_full(&mut reader, &mut header)? {
            break;
        }
        let len = u32::from_be_bytes(header[..4].try_into().expect("4 bytes"));
        let crc = u32::from_be_bytes(header[4..].try_into().expect("4 bytes"));
        if len > MAX_RECORD {
            break;
        }
        let mut payload = vec![0u8; len as usize];
        if !read_full(&mut reader, &mut payload)? || crc32fast::hash(&payload) != crc {
            break;
        }
        good += 8 + u64::from(len);
        records.push(payload);
    }
    Ok((records, good))
}

/// Fills `buf`, or returns false at a clean or torn end of file.
fn read_full(reader: &mut impl Read, buf: &mut [u8]) -> std::io::Result<bool> {
    let mut filled = 0;
    while filled < buf.len() {
        match reader.read(&mut buf[filled..])? {
            0 => return Ok(false),
            n => filled += n,
        }
    }
    Ok(true)
}

/// CRC-32 (IEEE), bitwise: records are small and this keeps the crate free of another dependency.
#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc_matches_the_standard_check_value() {
        assert_eq!(crc32fast::hash(b"123456789"), 0xcbf4_3926);
    }

    // A failed append (a full disk) must not leave a torn record in the middle of the file:
    // replay stops at the first torn record, so every record appended after it would be lost.
    #[test]
    fn a_failed_append_is_cut_off_and_later_records_replay() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("pool.journal");
        let (mut journal, _) = Journal::open(&path, Sync::Os).unwrap();
        journal.append(b"before").unwrap();
        journal.fail_after = Some(11);
        assert!(journal.append_many([&b"failed one"[..], &b"failed two"[..]]).is_err());
        journal.append(b"after").unwrap();
        drop(journal);
        let (_, replayed) = Journal::open(&path, Sync::Os).unwrap();
        assert_eq!(replayed, [b"before".to_vec(), b"after".to_vec()]);
    }

    #[test]
    fn appended_records_replay_after_reopening() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("pool.journal");
        let (mut journal, replayed) = Journal::open(&path, Sync::Always).unwrap();
        assert!(replayed.is_empty());
        journal.append(b"first").unwrap();
        journal.append_many([&b"second"[..], &b"third"[..]]).unwrap();
        drop(journal);
        let (_, replayed) = Journal::open(&path, Sync::Os).unwrap();
        assert_eq!(replayed, [b"first".to_vec(), b"second".to_vec(), b"third".to_vec()]);
    }

    #[test]
    fn a_torn_tail_is_dropped_and_appends_continue_after_the_last_good_record() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("pool.journal");
        let (mut journal, _) = Journal::open(&path, Sync::Os).unwrap();
        journal.append(b"kept").unwrap();
        journal.append(b"torn by a crash").unwrap();
        drop(journal);
        let len = std::fs::metadata(&path).unwrap().len();
        OpenOptions::new().write(true).open(&path).unwrap().set_len(len - 3).unwrap();
        let (mut journal, replayed) = Journal::open(&path, Sync::Os).unwrap();
        assert_eq!(replayed, [b"kept".to_vec()]);
        journal.append(b"after").unwrap();
        drop(journal);
        let (_, replayed) = Journal::open(&path, Sync::Os).unwrap();
        assert_eq!(replayed, [b"kept".to_vec(), b"after".to_vec()]);
    }

    #[test]
    fn a_corrupt_record_ends_the_replay() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("pool.journal");
        let (mut journal, _) = Journal::open(&path, Sync::Os).unwrap();
        journal.append_many([&b"one"[..], &b"two"[..]]).unwrap();
        drop(journal);
        let mut bytes = std::fs::read(&path).unwrap();
        let last = bytes.len() - 1;
        bytes[last] ^= 0xff; // flip a bit in "two"
        std::fs::write(&path, bytes).unwrap();
        let (_, replayed) = Journal::open(&path, Sync::Os).unwrap();
        assert_eq!(replayed, [b"one".to_vec()]);
    }

    #[test]
    fn a_second_opener_is_refused_while_the_first_holds_the_journal() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("mempool.journal");
        let (first, _) = Journal::open(&path, Sync::Os).unwrap();
        let err = Journal::open(&path, Sync::Os).err().expect("refused");
        assert!(err.to_string().contains("in use"), "{err}");
        drop(first);
        assert!(Journal::open(&path, Sync::Os).is_ok());
    }

    #[test]
    fn compaction_keeps_only_the_live_transactions() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("pool.journal");
        let (mut journal, _) = Journal::open(&path, Sync::Os).unwrap();
        journal.append_many([&b"mined"[..], &b"pending"[..], &b"dropped"[..]]).unwrap();
        journal.compact([&b"pending"[..]]).unwrap();
        journal.append(b"new").unwrap();
        drop(journal);
        let (_, replayed) = Journal::open(&path, Sync::Os).unwrap();
        assert_eq!(replayed, [b"pending".to_vec(), b"new".to_vec()]);
    }
}
