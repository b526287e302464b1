//! The W1–W8 workloads of `scopefs bench`: each one timed against a work directory.

use std::fs::{self, File};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{bail, ensure, Context, Result};

use super::{unix_nanos, RateKind, Row, Workload, MIB};

/// Files of W3 are spread over this many directories.
pub(super) const W3_DIRS: u64 = 100;
pub(super) const W3_FILE_SIZE: usize = 4096;
/// The default W5 tree must hold at least this many files.
const TREE_MIN_FILES: usize = 3000;
/// Crates (from the local cargo source cache) preferred for the default W5 tree.
const TREE_CRATES: &[&str] = &[
    "tokio",
    "aws-sdk-s3",
    "rusqlite",
    "syn",
    "serde",
    "hyper",
    "regex-automata",
    "clap_builder",
    "axum",
    "tracing-subscriber",
    "aws-smithy-runtime",
    "rustls",
    "tower",
    "h2",
];

pub(super) struct Bench {
    pub(super) work: PathBuf,
    pub(super) size_mib: u64,
    pub(super) files: u64,
    pub(super) streams: u64,
    pub(super) tree: Option<PathBuf>,
    pub(super) rows: Vec<Row>,
    pub(super) notes: Vec<String>,
    pub(super) big_written: bool,
    pub(super) small_written: bool,
    /// Processes whose CPU time each workload is charged with, and what each workload spent.
    pub(super) cpu_pids: Vec<u32>,
    pub(super) cpu: Vec<super::cpu::WorkloadCpu>,
}

impl Bench {
    pub(super) fn run_all(&mut self, selected: &[Workload]) -> Result<()> {
        for w in selected {
            eprintln!("bench: running {w:?}");
            let before = super::cpu::ticks(&self.cpu_pids)?;
            match w {
                Workload::W1 => self.w1()?,
                Workload::W2 => self.w2()?,
                Workload::W3 => self.w3()?,
                Workload::W4 => self.w4()?,
                Workload::W5 => self.w5()?,
                Workload::W6 => self.w6()?,
                Workload::W7 => self.w7()?,
                Workload::W8 => self.w8()?,
            }
            let seconds = super::cpu::seconds_between(&before, &super::cpu::ticks(&self.cpu_pids)?);
            if !self.cpu_pids.is_empty() {
                self.cpu.push(super::cpu::WorkloadCpu { workload: format!("{w:?}"), seconds });
            }
        }
        Ok(())
    }

    fn big_file(&self) -> PathBuf {
        self.work.join("w1-sequential.bin")
    }

    fn push(&mut self, workload: &str, name: &str, ops: u64, bytes: u64, seconds: f64, rate_kind: RateKind) {
        self.rows.push(Row { workload: workload.to_string(), name: name.to_string(), ops, bytes, seconds, rate_kind });
    }

    /// W1: sequential write in 1 MiB writes; the time includes the final fsync.
    fn w1(&mut self) -> Result<()> {
        let (ops, bytes, secs) = write_big_file(&self.big_file(), self.size_mib)?;
        self.big_written = true;
        self.push("W1", "sequential write + fsync", ops, bytes, secs, RateKind::Bytes);
        Ok(())
    }

    /// W2: read the W1 file back with kernel caches dropped, then again warm.
    fn w2(&mut self) -> Result<()> {
        if !self.big_written {
            write_big_file(&self.big_file(), self.size_mib)?;
            self.big_written = true;
            self.notes.push("W2 wrote its input file first (untimed) because W1 was not selected".into());
        }
        let expected = self.size_mib * MIB;
        let dropped = drop_caches();
        self.notes.push(match &dropped {
            Ok(()) => "W2 cold: kernel page/dentry/inode caches dropped (sync; echo 3 > /proc/sys/vm/drop_caches); \
                       a filesystem's own local cache (e.g. scopefs's block cache) is not dropped"
                .into(),
            Err(err) => format!("W2 cold: could not drop kernel caches ({err}); the cold read may be warm"),
        });
        let cold_name =
            if dropped.is_ok() { "sequential read, cold" } else { "sequential read, cold (caches NOT dropped)" };
        let (ops, bytes, secs) = read_file(&self.big_file())?;
        ensure!(bytes == expected, "W2 read {bytes} bytes, expected {expected}");
        self.push("W2", cold_name, ops, bytes, secs, RateKind::Bytes);
        let (ops, bytes, secs) = read_file(&self.big_file())?;
        ensure!(bytes == expected, "W2 read {bytes} bytes, expected {expected}");
        self.push("W2", "sequential read, warm", ops, bytes, secs, RateKind::Bytes);
        Ok(())
    }

