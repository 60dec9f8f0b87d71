//! `-o` / `-g` / `--numeric-ids` at the receiver: which uid and gid each
//! entry gets, as rsync decides it. By name where the sender sent the
//! name of its id and this host knows that name; by number otherwise, or
//! always with `--numeric-ids`. Only a receiver running as root may, and
//! only where its policy allows (`atou serve --allow-owners`, or the
//! receiving end's own `-o` / `-g`); the names are looked up through the
//! system's name service (NSS), a bounded number of them.

use std::collections::HashMap;

use nix::unistd::{Gid, Group, Uid, User};

use super::ReceivePolicy;
use crate::io::dest_dir::Ids;
use crate::transfer::messages::Ownership;
use crate::transfer::Error;

/// Names a plan may ask this host to look up, users and groups together:
/// each may be a query to a directory server.
pub const NAMES_MAX: usize = 4096;

/// Whether this receiver may give entries their owners; why not, as the
/// refusal says.
pub(super) fn check_allowed(own: &Ownership, policy: &ReceivePolicy) -> Result<(), Error> {
    let why = if !policy.allow_owners {
        if policy.users_own {
            "the sending end asked to keep owners and groups (-o/-g), but this copy was not \
             given -o or -g"
                .to_string()
        } else {
            "this server does not give files their senders' owners and groups (its operator \
             can start it, as root, with --allow-owners)"
                .to_string()
        }
    } else if policy.key_forbids_owners {
        "this client's key may not give files their owners and groups here (its line in the \
         server's authorized keys has no `owners` option)"
            .to_string()
    } else if !Uid::effective().is_root() {
        format!(
            "the receiving end runs as uid {}, not root, so it cannot give files their owners \
             and groups: leave out -o, -g and --numeric-ids",
            Uid::effective()
        )
    } else if own.user_names.len() + own.group_names.len() > NAMES_MAX {
        format!(
            "the plan names {} users and groups, over this receiver's limit of {NAMES_MAX}",
            own.user_names.len() + own.group_names.len()
        )
    } else {
        return Ok(());
    };
    Err(Error::Refused { why })
}

/// Per manifest entry, the ids it gets here.
pub(super) fn resolve(own: &Ownership) -> Vec<Ids> {
    let users = if own.numeric || !own.user {
        HashMap::new()
    } else {
        local_ids(&own.user_names, |name| {
            User::from_name(name).ok().flatten().map(|u| u.uid.as_raw())
        })
    };
    let groups = if own.numeric || !own.group {
        HashMap::new()
    } else {
        local_ids(&own.group_names, |name| {
            Group::from_name(name)
                .ok()
                .flatten()
                .map(|g| g.gid.as_raw())
        })
    };
    own.ids
        .iter()
        .map(|&(uid, gid)| Ids {
            uid: own.user.then(|| users.get(&uid).copied().unwrap_or(uid)),
            gid: own.group.then(|| groups.get(&gid).copied().unwrap_or(gid)),
        })
        .collect()
}

/// The sender's id → this host's id, for the names this host knows.
fn local_ids(names: &[(u32, String)], lookup: impl Fn(&str) -> Option<u32>) -> HashMap<u32, u32> {
    names
        .iter()
        .filter_map(|(theirs, name)| lookup(name).map(|ours| (*theirs, ours)))
        .collect()
}

/// The sender's side: the ownership of `ids` (per entry, in manifest
/// order), with the names of the ids this host has names for.
pub fn ownership(ids: Vec<(u32, u32)>, user: bool, group: bool, numeric: bool) -> Ownership {
    let mut user_names = Vec::new();
    let mut group_names = Vec::new();
    if !numeric {
        let mut uids: Vec<u32> = ids.iter().map(|&(u, _)| u).collect();
        let mut gids: Vec<u32> = ids.iter().map(|&(_, g)| g).collect();
        uids.sort_unstable();
        uids.dedup();
        gids.sort_unstable();
        gids.dedup();
        if user {
            user_names = uids
                .into_iter()
                .filter_map(|u| Some((u, User::from_uid(Uid::from_raw(u)).ok()??.name)))
                .collect();
        }
        if group {
            group_names = gids
                .into_iter()
                .filter_map(|g| Some((g, Group::from_gid(Gid::from_raw(g)).ok()??.name)))
                .collect();
        }
    }
    Ownership {
        user,
        group,
        numeric,
        ids,
        user_names,
        group_names,
    }
}
