//! Key flags: what a client proves and pins, what a server accepts
//! (docs/security.md).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Result;
use clap::Args;

use crate::config::keys::{
    self, KnownHosts, Strictness, Verified, AUTHORIZED_KEYS_FILE, IDENTITY_FILE, KNOWN_HOSTS_FILE,
};
use crate::proto::crypto::{
    format_public_key, parse_public_key, AuthorizedKeys, Cipher, ClientAuth, PublicKey, ServerAuth,
    StaticKeypair,
};

use super::net::runtime;
use super::UsageError;

/// How long a first connection waits for the server to tell its key.
const KEY_QUERY_WAIT: Duration = Duration::from_secs(5);

#[derive(Args, Debug, Clone)]
#[command(next_help_heading = "Authentication and encryption")]
pub(super) struct ClientAuthArgs {
    /// This client's private key (default: $XDG_CONFIG_HOME/atou/id_x25519 or ~/.config/atou/id_x25519, made by `atou keygen`; without one, a key made for this run, which only servers that accept any key take)
    #[arg(long, value_name = "FILE")]
    identity: Option<PathBuf>,
    /// The server's public key, pinned: `atou-x25519 BASE64`, the base64 alone, or a file holding it (the server prints it at start); known_hosts is then not consulted
    #[arg(long, value_name = "KEY|FILE")]
    server_key: Option<String>,
    /// Where servers' keys are recorded on first use and checked after, as ssh's known_hosts (default: $XDG_CONFIG_HOME/atou/known_hosts or ~/.config/atou/known_hosts)
    #[arg(long, value_name = "FILE")]
    known_hosts: Option<PathBuf>,
    /// Packet cipher: aes-256-gcm, chacha20-poly1305, or auto (AES-256-GCM where the CPU has AES instructions, else ChaCha20-Poly1305)
    #[arg(long, value_name = "CIPHER", default_value = "auto", value_parser = parse_cipher)]
    cipher: Cipher,
    /// Where the data sent is sealed and sent from: off (the protocol's thread) or on (a thread of its own, a batch at a time, so that the protocol's thread does neither the AEAD work nor the send's copy; a copy to a local directory opens it on one too; experimental: slower where two cores run both ends, see docs/security.md)
    #[arg(
        long,
        value_name = "WHERE",
        default_value = "off",
        value_enum,
        hide_possible_values = true
    )]
    seal_thread: crate::io::SealAside,
    /// No authentication and no encryption, for a server run with --no-auth on a network you trust
    #[arg(long, conflicts_with_all = ["identity", "server_key", "known_hosts"])]
    no_auth: bool,
    /// Load key files even if group/others can write them (sshd's StrictModes no); default: refuse
    #[arg(long)]
    no_strict_modes: bool,
}

/// `--no-strict-modes`, as [`keys`] takes it.
fn strictness(no_strict_modes: bool) -> Strictness {
    if no_strict_modes {
        Strictness::Lax
    } else {
        Strictness::Strict
    }
}

fn parse_cipher(s: &str) -> Result<Cipher, crate::proto::crypto::protect::UnknownCipher> {
    s.parse()
}

impl ClientAuthArgs {
    pub(super) fn no_auth(&self) -> bool {
        self.no_auth
    }

    /// Sets `--seal-thread` for this process's connections.
    pub(super) fn choose_threads(&self) {
        self.seal_thread.choose();
    }

    /// Fresh keys for both ends of a transfer this process runs itself
    /// (`atou copy` to a local directory): nobody else holds either key,
    /// so no other local user can join the loopback receiver.
    pub(super) fn ephemeral_pair(&self) -> Result<(ClientAuth, ServerAuth)> {
        let gen =
            || StaticKeypair::generate().map_err(|e| anyhow::anyhow!("cannot make a key: {e}"));
        let (client, server) = (gen()?, gen()?);
        let line = format_public_key(&client.public(), "this atou copy") + "\n";
        let authorized = AuthorizedKeys::parse(line.as_bytes())?;
        Ok((
            ClientAuth {
                identity: client,
                server_key: server.public(),
                cipher: self.cipher,
            },
            ServerAuth {
                identity: Some(server),
                authorized: Some(Arc::new(authorized)),
                allow_plain: false,
            },
        ))
    }

