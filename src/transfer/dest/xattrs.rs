//! `-X` / `-A` at the receiver: which of the sender's extended attributes
//! and POSIX ACLs each entry gets. Only where the policy allows (`atou
//! serve --allow-xattrs` / `--allow-acls`, or the receiving end's own
//! `-X` / `-A`); `user.*` always, `security.*` and `trusted.*` only with
//! `--allow-xattrs=all` (or a copy's own `-X` with `-p`) and as root, as a non-root
//! rsync receiver sets `user.*` alone. An ACL's binary form names users
//! and groups by number: they are kept by number (`--numeric-ids`).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use super::policy::XattrGrant;
use super::ReceivePolicy;
use crate::io::xattr::{ACL_ACCESS, ACL_DEFAULT};
use crate::transfer::messages::{Xattr, Xattrs};
use crate::transfer::Error;

/// Whether this receiver may set what the plan carries; why not, as the
/// refusal says. A name outside what the sender's own flags send is a
/// hostile plan, refused too.
pub(super) fn check_allowed(x: &Xattrs, policy: &ReceivePolicy) -> Result<(), Error> {
    let refuse = |why: String| Err(Error::Refused { why });
    if x.xattrs && policy.allow_xattrs == XattrGrant::None {
        return refuse(if policy.users_own {
            "the sending end asked to keep extended attributes (-X), but this copy was not \
             given -X"
                .into()
        } else {
            "this server does not set its senders' extended attributes (its operator can \
             start it with --allow-xattrs)"
                .into()
        });
    }
    if x.xattrs && policy.key_forbids_xattrs {
        return refuse(
            "this client's key may not set extended attributes here (its line in the server's \
             authorized keys has no `xattrs` option)"
                .into(),
        );
    }
    if x.acls && !policy.allow_acls {
        return refuse(if policy.users_own {
            "the sending end asked to keep ACLs (-A), but this copy was not given -A".into()
        } else {
            "this server does not set its senders' ACLs (its operator can start it with \
             --allow-acls)"
                .into()
        });
    }
    if x.acls && policy.key_forbids_acls {
        return refuse(
            "this client's key may not set ACLs here (its line in the server's authorized keys \
             has no `acls` option)"
                .into(),
        );
    }
    for (_, attrs) in &x.entries {
        for (name, _) in attrs {
            let acl = name == ACL_ACCESS || name == ACL_DEFAULT;
            let sent = if acl {
                x.acls
            } else {
                x.xattrs
                    && [&b"user."[..], b"security.", b"trusted."]
                        .iter()
                        .any(|ns| name.starts_with(ns))
            };
            if !sent {
                return refuse(format!(
                    "the plan carries the attribute {:?}, which neither -X nor -A sends",
                    String::from_utf8_lossy(name)
                ));
            }
        }
    }
    Ok(())
}

/// Per manifest entry (of `entries`), the attributes it gets here; the
/// ones this receiver leaves out (namespaces its policy or its user may
/// not set) are counted in `left_out`.
pub(super) fn resolve(
    x: &Xattrs,
    policy: &ReceivePolicy,
    entries: usize,
    left_out: &mut u64,
) -> Vec<Vec<Xattr>> {
    let root = rustix::process::geteuid().is_root();
    let mut out = vec![Vec::new(); entries];
    for (entry, attrs) in &x.entries {
        let kept: Vec<Xattr> = attrs
            .iter()
            .filter(|(name, _)| {
                let keep = name.starts_with(b"user.")
                    || name == ACL_ACCESS
                    || name == ACL_DEFAULT
                    || (policy.allow_xattrs == XattrGrant::All && root);
                *left_out += u64::from(!keep);
                keep
            })
            .cloned()
            .collect();
        out[*entry as usize] = kept;
    }
    out
}

/// A plan's attributes, as this receiver sets them.
#[derive(Debug, Default)]
pub struct PlanXattrs {
    /// Per manifest entry, the attributes it gets; empty without `-X` /
    /// `-A`.
    pub per_entry: Vec<Vec<Xattr>>,
    pub tally: Arc<Tally>,
}

/// What setting the attributes did, over the whole finish.
#[derive(Debug, Default)]
pub struct Tally {
    /// Attributes set.
    pub set: AtomicU64,
    /// Attributes the file system or kernel refused (EOPNOTSUPP, ENOSPC,
    /// EPERM…), each named in a warning, or left out by policy.
    pub refused: AtomicU64,
}

/// Warnings printed, at most: a tree on a file system without xattrs
/// would otherwise print one a file.
const WARNINGS_MAX: u64 = 20;

impl Tally {
    /// Sets each of `attrs` with `set`; one refused is a warning naming
    /// it, not a failed transfer (as rsync, which reports it and goes on
    /// but exits 23; here the summary counts it).
    pub fn set_all(
        &self,
        shown: &std::path::Path,
        attrs: &[Xattr],
        mut set: impl FnMut(&[u8], &[u8]) -> std::io::Result<()>,
    ) {
        for (name, value) in attrs {
            match set(name, value) {
                Ok(()) => {
                    self.set.fetch_add(1, Ordering::Relaxed);
                }
                Err(e) => {
                    if self.refused.fetch_add(1, Ordering::Relaxed) < WARNINGS_MAX {
                        eprintln!(
                            "atou: warning: {}: attribute {} not set: {e}",
                            shown.display(),
                            String::from_utf8_lossy(name)
                        );
                    }
                }
            }
        }
    }
}
