//! The ssh bootstrap's line protocol and punch datagram.
//!
//! `atou copy` with a remote end runs `ssh HOST atou __remote --hello
//! HELLO receive|send ...`, and the remote end answers with one line over
//! the ssh channel, which ssh has already authenticated and encrypted:
//!
//! ```text
//! local  -> remote   ATOU-BOOTSTRAP 2 <local public key>     (the argument of --hello)
//! remote -> local    ATOU-BOOTSTRAP 2 <udp port>[,<port>...] <remote public key> <server ip|-> [<punch token>]
//! remote -> local    ATOU-READY                      (pull: every port was punched)
//! local  -> remote   ATOU-BOOTSTRAP 2 send-to <ip:port|ssh> <receiver's public key>
//!                                                    (third-party copy: where the source sends)
//! ```
//!
//! The hello rides the command line rather than stdin: ssh sends a
//! channel's input only once the remote command has started, so a hello
//! on stdin cost the copy a round trip before the answer (0.1 s of a
//! 54 KB copy over 100 ms). It holds nothing secret (a public key, which
//! any user of the remote host may read in its process list); the punch
//! token, which is secret, is the remote's to draw and travels in its
//! answer. Keys and the token are base64 of 32 bytes. The keys are ephemeral, one
//! pair per run, and each end pins the other's: the UDP transfer is
//! authenticated by what came over ssh. In a pull the remote end sends,
//! from sockets the local end first reaches with a *punch* datagram
//! carrying the token, so that a NAT or stateful firewall in front of the
//! local end lets the transfer in (see docs/security.md, "The ssh
//! bootstrap, step by step").
//!
//! Pure functions, no I/O but [`bind_in_range`] and [`random_token`].

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, UdpSocket};

use base64::engine::general_purpose::STANDARD;
use base64::Engine;

use crate::proto::crypto::PublicKey;
use crate::transfer::remote::RemoteError;
use crate::transfer::Error;
// The remote end's words reach the user's terminal only escaped.
use crate::util::text::escape;

/// First word of both bootstrap lines.
pub const MAGIC: &str = "ATOU-BOOTSTRAP";
/// The bootstrap protocol's version; both ends must speak the same.
pub const VERSION: u32 = 2;
/// The remote's line, in a pull, once every port has been punched.
pub const READY: &str = "ATOU-READY";
/// Longest bootstrap line either end reads.
pub const MAX_LINE: usize = 4096;
/// A punch datagram: these bytes, then the 32-byte token.
const PUNCH_MAGIC: &[u8] = b"ATOU-PUNCH\x01";
/// Length of a punch datagram.
pub const PUNCH_LEN: usize = PUNCH_MAGIC.len() + 32;
/// Most ports (streams) one bootstrap line may carry.
pub const MAX_PORTS: usize = 64;

/// What the local end says first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hello {
    pub key: PublicKey,
}

/// What the remote end answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    /// The UDP ports it listens (push) or sends (pull) on.
    pub ports: Vec<u16>,
    pub key: PublicKey,
    /// The address the ssh client reached it on (`$SSH_CONNECTION`), if
    /// known: the host as ssh resolved it, ProxyJump and aliases included.
    pub addr: Option<IpAddr>,
    /// Pull only: what each punch datagram must carry, drawn by the
    /// remote end (the sender, whose sockets the punches open).
    pub token: Option<[u8; 32]>,
}

/// Where the source host of a third-party copy sends, said on its stdin
/// by the host that runs `atou copy` once the destination has answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SendTo {
    pub route: SendRoute,
    /// The receiver's one-time key, pinned: the source talks to nothing
    /// else.
    pub key: PublicKey,
}

/// The way a third-party copy's data goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SendRoute {
    /// Over UDP, straight to the receiver at this address.
    Udp(SocketAddr),
    /// Through the source's ssh channel, relayed by the host that runs
    /// `atou copy` (`--via-local`).
    Ssh,
}

/// The word before [`SendTo`]'s fields.
const SEND_TO_WORD: &str = "send-to";

fn b64(bytes: &[u8; 32]) -> String {
    STANDARD.encode(bytes)
}

/// A line that does not read as the bootstrap's, and why.
fn bad(why: impl Into<String>) -> Error {
    Error::Bootstrap(why.into())
}

