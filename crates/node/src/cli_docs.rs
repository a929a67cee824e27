//! Man pages and shell completions from a binary's own clap definition, for
//! the Debian package (`make deb`). Each binary writes its own
//! (`memlend generate-docs DIR`, `memlendd --generate-docs DIR`), so they
//! never drift from its flags.

use anyhow::{Context, Result};
use clap::Command;
use clap_complete::Shell;
use std::path::{Path, PathBuf};

/// Nested subcommands deeper than this get no page of their own (memlend's
/// go two deep: `memlend lab up`).
const DEPTH_MAX: usize = 3;

/// Write `DIR/man1/<name>[-<sub>...].1` for the command and each visible
/// subcommand, and `DIR/completions/{bash/<name>, zsh/_<name>,
/// fish/<name>.fish}`. The files written.
pub fn write(cmd: Command, dir: &Path) -> Result<Vec<PathBuf>> {
    let mut cmd = cmd;
    cmd.build();
    let name = cmd.get_name().to_string();
    let mut written = Vec::new();
    let man = dir.join("man1");
    std::fs::create_dir_all(&man).with_context(|| format!("cannot make {}", man.display()))?;
    write_pages(&cmd, &name, &man, 0, &mut written)?;
    for (shell, file) in [
        (Shell::Bash, name.clone()),
        (Shell::Zsh, format!("_{name}")),
        (Shell::Fish, format!("{name}.fish")),
    ] {
        let sub = dir.join("completions").join(shell.to_string());
        std::fs::create_dir_all(&sub).with_context(|| format!("cannot make {}", sub.display()))?;
        let mut text = Vec::new();
        clap_complete::generate(shell, &mut cmd.clone(), &name, &mut text);
        written.push(put(&sub.join(file), &text)?);
    }
    Ok(written)
}

fn write_pages(
    cmd: &Command,
    page: &str,
    man: &Path,
    depth: usize,
    written: &mut Vec<PathBuf>,
) -> Result<()> {
    let mut text = Vec::new();
    let named = cmd.clone().name(page.to_string());
    clap_mangen::Man::new(named).render(&mut text).context("cannot render a man page")?;
    written.push(put(&man.join(format!("{page}.1")), &text)?);
    if depth >= DEPTH_MAX {
        return Ok(());
    }
    for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set() && s.get_name() != "help") {
        write_pages(sub, &format!("{page}-{}", sub.get_name()), man, depth + 1, written)?;
    }
    Ok(())
}

fn put(path: &Path, bytes: &[u8]) -> Result<PathBuf> {
    std::fs::write(path, bytes).with_context(|| format!("cannot write {}", path.display()))?;
    Ok(path.to_path_buf())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::{Arg, Command};

    #[test]
    fn writes_a_page_per_visible_subcommand_and_three_completions() {
        let cmd = Command::new("demo")
            .about("a demo")
            .subcommand(Command::new("run").about("run it").arg(Arg::new("fast").long("fast")))
            .subcommand(Command::new("secret").hide(true));
        let dir = tempfile::tempdir().unwrap();
        let written = write(cmd, dir.path()).unwrap();
        let names: Vec<String> = written
            .iter()
            .map(|p| p.strip_prefix(dir.path()).unwrap().display().to_string())
            .collect();
        assert_eq!(
            names,
            [
                "man1/demo.1",
                "man1/demo-run.1",
                "completions/bash/demo",
                "completions/zsh/_demo",
                "completions/fish/demo.fish"
            ]
        );
        let page = std::fs::read_to_string(dir.path().join("man1/demo-run.1")).unwrap();
        assert!(page.contains(".TH demo-run 1") && page.contains("fast"), "{page}");
        let bash = std::fs::read_to_string(dir.path().join("completions/bash/demo")).unwrap();
        assert!(bash.contains("complete -F") && bash.contains("run"), "{bash}");
    }
}
