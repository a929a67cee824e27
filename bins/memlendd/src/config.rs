//! `memlendd --config FILE`: settings from a TOML file whose keys are the
//! daemon's own long flag names (`-` or `_` alike). The file is turned into
//! flags and parsed by the same clap definitions as the command line, so
//! every flag has a key, a key is checked exactly as its flag is, and no
//! second list of settings can drift from the first. Flags given on the
//! command line win: a single-valued one overrides the file's key, a
//! repeatable one (`export`, `nbd_allow`, `seed`) replaces the file's list.
//! An unknown key, a value of the wrong type or one its flag refuses is an
//! error that names the file and line.

use anyhow::{bail, Context, Result};
use clap::parser::ValueSource;
use clap::{Arg, ArgAction, ArgMatches, Command};
use std::ffi::OsString;
use std::path::Path;

/// Keys the file may not set: they are about the file itself, or clap's.
const NOT_KEYS: [&str; 5] = ["config", "check-config", "generate-docs", "help", "version"];
/// A config file is a few hundred bytes; refuse anything absurd.
const FILE_BYTES_MAX: u64 = 1 << 20;

/// The flags `path` stands for, to be parsed before the command line's
/// (`cli`, already parsed once into `cli_matches`).
pub fn file_flags(path: &Path, cmd: &Command, cli_matches: &ArgMatches) -> Result<Vec<OsString>> {
    let size = std::fs::metadata(path)
        .with_context(|| format!("cannot read config {}", path.display()))?
        .len();
    if size > FILE_BYTES_MAX {
        bail!(
            "config {}: {size} bytes is more than a config file ({FILE_BYTES_MAX})",
            path.display()
        );
    }
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read config {}", path.display()))?;
    flags_from_text(&text, &path.display().to_string(), cmd, cli_matches)
}

fn flags_from_text(
    text: &str,
    name: &str,
    cmd: &Command,
    cli_matches: &ArgMatches,
) -> Result<Vec<OsString>> {
    let spans =
        toml::de::DeTable::parse(text).map_err(|e| anyhow::anyhow!("config {name}: {e}"))?;
    let mut flags = Vec::new();
    let mut seen = std::collections::HashSet::new();
    for (key, value) in spans.get_ref().iter() {
        let line = 1 + text[..key.span().start].matches('\n').count();
        let at = |what: String| anyhow::anyhow!("config {name}, line {line}: {what}");
        let long = key.get_ref().replace('_', "-");
        let arg = cmd
            .get_arguments()
            .find(|a| a.get_long() == Some(long.as_str()) && !NOT_KEYS.contains(&long.as_str()))
            .ok_or_else(|| {
                at(format!("unknown key `{}` (keys are memlendd's flags)", key.get_ref()))
            })?;
        if !seen.insert(long.clone()) {
            return Err(at(format!("`{}` is set twice (`-` and `_` are the same)", key.get_ref())));
        }
        if cli_matches.value_source(arg.get_id().as_str()) == Some(ValueSource::CommandLine) {
            continue;
        }
        for v in
            values(arg, value.get_ref()).map_err(|w| at(format!("`{}`: {w}", key.get_ref())))?
        {
            check(cmd, arg, &v).map_err(|w| at(format!("`{}` = {v:?}: {w}", key.get_ref())))?;
            flags.push(OsString::from(format!("--{long}={v}")));
        }
        if is_switch(arg) && value.get_ref().as_bool() == Some(true) {
            flags.push(OsString::from(format!("--{long}")));
        }
    }
    Ok(flags)
}

fn is_switch(arg: &Arg) -> bool {
    matches!(arg.get_action(), ArgAction::SetTrue)
}

/// The flag values a key's value stands for: none for a switch (handled by
/// the caller), one for a single-valued flag, any number for a repeatable one.
fn values(arg: &Arg, value: &toml::de::DeValue) -> Result<Vec<String>, String> {
    use toml::de::DeValue;
    let scalar = |v: &DeValue| -> Result<String, String> {
        match v {
            DeValue::String(s) => Ok(s.to_string()),
            DeValue::Integer(i) if i.radix() == 10 => Ok(i.as_str().replace('_', "")),
            DeValue::Float(f) => Ok(f.as_str().replace('_', "")),
            other => Err(format!("expected a string or a number, found {}", other.type_str())),
        }
    };
    if is_switch(arg) {
        return match value {
            DeValue::Boolean(_) => Ok(Vec::new()),
            other => Err(format!("expected true or false, found {}", other.type_str())),
        };
    }
    match (value, arg.get_action()) {
        (DeValue::Array(items), ArgAction::Append) => {
            items.iter().map(|item| scalar(item.get_ref())).collect()
        }
        (DeValue::Array(_), _) => Err("takes one value, not a list".into()),
        (v, _) => Ok(vec![scalar(v)?]),
    }
}

