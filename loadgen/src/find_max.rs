//! `--find-max`: closed loop at concurrency 1, 2, 4, … until throughput stops growing. The
//! best step's rate is the max sustainable rate that sessions take fractions of.

use std::sync::Arc;
use std::time::Duration;

use crate::progress::Progress;
use crate::run::{IdSource, Load, RunOutput, RunSpec, run};
use crate::summary::{Summary, summarize};
use crate::target::Target;

/// A step must beat the best so far by this factor to count as growth.
const GROWTH: f64 = 1.03;
/// Steps in a row without growth before the search stops.
const FLAT_STEPS: usize = 2;
/// Steps with more errors than this share are not sustainable and cannot be the max.
const MAX_ERROR_SHARE: f64 = 0.01;

pub use session::loadgen::{FindMax, Step};

pub struct Search {
    pub max_concurrency: usize,
    pub step: Duration,
    pub warmup: Duration,
    pub timeout: Duration,
}

pub async fn find_max(
    target: Arc<Target>,
    search: &Search,
    ids: &Arc<IdSource>,
    direct: bool,
    show_progress: bool,
) -> anyhow::Result<(FindMax, Vec<RunOutput>)> {
    let mut steps = Vec::new();
    let mut outputs = Vec::new();
    let mut best: Option<Step> = None;
    let mut flat = 0;
    let mut concurrency = 1;
    while concurrency <= search.max_concurrency {
        let spec = RunSpec {
            load: Load::Closed { concurrency },
            duration: search.step,
            warmup: search.warmup,
            timeout: search.timeout,
        };
        let progress = show_progress.then(|| Arc::new(Progress::default()));
        let ticker = progress
            .as_ref()
            .map(|p| p.spawn_ticker(format!("find-max c{concurrency}")));
        let output = run(target.clone(), &spec, ids, progress).await;
        if let Some(ticker) = ticker {
            ticker.abort();
        }
        let output = output?;
        let summary: Summary = summarize(&output, &target.url, direct, search.warmup.as_secs_f64());
        let errors = summary.error_count();
        let step = Step {
            concurrency,
            achieved_rate: summary.achieved_rate,
            ok: summary.ok,
            errors,
            p50_us: summary.latency_us.p50,
            p99_us: summary.latency_us.p99,
        };
        if show_progress {
            eprintln!(
                "loadgen: find-max c{concurrency}: {:.1} req/s, p99 {:.1} µs, {errors} errors",
                step.achieved_rate, step.p99_us
            );
        }
        let sustainable = (errors as f64) <= MAX_ERROR_SHARE * summary.measured.max(1) as f64;
        let best_rate = best.as_ref().map(|best| best.achieved_rate);
        if sustainable && best_rate.is_none_or(|rate| step.achieved_rate > rate * GROWTH) {
            flat = 0;
        } else {
            flat += 1;
        }
        if sustainable && best_rate.is_none_or(|rate| step.achieved_rate > rate) {
            best = Some(step.clone());
        }
        steps.push(step);
        outputs.push(output);
        if flat >= FLAT_STEPS {
            break;
        }
        concurrency *= 2;
    }
    let best = best.ok_or_else(|| {
        anyhow::anyhow!("no step of the search was sustainable (every step had over 1% errors)")
    })?;
    Ok((
        FindMax {
            mode: "find-max".to_owned(),
            url: target.url.clone(),
            direct,
            max_rate: best.achieved_rate,
            best_concurrency: best.concurrency,
            step_duration_s: search.step.as_secs_f64(),
            steps,
        },
        outputs,
    ))
}