fn unb64(what: &str, s: &str) -> Result<[u8; 32], Error> {
    let v = STANDARD
        .decode(s)
        .map_err(|_| bad(format!("the {what} is not base64")))?;
    <[u8; 32]>::try_from(v.as_slice()).map_err(|_| bad(format!("the {what} is not 32 bytes")))
}

/// Splits `MAGIC VERSION rest...`, checking both.
fn words(line: &str) -> Result<Vec<&str>, Error> {
    let line = line.strip_suffix('\n').unwrap_or(line);
    let line = line.strip_suffix('\r').unwrap_or(line);
    let w: Vec<&str> = line.split(' ').collect();
    if w.first() != Some(&MAGIC) {
        return Err(bad("not a bootstrap line"));
    }
    match w.get(1).map(|v| v.parse::<u32>()) {
        Some(Ok(VERSION)) => Ok(w),
        Some(Ok(v)) => Err(bad(format!(
            "bootstrap version {v}, this atou speaks {VERSION}; run the same atou release at both ends"
        ))),
        _ => Err(bad("no bootstrap version")),
    }
}

impl Hello {
    /// One line without its newline: a single argument of `--hello`.
    pub fn encode(&self) -> String {
        format!("{MAGIC} {VERSION} {}", b64(&self.key.0))
    }

    pub fn decode(line: &str) -> Result<Hello, Error> {
        let w = words(line)?;
        let [_, _, key] = w.as_slice() else {
            return Err(bad("a bootstrap hello has a key and nothing else"));
        };
        Ok(Hello {
            key: PublicKey(unb64("public key", key)?),
        })
    }
}

impl Answer {
    pub fn encode(&self) -> String {
        let ports: Vec<String> = self.ports.iter().map(u16::to_string).collect();
        let addr = self.addr.map_or("-".to_string(), |a| a.to_string());
        let token = self
            .token
            .map_or(String::new(), |t| format!(" {}", b64(&t)));
        format!(
            "{MAGIC} {VERSION} {} {} {addr}{token}\n",
            ports.join(","),
            b64(&self.key.0)
        )
    }

    pub fn decode(line: &str) -> Result<Answer, Error> {
        let w = words(line)?;
        let (ports, key, addr, token) = match w.as_slice() {
            [_, _, ports, key, addr] => (ports, key, addr, None),
            [_, _, ports, key, addr, token] => {
                (ports, key, addr, Some(unb64("punch token", token)?))
            }
            _ => {
                return Err(bad(
                    "a bootstrap answer has ports, a key, an address and at most a token",
                ))
            }
        };
        let ports: Vec<u16> = ports
            .split(',')
            .map(|p| match p.parse::<u16>() {
                Ok(p) if p > 0 => Ok(p),
                _ => Err(bad(format!("`{}` is not a UDP port", escape(p.as_bytes())))),
            })
            .collect::<Result<_, _>>()?;
        if ports.len() > MAX_PORTS {
            return Err(bad(format!("{} ports, at most {MAX_PORTS}", ports.len())));
        }
        let addr = match *addr {
            "-" => None,
            a => Some(
                a.parse()
                    .map_err(|_| bad(format!("`{}` is not an IP address", escape(a.as_bytes()))))?,
            ),
        };
        Ok(Answer {
            ports,
            key: PublicKey(unb64("public key", key)?),
            addr,
            token,
        })
    }
}

impl SendTo {
    pub fn encode(&self) -> String {
        let route = match self.route {
            SendRoute::Udp(addr) => addr.to_string(),
            SendRoute::Ssh => "ssh".to_string(),
        };
        format!(
            "{MAGIC} {VERSION} {SEND_TO_WORD} {route} {}\n",
            b64(&self.key.0)
        )
    }

    pub fn decode(line: &str) -> Result<SendTo, Error> {
        let w = words(line)?;
        let [_, _, SEND_TO_WORD, route, key] = w.as_slice() else {
            return Err(bad(
                "a send-to line has `send-to`, an address or `ssh`, and a key",
            ));
        };
        let route = match *route {
            "ssh" => SendRoute::Ssh,
            a => SendRoute::Udp(a.parse().map_err(|_| {
                bad(format!(
                    "`{}` is not an IP address and port",
                    escape(a.as_bytes())
                ))
            })?),
        };
        Ok(SendTo {
            route,
            key: PublicKey(unb64("public key", key)?),
        })
    }
}

