//! `memlend replay`: page-access traces through eviction policies.

use anyhow::{bail, Context, Result};
use clap::Args;
use memlend_replay::{densify, replay, Outcome, POLICIES};
use std::path::PathBuf;

#[derive(Args, Debug)]
pub struct ReplayArgs {
    /// Trace files written by `memlend run --trace DIR` (DIR/<pid>.trace).
    #[arg(required = true)]
    pub traces: Vec<PathBuf>,
    /// Cache sizes: pages, or a percentage of the distinct pages the trace
    /// touches; comma-separated.
    #[arg(long, default_value = "10%,25%,50%")]
    pub cache: String,
    /// Count misses only after this share of the trace (the first part
    /// fills the cache, and holds the program's loading phase).
    #[arg(long, default_value_t = 0.5)]
    pub warm: f64,
    /// Policies to replay, comma-separated.
    #[arg(long, default_value = "fifo,s3fifo-blind,s3fifo,clock,lru,arc,opt")]
    pub policies: String,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    pub json: bool,
}

pub fn run(a: &ReplayArgs) -> Result<()> {
    if !(0.0..1.0).contains(&a.warm) {
        bail!("--warm {} is not in [0, 1)", a.warm);
    }
    let policies: Vec<&str> = a.policies.split(',').filter(|p| !p.is_empty()).collect();
    if let Some(bad) = policies.iter().find(|p| !POLICIES.contains(p)) {
        bail!("no policy {bad:?}; there are {}", POLICIES.join(", "));
    }
    let mut results = Vec::new();
    for path in &a.traces {
        let raw = memlend_fault::trace::read(path)
            .with_context(|| format!("reading trace {}", path.display()))?;
        if raw.is_empty() {
            bail!("{}: an empty trace", path.display());
        }
        let trace = densify(&raw);
        let warm = (raw.len() as f64 * a.warm) as usize;
        let sizes = cache_sizes(&a.cache, trace.distinct)?;
        let mut outcomes = Vec::new();
        for &pages in &sizes {
            for p in &policies {
                outcomes.push(replay(p, &trace, pages, warm));
            }
        }
        if !a.json {
            print_table(path, raw.len(), trace.distinct, &outcomes);
        }
        results.push((path.clone(), raw.len(), trace.distinct, outcomes));
    }
    if a.json {
        println!("{}", to_json(&results));
    }
    Ok(())
}

fn cache_sizes(spec: &str, distinct: usize) -> Result<Vec<usize>> {
    spec.split(',')
        .filter(|s| !s.is_empty())
        .map(|s| {
            let pages = match s.strip_suffix('%') {
                Some(pct) => {
                    let pct: f64 = pct.parse().with_context(|| format!("--cache {s:?}"))?;
                    (distinct as f64 * pct / 100.0) as usize
                }
                None => s.parse().with_context(|| format!("--cache {s:?}: pages or N%"))?,
            };
            match pages {
                0 => bail!("--cache {s:?} is no pages"),
                p => Ok(p),
            }
        })
        .collect()
}

fn print_table(path: &std::path::Path, entries: usize, distinct: usize, outcomes: &[Outcome]) {
    println!("{}: {entries} accesses to {distinct} distinct pages", path.display());
    println!(
        "{:>12}  {:<13} {:>12}  {:>10}  {:>9}",
        "cache pages", "policy", "misses", "miss ratio", "x opt"
    );
    for o in outcomes {
        let opt = outcomes.iter().find(|x| x.policy == "opt" && x.cache_pages == o.cache_pages);
        let x_opt = opt.map_or(String::from("-"), |opt| {
            format!("{:.2}", o.misses as f64 / opt.misses.max(1) as f64)
        });
        println!(
            "{:>12}  {:<13} {:>12}  {:>10.4}  {:>9}",
            o.cache_pages,
            o.policy,
            o.misses,
            o.miss_ratio(),
            x_opt
        );
    }
}

type Result1 = (PathBuf, usize, usize, Vec<Outcome>);

fn to_json(results: &[Result1]) -> serde_json::Value {
    let traces: Vec<serde_json::Value> = results
        .iter()
        .map(|(path, entries, distinct, outcomes)| {
            let rows: Vec<serde_json::Value> = outcomes
                .iter()
                .map(|o| {
                    serde_json::json!({
                        "policy": o.policy, "cache_pages": o.cache_pages,
                        "accesses": o.accesses, "misses": o.misses, "miss_ratio": o.miss_ratio(),
                    })
                })
                .collect();
            serde_json::json!({
                "trace": path.display().to_string(), "entries": entries,
                "distinct_pages": distinct, "outcomes": rows,
            })
        })
        .collect();
    serde_json::json!({ "traces": traces })
}
