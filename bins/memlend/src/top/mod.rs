//! `memlend top`: a live view of this node (its class, lent and borrowed
//! memory, leases and the health of the peers on the other side, from the
//! local memlendd) and of the processes that borrow through memlend here
//! (resident and far memory, faults per second, miss latency, prefetch,
//! the compressed pool). It redraws every `--interval-ms`, quits on `q`,
//! and needs nothing but a terminal (ssh is fine); `--once` prints one look
//! as text.

mod procs;
mod view;

use anyhow::{Context, Result};
use clap::Args;
use ratatui::crossterm::event::{self, Event, KeyCode, KeyEventKind, KeyModifiers};
use ratatui::crossterm::{execute, terminal};
use ratatui::style::{Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Borders, Paragraph};
use std::path::PathBuf;
use std::time::{Duration, Instant};

#[derive(Args, Debug)]
pub struct TopArgs {
    /// The daemon's API socket (default $MEMLEND_POOL or
    /// /run/memlend/memlendd.sock).
    #[arg(long, conflicts_with = "node")]
    pub api: Option<PathBuf>,
    /// A node of a lab on this machine, by name (`memlend lab up`).
    #[arg(long)]
    pub node: Option<String>,
    /// Milliseconds between two looks.
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u64).range(100..=60_000))]
    pub interval_ms: u64,
    /// Print one look as text and exit (no terminal needed).
    #[arg(long)]
    pub once: bool,
}

pub fn run(a: &TopArgs) -> Result<()> {
    let api = crate::status::api_path(a.api.as_ref(), a.node.as_ref())?;
    let mut procs = procs::Procs::default();
    let mut look = || view::Snapshot {
        api: api.display().to_string(),
        node: crate::status::fetch(&api).map_err(|e| format!("{e:#}")),
        procs: procs.look(),
    };
    if a.once {
        for (line, _) in view::lines(&look()) {
            println!("{line}");
        }
        return Ok(());
    }
    let _screen = Screen::enter()?;
    let mut term =
        ratatui::Terminal::new(ratatui::backend::CrosstermBackend::new(std::io::stdout()))?;
    let interval = Duration::from_millis(a.interval_ms);
    loop {
        let snapshot = look();
        term.draw(|f| draw(f, &snapshot, a.interval_ms))?;
        let next = Instant::now() + interval;
        while let Some(left) = next.checked_duration_since(Instant::now()) {
            if !event::poll(left)? {
                break;
            }
            if let Event::Key(k) = event::read()? {
                let ctrl_c =
                    k.code == KeyCode::Char('c') && k.modifiers.contains(KeyModifiers::CONTROL);
                let quit = matches!(k.code, KeyCode::Char('q') | KeyCode::Esc) || ctrl_c;
                if k.kind == KeyEventKind::Press && quit {
                    return Ok(());
                }
            }
        }
    }
}

fn draw(f: &mut ratatui::Frame, s: &view::Snapshot, interval_ms: u64) {
    let bold = Style::default().add_modifier(Modifier::BOLD);
    let text: Vec<Line> = view::lines(s)
        .into_iter()
        .map(|(l, head)| if head { Line::from(Span::styled(l, bold)) } else { Line::from(l) })
        .collect();
    let title = format!(" memlend top: every {interval_ms} ms, q to quit ");
    let block = Block::default().borders(Borders::ALL).title(title);
    f.render_widget(Paragraph::new(text).block(block), f.area());
}

/// The terminal in raw mode on the alternate screen, put back on every
/// exit path (errors, and panics through Drop while unwinding).
struct Screen;

impl Screen {
    fn enter() -> Result<Screen> {
        terminal::enable_raw_mode().context("memlend top needs a terminal (or --once)")?;
        let screen = Screen;
        execute!(std::io::stdout(), terminal::EnterAlternateScreen)?;
        Ok(screen)
    }
}

impl Drop for Screen {
    fn drop(&mut self) {
        let _ = execute!(std::io::stdout(), terminal::LeaveAlternateScreen);
        let _ = terminal::disable_raw_mode();
    }
}
