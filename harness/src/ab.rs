//! Probe effect as an A/B: windows of one open loop at one rate, the tracer attached only in
//! the traced ones, in flipping pairs (U T T U U T …) so a linear drift of the machine falls
//! on both arms alike. `validate` and `profile` both measure this way; the ratios are
//! computed by `session::analysis::ab` from the windows written here.

use std::path::PathBuf;

use anyhow::Context as _;
use session::analysis::ab;
use session::breakdown::Breakdown;
use session::loadgen::Summary;
use session::validation::{Hits, WindowRecord};

use crate::procs::TracerProc;
use crate::procstat;

/// A tracer attached for one window, writing into `dir`.
pub struct Traced {
    pub tracer: TracerProc,
    pub dir: PathBuf,
}

impl Traced {
    /// SIGINT, wait for its files, and return its breakdown.json.
    pub fn stop(mut self) -> anyhow::Result<(Breakdown, PathBuf)> {
        self.tracer.stop()?;
        let breakdown = crate::workspace::read_json(&self.dir.join("breakdown.json"))?;
        Ok((breakdown, self.dir))
    }
}

/// What a run of windows needs from its harness.
pub trait Arms {
    /// Attaches the tracer for window `index`, and returns once its programs are attached.
    fn attach(&mut self, index: usize) -> anyhow::Result<Traced>;
    /// One window of the open loop; loadgen's summary.
    fn open_loop(&mut self, seconds: f64) -> anyhow::Result<Summary>;
}

/// Whether window `index` is traced in the flipping-pairs order U T T U U T T U ….
pub fn is_traced(index: usize) -> bool {
    ab::arm_of(index) == ab::Arm::Traced
}

/// `per_arm` traced and `per_arm` untraced windows of `seconds` each. Each window's figures
/// come from the client (latency from the scheduled send) and /proc (the CPU of the target
/// `target_pid` and all its descendants, such as nginx's workers, the busy share of its CPU
/// `gateway_cpu`, and the tracer's own CPU over the load alone).
pub fn windows(
    arms: &mut impl Arms,
    target_pid: u32,
    gateway_cpu: usize,
    per_arm: usize,
    seconds: f64,
) -> anyhow::Result<Vec<WindowRecord>> {
    let mut windows = Vec::new();
    for i in 0..2 * per_arm {
        let traced = is_traced(i);
        let tracer = if traced { Some(arms.attach(i)?) } else { None };
        let tracer_cpu = || {
            tracer
                .as_ref()
                .and_then(|t| procstat::cpu_seconds(t.tracer.pid()))
        };
        let (cpu_before, cpu0_before, tracer_before) = (
            procstat::tree_cpu_seconds(target_pid),
            procstat::cpu_times(gateway_cpu),
            tracer_cpu(),
        );
        let load = arms.open_loop(seconds);
        let (cpu_after, cpu0_after, tracer_after) = (
            procstat::tree_cpu_seconds(target_pid),
            procstat::cpu_times(gateway_cpu),
            tracer_cpu(),
        );
        let breakdown = tracer.map(Traced::stop).transpose()?;
        let load = load?;
        let ok = load.ok as f64;
        let cpu_s = cpu_after.zip(cpu_before).map(|(a, b)| a - b);
        let finite = |x: f64| Some(x).filter(|x| x.is_finite());
        let tracer = breakdown.as_ref().map(|(b, _)| b);
        let window = WindowRecord {
            index: i as u64,
            arm: ab::arm_of(i),
            p50_us: finite(load.latency_us.p50),
            p99_us: finite(load.latency_us.p99),
            p999_us: finite(load.latency_us.p999),
            max_us: finite(load.latency_us.max),
            ok: load.ok,
            errors: load.errors.clone(),
            achieved_rate: finite(load.achieved_rate),
            gateway_cpu_s: cpu_s,
            gateway_cpu_us_per_request: cpu_s.map(|s| s * 1e6 / ok.max(1.0)),
            gateway_cpu_share: cpu_s.map(|s| s / seconds),
            cpu0_busy: cpu0_before
                .zip(cpu0_after)
                .map(|(b, a)| b.busy_share_until(&a)),
            // The tracer process over the load, attach and final drawing left out.
            tracer_cpu_cores: tracer_after
                .zip(tracer_before)
                .map(|(a, b)| (a - b) / seconds),
            tracer_bpf_ns_per_request: None,
            tracer_lost_events: tracer.map(|b| b.lost_events),
            tracer_requests: tracer.map(|b| b.requests),
            tracer_hits_per_request: tracer.map(|b| Hits::from(b.hits_per_request)),
        };
        eprintln!(
            "xtask:   window {i} {}: p50 {:.0} µs p99 {:.0} µs, {:.1} µs CPU/request",
            if traced { "traced" } else { "untraced" },
            load.latency_us.p50,
            load.latency_us.p99,
            cpu_s.map_or(f64::NAN, |s| s * 1e6 / ok.max(1.0)),
        );
        windows.push(window);
    }
    Ok(windows)
}

/// The traced/untraced comparison of windows written by [`windows`].
pub fn compare(windows: &[WindowRecord]) -> anyhow::Result<ab::Comparison> {
    let windows = windows
        .iter()
        .map(|w| {
            w.compared()
                .with_context(|| format!("A/B window {} is incomplete", w.index))
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    Ok(ab::compare(&windows))
}

/// The median of the finite values; NaN if there is none.
pub fn median(values: Vec<f64>) -> f64 {
    session::stats::median(&values).unwrap_or(f64::NAN)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pairs_flip_order() {
        let arms: String = (0..8)
            .map(|i| if is_traced(i) { 'T' } else { 'U' })
            .collect();
        assert_eq!(arms, "UTTUUTTU");
    }

    #[test]
    fn windows_are_compared_and_an_incomplete_one_is_named() {
        let window = |index: u64, p50: f64| WindowRecord {
            index,
            arm: ab::arm_of(index as usize),
            p50_us: Some(p50),
            p99_us: Some(2.0),
            p999_us: Some(3.0),
            max_us: None,
            ok: 10,
            errors: Default::default(),
            achieved_rate: None,
            gateway_cpu_s: None,
            gateway_cpu_us_per_request: Some(4.0),
            gateway_cpu_share: None,
            cpu0_busy: Some(0.5),
            tracer_cpu_cores: None,
            tracer_bpf_ns_per_request: None,
            tracer_lost_events: None,
            tracer_requests: None,
            tracer_hits_per_request: None,
        };
        let c = compare(&[window(0, 100.0), window(1, 110.0)]).unwrap();
        assert_eq!(c.pairs, 1);
        assert_eq!(c.metrics.p50_us.ratio_of_medians, Some(1.1));
        let mut bad = window(1, 1.0);
        bad.gateway_cpu_us_per_request = None;
        let err = compare(&[window(0, 1.0), bad]).unwrap_err();
        assert!(format!("{err:#}").contains("window 1"), "{err:#}");
    }
}
