//! `atou completions SHELL` and the man pages, both from the clap
//! definitions (clap_complete, clap_mangen), so they never drift from
//! `--help`.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::{Args, CommandFactory, ValueEnum};

use super::Cli;

#[derive(Clone, Copy, Debug, ValueEnum)]
pub(super) enum Shell {
    Bash,
    Zsh,
    Fish,
}

#[derive(Args, Debug)]
#[command(after_help = "Examples:\n  \
    atou completions bash > /etc/bash_completion.d/atou\n  \
    atou completions zsh > \"${fpath[1]}/_atou\"\n  \
    atou completions fish > ~/.config/fish/completions/atou.fish")]
pub(super) struct CompletionsArgs {
    /// The shell to complete for
    #[arg(value_enum)]
    shell: Shell,
}

pub(super) fn completions(args: CompletionsArgs) -> Result<ExitCode> {
    let mut cmd = Cli::command();
    let shell = match args.shell {
        Shell::Bash => clap_complete::Shell::Bash,
        Shell::Zsh => clap_complete::Shell::Zsh,
        Shell::Fish => clap_complete::Shell::Fish,
    };
    clap_complete::generate(shell, &mut cmd, "atou", &mut std::io::stdout());
    Ok(ExitCode::SUCCESS)
}

#[derive(Args, Debug)]
pub(super) struct ManArgs {
    /// Directory to write atou.1 and atou-SUBCOMMAND.1 into
    #[arg(value_name = "DIR")]
    dir: PathBuf,
}

/// Writes `atou.1` and one page per visible subcommand into `dir`.
pub(super) fn man(args: ManArgs) -> Result<ExitCode> {
    write_man_pages(&args.dir)?;
    Ok(ExitCode::SUCCESS)
}

fn write_man_pages(dir: &Path) -> Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("create {}", dir.display()))?;
    let cmd = Cli::command().version(env!("CARGO_PKG_VERSION"));
    let write = |name: &str, page: clap::Command| -> Result<()> {
        let mut out = Vec::new();
        clap_mangen::Man::new(page).render(&mut out)?;
        let path = dir.join(format!("{name}.1"));
        std::fs::write(&path, out).with_context(|| format!("write {}", path.display()))
    };
    write("atou", cmd.clone())?;
    for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
        let name = format!("atou-{}", sub.get_name());
        write(&name, sub.clone().name(name.clone()))?;
    }
    Ok(())
}
