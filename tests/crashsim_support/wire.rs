//! The byte encoding between a test and the process serving its recording mount: integers
//! little-endian, byte strings length-prefixed, one tag byte per variant; used for commands,
//! answers, ops, images and recordings.

use std::ffi::OsString;
use std::io::{self, Read, Write};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::sync::Arc;

use super::ops::{FaultOn, Fired, Op};

/// Bytes being written.
#[derive(Default)]
pub struct Out(pub Vec<u8>);

impl Out {
    pub fn u8(&mut self, v: u8) -> &mut Self {
        self.0.push(v);
        self
    }

    pub fn u64(&mut self, v: u64) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }

    pub fn u128(&mut self, v: u128) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }

    pub fn bytes(&mut self, b: &[u8]) -> &mut Self {
        self.u64(b.len() as u64);
        self.0.extend_from_slice(b);
        self
    }

    pub fn name(&mut self, n: &OsString) -> &mut Self {
        self.bytes(n.as_bytes())
    }

    /// Sends the bytes as one frame.
    pub fn send(&self, w: &mut impl Write) -> io::Result<()> {
        w.write_all(&(self.0.len() as u64).to_le_bytes())?;
        w.write_all(&self.0)?;
        w.flush()
    }
}

/// Bytes being read.
pub struct In {
    data: Vec<u8>,
    at: usize,
}

fn short() -> io::Error {
    io::Error::new(io::ErrorKind::UnexpectedEof, "a crashsim frame ended early")
}

impl In {
    /// Receives one frame.
    pub fn recv(r: &mut impl Read) -> io::Result<In> {
        let mut len = [0u8; 8];
        r.read_exact(&mut len)?;
        let mut data = vec![0u8; u64::from_le_bytes(len) as usize];
        r.read_exact(&mut data)?;
        Ok(In { data, at: 0 })
    }

    fn take(&mut self, n: usize) -> io::Result<&[u8]> {
        let end = self.at.checked_add(n).filter(|e| *e <= self.data.len()).ok_or_else(short)?;
        let s = &self.data[self.at..end];
        self.at = end;
        Ok(s)
    }

    pub fn u8(&mut self) -> io::Result<u8> {
        Ok(self.take(1)?[0])
    }

    pub fn u64(&mut self) -> io::Result<u64> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().unwrap()))
    }

    pub fn u128(&mut self) -> io::Result<u128> {
        Ok(u128::from_le_bytes(self.take(16)?.try_into().unwrap()))
    }

    pub fn bytes(&mut self) -> io::Result<Vec<u8>> {
        let n = self.u64()? as usize;
        Ok(self.take(n)?.to_vec())
    }

    pub fn name(&mut self) -> io::Result<OsString> {
        Ok(OsString::from_vec(self.bytes()?))
    }

    pub fn string(&mut self) -> io::Result<String> {
        String::from_utf8(self.bytes()?).map_err(|_| io::Error::other("a crashsim string is not UTF-8"))
    }
}

pub fn put_op(o: &mut Out, op: &Op) {
    match op {
        Op::Write { file, offset, data } => o.u8(0).u64(*file).u64(*offset).bytes(data),
        Op::Truncate { file, size } => o.u8(1).u64(*file).u64(*size),
        Op::Create { dir, name, file } => o.u8(2).u64(*dir).name(name).u64(*file),
        Op::Mkdir { dir, name, new } => o.u8(3).u64(*dir).name(name).u64(*new),
        Op::Symlink { dir, name, target, new } => o.u8(4).u64(*dir).name(name).name(target).u64(*new),
        Op::Link { file, dir, name } => o.u8(5).u64(*file).u64(*dir).name(name),
        Op::Unlink { dir, name, file } => o.u8(6).u64(*dir).name(name).u64(*file),
        Op::Rmdir { dir, name, file } => o.u8(7).u64(*dir).name(name).u64(*file),
        Op::Rename { from_dir, from_name, to_dir, to_name, file, other, flags } => o
            .u8(8)
            .u64(*from_dir)
            .name(from_name)
            .u64(*to_dir)
            .name(to_name)
            .u64(*file)
            .u64(other.map_or(0, |x| x + 1))
            .u64(u64::from(*flags)),
        Op::Fsync { file, datasync } => o.u8(9).u64(*file).u8(u8::from(*datasync)),
        Op::FsyncDir { dir } => o.u8(10).u64(*dir),
    };
}

pub fn get_op(i: &mut In) -> io::Result<Op> {
    Ok(match i.u8()? {
        0 => Op::Write { file: i.u64()?, offset: i.u64()?, data: Arc::from(i.bytes()?) },
        1 => Op::Truncate { file: i.u64()?, size: i.u64()? },
        2 => Op::Create { dir: i.u64()?, name: i.name()?, file: i.u64()? },
        3 => Op::Mkdir { dir: i.u64()?, name: i.name()?, new: i.u64()? },
        4 => Op::Symlink { dir: i.u64()?, name: i.name()?, target: i.name()?, new: i.u64()? },
        5 => Op::Link { file: i.u64()?, dir: i.u64()?, name: i.name()? },
        6 => Op::Unlink { dir: i.u64()?, name: i.name()?, file: i.u64()? },
        7 => Op::Rmdir { dir: i.u64()?, name: i.name()?, file: i.u64()? },
        8 => Op::Rename {
            from_dir: i.u64()?,
            from_name: i.name()?,
            to_dir: i.u64()?,
            to_name: i.name()?,
            file: i.u64()?,
            other: i.u64()?.checked_sub(1),
            flags: i.u64()? as u32,
        },
        9 => Op::Fsync { file: i.u64()?, datasync: i.u8()? != 0 },
        10 => Op::FsyncDir { dir: i.u64()? },
        t => return Err(io::Error::other(format!("unknown op tag {t}"))),
    })
}

pub fn put_fault(o: &mut Out, on: FaultOn, errno: i32) {
    match on {
        FaultOn::Write(k) => o.u8(0).u64(k as u64),
        FaultOn::Sync(k) => o.u8(1).u64(k as u64),
    };
    o.u64(errno as u64);
}

pub fn get_fault(i: &mut In) -> io::Result<(FaultOn, i32)> {
    let kind = i.u8()?;
    let k = i.u64()? as usize;
    let on = if kind == 0 { FaultOn::Write(k) } else { FaultOn::Sync(k) };
    Ok((on, i.u64()? as i32))
}

pub fn put_fired(o: &mut Out, f: &Fired) {
    o.u64(f.at_op as u64).u64(f.errno as u64).bytes(f.what.as_bytes()).u64(f.file).u8(u8::from(f.sync));
}

pub fn get_fired(i: &mut In) -> io::Result<Fired> {
    Ok(Fired {
        at_op: i.u64()? as usize,
        errno: i.u64()? as i32,
        what: i.string()?,
        file: i.u64()?,
        sync: i.u8()? != 0,
    })
}
