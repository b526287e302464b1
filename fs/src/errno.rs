//! The one mapping from a failed FUSE request (an `EngineError`, or a request this filesystem
//! does not implement) to the errno it answers.

use fuser::Errno;
use scopefs::engine::EngineError;

/// The raw errno for an engine error.
pub fn errno_code(err: &EngineError) -> i32 {
    // A full disk is told as such, whichever layer met it (a write of staging, SQLite, a log).
    if err.out_of_space() {
        return libc::ENOSPC;
    }
    match err {
        EngineError::NotFound => libc::ENOENT,
        EngineError::Exists => libc::EEXIST,
        EngineError::NotDir => libc::ENOTDIR,
        EngineError::IsDir => libc::EISDIR,
        EngineError::NotEmpty => libc::ENOTEMPTY,
        EngineError::NameTooLong | EngineError::PathTooLong => libc::ENAMETOOLONG,
        EngineError::TooManyEntries | EngineError::ListingTooLarge => libc::E2BIG,
        EngineError::Busy(_) | EngineError::ScopeBusy(_) => libc::EAGAIN,
        EngineError::InvalidName(_) | EngineError::Invalid(_) | EngineError::BadSymlinkTarget => libc::EINVAL,
        EngineError::NotPermitted(_) => libc::EPERM,
        EngineError::ReadOnly => libc::EROFS,
        // Only path writes that ask for it (never a FUSE operation) fail this way.
        EngineError::Changed => libc::EAGAIN,
        EngineError::QuotaExceeded(_) => libc::EDQUOT,
        EngineError::NoSpace => libc::ENOSPC,
        EngineError::TooLarge => libc::EFBIG,
        EngineError::BadHandle => libc::EBADF,
        EngineError::Unsupported(_) => libc::EOPNOTSUPP,
        EngineError::TooManyLinks => libc::EMLINK,
        EngineError::NoData => libc::ENODATA,
        EngineError::Range => libc::ERANGE,
        EngineError::ValueTooLarge => libc::E2BIG,
        EngineError::XattrsFull => libc::ENOSPC,
        EngineError::Store(_)
        | EngineError::Corrupt { .. }
        | EngineError::Metadata(_)
        | EngineError::Migration(_)
        | EngineError::Io(_)
        | EngineError::Poisoned(_)
        | EngineError::WriteLost => libc::EIO,
    }
}

/// The FUSE reply error for an engine error.
pub fn to_errno(err: &EngineError) -> Errno {
    Errno::from_i32(errno_code(err))
}

/// Why a FUSE request failed.
#[derive(Debug)]
pub enum Failure {
    /// The engine refused or failed the request.
    Engine(EngineError),
    /// A request with a flag, mode or file type this filesystem does not implement (e.g.
    /// `RENAME_WHITEOUT`): answered with the errno of the engine error it carries.
    Unsupported(EngineError),
    /// An operation this filesystem does not implement at all (`lseek`, `ioctl`, ...): `ENOSYS`,
    /// as fuser's defaults answer; the kernel then stops sending some of them.
    NotImplemented,
}

impl From<EngineError> for Failure {
    fn from(err: EngineError) -> Self {
        Failure::Engine(err)
    }
}

impl Failure {
    /// The FUSE reply error.
    pub fn errno(&self) -> Errno {
        match self {
            Failure::Engine(err) | Failure::Unsupported(err) => to_errno(err),
            Failure::NotImplemented => Errno::ENOSYS,
        }
    }
}

/// Whether the error is an internal failure (answered with `EIO`) worth a log line.
pub fn is_internal(err: &EngineError) -> bool {
    errno_code(err) == libc::EIO
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn namespace_errors_map_to_their_errno() {
        let cases: Vec<(EngineError, i32)> = vec![
            (EngineError::NotFound, libc::ENOENT),
            (EngineError::Exists, libc::EEXIST),
            (EngineError::NotDir, libc::ENOTDIR),
            (EngineError::IsDir, libc::EISDIR),
            (EngineError::NotEmpty, libc::ENOTEMPTY),
            (EngineError::NameTooLong, libc::ENAMETOOLONG),
            (EngineError::InvalidName("control character"), libc::EINVAL),
            (EngineError::Invalid("bad offset"), libc::EINVAL),
            (EngineError::BadSymlinkTarget, libc::EINVAL),
            (EngineError::NotPermitted("hard link"), libc::EPERM),
            (EngineError::ReadOnly, libc::EROFS),
            (EngineError::Changed, libc::EAGAIN),
            (EngineError::QuotaExceeded("bytes"), libc::EDQUOT),
            (EngineError::NoSpace, libc::ENOSPC),
            (EngineError::BadHandle, libc::EBADF),
            (EngineError::Unsupported("xattr"), libc::EOPNOTSUPP),
            (EngineError::NoData, libc::ENODATA),
            (EngineError::Range, libc::ERANGE),
            (EngineError::ValueTooLarge, libc::E2BIG),
            (EngineError::XattrsFull, libc::ENOSPC),
        ];
        for (err, code) in cases {
            assert_eq!(errno_code(&err), code, "{err:?}");
            assert_eq!(to_errno(&err).code(), code, "{err:?}");
            assert!(!is_internal(&err), "{err:?}");
        }
    }

    #[test]
    fn unsupported_requests_answer_their_errno_and_missing_operations_enosys() {
        assert_eq!(Failure::from(EngineError::NotFound).errno(), Errno::ENOENT);
        assert_eq!(Failure::Unsupported(EngineError::Invalid("rename flags")).errno(), Errno::EINVAL);
        assert_eq!(Failure::Unsupported(EngineError::Unsupported("fallocate mode")).errno(), Errno::EOPNOTSUPP);
        assert_eq!(Failure::NotImplemented.errno(), Errno::ENOSYS);
    }

    #[test]
    fn internal_failures_map_to_eio() {
        let cases = vec![
            EngineError::Corrupt { sha256: "00".repeat(32) },
            EngineError::Io(std::io::Error::other("disk")),
            EngineError::Store(scopefs::store::StoreError::Unavailable("down".into())),
            EngineError::Store(scopefs::store::StoreError::Timeout(std::time::Duration::from_secs(1))),
        ];
        for err in cases {
            assert_eq!(errno_code(&err), libc::EIO, "{err:?}");
            assert!(is_internal(&err));
        }
    }
}