    /// Keys for a connection to `host` (as the user named it) at `peer`;
    /// `None` with --no-auth. A server seen for the first time is asked
    /// for its key, which is recorded in known_hosts and said so.
    ///
    /// `plain_if_keyless`: a server that has no key is used unauthenticated
    /// (said on stderr) instead of refused; for probes, whose test pattern
    /// is nobody's secret.
    ///
    /// `maxidle` bounds the wait for the server's key (at most 5 s).
    pub(super) fn resolve(
        &self,
        host: &str,
        peer: SocketAddr,
        maxidle: Duration,
        plain_if_keyless: bool,
    ) -> Result<Option<ClientAuth>> {
        if self.no_auth {
            return Ok(None);
        }
        let identity = self.identity()?;
        let server_key = match &self.server_key {
            Some(k) => read_key_arg(k, strictness(self.no_strict_modes))?,
            None => match self.known_server_key(host, peer, maxidle) {
                Ok(k) => k,
                Err(e)
                    if plain_if_keyless
                        && matches!(
                            e.downcast_ref::<crate::io::ProbeError>(),
                            Some(crate::io::ProbeError::Conn {
                                error: crate::proto::ConnError::NoIdentity,
                                ..
                            })
                        ) =>
                {
                    // The "no key" answer is not authenticated: a host whose
                    // key is recorded never falls back to cleartext on it.
                    if let Some((recorded, path)) = self.recorded_key(host)? {
                        return Err(UsageError(format!(
                            "{host} answered that it has no key, but {} records its key {}: \
                             someone may be intercepting the connection, or the server lost \
                             its key; refusing to go on unauthenticated (--no-auth to do so \
                             knowingly)",
                            path.display(),
                            format_public_key(&recorded, "")
                        ))
                        .into());
                    }
                    eprintln!(
                        "atou: {host} has no key: this probe is unauthenticated and unencrypted"
                    );
                    return Ok(None);
                }
                Err(e) => return Err(e),
            },
        };
        Ok(Some(ClientAuth {
            identity,
            server_key,
            cipher: self.cipher,
        }))
    }

    fn identity(&self) -> Result<StaticKeypair> {
        let strict = strictness(self.no_strict_modes);
        if let Some(path) = &self.identity {
            return Ok(keys::read_identity(path, strict)?);
        }
        let default = keys::config_dir().ok().map(|d| d.join(IDENTITY_FILE));
        match default {
            Some(path) if path.exists() => Ok(keys::read_identity(&path, strict)?),
            _ => Ok(StaticKeypair::generate()
                .map_err(|e| anyhow::anyhow!("cannot make a key for this run: {e}"))?),
        }
    }

    /// The key known_hosts records for `host`, and the file's path.
    fn recorded_key(&self, host: &str) -> Result<Option<(PublicKey, PathBuf)>> {
        let path = match &self.known_hosts {
            Some(p) => p.clone(),
            None => keys::config_dir()?.join(KNOWN_HOSTS_FILE),
        };
        let known = KnownHosts::load(&path, strictness(self.no_strict_modes))?;
        Ok(known.lookup(host).map(|k| (k, path)))
    }

    fn known_server_key(
        &self,
        host: &str,
        peer: SocketAddr,
        maxidle: Duration,
    ) -> Result<PublicKey> {
        let wait = if maxidle.is_zero() {
            KEY_QUERY_WAIT
        } else {
            maxidle.min(KEY_QUERY_WAIT)
        };
        let path = match &self.known_hosts {
            Some(p) => p.clone(),
            None => keys::config_dir()?.join(KNOWN_HOSTS_FILE),
        };
        let mut known = KnownHosts::load(&path, strictness(self.no_strict_modes))?;
        // Asked even when recorded (one round trip): a changed key is then
        // refused with the file and line to edit, as ssh does, instead of
        // a handshake that goes unanswered.
        let key = runtime()?.block_on(crate::io::query_server_key(peer, wait))?;
        // The answer is not authenticated: a recorded key decides, and a
        // different one is refused (ssh's rule); the handshake then proves
        // the server holds the key.
        match known.verify(host, &key)? {
            Verified::Matched => {}
            Verified::Recorded => eprintln!(
                "atou: first connection to {host}: recorded its key {} in {} (check it against \
                 what `atou serve` printed there; a later change will be refused)",
                format_public_key(&key, ""),
                path.display()
            ),
        }
        Ok(key)
    }
}

