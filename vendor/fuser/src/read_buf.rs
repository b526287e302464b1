use std::mem::align_of;

use crate::ll::fuse_abi as abi;
use crate::session::MAX_WRITE_SIZE;

/// Size of the buffer for reading a request from the kernel. Since the kernel may send
/// up to `MAX_WRITE_SIZE` bytes in a write request, we use that value plus some extra space.
pub(crate) const BUFFER_SIZE: usize = MAX_WRITE_SIZE + 4096;

/// A buffer for one request, page-aligned (so properly aligned for `fuse_in_header`).
///
/// scopefs patch: an anonymous mapping instead of `vec![0; BUFFER_SIZE]`. The zeroed `Vec`
/// was `memset` in full whenever the allocator served it from a reused heap (16 MiB per
/// buffer, per session thread and per mount handshake: resident memory and startup time that
/// grew with the number of mounts); a fresh mapping costs only the pages the kernel writes.
///
/// A buffer made with [`FuseReadBuf::resident`] has its first bytes present before its first
/// read, locked in memory when the process may lock them, and left out of forked children. The
/// kernel copies a request into the buffer inside `read(2)`; a page it must fault in there fails
/// the copy when the process has been sent `SIGKILL` meanwhile, and the kernel then ends the
/// request with `EIO` instead of handing it to the next server (`FUSE_NOTIFY_RESEND`): a program
/// would see `EIO` from a `write` because the server was killed. With the pages present (and
/// writable: not shared copy-on-write with a child) the copy cannot fail.
#[derive(Debug)]
pub(crate) struct FuseReadBuf {
    ptr: std::ptr::NonNull<u8>,
    len: usize,
}

// SAFETY: the mapping is owned by the buffer and used through `&mut self` only.
unsafe impl Send for FuseReadBuf {}

impl FuseReadBuf {
    /// A buffer of `BUFFER_SIZE` bytes whose first `resident` bytes (rounded up to whole pages,
    /// at most the buffer) are present before it is used: locked with `mlock(2)` when allowed,
    /// otherwise written once (present until memory pressure swaps them out). Returns the buffer
    /// and why its pages are not locked, if they are not.
    pub(crate) fn resident(resident: usize) -> (Self, std::io::Result<()>) {
        let buf = Self::new();
        let page = page_size::get();
        let len = resident.div_ceil(page).saturating_mul(page).min(buf.len);
        let base = buf.ptr.as_ptr();
        // SAFETY: advice on our own mapping: forked children get no copy of it, so this
        // process's pages never become copy-on-write (which a kernel write would have to fault).
        unsafe { libc::madvise(base.cast(), buf.len, libc::MADV_DONTFORK) };
        // SAFETY: locks (and so populates, writable: the mapping is private and writable) the
        // first `len` bytes of our own mapping.
        let locked = if len > 0 && unsafe { libc::mlock(base.cast(), len) } != 0 {
            Err(std::io::Error::last_os_error())
        } else {
            Ok(())
        };
        if locked.is_err() {
            for at in (0..len).step_by(page) {
                // SAFETY: `at < len <= buf.len`: a byte of our own writable mapping, which reads
                // as zero until the kernel writes a request there.
                unsafe { std::ptr::write_volatile(base.add(at), 0) };
            }
        }
        (buf, locked)
    }

    /// Creates a new `FuseReadBuf` of `BUFFER_SIZE` bytes.
    ///
    /// # Panics
    /// When the mapping cannot be made (out of address space), like an allocation failure.
    pub(crate) fn new() -> Self {
        // SAFETY: a fresh private anonymous mapping.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                BUFFER_SIZE,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert!(
            ptr != libc::MAP_FAILED,
            "cannot map a FUSE request buffer: {}",
            std::io::Error::last_os_error()
        );
        let ptr = std::ptr::NonNull::new(ptr.cast()).expect("mmap never returns null");
        debug_assert_eq!(ptr.as_ptr() as usize % align_of::<abi::fuse_in_header>(), 0);
        Self {
            ptr,
            len: BUFFER_SIZE,
        }
    }

    /// Returns a mutable reference to the (aligned) buffer.
    pub(crate) fn as_mut(&mut self) -> &mut [u8] {
        // SAFETY: the mapping is `len` bytes, readable and writable, owned by `self`.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for FuseReadBuf {
    fn drop(&mut self) {
        // SAFETY: unmaps the mapping made in `new`, once.
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}