/// The server's own address in `$SSH_CONNECTION` (`client-ip client-port
/// server-ip server-port`): the address the ssh client connected to.
pub fn ssh_server_ip(ssh_connection: &str) -> Option<IpAddr> {
    let ip: IpAddr = ssh_connection
        .split_ascii_whitespace()
        .nth(2)?
        .parse()
        .ok()?;
    // An IPv4 client on a dual-stack sshd shows as ::ffff:a.b.c.d.
    Some(match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    })
}

/// A punch datagram carrying `token`.
pub fn punch(token: &[u8; 32]) -> Vec<u8> {
    let mut d = PUNCH_MAGIC.to_vec();
    d.extend_from_slice(token);
    d
}

/// Whether `datagram` is a punch carrying `token`, compared in constant
/// time (a guess learns nothing from how long the answer took).
pub fn is_punch(datagram: &[u8], token: &[u8; 32]) -> bool {
    if datagram.len() != PUNCH_LEN || !datagram.starts_with(PUNCH_MAGIC) {
        return false;
    }
    let diff = datagram[PUNCH_MAGIC.len()..]
        .iter()
        .zip(token)
        .fold(0u8, |acc, (a, b)| acc | (a ^ b));
    std::hint::black_box(diff) == 0
}

/// 32 bytes from the OS's CSPRNG.
pub fn random_token() -> Result<[u8; 32], RemoteError> {
    use ring::rand::SecureRandom;
    let mut t = [0; 32];
    ring::rand::SystemRandom::new()
        .fill(&mut t)
        .map_err(|_| RemoteError::Failed("the system's random number generator failed".into()))?;
    Ok(t)
}

/// `--port LOW[-HIGH]`: UDP ports to bind, 0 for any.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PortRange {
    pub low: u16,
    pub high: u16,
}

impl PortRange {
    /// Any port the kernel picks.
    pub const ANY: PortRange = PortRange { low: 0, high: 0 };
}

impl std::fmt::Display for PortRange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.low == self.high {
            write!(f, "{}", self.low)
        } else {
            write!(f, "{}-{}", self.low, self.high)
        }
    }
}

impl std::str::FromStr for PortRange {
    type Err = String;

    fn from_str(s: &str) -> Result<PortRange, String> {
        let port = |p: &str| {
            p.trim()
                .parse::<u16>()
                .map_err(|_| format!("`{p}` is not a UDP port (0 to 65535)"))
        };
        let (low, high) = match s.split_once('-') {
            Some((l, h)) => (port(l)?, port(h)?),
            None => (port(s)?, port(s)?),
        };
        if low > high || (low == 0 && high != 0) {
            return Err(format!(
                "`{s}` is not a port range LOW-HIGH with 1 <= LOW <= HIGH (or 0 for any)"
            ));
        }
        Ok(PortRange { low, high })
    }
}

/// Binds `count` UDP sockets on `ip`'s wildcard address, each on the
/// first free port of `range` (any port for 0).
pub fn bind_in_range(
    ip: IpAddr,
    range: PortRange,
    count: usize,
) -> Result<Vec<UdpSocket>, RemoteError> {
    let any: IpAddr = match ip {
        IpAddr::V4(_) => Ipv4Addr::UNSPECIFIED.into(),
        IpAddr::V6(_) => Ipv6Addr::UNSPECIFIED.into(),
    };
    let mut out = Vec::with_capacity(count);
    let mut next = range.low;
    while out.len() < count {
        if range.low == 0 {
            let s = UdpSocket::bind(SocketAddr::new(any, 0))
                .map_err(|e| RemoteError::Failed(format!("cannot open a UDP socket: {e}")))?;
            out.push(s);
            continue;
        }
        loop {
            if next > range.high || next == 0 {
                return Err(RemoteError::Failed(format!(
                    "no free UDP port in --port {range} for {count} socket{} \
                     (one per stream); widen the range",
                    if count == 1 { "" } else { "s" }
                )));
            }
            let p = next;
            next = next.wrapping_add(1);
            if let Ok(s) = UdpSocket::bind(SocketAddr::new(any, p)) {
                out.push(s);
                break;
            }
        }
    }
    Ok(out)
}

