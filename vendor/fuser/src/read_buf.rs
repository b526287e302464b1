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
#[derive(Debug)]
pub(crate) struct FuseReadBuf {
    ptr: std::ptr::NonNull<u8>,
    len: usize,
}

// SAFETY: the mapping is owned by the buffer and used through `&mut self` only.
unsafe impl Send for FuseReadBuf {}

impl FuseReadBuf {
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
