//! `crosscheck RAW [--breakdown breakdown.json] [--out FILE.json]`: the independent
//! aggregation of fsync durations and run-queue delays from a raw event dump
//! (`tracer record --raw-events RAW`), printed beside the model's figures when given the
//! session's breakdown.json. Deliberately shares no code with the rebuild model.

use std::path::PathBuf;

use anyhow::Context as _;
use clap::Parser;
use tracer::validate::crosscheck;

#[derive(Parser)]
#[command(about = "Aggregate fsync durations and run-queue delays straight from a raw event dump")]
struct Args {
    /// The raw dump written by `tracer record --raw-events`.
    raw: PathBuf,
    /// The same session's breakdown.json, to compare with its `kernel` section.
    #[arg(long)]
    breakdown: Option<PathBuf>,
    /// Write the figures (and the comparison) as JSON here.
    #[arg(long)]
    out: Option<PathBuf>,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let check = crosscheck::check(crosscheck::read_dump(&args.raw)?);
    let mut json = serde_json::json!({ "independent": check.to_json() });
    if let Some(path) = &args.breakdown {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        let breakdown: serde_json::Value = serde_json::from_str(&text)
            .with_context(|| format!("{} is not JSON", path.display()))?;
        let kernel = breakdown
            .get("kernel")
            .with_context(|| format!("{} has no `kernel` section", path.display()))?;
        let comparison = crosscheck::compare(&check, kernel);
        print!("{}", crosscheck::table(&comparison));
        json["comparison"] = comparison;
    } else {
        let none = serde_json::json!({});
        print!("{}", crosscheck::table(&crosscheck::compare(&check, &none)));
    }
    println!(
        "crosscheck: {} events, writer tids {:?}, {} switch-ins of threads never seen before",
        check.events, check.writer_tids, check.switch_in_unknown
    );
    if let Some(out) = &args.out {
        std::fs::write(out, serde_json::to_string_pretty(&json)? + "\n")
            .with_context(|| format!("writing {}", out.display()))?;
    }
    Ok(())
}