    /// W3: create the small files (and their directories).
    fn w3(&mut self) -> Result<()> {
        let (ops, bytes, secs) = create_small_files(&self.work.join("w3"), self.files)?;
        self.small_written = true;
        self.push("W3", "create 4 KiB files", ops, bytes, secs, RateKind::Ops);
        Ok(())
    }

    /// W4: stat every small file and list every directory.
    fn w4(&mut self) -> Result<()> {
        let root = self.work.join("w3");
        if !self.small_written {
            create_small_files(&root, self.files)?;
            self.small_written = true;
            self.notes.push("W4 created its input files first (untimed) because W3 was not selected".into());
        }
        let start = Instant::now();
        let mut ops = 0u64;
        let mut seen = 0u64;
        let dirs = W3_DIRS.min(self.files);
        for d in 0..dirs {
            let dir = root.join(dir_name(d));
            for entry in fs::read_dir(&dir).with_context(|| format!("W4 cannot list {}", dir_name(d)))? {
                let entry = entry.context("W4 readdir")?;
                let meta = fs::metadata(entry.path()).context("W4 stat")?;
                ensure!(meta.len() == W3_FILE_SIZE as u64, "W4 found a file of {} bytes", meta.len());
                seen += 1;
                ops += 1;
            }
            ops += 1;
        }
        let secs = start.elapsed().as_secs_f64();
        ensure!(seen == self.files, "W4 saw {seen} files, expected {}", self.files);
        self.push("W4", "stat files + list dirs", ops, 0, secs, RateKind::Ops);
        Ok(())
    }

    /// W5: unpack a source tree, then put it under git.
    fn w5(&mut self) -> Result<()> {
        let tarball = match &self.tree {
            Some(t) => t.clone(),
            None => default_tree()?,
        };
        let (entries, bytes) = tar_stats(&tarball)?;
        let dest = self.work.join("w5");
        fs::create_dir(&dest).context("W5 cannot create its directory")?;

        let start = Instant::now();
        let status = Command::new("tar")
            .arg("-xf")
            .arg(&tarball)
            .arg("-C")
            .arg(&dest)
            .status()
            .context("W5 cannot run tar (is it on PATH?)")?;
        let secs = start.elapsed().as_secs_f64();
        ensure!(status.success(), "W5 tar -x failed: {status}");
        self.push("W5", "unpack source tree", entries, bytes, secs, RateKind::Ops);

        let start = Instant::now();
        for args in [&["init", "-q"][..], &["add", "-A"][..], &["commit", "-qm", "bench"][..]] {
            let status = Command::new("git")
                .args(["-c", "user.name=scopefs bench", "-c", "user.email=bench@localhost"])
                .args(["-c", "init.defaultBranch=main", "-c", "gc.auto=0", "-c", "commit.gpgSign=false"])
                .args(args)
                .current_dir(&dest)
                .status()
                .context("W5 cannot run git (is it on PATH?)")?;
            ensure!(status.success(), "W5 git {} failed: {status}", args[0]);
        }
        let secs = start.elapsed().as_secs_f64();
        self.push("W5", "git init + add -A + commit", entries, bytes, secs, RateKind::Ops);
        Ok(())
    }

    /// W6: remove everything the other workloads created (the whole work directory).
    fn w6(&mut self) -> Result<()> {
        let start = Instant::now();
        let removed = remove_tree(&self.work)?;
        let secs = start.elapsed().as_secs_f64();
        self.push("W6", "rm -rf everything", removed, 0, secs, RateKind::Ops);
        Ok(())
    }