/// `--server-key`: a key, or a file whose first word pair is one.
fn read_key_arg(arg: &str, strict: Strictness) -> Result<PublicKey> {
    if let Ok(k) = parse_public_key(arg) {
        return Ok(k);
    }
    let path = Path::new(arg);
    if path.exists() {
        let bytes = keys::read_pinned_key_file(path, strict)
            .map_err(|e| UsageError(format!("--server-key: {e}")))?;
        let text = String::from_utf8_lossy(&bytes);
        let line = text.lines().next().unwrap_or("");
        return parse_public_key(line).map_err(|e| {
            UsageError(format!(
                "--server-key {}: not an atou public key: {e}",
                path.display()
            ))
            .into()
        });
    }
    Err(UsageError(format!(
        "--server-key `{}` is neither an atou public key (`atou-x25519 BASE64`) nor a file",
        crate::util::text::escape(arg.as_bytes())
    ))
    .into())
}

#[derive(Args, Debug, Clone)]
#[command(next_help_heading = "Authentication and encryption")]
pub(super) struct ServeAuthArgs {
    /// The server's private key (default: $XDG_CONFIG_HOME/atou/id_x25519 or ~/.config/atou/id_x25519; make one with `atou keygen`); its public key is printed at start for clients to pin
    #[arg(long, value_name = "FILE")]
    identity: Option<PathBuf>,
    /// Client keys allowed, one `[OPTIONS] atou-x25519 BASE64 [COMMENT]` per line; OPTIONS `subdir=PATH` (the key writes only beneath PATH in DEST), `overwrite` and `delete` (the key may ask --overwrite or --delete where the server allows it) (default: $XDG_CONFIG_HOME/atou/authorized_keys or ~/.config/atou/authorized_keys). Required with --dir unless --no-auth
    #[arg(long, value_name = "FILE")]
    authorized_keys: Option<PathBuf>,
    /// Serve unauthenticated, unencrypted clients too: anyone who can send UDP here may write into --dir. Only on a network you trust
    #[arg(long)]
    no_auth: bool,
    /// Load key files even if group/others can write them (sshd's StrictModes no); default: refuse
    #[arg(long)]
    no_strict_modes: bool,
}

impl ServeAuthArgs {
    /// What the server accepts. `files`: it writes into a directory,
    /// which needs authorized keys unless --no-auth.
    pub(super) fn resolve(&self, files: bool) -> Result<ServerAuth> {
        if let (true, Some(p)) = (self.no_auth, &self.authorized_keys) {
            return Err(UsageError(format!(
                "--no-auth takes any client, so --authorized-keys {} (and its subdir= and \
                 overwrite limits) would not apply: pass one or the other",
                p.display()
            ))
            .into());
        }
        let config = keys::config_dir().ok();
        let strict = strictness(self.no_strict_modes);
        let identity = match &self.identity {
            Some(p) => Some(keys::read_identity(p, strict)?),
            None => match config.as_ref().map(|d| d.join(IDENTITY_FILE)) {
                Some(p) if p.exists() => Some(keys::read_identity(&p, strict)?),
                _ => None,
            },
        };
        let authorized = match &self.authorized_keys {
            Some(p) => Some(Arc::new(AuthorizedKeys::load(p, strict)?)),
            None => match config.as_ref().map(|d| d.join(AUTHORIZED_KEYS_FILE)) {
                Some(p) if p.exists() => Some(Arc::new(AuthorizedKeys::load(&p, strict)?)),
                _ => None,
            },
        };
        if self.no_auth {
            return Ok(ServerAuth {
                identity,
                authorized: None,
                allow_plain: true,
            });
        }
        if !files {
            // A probe sink writes nothing: any key, and plain probes too
            // (still under the 3× rule and the budgets).
            return Ok(ServerAuth {
                identity,
                authorized,
                allow_plain: true,
            });
        }
        let Some(identity) = identity else {
            return Err(UsageError(format!(
                "--dir needs a server key: run `atou keygen` (it writes {}), or pass --identity \
                 FILE; or --no-auth to let anyone who can reach this port write into the \
                 directory (only on a network you trust)",
                config
                    .map(|d| d.join(IDENTITY_FILE).display().to_string())
                    .unwrap_or_else(|| "~/.config/atou/id_x25519".into())
            ))
            .into());
        };
        match authorized {
            Some(a) if !a.is_empty() => Ok(ServerAuth {
                identity: Some(identity),
                authorized: Some(a),
                allow_plain: false,
            }),
            _ => Err(UsageError(
                "--dir needs authorized keys: pass --authorized-keys FILE (one client public \
                 key per line, as `atou keygen` prints it on the client), or put them in \
                 ~/.config/atou/authorized_keys; or --no-auth to let anyone who can reach this \
                 port write into the directory (only on a network you trust)"
                    .to_string(),
            )
            .into()),
        }
    }
}
