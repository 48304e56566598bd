//! Root only: calibration measures a positive, finite cost for every probe kind and leaves
//! nothing attached. No timing thresholds: the numbers are printed, not judged.

use tracer::calibrate;

fn is_root() -> bool {
    // SAFETY: no preconditions.
    unsafe { libc::geteuid() == 0 }
}

#[test]
fn every_kind_gets_a_positive_finite_cost() {
    if !is_root() {
        eprintln!("SKIPPED every_kind_gets_a_positive_finite_cost: needs root (eBPF)");
        return;
    }
    let calibration = calibrate::run().expect("calibration");
    eprintln!("{calibration:#?}");
    for (name, cost) in [
        ("site", &calibration.site),
        ("syscall", &calibration.syscall),
        ("sock", &calibration.sock),
        ("sched", &calibration.sched),
    ] {
        assert!(
            cost.ns_per_hit.is_finite() && cost.ns_per_hit > 0.0,
            "{name}: {} ns per hit",
            cost.ns_per_hit
        );
        let rounds = cost.rounds.len();
        assert!(
            (calibrate::MIN_ROUNDS..=calibrate::ROUNDS).contains(&rounds),
            "{name}: {rounds} rounds"
        );
    }
    let uprobes = std::fs::read_to_string("/sys/kernel/tracing/uprobe_events").unwrap_or_default();
    assert!(!uprobes.contains("tracer_calibration"), "{uprobes}");
}
