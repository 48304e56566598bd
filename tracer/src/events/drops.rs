//! What the kernel programs could not do (`abi::Drops`, per CPU), summed for the session's
//! end: nothing is dropped silently, it is counted and reported in breakdown.json.

use aya::maps::{MapData, PerCpuArray};
use tracer_ebpf::abi::Drops;

/// Sum of the per-CPU records.
pub fn fold(per_cpu: impl IntoIterator<Item = Drops>) -> Drops {
    per_cpu.into_iter().fold(Drops::default(), |acc, d| Drops {
        tids_full: acc.tids_full + d.tids_full,
        in_flight_full: acc.in_flight_full + d.in_flight_full,
        stack_failed: acc.stack_failed + d.stack_failed,
        forced_wakeups: acc.forced_wakeups + d.forced_wakeups,
    })
}

pub fn read(map: &PerCpuArray<MapData, Drops>) -> anyhow::Result<Drops> {
    Ok(fold(map.get(&0, 0)?.iter().copied()))
}

pub fn to_json(drops: &Drops) -> serde_json::Value {
    serde_json::json!({
        "tids_full": drops.tids_full,
        "in_flight_full": drops.in_flight_full,
        "stack_failed": drops.stack_failed,
        "forced_wakeups": drops.forced_wakeups,
    })
}

/// Adds the kernel's `recursion_misses` (programs skipped because another BPF program ran on
/// the CPU; per program, by name) to the `drops` section: their sum, and the programs that
/// had any. Returns the warning to print, if any was skipped.
pub fn add_recursion_misses(
    drops: &mut serde_json::Value,
    misses: &[(String, u64)],
) -> Option<String> {
    let total: u64 = misses.iter().map(|(_, n)| n).sum();
    let by_program: serde_json::Map<String, serde_json::Value> = misses
        .iter()
        .map(|(name, n)| (name.clone(), (*n).into()))
        .collect();
    drops["recursion_misses"] = total.into();
    drops["recursion_misses_by_program"] = by_program.into();
    (total > 0).then(|| {
        let names: Vec<String> = misses.iter().map(|(n, c)| format!("{n} {c}")).collect();
        format!(
            "tracer: WARNING the kernel skipped our programs {total} times because another BPF \
             program was running on the CPU ({}); events they would have written are missing, \
             and no loss span covers them",
            names.join(", ")
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sums_every_field() {
        let one = Drops {
            tids_full: 1,
            in_flight_full: 2,
            stack_failed: 3,
            forced_wakeups: 4,
        };
        let sum = fold([one, one]);
        assert_eq!(
            (
                sum.tids_full,
                sum.in_flight_full,
                sum.stack_failed,
                sum.forced_wakeups
            ),
            (2, 4, 6, 8)
        );
    }

    /// Issue 21 item 8: recursion misses are reported under `drops`, summed and by program,
    /// with a warning only when there are any.
    #[test]
    fn item8_recursion_misses_in_drops_with_a_warning() {
        let mut drops = to_json(&Drops::default());
        assert_eq!(add_recursion_misses(&mut drops, &[]), None);
        assert_eq!(drops["recursion_misses"], 0);
        assert_eq!(drops["recursion_misses_by_program"], serde_json::json!({}));
        let misses = [
            ("sched_switch".to_owned(), 2),
            ("site_request_begin".to_owned(), 1),
        ];
        let warning = add_recursion_misses(&mut drops, &misses).unwrap();
        assert!(
            warning.contains("3 times") && warning.contains("sched_switch 2"),
            "{warning}"
        );
        assert_eq!(drops["recursion_misses"], 3);
        assert_eq!(
            drops["recursion_misses_by_program"]["site_request_begin"],
            1
        );
    }
}