/// `[USER@]HOST:PATH` (scp's form; an IPv6 address in brackets) split
/// into what ssh is given (`[USER@]HOST`) and PATH.
pub fn split_ssh_target(s: &str) -> Result<(String, String), RemoteError> {
    let usage = |why: String| RemoteError::Usage(why);
    let (user, rest) = match s.split_once('@') {
        Some((u, r)) if !u.contains(':') && !u.contains('/') => (Some(u), r),
        _ => (None, s),
    };
    let (host, path) = if let Some(inner) = rest.strip_prefix('[') {
        let (addr, after) = inner
            .split_once(']')
            .ok_or_else(|| usage(format!("`{s}`: an IPv6 address needs its closing `]`")))?;
        let path = after
            .strip_prefix(':')
            .ok_or_else(|| usage(format!("`{s}`: a `:` must follow `[{addr}]`")))?;
        (addr.to_string(), path)
    } else {
        let (h, p) = rest
            .split_once(':')
            .ok_or_else(|| usage(format!("`{s}` is not [USER@]HOST:PATH")))?;
        (h.to_string(), p)
    };
    if host.is_empty() {
        return Err(usage(format!("`{s}` names no host")));
    }
    let target = match user {
        Some("") => return Err(usage(format!("`{s}` names an empty user"))),
        Some(u) => format!("{u}@{host}"),
        None => host,
    };
    Ok((target, path.to_string()))
}

