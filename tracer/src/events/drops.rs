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
}
