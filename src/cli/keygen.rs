//! `atou keygen`: a key pair for authenticated transfers, as ssh-keygen.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::Args;

use crate::config::keys::{self, public_path, IDENTITY_FILE};
use crate::proto::crypto::format_public_key;
use crate::proto::crypto::StaticKeypair;

#[derive(Args, Debug)]
pub(super) struct KeygenArgs {
    /// Where to write the private key (the public key goes to FILE.pub);
    /// default $XDG_CONFIG_HOME/atou/id_x25519 or ~/.config/atou/id_x25519
    #[arg(short = 'f', long, value_name = "FILE")]
    file: Option<PathBuf>,
    /// The comment after the public key; default USER@HOST
    #[arg(short = 'C', long, value_name = "TEXT")]
    comment: Option<String>,
    /// Replace an existing key pair at FILE
    #[arg(long)]
    force: bool,
}

pub(super) fn keygen(args: KeygenArgs) -> Result<ExitCode> {
    let path = match args.file {
        Some(f) => f,
        None => keys::config_dir()?.join(IDENTITY_FILE),
    };
    let comment = args.comment.unwrap_or_else(default_comment);
    let keypair = StaticKeypair::generate().context("cannot generate a key pair")?;
    keys::write_identity(&path, &keypair, &comment, args.force)?;
    println!(
        "private key: {} (mode 0600; keep it secret)",
        path.display()
    );
    println!("public key:  {}", public_path(&path).display());
    println!("{}", format_public_key(&keypair.public(), &comment));
    Ok(ExitCode::SUCCESS)
}

fn default_comment() -> String {
    let user = std::env::var("USER").unwrap_or_default();
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    let host = host.trim();
    let comment = if user.is_empty() {
        host.to_string()
    } else {
        format!("{user}@{host}")
    };
    // Only what a one-line comment can hold.
    comment
        .chars()
        .filter(|c| !c.is_whitespace() && !c.is_control())
        .collect()
}
