//! The extended-attribute and `fallocate` callbacks of `ScopeFs` (a child module of `adapter`):
//! flag decoding (unknown flags and modes are unsupported requests), `getxattr`/`listxattr` size
//! probing, one engine call each.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;

use fuser::{FileHandle, INodeNo, ReplyEmpty, ReplyXattr};
use scopefs::engine::{AllocMode, EngineError, EngineResult, XattrMode};

use super::{call, reply_empty, ScopeFs};
use crate::errno::{to_errno, Failure};

/// `setxattr` flags to a mode (both `XATTR_CREATE` and `XATTR_REPLACE` always fail, as on
/// Linux); unknown bits are `Invalid`.
pub fn xattr_mode(flags: i32) -> EngineResult<XattrMode> {
    if flags & !(libc::XATTR_CREATE | libc::XATTR_REPLACE) != 0 {
        return Err(EngineError::Invalid("unknown setxattr flags"));
    }
    Ok(match (flags & libc::XATTR_CREATE != 0, flags & libc::XATTR_REPLACE != 0) {
        (true, true) => XattrMode::CreateAndReplace,
        (true, false) => XattrMode::Create,
        (false, true) => XattrMode::Replace,
        (false, false) => XattrMode::Either,
    })
}

/// `fallocate` mode bits to an `AllocMode`; anything else is `Unsupported` (`EOPNOTSUPP`).
pub fn alloc_mode(mode: i32) -> EngineResult<AllocMode> {
    const KEEP: i32 = libc::FALLOC_FL_KEEP_SIZE;
    const PUNCH: i32 = libc::FALLOC_FL_PUNCH_HOLE;
    const ZERO: i32 = libc::FALLOC_FL_ZERO_RANGE;
    match mode {
        0 => Ok(AllocMode::Allocate { keep_size: false }),
        KEEP => Ok(AllocMode::Allocate { keep_size: true }),
        m if m == PUNCH | KEEP => Ok(AllocMode::PunchHole),
        ZERO => Ok(AllocMode::ZeroRange { keep_size: false }),
        m if m == ZERO | KEEP => Ok(AllocMode::ZeroRange { keep_size: true }),
        _ => Err(EngineError::Unsupported("fallocate mode")),
    }
}

/// Answers a `getxattr`/`listxattr`: the length when probed with size 0, `ERANGE` when the
/// caller's buffer is too small, else the bytes.
fn reply_sized(reply: ReplyXattr, size: u32, result: Result<Vec<u8>, fuser::Errno>) {
    match result {
        Ok(data) if size == 0 => match u32::try_from(data.len()) {
            Ok(n) => reply.size(n),
            Err(_) => reply.error(to_errno(&EngineError::Range)),
        },
        Ok(data) if data.len() > size as usize => reply.error(to_errno(&EngineError::Range)),
        Ok(data) => reply.data(&data),
        Err(e) => reply.error(e),
    }
}

impl ScopeFs {
    pub(crate) fn do_setxattr(&self, ino: INodeNo, name: &OsStr, value: &[u8], flags: i32, reply: ReplyEmpty) {
        let r = call("setxattr", || -> Result<(), Failure> {
            let mode = xattr_mode(flags).map_err(Failure::Unsupported)?;
            Ok(self.engine.setxattr(ino.0, name.as_bytes(), value, mode)?)
        });
        reply_empty(reply, r);
    }

    pub(crate) fn do_getxattr(&self, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        reply_sized(reply, size, call("getxattr", || self.engine.getxattr(ino.0, name.as_bytes())));
    }

    pub(crate) fn do_listxattr(&self, ino: INodeNo, size: u32, reply: ReplyXattr) {
        reply_sized(reply, size, call("listxattr", || self.engine.listxattr(ino.0)));
    }

    pub(crate) fn do_removexattr(&self, ino: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        reply_empty(reply, call("removexattr", || self.engine.removexattr(ino.0, name.as_bytes())));
    }

    pub(crate) fn do_fallocate(
        &self,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        let r = call("fallocate", || -> Result<(), Failure> {
            let mode = alloc_mode(mode).map_err(Failure::Unsupported)?;
            Ok(self.engine.fallocate(ino.0, fh.0, offset, length, mode)?)
        });
        reply_empty(reply, r);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn setxattr_flags_map_to_modes() {
        assert_eq!(xattr_mode(0).unwrap(), XattrMode::Either);
        assert_eq!(xattr_mode(libc::XATTR_CREATE).unwrap(), XattrMode::Create);
        assert_eq!(xattr_mode(libc::XATTR_REPLACE).unwrap(), XattrMode::Replace);
        assert_eq!(xattr_mode(libc::XATTR_CREATE | libc::XATTR_REPLACE).unwrap(), XattrMode::CreateAndReplace);
        assert!(matches!(xattr_mode(8), Err(EngineError::Invalid(_))));
    }

    #[test]
    fn fallocate_modes_map_or_are_unsupported() {
        use libc::{FALLOC_FL_COLLAPSE_RANGE, FALLOC_FL_INSERT_RANGE, FALLOC_FL_KEEP_SIZE, FALLOC_FL_PUNCH_HOLE};
        assert_eq!(alloc_mode(0).unwrap(), AllocMode::Allocate { keep_size: false });
        assert_eq!(alloc_mode(FALLOC_FL_KEEP_SIZE).unwrap(), AllocMode::Allocate { keep_size: true });
        assert_eq!(alloc_mode(FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE).unwrap(), AllocMode::PunchHole);
        assert_eq!(alloc_mode(libc::FALLOC_FL_ZERO_RANGE).unwrap(), AllocMode::ZeroRange { keep_size: false });
        for m in [FALLOC_FL_PUNCH_HOLE, FALLOC_FL_COLLAPSE_RANGE, FALLOC_FL_INSERT_RANGE, 0x40] {
            assert!(matches!(alloc_mode(m), Err(EngineError::Unsupported(_))), "{m:#x}");
        }
    }
}
