//! Root only: calibration measures a finite cost for every probe kind, positive in a run the
//! machine's other load did not swamp, and leaves nothing attached. No timing thresholds:
//! the numbers are printed, not judged. `TRACER_ATTACH` (as `--attach`) picks the syscall and
//! socket hooks it measures; `cargo xtask vmtest` runs it once per mode.

use tracer::{
    attach::detect::{Choice, Plan},
    calibrate::{self, Calibration, KindCost},
};

fn is_root() -> bool {
    rustix::process::geteuid().is_root()
}

fn kinds(calibration: &Calibration) -> [(&'static str, &KindCost); 4] {
    [
        ("site", &calibration.site),
        ("syscall", &calibration.syscall),
        ("sock", &calibration.sock),
        ("sched", &calibration.sched),
    ]
}

fn choice() -> Choice {
    std::env::var("TRACER_ATTACH").map_or(Choice::Auto, |mode| {
        clap::ValueEnum::from_str(&mode, false)
            .expect("TRACER_ATTACH: auto, tracepoint, kprobe or fentry")
    })
}

/// On a shared 2-CPU machine a busy neighbour can swamp a round (the cost comes out noisy, or
/// unmeasured); a few attempts tell that apart from a probe that costs nothing.
const ATTEMPTS: usize = 3;

#[test]
fn every_kind_gets_a_positive_finite_cost() {
    if !is_root() {
        eprintln!("SKIPPED every_kind_gets_a_positive_finite_cost: needs root (eBPF)");
        return;
    }
    let mut positive = [false; 4];
    for attempt in 1..=ATTEMPTS {
        let plan = Plan::new(choice()).expect("detecting attach modes");
        eprintln!(
            "attempt {attempt}: syscalls {}, sockets {}",
            plan.syscalls, plan.sockets
        );
        let calibration = calibrate::run(&plan).expect("calibration");
        for (i, (name, cost)) in kinds(&calibration).into_iter().enumerate() {
            eprintln!(
                "attempt {attempt}: {name} {} ns per hit (rounds {:.1}..{:.1}, untraced \
                 {:.1} ns per loop unit, {:.2} hits per unit)",
                cost.ns_per_hit
                    .map_or_else(|| "unmeasured".to_owned(), |ns| format!("{ns:.1}")),
                cost.min_ns,
                cost.max_ns,
                cost.untraced_ns_per_unit,
                cost.hits_per_unit
            );
            assert!(cost.min_ns.is_finite() && cost.max_ns.is_finite(), "{name}");
            if let Some(ns) = cost.ns_per_hit {
                assert!(ns.is_finite() && ns > 0.0, "{name}: {ns}");
            }
            let rounds = cost.rounds.len();
            assert!(
                (calibrate::MIN_ROUNDS..=calibrate::ROUNDS).contains(&rounds),
                "{name}: {rounds} rounds"
            );
            assert!(cost.hits_per_unit > 0.0, "{name}: the probe never fired");
            positive[i] |= cost.ns_per_hit.is_some();
        }
        if positive.iter().all(|&p| p) {
            break;
        }
    }
    assert_eq!(positive, [true; 4], "site, syscall, sock, sched");
    let uprobes = std::fs::read_to_string("/sys/kernel/tracing/uprobe_events").unwrap_or_default();
    assert!(!uprobes.contains("tracer_calibration"), "{uprobes}");
}
