//! What the kernel programs could not do (`abi::Drops`, per CPU), summed for the session's
//! end: nothing is dropped silently, it is counted and reported in breakdown.json.

use aya::maps::{MapData, PerCpuArray};
use tracer_ebpf::abi::{Drops, TARGET_SOCKS_ENTRIES};

/// Sum of the per-CPU records.
pub fn fold(per_cpu: impl IntoIterator<Item = Drops>) -> Drops {
    per_cpu.into_iter().fold(Drops::default(), |acc, d| Drops {
        tids_full: acc.tids_full + d.tids_full,
        in_flight_full: acc.in_flight_full + d.in_flight_full,
        stack_failed: acc.stack_failed + d.stack_failed,
        forced_wakeups: acc.forced_wakeups + d.forced_wakeups,
        socks_added: acc.socks_added + d.socks_added,
        socks_removed: acc.socks_removed + d.socks_removed,
    })
}

pub fn read(map: &PerCpuArray<MapData, Drops>) -> anyhow::Result<Drops> {
    Ok(fold(map.get(&0, 0)?.iter().copied()))
}

/// TARGET_SOCKS entries the LRU map must have evicted: more were added than removed and fit.
/// A lower bound (the kernel does not report evictions; an LRU map can evict before it is
/// full). An evicted socket of the target loses its data-ready events until it is read again.
pub fn target_socks_evicted_at_least(drops: &Drops) -> u64 {
    drops
        .socks_added
        .saturating_sub(drops.socks_removed)
        .saturating_sub(u64::from(TARGET_SOCKS_ENTRIES))
}

/// breakdown.json's `drops` section, before what user space adds to it
/// (`established_unclaimed`, and the two below).
pub fn to_model(drops: &Drops) -> session::breakdown::Drops {
    session::breakdown::Drops {
        tids_full: drops.tids_full,
        in_flight_full: drops.in_flight_full,
        stack_failed: drops.stack_failed,
        forced_wakeups: drops.forced_wakeups,
        target_socks_evicted_at_least: Some(target_socks_evicted_at_least(drops)),
        ..session::breakdown::Drops::default()
    }
}

/// Adds the kernel's `recursion_misses` (programs skipped because another BPF program ran on
/// the CPU; per program, by name) to the `drops` section: their sum, and the programs that
/// had any. Returns the warning to print, if any was skipped.
pub fn add_recursion_misses(
    drops: &mut session::breakdown::Drops,
    misses: &[(String, u64)],
) -> Option<String> {
    let total: u64 = misses.iter().map(|(_, n)| n).sum();
    drops.recursion_misses = Some(Some(total));
    drops.recursion_misses_by_program = Some(misses.iter().cloned().collect());
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

/// Adds the syscall kretprobes' missed exits (their instances ran out) to the `drops`
/// section: the sum and the programs with any (0 unless syscalls were kprobes), or null and
/// `kretprobe_missed_note` saying why where it is unknown. Returns the line to print, if any
/// exit was missed or the count is unknown.
pub fn add_kretprobe_missed(
    drops: &mut session::breakdown::Drops,
    missed: Result<&[(String, u64)], &str>,
) -> Option<String> {
    let missed = match missed {
        Ok(missed) => missed,
        Err(reason) => {
            drops.kretprobe_missed = Some(None);
            drops.kretprobe_missed_note = Some(reason.to_owned());
            return Some(format!(
                "tracer: syscall exits missed by kretprobes are not counted: {reason}"
            ));
        }
    };
    let total: u64 = missed.iter().map(|(_, n)| n).sum();
    drops.kretprobe_missed = Some(Some(total));
    drops.kretprobe_missed_by_program =
        Some(missed.iter().filter(|(_, n)| *n > 0).cloned().collect());
    (total > 0).then(|| {
        format!(
            "tracer: WARNING {total} syscall exits were missed by kretprobes with no free \
             instance; requests that needed them are incomplete or misattributed"
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
            socks_added: 5,
            socks_removed: 6,
        };
        let sum = fold([one, one]);
        assert_eq!(
            (
                sum.tids_full,
                sum.in_flight_full,
                sum.stack_failed,
                sum.forced_wakeups,
                sum.socks_added,
                sum.socks_removed
            ),
            (2, 4, 6, 8, 10, 12)
        );
    }

    /// Issue 21 item 10: more sockets added than removed and than TARGET_SOCKS holds means
    /// the LRU map evicted that many at least; none is claimed otherwise.
    #[test]
    fn item10_target_socks_evictions_counted() {
        let cap = u64::from(TARGET_SOCKS_ENTRIES);
        let drops = |socks_added, socks_removed| Drops {
            socks_added,
            socks_removed,
            ..Drops::default()
        };
        assert_eq!(target_socks_evicted_at_least(&drops(cap, 0)), 0);
        assert_eq!(target_socks_evicted_at_least(&drops(cap + 7, 2)), 5);
        assert_eq!(target_socks_evicted_at_least(&drops(10, 20)), 0);
        assert_eq!(
            to_model(&drops(cap + 1, 0)).target_socks_evicted_at_least,
            Some(1)
        );
    }

    /// Issue 21 item 9: kretprobe misses are reported under `drops`, null with a note where
    /// unknown.
    #[test]
    fn item9_kretprobe_missed_in_drops() {
        let mut drops = to_model(&Drops::default());
        let why = "Linux 6.1.0 does not report a kprobe link's missed count (6.7.0+)";
        let note = add_kretprobe_missed(&mut drops, Err(why)).expect("a line saying why");
        assert!(note.contains(why), "{note}");
        assert_eq!(drops.kretprobe_missed, Some(None));
        assert_eq!(drops.kretprobe_missed_note.as_deref(), Some(why));
        let mut drops = to_model(&Drops::default());
        assert_eq!(add_kretprobe_missed(&mut drops, Ok(&[])), None);
        assert_eq!(drops.kretprobe_missed, Some(Some(0)));
        let missed = [
            ("kretprobe_sys_read".to_owned(), 4),
            ("kretprobe_sys_write".to_owned(), 0),
        ];
        let warning = add_kretprobe_missed(&mut drops, Ok(&missed)).unwrap();
        assert!(warning.contains("4 syscall exits"), "{warning}");
        assert_eq!(
            drops.kretprobe_missed_by_program,
            Some([("kretprobe_sys_read".to_owned(), 4)].into())
        );
    }

    /// Issue 21 item 8: recursion misses are reported under `drops`, summed and by program,
    /// with a warning only when there are any.
    #[test]
    fn item8_recursion_misses_in_drops_with_a_warning() {
        let mut drops = to_model(&Drops::default());
        assert_eq!(add_recursion_misses(&mut drops, &[]), None);
        assert_eq!(drops.recursion_misses, Some(Some(0)));
        assert_eq!(drops.recursion_misses_by_program, Some([].into()));
        let misses = [
            ("sched_switch".to_owned(), 2),
            ("site_request_begin".to_owned(), 1),
        ];
        let warning = add_recursion_misses(&mut drops, &misses).unwrap();
        assert!(
            warning.contains("3 times") && warning.contains("sched_switch 2"),
            "{warning}"
        );
        assert_eq!(drops.recursion_misses, Some(Some(3)));
        assert_eq!(
            drops.recursion_misses_by_program.unwrap()["site_request_begin"],
            1
        );
    }
}
