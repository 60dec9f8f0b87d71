//! File-system facts the standard library does not give.

use std::ffi::CString;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// The size in bytes of the file system holding `path` (statvfs(3):
/// blocks times fragment size).
pub fn filesystem_size(path: &Path) -> io::Result<u64> {
    let c_path = CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "a path with a NUL byte"))?;
    // SAFETY: statvfs is plain old data; all-zero is a valid value.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: c_path is a valid NUL-terminated string and st a valid,
    // writable statvfs that outlives the call.
    if unsafe { libc::statvfs(c_path.as_ptr(), &mut st) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(st.f_blocks.saturating_mul(st.f_frsize))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_root_file_system_has_a_size_and_a_missing_path_is_an_error() {
        assert!(filesystem_size(Path::new("/")).unwrap() > 0);
        assert!(filesystem_size(Path::new("/no/such/path/here")).is_err());
    }
}
