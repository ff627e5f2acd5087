//! A host tap device: the host end of a VM's virtio-net. Hand-written because it is one
//! TUNSETIFF and three address ioctls; the crates that wrap them (`tun`, `tun-tap`) bring an
//! async stack or a different fd model that the device's one poll thread does not need. The tap
//! is not persistent: it goes away with the VMM process that made it, so the enclave's removal
//! removes it.

use std::fs::{File, OpenOptions};
use std::io::{self, Read, Write};
use std::net::Ipv4Addr;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt;

use super::virtio_net::NetBackend;

/// TUNSETIFF, _IOW('T', 202, int).
const TUNSETIFF: libc::c_ulong = 0x4004_54ca;
const IFF_TAP: i16 = 0x0002;
const IFF_NO_PI: i16 = 0x1000;
/// struct ifreq: the name, then a 24-byte union (flags, or a sockaddr).
const IFREQ_LEN: usize = 40;

#[derive(Debug)]
pub struct Tap {
    file: File,
    name: String,
}

fn ifreq(name: &str) -> io::Result<[u8; IFREQ_LEN]> {
    if name.is_empty() || name.len() >= libc::IFNAMSIZ || name.contains(['/', ' ', '\0']) {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, format!("{name:?} is not an interface name (1-15 characters)")));
    }
    let mut req = [0u8; IFREQ_LEN];
    req[..name.len()].copy_from_slice(name.as_bytes());
    Ok(req)
}

fn ioctl(fd: BorrowedFd<'_>, request: libc::c_ulong, req: &mut [u8; IFREQ_LEN], what: &str) -> io::Result<()> {
    // SAFETY: every request used here reads or writes a struct ifreq, which `req` is in size.
    if unsafe { libc::ioctl(fd.as_raw_fd(), request, req.as_mut_ptr()) } < 0 {
        let e = io::Error::last_os_error();
        return Err(io::Error::new(e.kind(), format!("{what}: {e}")));
    }
    Ok(())
}

/// An ifreq carrying an AF_INET sockaddr in its union.
fn ifreq_addr(name: &str, addr: Ipv4Addr) -> io::Result<[u8; IFREQ_LEN]> {
    let mut req = ifreq(name)?;
    req[16..18].copy_from_slice(&(libc::AF_INET as u16).to_ne_bytes());
    req[20..24].copy_from_slice(&addr.octets());
    Ok(req)
}

impl Tap {
    /// Creates (or attaches to) the tap `name`, non-blocking, frames without packet info. With
    /// `host` (address, prefix length), gives the host end that address and brings it up.
    pub fn open(name: &str, host: Option<(Ipv4Addr, u8)>) -> io::Result<Tap> {
        let mut req = ifreq(name)?;
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
            .open("/dev/net/tun")
            .map_err(|e| io::Error::new(e.kind(), format!("/dev/net/tun: {e}")))?;
        req[16..18].copy_from_slice(&(IFF_TAP | IFF_NO_PI).to_ne_bytes());
        ioctl(file.as_fd(), TUNSETIFF, &mut req, &format!("tap {name}"))?;
        if let Some((addr, prefix)) = host {
            configure(name, addr, prefix)?;
            confine(name)?;
        }
        Ok(Tap { file, name: name.to_string() })
    }

    pub fn name(&self) -> &str {
        &self.name
    }
}

/// Gives the interface an IPv4 address and netmask and sets it up.
fn configure(name: &str, addr: Ipv4Addr, prefix: u8) -> io::Result<()> {
    if prefix > 32 {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, format!("prefix length {prefix} is over 32")));
    }
    // SAFETY: plain socket(2); the result is checked and owned at once.
    let raw = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if raw < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `raw` is a fresh descriptor nobody else owns.
    let sock = unsafe { OwnedFd::from_raw_fd(raw) };
    let mask = Ipv4Addr::from(u32::MAX.checked_shl(32 - prefix as u32).unwrap_or(0));
    ioctl(sock.as_fd(), libc::SIOCSIFADDR, &mut ifreq_addr(name, addr)?, &format!("address {addr} on {name}"))?;
    ioctl(sock.as_fd(), libc::SIOCSIFNETMASK, &mut ifreq_addr(name, mask)?, &format!("netmask /{prefix} on {name}"))?;
    let mut req = ifreq(name)?;
    ioctl(sock.as_fd(), libc::SIOCGIFFLAGS, &mut req, &format!("flags of {name}"))?;
    let flags = i16::from_ne_bytes([req[16], req[17]]) | libc::IFF_UP as i16;
    req[16..18].copy_from_slice(&flags.to_ne_bytes());
    ioctl(sock.as_fd(), libc::SIOCSIFFLAGS, &mut req, &format!("bringing {name} up"))
}

/// Keeps the guest on its link: what it sends is never forwarded from the tap (even on a host
/// that forwards between its other interfaces), a source address outside the tap's subnet is
/// dropped (strict reverse-path filter), and there is no IPv6 on it (no link-local address the
/// host did not give).
fn confine(name: &str) -> io::Result<()> {
    for (setting, value) in [("ipv4/conf/{}/forwarding", "0"), ("ipv4/conf/{}/rp_filter", "1"), ("ipv6/conf/{}/disable_ipv6", "1")] {
        let path = format!("/proc/sys/net/{}", setting.replace("{}", name));
        // A host without IPv6 has nothing to turn off.
        if setting.starts_with("ipv6") && !std::path::Path::new(&path).exists() {
            continue;
        }
        std::fs::write(&path, value).map_err(|e| io::Error::new(e.kind(), format!("{path}: {e}")))?;
    }
    Ok(())
}

impl AsFd for Tap {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.file.as_fd()
    }
}

impl NetBackend for Tap {
    fn send(&mut self, frame: &[u8]) -> io::Result<()> {
        self.file.write(frame).map(drop)
    }

    fn recv(&mut self, buf: &mut [u8]) -> io::Result<Option<usize>> {
        match self.file.read(buf) {
            Ok(n) => Ok(Some(n)),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(None),
            Err(e) => Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_names_are_refused_before_any_ioctl() {
        for name in ["", "a-name-far-too-long", "a/b"] {
            assert!(Tap::open(name, None).unwrap_err().to_string().contains("not an interface name"), "{name}");
        }
    }
}