    /// W7: `streams` writers at once, each writing its own file of `size_mib / streams` MiB (one at
    /// least) in 1 MiB writes and fsyncing it; timed from the first create to the last fsync's
    /// return. Its files are removed afterwards (untimed), so it runs after W6 as well.
    fn w7(&mut self) -> Result<()> {
        let dir = self.work.join("w7");
        // W6 removes the work directory; then W7 removes it again when done.
        let work_existed = self.work.exists();
        fs::create_dir_all(&dir).context("W7 cannot create its directory")?;
        let per_stream = (self.size_mib / self.streams).max(1);
        let start = Instant::now();
        let results: Vec<Result<(u64, u64, f64)>> = std::thread::scope(|s| {
            let writers: Vec<_> = (0..self.streams)
                .map(|i| {
                    let path = dir.join(format!("stream-{i}.bin"));
                    s.spawn(move || write_file(&path, per_stream, i))
                })
                .collect();
            writers
                .into_iter()
                .map(|w| w.join().unwrap_or_else(|_| Err(anyhow::anyhow!("a W7 writer panicked"))))
                .collect()
        });
        let secs = start.elapsed().as_secs_f64();
        let (mut ops, mut bytes) = (0, 0);
        for r in results {
            let (o, b, _) = r?;
            ops += o;
            bytes += b;
        }
        let name = format!("{} parallel sequential writes + fsync", self.streams);
        self.push("W7", &name, ops, bytes, secs, RateKind::Bytes);
        remove_tree(&dir)?;
        if !work_existed {
            fs::remove_dir(&self.work).context("W7 cannot remove the work directory")?;
        }
        Ok(())
    }
}

impl Bench {
    /// W8: `fsync` latency of small files: `FSYNC_FILES` times, create a file, write 4 KiB, `fsync`
    /// it (each timed alone); rows for the median and the 99th percentile. Its files are removed
    /// afterwards (untimed).
    fn w8(&mut self) -> Result<()> {
        let dir = self.work.join("w8");
        let work_existed = self.work.exists();
        fs::create_dir_all(&dir).context("W8 cannot create its directory")?;
        let mut data = vec![0u8; W3_FILE_SIZE];
        let mut rng = 0x2545_f491_4f6c_dd1du64 ^ unix_nanos();
        let mut times = Vec::with_capacity(FSYNC_FILES);
        for i in 0..FSYNC_FILES {
            for chunk in data.chunks_exact_mut(8) {
                chunk.copy_from_slice(&xorshift(&mut rng).to_le_bytes());
            }
            let start = Instant::now();
            let mut file = File::create(dir.join(format!("f{i}"))).context("W8 create")?;
            file.write_all(&data).context("W8 write")?;
            file.sync_all().context("W8 fsync")?;
            times.push(start.elapsed().as_secs_f64());
        }
        times.sort_by(f64::total_cmp);
        let at = |q: f64| times[((times.len() as f64 * q).ceil() as usize).clamp(1, times.len()) - 1];
        let bytes = W3_FILE_SIZE as u64;
        self.push("W8", "create + 4 KiB write + fsync, p50", 1, bytes, at(0.50), RateKind::Ops);
        self.push("W8", "create + 4 KiB write + fsync, p99", 1, bytes, at(0.99), RateKind::Ops);
        remove_tree(&dir)?;
        if !work_existed {
            fs::remove_dir(&self.work).context("W8 cannot remove the work directory")?;
        }
        Ok(())
    }
}

/// Files W8 fsyncs (one at a time).
const FSYNC_FILES: usize = 200;

/// Writes `size_mib` MiB in 1 MiB writes and fsyncs; returns (writes, bytes, seconds).
pub(super) fn write_big_file(path: &Path, size_mib: u64) -> Result<(u64, u64, f64)> {
    write_file(path, size_mib, 0)
}