/// `s` quoted for the remote shell ssh runs the command with.
pub fn shell_quote(s: &str) -> String {
    if !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_./=,:@+%".contains(&b))
    {
        return s.to_string();
    }
    format!("'{}'", s.replace('\'', r"'\''"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(b: u8) -> PublicKey {
        PublicKey([b; 32])
    }

    #[test]
    fn lines_round_trip() {
        let h = Hello { key: key(1) };
        assert!(!h.encode().contains('\n'), "one argument, one line");
        assert_eq!(Hello::decode(&h.encode()).unwrap(), h);
        for a in [
            Answer {
                ports: vec![40000],
                key: key(3),
                addr: Some("192.0.2.1".parse().unwrap()),
                token: None,
            },
            Answer {
                ports: vec![1, 2, 65535],
                key: key(4),
                addr: None,
                token: Some([7; 32]),
            },
            Answer {
                ports: vec![9],
                key: key(5),
                addr: Some("2001:db8::1".parse().unwrap()),
                token: Some([8; 32]),
            },
        ] {
            assert_eq!(Answer::decode(&a.encode()).unwrap(), a);
        }
    }

    #[test]
    fn send_to_lines_round_trip_and_refuse_what_is_not_one() {
        for route in [
            SendRoute::Udp("192.0.2.7:40000".parse().unwrap()),
            SendRoute::Udp("[2001:db8::2]:9".parse().unwrap()),
            SendRoute::Ssh,
        ] {
            let s = SendTo { route, key: key(6) };
            assert!(s.encode().ends_with('\n') && s.encode().matches('\n').count() == 1);
            assert_eq!(SendTo::decode(&s.encode()).unwrap(), s);
        }
        let good = SendTo {
            route: SendRoute::Ssh,
            key: key(6),
        }
        .encode();
        assert!(SendTo::decode(&good.replace("send-to", "sendto")).is_err());
        assert!(SendTo::decode(&good.replace(" ssh ", " host:1 ")).is_err());
        assert!(SendTo::decode(&good.replace(" ssh ", " 192.0.2.7 ")).is_err());
        assert!(SendTo::decode(&good.replace(" ssh ", " ")).is_err());
        assert!(SendTo::decode(&format!("{} x", good.trim_end())).is_err());
        // An answer is not an order.
        let answer = Answer {
            ports: vec![5],
            key: key(1),
            addr: None,
            token: None,
        };
        assert!(SendTo::decode(&answer.encode()).is_err());
    }

    #[test]
    fn bad_lines_are_refused() {
        assert!(Hello::decode("hello").is_err());
        assert!(Hello::decode("ATOU-BOOTSTRAP 1 AAAA")
            .unwrap_err()
            .to_string()
            .contains("version 1"));
        assert!(Hello::decode("ATOU-BOOTSTRAP 2 AAAA").is_err());
        let two_words = format!("{} {}", Hello { key: key(1) }.encode(), b64(&[7; 32]));
        assert!(Hello::decode(&two_words).is_err(), "a hello holds no token");
        let good = Answer {
            ports: vec![5],
            key: key(1),
            addr: None,
            token: None,
        }
        .encode();
        assert!(Answer::decode(&good.replace(" -", " - AAAA")).is_err());
        assert!(Answer::decode(&good.replace(" 5 ", " 0 ")).is_err());
        assert!(Answer::decode(&good.replace(" 5 ", " 70000 ")).is_err());
        assert!(Answer::decode(&good.replace(" -", " nope")).is_err());
        assert!(Answer::decode(&good.replace(" -", "")).is_err());
    }

    #[test]
    fn a_hostile_answer_cannot_put_control_characters_in_the_message() {
        let good = Answer {
            ports: vec![5],
            key: key(1),
            addr: None,
            token: None,
        }
        .encode();
        for bad in [
            good.replace(" 5 ", " 5\x1b[2J "),
            good.replace(" -", " \x1b]0;owned\x07"),
        ] {
            let why = Answer::decode(&bad).unwrap_err().to_string();
            assert!(!why.chars().any(|c| c.is_control()), "{why:?}");
        }
    }

    #[test]
    fn ssh_connection_gives_the_servers_address() {
        assert_eq!(
            ssh_server_ip("10.0.0.1 51234 10.0.0.2 22"),
            Some("10.0.0.2".parse().unwrap())
        );
        assert_eq!(
            ssh_server_ip("::ffff:10.0.0.1 5 ::ffff:127.0.0.1 22"),
            Some("127.0.0.1".parse().unwrap())
        );
        assert_eq!(
            ssh_server_ip("2001:db8::1 5 2001:db8::2 22"),
            Some("2001:db8::2".parse().unwrap())
        );
        assert_eq!(ssh_server_ip(""), None);
        assert_eq!(ssh_server_ip("a b c d"), None);
    }

    #[test]
    fn a_punch_needs_the_exact_token() {
        let t = [9; 32];
        assert!(is_punch(&punch(&t), &t));
        let mut other = t;
        other[31] ^= 1;
        assert!(!is_punch(&punch(&other), &t));
        assert!(!is_punch(&punch(&t)[..PUNCH_LEN - 1], &t));
        let mut long = punch(&t);
        long.push(0);
        assert!(!is_punch(&long, &t));
        assert!(!is_punch(&[0; PUNCH_LEN], &t));
        assert_ne!(random_token().unwrap(), random_token().unwrap());
    }

    #[test]
    fn port_ranges() {
        let r = |s: &str| s.parse::<PortRange>();
        assert_eq!(r("0").unwrap(), PortRange::ANY);
        assert_eq!(
            r("7000").unwrap(),
            PortRange {
                low: 7000,
                high: 7000
            }
        );
        assert_eq!(
            r("7000-7010").unwrap(),
            PortRange {
                low: 7000,
                high: 7010
            }
        );
        assert!(r("7010-7000").is_err());
        assert!(r("0-10").is_err());
        assert!(r("x").is_err());
        assert!(r("70000").is_err());
        assert_eq!(r("7000-7010").unwrap().to_string(), "7000-7010");
    }

    #[test]
    fn binding_in_a_range_takes_free_ports_in_it() {
        let ip: IpAddr = Ipv4Addr::LOCALHOST.into();
        let any = bind_in_range(ip, PortRange::ANY, 2).unwrap();
        assert_eq!(any.len(), 2);
        // A range of one port already taken: a clear error.
        let taken = any[0].local_addr().unwrap().port();
        let range = PortRange {
            low: taken,
            high: taken,
        };
        assert!(bind_in_range(ip, range, 1)
            .unwrap_err()
            .to_string()
            .contains("no free UDP port"));
    }

    #[test]
    fn ssh_targets() {
        let t = |s: &str| split_ssh_target(s).unwrap();
        assert_eq!(t("h:x"), ("h".into(), "x".into()));
        assert_eq!(t("u@h:/a/b"), ("u@h".into(), "/a/b".into()));
        assert_eq!(t("h:"), ("h".into(), "".into()));
        assert_eq!(t("[::1]:d"), ("::1".into(), "d".into()));
        assert_eq!(t("u@[::1]:d:e"), ("u@::1".into(), "d:e".into()));
        assert!(split_ssh_target(":x").is_err());
        assert!(split_ssh_target("@h:x").is_err());
        assert!(split_ssh_target("[::1]x").is_err());
    }

    #[test]
    fn quoting_for_the_remote_shell() {
        assert_eq!(shell_quote("a/b.c"), "a/b.c");
        assert_eq!(shell_quote("a b"), "'a b'");
        assert_eq!(shell_quote("it's"), r"'it'\''s'");
        assert_eq!(shell_quote(""), "''");
        assert_eq!(shell_quote("$HOME;rm"), "'$HOME;rm'");
    }
}
