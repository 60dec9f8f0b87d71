//! One command-line flag per knob, generated from [`KNOBS`], plus `--config`.
//!
//! Precedence: flags over the config file over defaults.

use std::path::PathBuf;

use anyhow::Result;
use clap::{Arg, ArgMatches, Args, Command, FromArgMatches};

use crate::proto::tuning::KNOBS;
use crate::proto::Tuning;

use super::UsageError;

const HEADING: &str = "Tuning (flags override --config; see docs/tuning.md)";

#[derive(Debug, Clone, Default)]
pub(crate) struct TuningArgs {
    config: Option<PathBuf>,
    /// (knob, value) for each flag given.
    flags: Vec<(&'static str, String)>,
}

fn flag(name: &str) -> String {
    name.replace('_', "-")
}

impl TuningArgs {
    /// The commands' defaults ([`Tuning::command_default`]: bbr, rack),
    /// then the config file, then the flags. Returns notes about config
    /// lines that were accepted but do not apply.
    /// Whether the user set knob `name`, by flag or in a config file.
    pub(crate) fn sets(&self, name: &str) -> bool {
        self.config.is_some() || self.flags.iter().any(|(n, _)| *n == name)
    }

    pub(crate) fn resolve(&self) -> Result<(Tuning, Vec<String>)> {
        let mut tuning = Tuning::command_default();
        let mut notes = Vec::new();
        if let Some(path) = &self.config {
            let text = std::fs::read_to_string(path).map_err(|e| {
                UsageError(format!("cannot read config file {}: {e}", path.display()))
            })?;
            notes = tuning
                .apply_config(&text)
                .map_err(|e| UsageError(format!("config file {}: {e}", path.display())))?
                .into_iter()
                .map(|n| format!("{}: {n}", path.display()))
                .collect();
        }
        for (name, value) in &self.flags {
            tuning
                .set(name, value)
                .map_err(|e| UsageError(format!("--{}: {}", flag(name), e.message)))?;
        }
        tuning
            .validate()
            .map_err(|e| UsageError(format!("--{}: {}", flag(&e.key), e.message)))?;
        Ok((tuning, notes))
    }
}

impl FromArgMatches for TuningArgs {
    fn from_arg_matches(m: &ArgMatches) -> Result<Self, clap::Error> {
        Ok(TuningArgs {
            config: m.get_one::<PathBuf>("config").cloned(),
            flags: KNOBS
                .iter()
                .filter_map(|k| m.get_one::<String>(k.name).map(|v| (k.name, v.clone())))
                .collect(),
        })
    }

    fn update_from_arg_matches(&mut self, m: &ArgMatches) -> Result<(), clap::Error> {
        *self = Self::from_arg_matches(m)?;
        Ok(())
    }
}

impl Args for TuningArgs {
    fn augment_args(cmd: Command) -> Command {
        let defaults = Tuning::command_default();
        let mut cmd = cmd.arg(
            Arg::new("config")
                .long("config")
                .value_name("FILE")
                .value_parser(clap::value_parser!(PathBuf))
                .help("Read knobs from FILE: `name value` lines, atou's config files included")
                .help_heading(HEADING),
        );
        for k in KNOBS {
            let mut arg = Arg::new(k.name)
                .long(flag(k.name))
                .value_name(k.value_name)
                .allow_hyphen_values(false)
                .help(format!(
                    "{} [default: {}]",
                    k.help,
                    defaults.get(k.name).unwrap_or_default()
                ))
                .help_heading(HEADING);
            for alias in k.aliases {
                arg = arg.visible_alias(flag(alias));
            }
            cmd = cmd.arg(arg);
        }
        cmd
    }

    fn augment_args_for_update(cmd: Command) -> Command {
        Self::augment_args(cmd)
    }
}
