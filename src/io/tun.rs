//! A TUN device: IP packets in and out of a file descriptor.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;

/// An open TUN device (no packet-information header: each read is one IP
/// packet). Closing it removes the device.
pub(crate) struct Tun {
    file: File,
    name: String,
}

impl Tun {
    /// Creates the TUN device `name` in the caller's network namespace.
    pub(crate) fn create(name: &str) -> io::Result<Tun> {
        if name.is_empty() || name.len() >= libc::IFNAMSIZ || name.contains('/') {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("`{name}` is not a valid interface name (1 to 15 characters)"),
            ));
        }
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .open("/dev/net/tun")
            .map_err(|e| io::Error::new(e.kind(), format!("/dev/net/tun: {e}")))?;
        // SAFETY: ifreq is plain old data; all-zero is a valid value.
        let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
        for (dst, src) in req.ifr_name.iter_mut().zip(name.bytes()) {
            *dst = src as libc::c_char;
        }
        req.ifr_ifru.ifru_flags = (libc::IFF_TUN | libc::IFF_NO_PI) as libc::c_short;
        // SAFETY: TUNSETIFF on the fd just opened, with a pointer to a live,
        // NUL-terminated ifreq; the kernel reads it and may write the name.
        let rc = unsafe { libc::ioctl(file.as_raw_fd(), libc::TUNSETIFF, &mut req) };
        if rc != 0 {
            let e = io::Error::last_os_error();
            return Err(io::Error::new(e.kind(), format!("TUNSETIFF {name}: {e}")));
        }
        Ok(Tun {
            file,
            name: name.to_string(),
        })
    }

    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    /// A second handle on the same device, for a reader and a writer on
    /// different threads.
    pub(crate) fn try_clone(&self) -> io::Result<Tun> {
        Ok(Tun {
            file: self.file.try_clone()?,
            name: self.name.clone(),
        })
    }

    /// Reads one packet (blocking).
    pub(crate) fn recv(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        io::Read::read(&mut self.file, buf)
    }

    /// Writes one packet.
    pub(crate) fn send(&mut self, packet: &[u8]) -> io::Result<usize> {
        io::Write::write(&mut self.file, packet)
    }
}