/// Writes `size_mib` MiB of stream `stream` in 1 MiB writes and fsyncs; every 4 KiB page is
/// unique across streams too. Returns (writes, bytes, seconds).
fn write_file(path: &Path, size_mib: u64, stream: u64) -> Result<(u64, u64, f64)> {
    let mut buf = vec![0u8; MIB as usize];
    let mut rng = 0x9e37_79b9_7f4a_7c15u64 ^ unix_nanos() ^ stream.wrapping_mul(0xa076_1d64_78bd_642f);
    for chunk in buf.chunks_exact_mut(8) {
        chunk.copy_from_slice(&xorshift(&mut rng).to_le_bytes());
    }
    let start = Instant::now();
    let mut file = File::create(path).context("W1 cannot create its file")?;
    for i in 0..size_mib {
        // Make every 4 KiB unique so content-addressed stores cannot dedup the data.
        for (j, page) in buf.chunks_exact_mut(4096).enumerate() {
            page[..8].copy_from_slice(&((stream << 48) | (i * 256 + j as u64)).to_le_bytes());
        }
        file.write_all(&buf).context("W1 write")?;
    }
    file.sync_all().context("W1 fsync")?;
    drop(file);
    Ok((size_mib, size_mib * MIB, start.elapsed().as_secs_f64()))
}

/// Reads a file in 1 MiB reads; returns (reads, bytes, seconds).
pub(super) fn read_file(path: &Path) -> Result<(u64, u64, f64)> {
    let mut buf = vec![0u8; MIB as usize];
    let start = Instant::now();
    let mut file = File::open(path).context("W2 cannot open the file")?;
    let (mut ops, mut bytes) = (0u64, 0u64);
    loop {
        let n = file.read(&mut buf).context("W2 read")?;
        if n == 0 {
            break;
        }
        ops += 1;
        bytes += n as u64;
    }
    Ok((ops, bytes, start.elapsed().as_secs_f64()))
}

/// `sync; echo 3 > /proc/sys/vm/drop_caches`.
fn drop_caches() -> Result<(), String> {
    // SAFETY: sync(2) takes no arguments and cannot fail.
    unsafe { libc::sync() };
    fs::write("/proc/sys/vm/drop_caches", b"3").map_err(|e| e.to_string())
}

fn dir_name(d: u64) -> String {
    format!("d{d:03}")
}

/// Creates `files` 4 KiB files over up to 100 directories; returns (creates, bytes, seconds).
pub(super) fn create_small_files(root: &Path, files: u64) -> Result<(u64, u64, f64)> {
    let dirs = W3_DIRS.min(files);
    let mut data = [0u8; W3_FILE_SIZE];
    let start = Instant::now();
    fs::create_dir(root).context("W3 cannot create its directory")?;
    for d in 0..dirs {
        fs::create_dir(root.join(dir_name(d))).context("W3 mkdir")?;
    }
    for i in 0..files {
        data[..8].copy_from_slice(&i.to_le_bytes());
        let path = root.join(dir_name(i % dirs)).join(format!("f{i:06}"));
        let mut f = File::create(&path).context("W3 create")?;
        f.write_all(&data).context("W3 write")?;
    }
    Ok((files + dirs, files * W3_FILE_SIZE as u64, start.elapsed().as_secs_f64()))
}

/// Removes a tree depth-first like `rm -rf`; returns the number of entries removed.
pub(super) fn remove_tree(path: &Path) -> Result<u64> {
    let mut removed = 0u64;
    for entry in fs::read_dir(path).context("W6 readdir")? {
        let entry = entry.context("W6 readdir")?;
        let kind = entry.file_type().context("W6 file type")?;
        if kind.is_dir() {
            removed += remove_tree(&entry.path())?;
        } else {
            fs::remove_file(entry.path()).context("W6 unlink")?;
            removed += 1;
        }
    }
    fs::remove_dir(path).context("W6 rmdir")?;
    Ok(removed + 1)
}

/// Entry count and total file bytes of a tarball (from `tar -tvf`, untimed).
fn tar_stats(tarball: &Path) -> Result<(u64, u64)> {
    let out = Command::new("tar").arg("-tvf").arg(tarball).output().context("cannot run tar (is it on PATH?)")?;
    ensure!(out.status.success(), "tar -t {} failed", tarball.display());
    let text = String::from_utf8_lossy(&out.stdout);
    let mut entries = 0u64;
    let mut bytes = 0u64;
    for line in text.lines() {
        entries += 1;
        if let Some(size) = line.split_whitespace().nth(2).and_then(|s| s.parse::<u64>().ok()) {
            bytes += size;
        }
    }
    ensure!(entries > 0, "{} holds no entries", tarball.display());
    Ok((entries, bytes))
}