/// Parse the flag with `v` alone, for an error at its line. Errors that
/// are about other flags (one it requires, or conflicts with) are left to
/// the parse of everything together.
fn check(cmd: &Command, arg: &Arg, v: &str) -> Result<(), String> {
    use clap::error::ErrorKind::{ArgumentConflict, MissingRequiredArgument};
    let flag = format!("--{}={v}", arg.get_long().unwrap_or_default());
    match cmd.clone().try_get_matches_from(["memlendd", &flag]) {
        Ok(_) => Ok(()),
        Err(e) if matches!(e.kind(), MissingRequiredArgument | ArgumentConflict) => Ok(()),
        Err(e) => {
            let text = e.render().to_string();
            let first = text.lines().next().unwrap_or("a bad value");
            Err(first.trim_start_matches("error: ").to_string())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    fn flags(text: &str, cli: &[&str]) -> Result<Vec<String>> {
        let cmd = crate::args::Args::command();
        let matches = cmd
            .clone()
            .try_get_matches_from(std::iter::once("memlendd").chain(cli.iter().copied()))?;
        let out = flags_from_text(text, "test.toml", &cmd, &matches)?;
        Ok(out.into_iter().map(|f| f.into_string().unwrap()).collect())
    }

    fn error(text: &str) -> String {
        format!("{:#}", flags(text, &[]).unwrap_err())
    }

    #[test]
    fn every_kind_of_key_becomes_its_flag() {
        let text = "lend = \"2G\"\nmlock = true\nprealloc = false\nmax_connections = 1_000\n\
                    export = [\"a=1G\", \"b=512M\"]\nthresholds = \"0.4,0.5,0.75,0.85\"\n\
                    reclaim-deadline-ms = 5000\ncluster = true\n";
        let got = flags(text, &[]).unwrap();
        let mut want = [
            "--lend=2G",
            "--mlock",
            "--max-connections=1000",
            "--export=a=1G",
            "--export=b=512M",
            "--thresholds=0.4,0.5,0.75,0.85",
            "--reclaim-deadline-ms=5000",
            "--cluster",
        ];
        want.sort();
        assert_eq!(got, want, "in key order");
    }

    #[test]
    fn the_nbd_unix_and_read_only_keys_become_their_flags() {
        let text = "nbd_unix = \"/run/memlend/nbd.sock\"\nnbd-read-only = true\n\
                    export = [\"a=1G,ro\", \"b=1G\"]\n";
        let got = flags(text, &[]).unwrap();
        let want = [
            "--export=a=1G,ro",
            "--export=b=1G",
            "--nbd-read-only",
            "--nbd-unix=/run/memlend/nbd.sock",
        ];
        assert_eq!(got, want, "in key order");
        assert!(error("export = \"a=1G,rw\"\n").contains("unknown export option `rw`"));
        assert!(error("nbd_read_only = \"yes\"\n").contains("expected true or false"));
    }

    #[test]
    fn the_command_line_wins_over_the_file() {
        let text = "lend = \"2G\"\nexport = [\"a=1G\"]\nlisten = \"0.0.0.0:7070\"\n";
        let got = flags(text, &["--export", "b=1G", "--lend", "1G"]).unwrap();
        assert_eq!(got, ["--listen=0.0.0.0:7070"]);
    }

    #[test]
    fn bad_keys_and_values_name_their_line() {
        assert!(error("lend = \"2G\"\nlned = \"1G\"\n").contains("line 2: unknown key `lned`"));
        let bad_size = error("\n\nlend = \"lots\"\n");
        assert!(bad_size.contains("line 3") && bad_size.contains("lend"), "{bad_size}");
        assert!(error("mlock = \"yes\"\n").contains("line 1: `mlock`: expected true or false"));
        assert!(error("listen = [\"a\", \"b\"]\n").contains("takes one value"));
        assert!(error("spin_us = 20000\n").contains("line 1"), "past its range");
        assert!(error("config = \"other.toml\"\n").contains("unknown key `config`"));
        assert!(error("[cluster]\nnode = \"a\"\n").contains("line 1"), "no tables");
        assert!(error("lend = \n").contains("test.toml"), "TOML syntax names the file");
        assert!(error("spin_us = 1\nspin-us = 2\n").contains("set twice"));
    }
}
