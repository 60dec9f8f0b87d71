//! Extended attributes (`-X`) and POSIX ACLs (`-A`, as their
//! `system.posix_acl_*` attributes), read at the sender and set at the
//! receiver, never following a symlink.

use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::Path;

use rustix::fs::{self as rfs, XattrFlags};

use crate::transfer::messages::{Xattr, XATTR_VALUE_MAX};

/// The ACL of a file (its access ACL) and the default ACL a directory
/// gives what is made in it.
pub(crate) const ACL_ACCESS: &[u8] = b"system.posix_acl_access";
pub(crate) const ACL_DEFAULT: &[u8] = b"system.posix_acl_default";

/// Bytes of an ACL that has only its three base entries (owner, group,
/// other: the mode): a 4-byte header and 8 bytes an entry
/// (linux/posix_acl_xattr.h). It carries nothing the mode does not.
const ACL_BASE_LEN: usize = 4 + 3 * 8;

/// Which attributes the sender reads.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Wanted {
    /// `-X`: `user.*`, and `security.*` / `trusted.*` where `root` (as
    /// rsync, whose non-root sender sends `user.*` alone).
    pub xattrs: bool,
    /// `-A`: the two ACL attributes.
    pub acls: bool,
    pub root: bool,
}

impl Wanted {
    /// Whether the attribute `name` goes with the plan.
    pub(crate) fn wants(&self, name: &[u8]) -> bool {
        if name == ACL_ACCESS || name == ACL_DEFAULT {
            self.acls
        } else if name.starts_with(b"user.") {
            self.xattrs
        } else if name.starts_with(b"security.") || name.starts_with(b"trusted.") {
            self.xattrs && self.root
        } else {
            false
        }
    }
}

/// Reads the attributes `wanted` names of open entries (whether a symlink
/// is followed was decided when it was opened: `--follow` sends what
/// links point to), into buffers kept from entry to entry: a tree of a
/// million files would otherwise zero 128 KiB for each.
pub(crate) struct Reader {
    wanted: Wanted,
    names: Vec<u8>,
    value: Vec<u8>,
}

impl Reader {
    pub(crate) fn new(wanted: Wanted) -> Reader {
        // Linux lists at most 64 KiB of names and holds values of at most
        // XATTR_SIZE_MAX: one buffer of each size always suffices.
        Reader {
            wanted,
            names: vec![0u8; 64 * 1024],
            value: vec![0u8; XATTR_VALUE_MAX],
        }
    }

    /// The attributes of what `fd` (an `O_PATH` descriptor, or any) is
    /// open on, through /proc's link to it, which leads to that inode
    /// whatever is at its path now (a symlink's own, for a descriptor of
    /// the link): there is no `flistxattr` for an `O_PATH` descriptor.
    pub(crate) fn read_fd(&mut self, fd: &impl AsRawFd) -> io::Result<Vec<Xattr>> {
        // None where the file system has none (EOPNOTSUPP).
        let path = format!("/proc/self/fd/{}", fd.as_raw_fd());
        let path = Path::new(&path);
        let listed = rfs::listxattr(path, &mut self.names[..]);
        let len = match listed {
            Ok(len) => len,
            Err(rustix::io::Errno::OPNOTSUPP) => return Ok(Vec::new()),
            Err(e) => return Err(e.into()),
        };
        let mut out = Vec::new();
        for name in self.names[..len]
            .split(|&b| b == 0)
            .filter(|n| !n.is_empty())
        {
            if !self.wanted.wants(name) {
                continue;
            }
            let got = rfs::getxattr(path, name, &mut self.value[..]);
            let n = match got {
                Ok(n) => n,
                // Removed since it was listed.
                Err(rustix::io::Errno::NODATA) => continue,
                Err(e) => return Err(e.into()),
            };
            if name == ACL_ACCESS && n <= ACL_BASE_LEN {
                continue;
            }
            out.push((name.to_vec(), self.value[..n].to_vec()));
        }
        Ok(out)
    }
}

/// Sets one attribute on the open file or directory `fd`.
pub(crate) fn set(fd: &impl AsFd, name: &[u8], value: &[u8]) -> io::Result<()> {
    rfs::fsetxattr(fd, name, value, XattrFlags::empty()).map_err(io::Error::from)
}

/// Sets one attribute on the entry `name` of the directory `dir`, not
/// following it (a symlink in the private staging directory, where no one
/// else can swap it): through /proc's link to `dir`, since Linux has no
/// `lsetxattrat`.
pub(crate) fn set_at(dir: &OwnedFd, name: &str, attr: &[u8], value: &[u8]) -> io::Result<()> {
    let path = format!("/proc/self/fd/{}/{name}", dir.as_raw_fd());
    rfs::lsetxattr(path.as_str(), attr, value, XattrFlags::empty()).map_err(io::Error::from)
}