/// The default W5 tarball: built once from crates in the cargo source cache.
fn default_tree() -> Result<PathBuf> {
    let out = std::env::temp_dir().join("scopefs-bench-tree-v2.tar");
    if out.is_file() {
        return Ok(out);
    }
    let cargo_home = std::env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cargo")))
        .context("neither CARGO_HOME nor HOME is set; pass --tree TARBALL")?;
    let src_root = cargo_home.join("registry").join("src");
    let mut crate_dirs: Vec<PathBuf> = Vec::new();
    for index in fs::read_dir(&src_root).with_context(|| {
        format!("no cargo source cache at {} to build the W5 tree from; pass --tree TARBALL", src_root.display())
    })? {
        let index = index?.path();
        if index.is_dir() {
            for c in fs::read_dir(&index)? {
                crate_dirs.push(c?.path());
            }
        }
    }
    crate_dirs.sort();
    let chosen = choose_crates(&crate_dirs);
    if chosen.is_empty() {
        bail!("the cargo source cache holds too few files for the W5 tree; pass --tree TARBALL");
    }
    eprintln!("bench: building the W5 tree tarball from {} crates (once)", chosen.len());
    let tmp = out.with_extension(format!("tmp{}", std::process::id()));
    let mut cmd = Command::new("tar");
    cmd.arg("-cf").arg(&tmp);
    for dir in &chosen {
        let parent = dir.parent().context("crate directory without parent")?;
        let name = dir.file_name().context("crate directory without name")?;
        cmd.arg("-C").arg(parent).arg(name);
    }
    let status = cmd.status().context("cannot run tar (is it on PATH?)")?;
    if !status.success() {
        let _ = fs::remove_file(&tmp);
        bail!("building the W5 tarball failed: {status}");
    }
    fs::rename(&tmp, &out).context("cannot store the W5 tarball")?;
    Ok(out)
}

/// Picks the newest version of each preferred crate, then others, until the
/// tree has at least `TREE_MIN_FILES` files. Empty when that is not reachable.
fn choose_crates(dirs: &[PathBuf]) -> Vec<PathBuf> {
    let mut chosen = Vec::new();
    let mut files = 0usize;
    let preferred = TREE_CRATES.iter().filter_map(|name| {
        dirs.iter().filter(|d| crate_name(d).as_deref() == Some(*name)).max_by(|a, b| a.file_name().cmp(&b.file_name()))
    });
    let rest = dirs.iter();
    for dir in preferred.chain(rest) {
        if files >= TREE_MIN_FILES {
            break;
        }
        if chosen.contains(dir) {
            continue;
        }
        let n = count_files(dir);
        if n > 0 {
            files += n;
            chosen.push(dir.clone());
        }
    }
    if files >= TREE_MIN_FILES {
        chosen
    } else {
        Vec::new()
    }
}

/// `tokio-1.54.1` → `tokio` (the name is everything before the last `-<digit>`).
pub(super) fn crate_name(dir: &Path) -> Option<String> {
    let base = dir.file_name()?.to_str()?;
    let cut = base
        .char_indices()
        .filter(|(i, c)| *c == '-' && base[i + 1..].starts_with(|d: char| d.is_ascii_digit()))
        .map(|(i, _)| i)
        .next_back()?;
    Some(base[..cut].to_string())
}

fn count_files(dir: &Path) -> usize {
    let Ok(entries) = fs::read_dir(dir) else {
        return 0;
    };
    entries
        .flatten()
        .map(|e| match e.file_type() {
            Ok(t) if t.is_dir() => count_files(&e.path()),
            Ok(_) => 1,
            Err(_) => 0,
        })
        .sum()
}

fn xorshift(state: &mut u64) -> u64 {
    let mut x = *state;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    *state = x;
    x
}
